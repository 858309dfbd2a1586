"""Instructions per block reference of adaptive admission's own calls (cachegrind), per src tree.

``instr_count.py``'s ``replay ... adaptive`` case counts the whole replay (minutes under
valgrind per version). For comparing versions of :mod:`kvtier.admission_adaptive` alone,
this records once the calls a :func:`kvtier.replay.replay` with ``admission="adaptive"``
makes to its admission object (``record(keys, busy, pending)`` and ``admit(new_keys,
room)`` with its answer), then, for each ``SRC`` folder, replays that log on a fresh
:class:`~kvtier.admission_adaptive.DuelingAdmission` under ``valgrind --tool=cachegrind
--cache-sim=no`` twice (loading the log only, then loading and replaying it) and prints the
difference per block reference of the logged lookups, and how many ``admit`` answers differ
from the logged ones (0 when the version decides as the recording one did).

Usage::

    python benchmarks/instr_admission.py --trace PATH [--policy lru] [--capacity 16000] \\
        [--inflight 0] SRC [SRC ...]

(run with the recording version's ``src`` on ``PYTHONPATH``; e.g. ``SRC`` = ``src`` and
the ``src`` of a ``git worktree add /tmp/old <commit>`` checkout.) The figures include the
harness loop's calls (about 165 instructions per block ref on the conversation trace).
"""

from __future__ import annotations

import argparse
import os
import pickle
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


def record_log(trace: str, policy: str, capacity: int, inflight: int, out: str) -> None:
    import kvtier.admission_adaptive as aa
    from kvtier.replay import replay
    from kvtier.trace import read_trace

    calls: list[tuple] = []
    record, admit = aa.DuelingAdmission.record, aa.DuelingAdmission.admit

    def logged_record(self, keys, busy=0, pending=0):
        calls.append((0, list(keys), busy, pending))
        return record(self, keys, busy, pending)

    def logged_admit(self, new_keys, room=None):
        answer = admit(self, new_keys, room)
        calls.append((1, list(new_keys), room, answer))
        return answer

    aa.DuelingAdmission.record, aa.DuelingAdmission.admit = logged_record, logged_admit
    try:
        replay(list(read_trace(trace)), policy, capacity, inflight=inflight,
               admission="adaptive")
    finally:
        aa.DuelingAdmission.record, aa.DuelingAdmission.admit = record, admit
    with open(out, "wb") as f:
        pickle.dump((policy, capacity, calls), f)


def replay_log(path: str, work: bool) -> None:
    from kvtier.admission_adaptive import make_admission
    from kvtier.policies import get_policy

    with open(path, "rb") as f:
        policy, capacity, calls = pickle.load(f)
    a = make_admission("adaptive", capacity, get_policy(policy))
    if not work:
        return
    rec, adm = a.record, a.admit
    differ = 0
    for c in calls:
        if c[0] == 0:
            rec(c[1], c[2], c[3])
        elif adm(c[1], c[2]) != c[3]:
            differ += 1
    print(f"admit answers differing: {differ}", file=sys.stderr)


def instructions(src: str, log: str, work: bool) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src), PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, __file__, "--replay", log] + (["--work"] if work else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                          cwd=tempfile.gettempdir())
    m = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if not m:
        raise RuntimeError(proc.stderr[-2000:])
    note = re.search(r"admit answers differing: \d+", proc.stderr)
    return int(m.group(1).replace(",", "")), note.group(0) if note else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", nargs="*", help="src folders to count")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--capacity", type=int, default=16_000)
    ap.add_argument("--inflight", type=int, default=0)
    ap.add_argument("--replay", help=argparse.SUPPRESS)
    ap.add_argument("--work", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.replay:
        replay_log(args.replay, args.work)
        return 0
    if args.trace is None:
        args.trace = str(shared_trace())
    if not args.src:
        ap.error("give at least one src folder")
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "calls.pkl")
        record_log(args.trace, args.policy, args.capacity, args.inflight, log)
        with open(log, "rb") as f:
            refs = sum(len(c[1]) for c in pickle.load(f)[2] if c[0] == 0)
        print(f"{args.policy} {args.capacity:,} W={args.inflight}: {refs:,} block refs logged")
        for src in args.src:
            base, _ = instructions(src, log, False)
            full, note = instructions(src, log, True)
            print(f"{src}: {(full - base) / refs:,.0f} instructions per block ref ({note})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
