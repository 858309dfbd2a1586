"""Shared by ``instr_vllm.py`` and ``instr_calllog.py``: count instructions of one stretch of a
Python run under callgrind.

A tiny C library (compiled here with gcc from valgrind's ``callgrind.h``) exports
``cg_start()`` / ``cg_stop()``; the measured child process loads it with :mod:`ctypes` and calls
them around the code to count, under ``valgrind --tool=callgrind --instr-atstart=no``, and
prints ``REFS <n>`` (the units to divide by) on stderr. Needs valgrind (with its headers) and gcc.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HELPER_C = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("measured"); }
"""


def build_helper(work: Path) -> Path:
    """Compile the toggle library into ``work``; return its path."""
    helper = work / "libcgtoggle.so"
    (work / "cg.c").write_text(HELPER_C)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(helper), str(work / "cg.c")],
                   check=True)
    return helper


def run_calls(helper: Path | str, calls: list, refs: int) -> None:
    """Child side (under callgrind): ``f(*args, **kw)`` for each ``(f, args, kw)`` of ``calls``
    between ``cg_start`` and ``cg_stop`` (after a ``gc.collect``), then ``REFS <refs>`` on
    stderr for :func:`count`."""
    import ctypes
    import gc

    cg = ctypes.CDLL(str(helper))
    gc.collect()
    cg.cg_start()
    for f, args, kw in calls:
        f(*args, **kw)
    cg.cg_stop()
    print("REFS", refs, file=sys.stderr)


def count(script: str, args: list[str], env: dict, work: Path, tag: str) -> tuple[int, int]:
    """Run ``python script *args`` under callgrind; return (instructions between cg_start and
    cg_stop, the REFS the child printed). Raises RuntimeError naming ``tag`` on failure."""
    out = work / f"cg.{tag}"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           f"--callgrind-out-file={out}.%p", sys.executable, script, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    refs = re.search(r"REFS (\d+)", proc.stderr)
    dumps = [p for p in work.glob(out.name + ".*") if re.search(r"\.\d+\.1$", p.name)]
    if proc.returncode or not refs or not dumps:
        raise RuntimeError(f"callgrind run {tag} failed:\n{proc.stderr[-3000:]}")
    total = re.search(r"^totals: (\d+)", dumps[0].read_text(), re.M)
    for p in work.glob(out.name + ".*"):
        p.unlink()
    return int(total.group(1)), int(refs.group(1))
