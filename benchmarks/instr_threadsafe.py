"""Instructions per block reference of ThreadSafeManager's lock on one thread (cachegrind).

docs/manager.md ("Threads") quotes these figures. For each policy, runs the embedded
500-request sample (prefix protocol, W=0, ``--capacity`` blocks) through a plain
``OffloadingManager`` and through ``ThreadSafeManager(OffloadingManager(...))`` under
``valgrind --tool=cachegrind --cache-sim=no``, once with one replay and once with two (a
fresh manager each), and prints (two replays - one replay) / block references: the
interpreter's start-up and the imports cancel out.

Usage::

    PYTHONHASHSEED=0 python benchmarks/instr_threadsafe.py [--policy lru,arc] [--capacity 4000]

Eight valgrind runs of a few seconds each (about a minute on a quiet 2-core host).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import sys
from kvtier.manager import OffloadingManager
from kvtier.replay import _prefix_protocol, _run
from kvtier.threadsafe import ThreadSafeManager
from kvtier.trace import embedded_sample_path, read_trace

policy, capacity, wrapped, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
trace = list(read_trace(embedded_sample_path()))
refs = 0
for _ in range(runs):
    m = OffloadingManager(capacity, policy)
    step, drain = _prefix_protocol(ThreadSafeManager(m) if wrapped else m, 0)
    counts, _, _ = _run(step, drain, trace, 512, None, False)
    refs = counts[1]
print(refs)
"""


def instructions(policy: str, capacity: int, wrapped: bool, runs: int) -> tuple[int, int]:
    """(instructions, block refs of one replay) of one child process under cachegrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        env = dict(os.environ, PYTHONHASHSEED="0",
                   PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run(
            ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
             sys.executable, "-c", CHILD, policy, str(capacity), "1" if wrapped else "0",
             str(runs)],
            capture_output=True, text=True, env=env, check=True)
        m = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
        if m is None:
            raise RuntimeError(f"no 'I refs' line in valgrind's output:\n{proc.stderr[-2000:]}")
        return int(m.group(1).replace(",", "")), int(proc.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="lru,arc", help="comma-separated policies")
    ap.add_argument("--capacity", type=int, default=4000, help="tier size in blocks")
    args = ap.parse_args()
    print(f"embedded sample, prefix protocol, W=0, {args.capacity} blocks; "
          "instructions per block reference, (two replays - one) / refs")
    for policy in args.policy.split(","):
        per_ref = {}
        for wrapped in (False, True):
            one, refs = instructions(policy, args.capacity, wrapped, 1)
            two, _ = instructions(policy, args.capacity, wrapped, 2)
            per_ref[wrapped] = (two - one) / refs
        plain, locked = per_ref[False], per_ref[True]
        print(f"  {policy:8s} plain {plain:8,.0f}   ThreadSafeManager {locked:8,.0f}   "
              f"cost {100 * (locked / plain - 1):+.1f} %")


if __name__ == "__main__":
    main()
