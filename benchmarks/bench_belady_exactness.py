"""How far Belady is from the optimum under the ``prefix`` protocol (brute force, tiny traces).

Under ``--protocol get`` Belady/MIN is exact (tests/policies/test_belady.py). Under
``prefix`` it is a heuristic; this script measures the distance on random tiny traces by
searching every choice of victims (same protocol as the replay, W = 0):

* prefix-closed traces (chains, like Mooncake's ``hash_ids``): 1,500 traces of 5-9 requests,
  tier 1-5 blocks, seed 7;
* arbitrary keys (not prefix-closed): 300 traces of 4-8 requests of 1-3 keys from 4-6 keys,
  tier 2-4 blocks, seed 1; also counts how often an online policy beats Belady there.

Usage: ``python benchmarks/bench_belady_exactness.py`` (about a minute). Figures in
docs/replay.md (*The offline reference*).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "policies"))

from test_belady import _requests, brute_force_prefix, chain_trace  # noqa: E402

from kvtier import available_policies  # noqa: E402
from kvtier.replay import replay  # noqa: E402


def measure(traces, label: str, compare_online: bool) -> None:
    below = worst = hits_b = hits_o = 0
    beaten_traces = beaten = 0
    others = [p for p in available_policies() if p != "belady"]
    for reqs, cap in traces:
        b = replay(_requests(reqs), "belady", cap).hit_blocks
        o = brute_force_prefix(tuple(map(tuple, reqs)), cap)
        if b > o:
            raise AssertionError(f"brute force below belady: {reqs} cap {cap}")
        below += b < o
        worst = max(worst, o - b)
        hits_b += b
        hits_o += o
        if compare_online:
            n = sum(replay(_requests(reqs), p, cap).hit_blocks > b for p in others)
            beaten += n
            beaten_traces += n > 0
    print(f"{label}: {len(traces)} traces, belady below the optimum on {below} "
          f"(worst by {worst} blocks), hits {hits_b:,} vs optimum {hits_o:,}"
          + (f"; an online policy beat belady on {beaten_traces} traces "
             f"({beaten} of {len(traces) * len(others)} comparisons)" if compare_online else ""))


def main() -> int:
    rng = random.Random(7)
    chains = []
    for _ in range(1500):
        reqs = chain_trace(rng, rng.randint(5, 9))
        chains.append((reqs, rng.randint(1, 5)))
    measure(chains, "prefix-closed", compare_online=False)
    rng = random.Random(1)
    anykeys = []
    for _ in range(300):
        reqs = [rng.sample(range(rng.randint(4, 6)), rng.randint(1, 3))
                for _ in range(rng.randint(4, 8))]
        anykeys.append((reqs, rng.randint(2, 4)))
    measure(anykeys, "arbitrary keys", compare_online=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
