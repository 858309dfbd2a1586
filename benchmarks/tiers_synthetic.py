"""Hit ratios of a host + disk tier stack on a synthetic prefix trace (not Mooncake).

3,000 documents with Zipf(0.9) popularity, each a shared prefix of 4-40 blocks; 20,000
requests, each one document's prefix plus 1-8 request-private blocks (seed 7). Compares
``host:2000,disk:20000`` (write-back and write-through) with one 22,000-block tier, for LRU and
ARC, to check on other traffic than the Mooncake trace how close the hierarchy comes to a single
tier of the combined size.

    python benchmarks/tiers_synthetic.py
"""

from __future__ import annotations

import random

from kvtier.replay import replay
from kvtier.tiersim import parse_tiers, replay_tiers
from kvtier.trace import Request


def synthetic_trace(seed: int = 7, docs: int = 3000, requests: int = 20000) -> list[Request]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 0.9 for i in range(docs)]
    lens = [rng.randint(4, 40) for _ in range(docs)]
    out = []
    uid = 10**9
    for _ in range(requests):
        d = rng.choices(range(docs), weights)[0]
        keys = [d * 1000 + j for j in range(lens[d])]
        for _ in range(rng.randint(1, 8)):
            uid += 1
            keys.append(uid)
        out.append(Request(keys, None, None, None))
    return out


def main() -> None:
    reqs = synthetic_trace()
    refs = sum(len(r.keys) for r in reqs)
    distinct = len({k for r in reqs for k in r.keys})
    print(f"synthetic Zipf-0.9 prefix trace: {len(reqs):,} requests, {refs:,} block refs, "
          f"{distinct:,} distinct blocks")
    for policy in ("lru", "arc"):
        single = replay(reqs, policy, 22000)
        for demotion in ("write-back", "write-through"):
            t = replay_tiers(reqs, parse_tiers("host:2000,disk:20000"), policy,
                             demotion=demotion)
            print(f"{policy:4} {demotion:13} host {100 * t.tier_hit_ratio('host'):5.2f} %  "
                  f"disk {100 * t.tier_hit_ratio('disk'):5.2f} %  all "
                  f"{100 * t.block_hit_ratio:5.2f} %  | one 22,000-block tier "
                  f"{100 * single.block_hit_ratio:5.2f} %")


if __name__ == "__main__":
    main()
