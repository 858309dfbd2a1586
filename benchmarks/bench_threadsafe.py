"""Benchmark: the cost of :class:`kvtier.threadsafe.ThreadSafeManager` on one thread.

Usage::

    python benchmarks/bench_threadsafe.py [--trace PATH] [--repeats 7]

Replays the trace (default: ../shared/traces/mooncake_conversation.jsonl next to the
repository, else the embedded sample) with the engine's prefix protocol (W=0) through a plain
``OffloadingManager`` and through ``ThreadSafeManager(OffloadingManager(...))`` for LRU and
ARC at 4,000 and 16,000 blocks, alternating plain and wrapped within each repeat so both see
the same machine load. Prints ns per block reference (best and median of the repeats, process
CPU time) and the wrapped/plain ratio of the bests. Each request makes 4 manager calls
(lookup_prefix, touch, prepare_load, prepare_store) and up to 2 completions, so the wrapper
adds about 6 lock round trips per request.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

from kvtier.manager import OffloadingManager
from kvtier.replay import _prefix_protocol, _run
from kvtier.threadsafe import ThreadSafeManager
from kvtier.trace import embedded_sample_path, find_shared_trace, read_trace

REPO = Path(__file__).resolve().parents[1]
SHARED = find_shared_trace(REPO)


def once(trace: list, policy: str, capacity: int, wrapped: bool) -> tuple[float, int]:
    manager = OffloadingManager(capacity, policy)
    target = ThreadSafeManager(manager) if wrapped else manager
    step, drain = _prefix_protocol(target, 0)
    gc.collect()
    t0 = time.process_time_ns()
    counts, _, _ = _run(step, drain, trace, 512, None, False)
    elapsed = time.process_time_ns() - t0
    return elapsed / counts[1], counts[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=SHARED if SHARED.exists() else None)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    path = args.trace or embedded_sample_path()
    trace = list(read_trace(path))
    print(f"trace {path}: {len(trace):,} requests, {sum(len(r.keys) for r in trace):,} refs")
    print(f"{'policy':8}{'blocks':>8}{'plain ns/ref':>14}{'wrapped ns/ref':>16}"
          f"{'ratio':>8}   (best; median in brackets)")
    for policy in ("lru", "arc"):
        for capacity in (4000, 16000):
            plain, wrapped = [], []
            hits = set()
            for _ in range(args.repeats):
                for is_wrapped, sink in ((False, plain), (True, wrapped)):
                    ns, h = once(trace, policy, capacity, is_wrapped)
                    sink.append(ns)
                    hits.add(h)
            assert len(hits) == 1, "the wrapper changed the result"
            bp, bw = min(plain), min(wrapped)
            print(f"{policy:8}{capacity:>8,}{bp:>9,.0f} ({statistics.median(plain):,.0f})"
                  f"{bw:>10,.0f} ({statistics.median(wrapped):,.0f}){bw / bp:>8.3f}")


if __name__ == "__main__":
    main()
