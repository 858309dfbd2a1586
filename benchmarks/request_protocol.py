"""Block hit ratio of ``--protocol request`` beside ``--protocol prefix`` (issue #11 section 2).

Replays a trace through each (policy, capacity, window) under both protocols and prints a
markdown table of block hit ratios and their difference (request - prefix, in points), the
table in docs/replay.md ("--protocol request"). Same calls as ``kvtier replay --protocol
{prefix,request} -p POLICY -c CAPACITY -W W``.

Usage::

    PYTHONPATH=src python benchmarks/request_protocol.py \\
        --trace /work/shared/traces/mooncake_conversation.jsonl \\
        --policies lru,arc,prefix-arc --capacities 1000,4000,16000 --windows 0,32
"""

from __future__ import annotations

import argparse
import sys
import time

from kvtier.replay import replay
from kvtier.trace import embedded_sample_path, read_trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="trace file (default: the embedded sample)")
    ap.add_argument("--policies", default="lru,arc,prefix-arc")
    ap.add_argument("--capacities", default="1000,4000,16000", help="blocks, comma-separated")
    ap.add_argument("--windows", default="0,32", help="in-flight windows W, comma-separated")
    args = ap.parse_args(argv)
    path = args.trace or embedded_sample_path()
    trace = list(read_trace(path))
    refs = sum(len(r.keys) for r in trace)
    policies = args.policies.split(",")
    capacities = [int(c) for c in args.capacities.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    print(f"trace {path}: {len(trace):,} requests, {refs:,} block refs", file=sys.stderr)
    print("| policy | blocks | W | prefix hit % | request hit % | request - prefix (points) |")
    print("|---|---:|---:|---:|---:|---:|")
    for policy in policies:
        for capacity in capacities:
            for window in windows:
                t0 = time.perf_counter()
                ratios = [
                    replay(trace, policy, capacity, protocol=protocol,
                           inflight=window).block_hit_ratio * 100
                    for protocol in ("prefix", "request")
                ]
                print(f"| {policy} | {capacity:,} | {window} | {ratios[0]:.2f} | "
                      f"{ratios[1]:.2f} | {ratios[1] - ratios[0]:+.2f} |", flush=True)
                print(f"  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
