"""Regenerate the golden replay values in ``tests/golden/`` (behaviour pins for refactors).

Usage::

    python scripts/regen_golden.py [--trace PATH] [--check] [--policy NAME ...]

For every registered policy x 3 tier sizes x in-flight window {0, 8} (protocol ``prefix``),
plus protocol ``get`` at the same sizes on the sample only (one call per key, 1.6x the cost
of a ``prefix`` replay, so kept out of the full trace's run), it replays a trace and records
the counts a replay reports: requests, block references, hit blocks, hit tokens, input
tokens, stores, store failures (calls and blocks), evictions. Two files:

* ``tests/golden/sample.json``: the embedded 500-request sample (always written);
* ``tests/golden/conversation.json``: the full Mooncake conversation trace, written when
  ``--trace`` or ``../shared/traces/mooncake_conversation.jsonl`` exists.

A change that moves any of these numbers must say why in its commit (issue #10, goal 1).
``--check`` compares instead of writing and exits 1 on any difference (what
``tests/test_golden.py`` does too). ``--policy`` limits the run to the named policies and
rewrites only their rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kvtier.policies import available_policies
from kvtier.replay import replay
from kvtier.trace import embedded_sample_path, find_shared_trace, read_trace

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
SHARED = find_shared_trace(REPO)

#: tier sizes in blocks: about 2 %, 8 % and 34 % of the sample's 11,879 distinct blocks;
#: 0.5 %, 2.2 % and 8.8 % of the full trace's 182,790 (the last two are the benchmark sizes)
CAPACITIES = {"sample": (250, 1000, 4000), "conversation": (1000, 4000, 16000)}
INFLIGHT = (0, 8)
FIELDS = (
    "requests", "block_refs", "hit_blocks", "hit_tokens", "input_tokens", "stored_blocks",
    "store_failures", "store_failed_blocks", "evictions",
)


def cases(name: str) -> list[tuple[str, str, int, int]]:
    """``(policy, protocol, capacity, inflight)`` of every golden row of trace ``name``."""
    rows = []
    for policy in available_policies():
        for capacity in CAPACITIES[name]:
            for inflight in INFLIGHT:
                rows.append((policy, "prefix", capacity, inflight))
            if name == "sample":
                rows.append((policy, "get", capacity, 0))
    return rows


def row_key(policy: str, protocol: str, capacity: int, inflight: int) -> str:
    return f"{policy}/{protocol}/{capacity}/W{inflight}"


def compute(requests: list, policy: str, protocol: str, capacity: int, inflight: int) -> dict:
    """The golden counts of one replay."""
    res = replay(requests, policy, capacity, inflight=inflight, protocol=protocol)
    return {field: getattr(res, field) for field in FIELDS}


def generate(name: str, requests: list, policies: list[str] | None = None) -> dict:
    return {
        row_key(*case): compute(requests, *case)
        for case in cases(name)
        if policies is None or case[0] in policies
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=SHARED, help="the full conversation trace")
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    ap.add_argument("--policy", action="append", help="only these policies' rows")
    args = ap.parse_args(argv)
    traces = {"sample": embedded_sample_path()}
    if args.trace.is_file():
        traces["conversation"] = args.trace
    else:
        print(f"{args.trace} not found: only the embedded sample", file=sys.stderr)
    status = 0
    for name, path in traces.items():
        requests = list(read_trace(path))
        t0 = time.perf_counter()
        values = generate(name, requests, args.policy)
        took = time.perf_counter() - t0
        out = GOLDEN / f"{name}.json"
        old = json.loads(out.read_text()) if out.exists() else {}
        if args.policy:  # only the named policies' rows are compared or rewritten
            old_rest = {k: v for k, v in old.items() if k.split("/")[0] not in args.policy}
            old = {k: v for k, v in old.items() if k not in old_rest}
        else:
            old_rest = {}
        if args.check:
            diff = [k for k in sorted(set(old) | set(values)) if old.get(k) != values.get(k)]
            for k in diff:
                print(f"{name} {k}: golden {old.get(k)} now {values.get(k)}")
            status |= bool(diff)
            print(f"{name}: {len(values)} rows, {len(diff)} differ ({took:.1f} s)")
        else:
            changed = sorted(k for k in values if old.get(k) != values[k])
            for k in changed:
                print(f"{name} {k}: {old.get(k)} -> {values[k]}")
            out.write_text(json.dumps({**old_rest, **values}, indent=1, sort_keys=True) + "\n")
            print(f"{name}: {len(values)} rows written to {out} ({took:.1f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
