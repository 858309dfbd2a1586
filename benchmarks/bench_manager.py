"""Bookkeeping cost of the OffloadingManager (core issue's performance targets).

Two parts, both with the garbage collector enabled as users run it:

1. Batch eviction (vLLM's microbenchmark): a full cache of N ready blocks, one
   ``prepare_store`` of N/2 new keys that evicts N/2 blocks. N = 1,000 / 5,000 / 10,000 /
   100,000. Then, at N = 100,000, the same call evicting k = N/200 = 500 blocks with the oldest 0%,
   50%, 90% and 99% of blocks pinned (pinned blocks at the LRU end are the worst case for a
   policy that scans past them). Prints ms per call and ns per evicted block; flat = the
   per-block cost does not grow with N or with the pinned share.
2. Per-operation cost at 10^3 .. 10^6 cached blocks, one key per call: lookup, touch,
   prepare_load + complete_load, and prepare_store + complete_store of a new key into a full
   cache (one eviction each). Prints ns per key, beside the floor: one bare ``dict.get`` of
   the same keys on the manager's key -> slot dict, which every operation pays at least once.

Usage::

    python benchmarks/bench_manager.py              # full run (about 2 minutes)
    python benchmarks/bench_manager.py --quick      # smaller sizes, fewer repeats
    python benchmarks/bench_manager.py --policy lru --policy arc --policy s3fifo

Targets (2-core machine): evicting 5,000 of 10,000 < 4 ms; per-evicted-block cost within
1.5x from N = 1,000 to 100,000 and from 0% to 99% pinned; at 10^6 blocks lookup <= 150 ns,
touch <= 300 ns, load+unload <= 1 us, store with eviction <= 2 us, each flat within 1.5x.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from kvtier import OffloadingManager, available_policies


def full_manager(policy: str, n: int, *, second_use: bool = True) -> OffloadingManager:
    """A manager of ``n`` blocks, all ready; half of them used twice (ARC: in T2)."""
    m = OffloadingManager(n, policy)
    keys = list(range(n))
    for start in range(0, n, 1024):
        chunk = keys[start : start + 1024]
        m.prepare_store(chunk)
        m.complete_store(chunk)
    if second_use:
        for start in range(0, n, 2048):  # every other 1024-chunk seen again
            m.touch(keys[start : start + 1024])
    return m


def batch_eviction(
    policy: str, n: int, pinned_share: float, evicted: int, repeats: int
) -> float:
    """Median seconds of one prepare_store of ``evicted`` new keys into a full cache."""
    times = []
    for _ in range(repeats):
        m = full_manager(policy, n)
        num_pinned = int(n * pinned_share)
        if num_pinned:
            m.prepare_load(list(range(num_pinned)))  # the oldest blocks: worst case for a scan
        new_keys = list(range(n, n + evicted))
        gc.collect()
        start = time.perf_counter()
        out = m.prepare_store(new_keys)
        times.append(time.perf_counter() - start)
        if out is None or len(out.evicted_keys) != evicted:
            raise RuntimeError(f"{policy}: expected {evicted} evictions")
    return statistics.median(times)


def per_op(policy: str, n: int, ops: int) -> dict[str, float]:
    """ns per key of one-key calls on a full cache of ``n`` blocks."""
    m = full_manager(policy, n)
    rng = random.Random(1)
    hot = [rng.randrange(n) for _ in range(ops)]
    result = {}

    # the floor: one bare probe of the manager's own key -> slot dict with the same keys.
    # Every operation needs at least this; no pure-Python lookup can cost less.
    probe = m._slot_of.get
    start = time.perf_counter_ns()
    for key in hot:
        probe(key)
    result["dict probe"] = (time.perf_counter_ns() - start) / ops

    lookup = m.lookup
    start = time.perf_counter_ns()
    for key in hot:
        lookup(key)
    result["lookup"] = (time.perf_counter_ns() - start) / ops

    touch = m.touch
    batches = [[key] for key in hot]
    start = time.perf_counter_ns()
    for batch in batches:
        touch(batch)
    result["touch"] = (time.perf_counter_ns() - start) / ops

    load, unload = m.prepare_load, m.complete_load
    start = time.perf_counter_ns()
    for batch in batches:
        load(batch)
        unload(batch)
    result["load+unload"] = (time.perf_counter_ns() - start) / ops

    store, complete = m.prepare_store, m.complete_store
    new = [[key] for key in range(n, n + ops)]
    start = time.perf_counter_ns()
    for batch in new:
        store(batch)
        complete(batch)
    result["store+evict"] = (time.perf_counter_ns() - start) / ops
    if m.stats().evictions != ops:
        raise RuntimeError(f"{policy}: expected {ops} evictions, got {m.stats().evictions}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", action="append", help="policy name (repeatable)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    args = parser.parse_args()
    policies = args.policy or ["lru", "arc"]
    unknown = set(policies) - set(available_policies())
    if unknown:
        parser.error(f"unknown policies {sorted(unknown)}; known: {available_policies()}")
    sizes = [1_000, 5_000, 10_000] if args.quick else [1_000, 5_000, 10_000, 100_000]
    repeats = 3 if args.quick else 7

    print("== batch eviction: one prepare_store into a full cache of N ready blocks ==")
    print(f"{'policy':8} {'N':>8} {'pinned':>7} {'evicted':>8} {'ms':>9} {'ns/block':>9}")
    big = sizes[-1]
    for policy in policies:
        batch_eviction(policy, sizes[0], 0.0, sizes[0] // 2, repeats)  # warm-up, not shown
        rows = [(n, 0.0, n // 2) for n in sizes]
        rows += [(big, share, big // 200) for share in (0.0, 0.5, 0.9, 0.99)]
        by_n, by_pinned = [], []
        for n, pinned, evicted in rows:
            seconds = batch_eviction(policy, n, pinned, evicted, repeats)
            ns = seconds * 1e9 / evicted
            (by_n if evicted == n // 2 else by_pinned).append(ns)
            print(
                f"{policy:8} {n:>8} {pinned:>7.0%} {evicted:>8} "
                f"{seconds * 1e3:>9.3f} {ns:>9.1f}"
            )
        print(
            f"{policy:8} ns/block max/min: over N {max(by_n) / min(by_n):.2f}x, "
            f"over pinned share {max(by_pinned) / min(by_pinned):.2f}x (target <= 1.5x)"
        )

    print()
    print("== per-operation cost, one key per call, ns per key ==")
    op_sizes = [1_000, 10_000, 100_000] if args.quick else [1_000, 10_000, 100_000, 1_000_000]
    ops = 50_000 if args.quick else 200_000
    names = ["dict probe", "lookup", "touch", "load+unload", "store+evict"]
    print(f"{'policy':8} {'blocks':>9} " + " ".join(f"{name:>12}" for name in names))
    for policy in policies:
        rows = []
        for n in op_sizes:
            row = per_op(policy, n, ops)
            rows.append(row)
            print(f"{policy:8} {n:>9} " + " ".join(f"{row[name]:>12.0f}" for name in names))
        spread = " ".join(
            f"{max(r[name] for r in rows) / min(r[name] for r in rows):>11.2f}x" for name in names
        )
        print(f"{policy:8} {'max/min':>9} {spread}")
    print("targets at 10^6: lookup <= 150, touch <= 300, load+unload <= 1000, store+evict <= 2000")
    print("dict probe = one bare d.get(key) on the manager's key -> slot dict (the pure-Python floor)")


if __name__ == "__main__":
    main()
