"""Wall time and peak memory of ``kvtier analyze`` and the Belady replay on the full trace.

Cases (each in a fresh child process, so peak RSS belongs to that case alone):

* ``analyze``: :func:`kvtier.analyze.analyze` streaming the trace file (parsing included, as
  ``kvtier analyze`` runs it);
* ``oracle``: building the :class:`~kvtier.oracle.NextUseOracle` from the parsed trace;
* ``belady@C`` / ``lru@C``: :func:`kvtier.replay.replay` of the parsed trace (the oracle build
  included for Belady) at 10 % and 30 % of the distinct blocks, prefix protocol, W = 0.

Per case: wall seconds (best and median of ``--repeat``), the child's peak RSS
(``ru_maxrss``) and its RSS before the case ran (trace parsed, modules imported), and the
peak of Python allocations during one run (``tracemalloc``, a separate run: it slows Python
down). Ratios Belady / LRU are printed at the end.

Usage::

    python benchmarks/bench_capacity.py [--trace PATH] [--repeat 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shared_trace() -> Path:
    """The full conversation trace (``kvtier.trace.find_shared_trace``)."""
    # lazily, as kvtier below: RSS is measured before it
    from kvtier.trace import find_shared_trace

    return find_shared_trace(ROOT)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _case(name: str, path: str, repeat: int, conn) -> None:
    from kvtier.analyze import analyze
    from kvtier.oracle import NextUseOracle
    from kvtier.replay import replay
    from kvtier.trace import read_trace

    reqs = None if name == "analyze" else list(read_trace(path))
    unique = len({k for r in reqs for k in r.keys}) if reqs is not None else 0

    def run():
        if name == "analyze":
            return analyze(read_trace(path))
        if name == "oracle":
            return NextUseOracle([r.keys for r in reqs])
        policy, share = name.split("@")
        return replay(reqs, policy, round(unique * float(share) / 100))

    before = _rss_mib()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t0)
        del result
    peak = _rss_mib()
    tracemalloc.start()
    run()
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    conn.send((min(times), statistics.median(times), before, peak, traced / 2**20))
    conn.close()


def measure(name: str, path: str, repeat: int) -> tuple:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_case, args=(name, path, repeat, child))
    proc.start()
    out = parent.recv()
    proc.join()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.trace is None:
        args.trace = str(shared_trace())
    cases = ["analyze", "oracle", "lru@10", "belady@10", "lru@30", "belady@30"]
    print(f"trace {args.trace}, best / median of {args.repeat}; RSS in MiB (before = trace "
          "parsed and modules imported)\n")
    print("| case | wall s (best) | median | peak RSS | RSS before | Python peak (tracemalloc) |")
    print("|---|---:|---:|---:|---:|---:|")
    res = {}
    for name in cases:
        best, med, before, peak, traced = measure(name, args.trace, args.repeat)
        res[name] = best
        print(f"| {name} | {best:.2f} | {med:.2f} | {peak:.0f} | {before:.0f} | "
              f"{traced:.1f} MiB |", flush=True)
    for share in ("10", "30"):
        print(f"\nbelady / lru at {share} %: {res['belady@' + share] / res['lru@' + share]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
