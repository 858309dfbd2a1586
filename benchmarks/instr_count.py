"""Instruction counts (cachegrind) of the manager's hot paths, old code vs new, alternating.

Timings on a shared 2-core machine vary by up to +-50%; instruction counts do not. This runs
each workload under ``valgrind --tool=cachegrind`` twice per code version, once doing the
work and once doing only its set-up, and divides the difference by the work's units:

* ``replay POLICY CAPACITY W [ADMISSION]``: instructions per block reference of
  :func:`kvtier.replay.replay` on the full conversation trace (prefix protocol; admission
  ``all`` unless given, e.g. ``"replay lru 16000 0 adaptive"``);
* ``batch POLICY N``: per evicted block, one ``prepare_store`` of N/2 new keys into a full
  tier of N blocks (half of them used twice), as ``bench_manager.py``'s batch eviction;
  ``batchstore POLICY N``: the same plus the ``complete_store`` of the N/2 keys (with logical
  recency a stored block takes its place in the order at ``prepare_store``, before it at
  ``complete_store``: this compares the whole cost of storing);
* ``op NAME POLICY N``: per call, 20,000 one-key calls over a full tier of N blocks:
  ``lookup``, ``touch``, ``load`` (prepare_load + complete_load), ``store`` (prepare_store +
  complete_store of a new key, one eviction each), as ``bench_manager.py``'s per-op table.

Usage::

    python benchmarks/instr_count.py --old /tmp/old-kvtier/src [--trace PATH] \\
        [--case "replay lru 16000 0"] ...

``--old`` is the ``src`` folder of another checkout (e.g. ``git worktree add /tmp/old-kvtier
<commit>``); both versions run the same workload script (this file, ``--run``), with
``PYTHONPATH`` pointing at each ``src`` in turn. Without ``--case`` a default set runs.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shared_trace() -> Path:
    """The full conversation trace (``kvtier.trace.find_shared_trace``)."""
    # not at the top: the measured child may run an old src tree
    from kvtier.trace import find_shared_trace

    return find_shared_trace(REPO)


OPS = 20_000

DEFAULT_CASES = [
    "replay lru 16000 0", "replay lru 16000 32", "replay arc 16000 0", "replay arc 16000 32",
    "batch lru 10000", "batch arc 10000",
    "op store lru 10000", "op store arc 10000", "op load lru 10000", "op load arc 10000",
    "op touch arc 10000", "op lookup lru 10000",
]


def full_manager(policy: str, n: int):
    from kvtier import OffloadingManager

    m = OffloadingManager(n, policy)
    keys = list(range(n))
    for start in range(0, n, 1024):
        chunk = keys[start : start + 1024]
        m.prepare_store(chunk)
        m.complete_store(chunk)
    for start in range(0, n, 2048):
        m.touch(keys[start : start + 1024])
    return m


def run(case: list[str], work: bool, trace: str) -> int:
    """Do the set-up of ``case`` and, if ``work``, its work; return the work's units."""
    kind = case[0]
    if kind == "replay":
        from kvtier.replay import replay
        from kvtier.trace import read_trace

        requests = list(read_trace(trace))
        policy, capacity, inflight = case[1], int(case[2]), int(case[3])
        # admission only when asked: older checkouts' replay() has no such argument
        extra = {"admission": case[4]} if len(case) > 4 else {}
        res = replay(requests if work else requests[:0], policy, capacity, inflight=inflight,
                     **extra)
        return res.block_refs if work else sum(len(r.keys) for r in requests)
    if kind in ("batch", "batchstore"):
        policy, n = case[1], int(case[2])
        m = full_manager(policy, n)
        new = list(range(n, n + n // 2))
        if work:
            m.prepare_store(new)
            if kind == "batchstore":  # the store completes too: the whole cost of a stored block
                m.complete_store(new)
        return n // 2
    name, policy, n = case[1], case[2], int(case[3])
    m = full_manager(policy, n)
    rng = random.Random(1)
    keys = [rng.randrange(n) for _ in range(OPS)]
    if name == "store":
        keys = [[n + i] for i in range(OPS)]
    else:
        keys = [[k] for k in keys]
    if not work:
        return OPS
    if name == "lookup":
        lookup = m.lookup
        for k in keys:
            lookup(k[0])
    elif name == "touch":
        touch = m.touch
        for k in keys:
            touch(k)
    elif name == "load":
        load, release = m.prepare_load, m.complete_load
        for k in keys:
            load(k)
            release(k)
    elif name == "store":
        store, complete = m.prepare_store, m.complete_store
        for k in keys:
            store(k)
            complete(k)
    return OPS


def instructions(src: str, case: str, work: bool, trace: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0")
        cmd = [
            "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
            sys.executable, __file__, "--run", case, "--trace", trace,
        ] + (["--work"] if work else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        m = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
        if not m:
            raise RuntimeError(proc.stderr[-2000:])
        return int(m.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="src folder of the old checkout")
    ap.add_argument("--new", default=str(REPO / "src"), help="src folder of the new code")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--case", action="append", help='e.g. "replay arc 16000 32"')
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--work", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.trace is None:
        args.trace = str(shared_trace())
    if args.run:
        run(args.run.split(), args.work, args.trace)
        return 0
    versions = [("new", args.new)] + ([("old", args.old)] if args.old else [])
    print("case | " + " | ".join(f"{v} instr/unit" for v, _ in versions) + " | new/old")
    for case in args.case or DEFAULT_CASES:
        per_unit = {}
        # set-up and work of each version back to back, versions alternating per case
        for version, src in versions:
            base = instructions(src, case, False, args.trace)
            full = instructions(src, case, True, args.trace)
            kind = case.split()[0]
            if kind == "replay":  # per block reference of the trace
                units = _refs(args.trace)
            else:  # per call, or per evicted block
                units = OPS if kind == "op" else int(case.split()[2]) // 2
            per_unit[version] = (full - base) / units
        ratio = per_unit["new"] / per_unit["old"] if "old" in per_unit else float("nan")
        cells = " | ".join(f"{per_unit[v]:,.0f}" for v, _ in versions)
        print(f"{case} | {cells} | {ratio:.3f}", flush=True)
    return 0


_REFS: dict[str, int] = {}


def _refs(trace: str) -> int:
    if trace not in _REFS:
        from kvtier.trace import read_trace

        _REFS[trace] = sum(len(r.keys) for r in read_trace(trace))
    return _REFS[trace]


if __name__ == "__main__":
    sys.exit(main())
