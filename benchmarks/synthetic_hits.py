"""Block hit ratios of a few policies on synthetic traces with other properties than the
Mooncake conversation trace, for one or more source trees side by side (e.g. the code before
and after a change to a policy's rules).

Traces (:func:`kvtier.synthetic.generate`): ``default`` (SyntheticSpec()), ``one-shot 80%``
(most sessions are one request of unique blocks), ``long turns, live tails`` (4-20 new blocks
per turn, no dead partial block). Capacities are shares of each trace's distinct blocks; the
``prefix`` protocol with ``W`` requests in flight.

Usage::

    python benchmarks/synthetic_hits.py [--policies sieve,lfu] [--windows 8,32] SRC [SRC ...]

``SRC`` is a ``src`` folder (default: this checkout's); each runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(policies: list[str], shares: list[float], windows: list[int]) -> dict:
    from kvtier.replay import ReplayOptions, replay
    from kvtier.synthetic import SyntheticSpec, generate
    from kvtier.trace import count_unique_blocks

    specs = {"default": SyntheticSpec(),
             "one-shot 80%": SyntheticSpec(one_shot=0.8, seed=1),
             "long turns, live tails": SyntheticSpec(turn_blocks=(4, 20), dead_tail=0.0, seed=2)}
    out = {}
    for name, spec in specs.items():
        reqs = list(generate(spec))
        unique = count_unique_blocks(reqs)[2]
        for policy in policies:
            for share in shares:
                for w in windows:
                    r = replay(reqs, policy, max(8, int(unique * share)), ReplayOptions(inflight=w))
                    out[f"{name} | {policy} | {share:.0%} | {w}"] = 100 * r.hit_blocks / r.block_refs
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="*")
    ap.add_argument("--policies", default="sieve,lfu")
    ap.add_argument("--shares", default="0.01,0.1")
    ap.add_argument("--windows", default="8,32")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    shares = [float(s) for s in args.shares.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    if args.child:
        print(json.dumps(measure(policies, shares, windows)))
        return 0
    srcs = args.src or [str(REPO / "src")]
    cols = []
    for src in srcs:
        proc = subprocess.run([sys.executable, __file__, "--child", "--policies", args.policies,
                               "--shares", args.shares, "--windows", args.windows],
                              capture_output=True, text=True, check=True,
                              env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
        cols.append(json.loads(proc.stdout))
    print("| trace | policy | capacity | W | " + " | ".join(srcs)
          + (" | last - first |" if len(srcs) > 1 else " |"))
    print("|---|---|---:|---:|" + "---:|" * (len(srcs) + (len(srcs) > 1)))
    for row in cols[0]:
        vals = [c[row] for c in cols]
        diff = f" | {vals[-1] - vals[0]:+.2f}" if len(vals) > 1 else ""
        print(f"| {row} | " + " | ".join(f"{v:.2f}" for v in vals) + diff + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
