"""How much of the LRU -> Belady gap each policy closes, on the real trace and a synthetic one.

For each trace, policy and capacity (1 %, 3 %, 10 %, 30 % of the trace's distinct blocks):
block hit ratio under the ``prefix`` protocol, W = 0, and the share of the gap between LRU and
Belady (offline) that the policy closes::

    closed = (hits(policy) - hits(lru)) / (hits(belady) - hits(lru))

(0 = no better than LRU, 1 = as good as Belady, < 0 = worse than LRU). Traces:

* ``conversation``: the Mooncake FAST'25 conversation trace (``../shared/traces``);
* ``synthetic``: :func:`synthetic_conversations` (seeded): multi-turn conversations whose
  every block is full, so a turn's last block *is* reused by the next turn (unlike Mooncake's
  partial last blocks), sharing Zipf-popular system prompts, interleaved at random.

Usage::

    python benchmarks/bench_belady_gap.py                 # both traces, markdown tables
    python benchmarks/bench_belady_gap.py --jobs 2 --trace PATH --json out.json

Deterministic (hit counts only): the figures in docs/policies.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from itertools import count
from pathlib import Path

from kvtier import available_policies
from kvtier.replay import replay
from kvtier.trace import Request, find_shared_trace, read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = find_shared_trace(ROOT)
SHARES = (0.01, 0.03, 0.10, 0.30)


def synthetic_conversations(conversations: int = 3000, prompts: int = 40, seed: int = 1,
                            active: int = 150) -> list[Request]:
    """Multi-turn chat traffic with full blocks and shared system prompts.

    Each conversation starts from one of ``prompts`` system prompts (2-12 blocks, chosen with
    Zipf(1) popularity), has a geometric number of turns (mean 4), and each turn appends 1-6
    new blocks to the previous turn's context (so the whole previous context is the prefix).
    ``active`` conversations are open at a time; each request picks one of them uniformly.
    """
    rng = random.Random(seed)
    fresh = count()
    prompt_keys = [[next(fresh) for _ in range(rng.randint(2, 12))] for _ in range(prompts)]
    weights = [1.0 / (i + 1) for i in range(prompts)]
    started = 0
    open_convs: list[list] = []  # [context keys, turns left]
    out: list[Request] = []

    def start() -> None:
        nonlocal started
        started += 1
        base = rng.choices(prompt_keys, weights)[0]
        turns = 1
        while rng.random() < 0.75:
            turns += 1
        open_convs.append([list(base), turns])

    while started < conversations or open_convs:
        while len(open_convs) < active and started < conversations:
            start()
        i = rng.randrange(len(open_convs))
        conv = open_convs[i]
        conv[0] = conv[0] + [next(fresh) for _ in range(rng.randint(1, 6))]
        conv[1] -= 1
        out.append(Request(conv[0], len(conv[0]) * 512, None, None))
        if conv[1] == 0:
            open_convs[i] = open_convs[-1]
            open_convs.pop()
    return out


_TRACES: dict[str, list] = {}


def _load(name: str, path: str) -> list:
    if name not in _TRACES:
        _TRACES[name] = (synthetic_conversations() if name == "synthetic"
                         else list(read_trace(path)))
    return _TRACES[name]


def _run(args):
    name, path, policy, capacity = args
    r = replay(_load(name, path), policy, capacity)
    return name, policy, capacity, r.hit_blocks, r.block_refs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", choices=("conversation", "synthetic"), default=None)
    args = ap.parse_args(argv)
    names = [args.only] if args.only else ["conversation", "synthetic"]
    policies = available_policies()
    caps: dict[str, list[int]] = {}
    for name in names:
        reqs = _load(name, args.trace)
        unique = len({k for r in reqs for k in r.keys})
        refs = sum(len(r.keys) for r in reqs)
        caps[name] = [max(1, round(unique * s)) for s in SHARES]
        print(f"{name}: {len(reqs):,} requests, {refs:,} block refs, {unique:,} distinct "
              f"blocks", file=sys.stderr)
    jobs = [(n, args.trace, p, c) for n in names for p in policies for c in caps[n]]
    jobs.sort(key=lambda j: (j[2] != "belady", -j[3]))  # slow ones first
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run, jobs))
    hits = {(n, p, c): (h, refs) for n, p, c, h, refs in rows}
    out = {}
    for name in names:
        print(f"\n### {name}: block hit ratio (%) and share of the LRU -> Belady gap closed\n")
        head = " | ".join(f"{s:.0%} ({c:,})" for s, c in zip(SHARES, caps[name]))
        print(f"| policy | {head} |")
        print("|---|" + "---|" * len(SHARES))
        out[name] = {}
        for p in sorted(policies, key=lambda p: (p == "belady", p)):
            cells = []
            for c in caps[name]:
                h, refs = hits[(name, p, c)]
                lru, bel = hits[(name, "lru", c)][0], hits[(name, "belady", c)][0]
                gap = (h - lru) / (bel - lru) if bel != lru else None
                out[name].setdefault(p, []).append(
                    {"capacity": c, "hit_blocks": h, "hit_ratio": h / refs, "gap_closed": gap})
                if p in ("lru", "belady") or gap is None:
                    cells.append(f"{h / refs * 100:.2f}")
                else:
                    cells.append(f"{h / refs * 100:.2f} ({gap * 100:+.1f} %)")
            print(f"| {p} | " + " | ".join(cells) + " |")
        gaps = []
        for c in caps[name]:
            (lru, refs), bel = hits[(name, "lru", c)], hits[(name, "belady", c)][0]
            gaps.append(f"{(bel - lru) / refs * 100:.2f}")
        print("| *gap LRU -> Belady (pp)* | " + " | ".join(gaps) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
