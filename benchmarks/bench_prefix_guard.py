"""prefix-<p> minus <p> on synthetic traces (kvtier.synthetic), with and without the safeguard.

For each synthetic trace kind (dead, live or half-dead partial tails; few or many one-shot
requests; short or long reuse gaps), each inner policy and three tier sizes (1 %, 5 %, 25 % of
the trace's distinct blocks), prints the mean and standard deviation over seeds of the block
hit ratio difference ``prefix-<p> - <p>`` in points, for the shipped wrapper (``guard``) and
for the wrapper with its safeguard off (``no guard``, the wrapper before it). The same traces
as ``tests/policies/test_prefix_guard.py`` (600 sessions), more seeds by default.

Usage::

    python benchmarks/bench_prefix_guard.py                  # 5 seeds, 2 worker processes
    python benchmarks/bench_prefix_guard.py --seeds 3 --policy lru --policy arc
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "policies"))

from test_prefix_guard import INNERS, SHARES, SPECS  # noqa: E402

from kvtier.policies import get_policy  # noqa: E402
from kvtier.policies.prefix import prefix_aware  # noqa: E402
from kvtier.replay import replay  # noqa: E402
from kvtier.synthetic import generate, trace_profile  # noqa: E402


def _cell(args):
    spec, seed, inner = args
    trace = generate(sessions=600, seed=seed, **SPECS[spec])
    distinct = trace_profile(trace)["distinct"]
    out = []
    unguarded = prefix_aware(get_policy(inner), f"prefix-{inner}-unguarded", guard=False)
    for share in SHARES:
        capacity = max(4, round(distinct * share))
        base = replay(trace, inner, capacity)
        ratio = 100.0 / base.block_refs
        new = replay(trace, f"prefix-{inner}", capacity).hit_blocks - base.hit_blocks
        old = replay(trace, unguarded, capacity).hit_blocks - base.hit_blocks
        out.append((share, new * ratio, old * ratio))
    return spec, seed, inner, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--policy", action="append", help="inner policy (repeatable); default all")
    ap.add_argument("--jobs", type=int, default=2)
    opts = ap.parse_args(argv)
    inners = opts.policy or list(INNERS)
    jobs = [(spec, seed, inner) for spec in SPECS for seed in range(1, opts.seeds + 1)
            for inner in inners]
    cells: dict = {}
    with ProcessPoolExecutor(opts.jobs) as pool:
        for spec, _seed, inner, out in pool.map(_cell, jobs):
            for share, new, old in out:
                cells.setdefault((spec, inner, share), []).append((new, old))
    print(f"prefix-<p> minus <p>, block hit ratio points, mean (sd) over {opts.seeds} seeds")
    print()
    print("| trace | policy | " + " | ".join(
        f"{int(100 * s)} % guard | {int(100 * s)} % no guard" for s in SHARES) + " |")
    print("|---|---|" + "---|---|" * len(SHARES))
    worst_new = worst_old = 0.0
    for spec in SPECS:
        for inner in inners:
            row = []
            for share in SHARES:
                vals = cells[(spec, inner, share)]
                new = [v[0] for v in vals]
                old = [v[1] for v in vals]
                sd = statistics.stdev if len(vals) > 1 else (lambda _: 0.0)
                row.append(f"{statistics.mean(new):+.2f} ({sd(new):.2f})")
                row.append(f"{statistics.mean(old):+.2f} ({sd(old):.2f})")
                worst_new = min(worst_new, statistics.mean(new))
                worst_old = min(worst_old, statistics.mean(old))
            print(f"| {spec} | {inner} | " + " | ".join(row) + " |")
    print()
    print(f"worst mean: guard {worst_new:+.3f}, no guard {worst_old:+.3f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
