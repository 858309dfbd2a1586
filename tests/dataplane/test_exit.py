"""Issue #12 fault 1: a program that exits with copies in flight keeps its exit status.

Each exit path runs in its own interpreter: create a KVOffloader, offload 64 blocks, then
leave before ``wait()``. Before the fix every one of them died with SIGABRT (exit 134,
"terminate called without an active exception"): the daemon worker was inside a torch op
when the interpreter shut down.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvtier.dataplane import KVOffloader  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROGRAM = textwrap.dedent("""
    import os, signal, sys
    import torch
    from kvtier.dataplane import KVOffloader

    mode = sys.argv[1]
    kv = [torch.randn(128, 2, 16, 8, 64) for _ in range(4)]   # 4 layers, 128 KiB blocks
    {open}
    off.offload([f"k{{i}}" for i in range(64)], list(range(64)))
    {leave}
""")

LEAVE = """
    if mode == "raise": raise RuntimeError("boom")
    if mode == "exit0": sys.exit(0)
    if mode == "exit3": sys.exit(3)
    if mode == "sigint":  # Python's own handler, also where SIGINT is ignored at start-up
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job's shell)
        os.kill(os.getpid(), signal.SIGINT)
    if mode == "fallthrough": pass
"""


def run_program(mode: str, with_block: bool) -> subprocess.CompletedProcess:
    if with_block:
        opener = "with KVOffloader.create(kv, num_blocks=256) as off:"
        body = textwrap.indent(
            'off.offload([f"k{i}" for i in range(64)], list(range(64)))\n'
            + textwrap.dedent(LEAVE), "    ")
        code = ("import os, signal, sys\nimport torch\nfrom kvtier.dataplane import KVOffloader\n"
                "mode = sys.argv[1]\n"
                "kv = [torch.randn(128, 2, 16, 8, 64) for _ in range(4)]\n"
                f"{opener}\n{body}\n")
    else:
        code = PROGRAM.format(open="off = KVOffloader.create(kv, num_blocks=256)",
                              leave=textwrap.dedent(LEAVE))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code, mode], env=env, capture_output=True,
                          text=True, timeout=120)


EXPECTED = {"raise": 1, "exit0": 0, "exit3": 3, "sigint": -signal.SIGINT, "fallthrough": 0}


CASES = [(mode, False) for mode in EXPECTED] + [("raise", True), ("sigint", True)]


@pytest.mark.parametrize(("mode", "with_block"), CASES)
def test_exit_with_copies_in_flight_keeps_the_exit_status(mode, with_block):
    res = run_program(mode, with_block)
    assert res.returncode == EXPECTED[mode], res.stderr[-2000:]
    assert "terminate called" not in res.stderr
    if mode == "raise":
        assert "RuntimeError: boom" in res.stderr


def test_with_block_applies_the_jobs_and_stops_the_worker():
    kv = [torch.randn(16, 2, 4, 8) for _ in range(2)]
    with KVOffloader.create(kv, num_blocks=32) as off:
        off.offload([f"k{i}" for i in range(16)], list(range(16)))
        worker = off.engine._backend.worker
    assert not worker.is_alive() and off.engine.closed
    assert off.lookup([f"k{i}" for i in range(16)]) == 16  # the stores were completed


def test_a_dropped_engine_stops_its_worker_thread():
    kv = [torch.randn(16, 2, 4, 8) for _ in range(2)]
    off = KVOffloader.create(kv, num_blocks=32)
    off.offload([f"k{i}" for i in range(16)], list(range(16)))
    worker = off.engine._backend.worker
    del off
    gc.collect()
    worker.join(10)
    assert not worker.is_alive()


def test_readme_dataplane_example_runs():
    """The README's KVOffloader block, with small tensors for its names."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if "KVOffloader.create" in b)
    kv_caches = [torch.randn(8, 2, 4, 2, 8) for _ in range(2)]
    names = {"kv_caches": kv_caches, "block_hashes": ["a", "b", "c"],
             "gpu_block_ids": [0, 1, 2], "new_hashes": ["a", "b", "x"],
             "free_gpu_block_ids": [5, 6, 7]}
    exec(compile(block, "README.md", "exec"), names)  # noqa: S102 - the README's own code
    off = names["off"]
    assert off.engine.closed and names["n"] == 2
    assert torch.equal(kv_caches[0][5], kv_caches[0][0])  # a's bytes restored into block 5


def test_restore_prefix_reads_a_generator_once():
    """Issue #12 fault 7: a generator of keys failed after the lookup had been counted."""
    kv = [torch.randn(8, 2, 4, 8) for _ in range(2)]
    with KVOffloader.create(kv, num_blocks=8) as off:
        off.offload(["a", "b"], [0, 1])
        off.wait()
        n, job = off.restore_prefix((k for k in ["a", "b", "c"]), [4, 5, 6])
        assert n == 2 and job is not None
        off.wait()
        assert torch.equal(kv[1][5], kv[1][1])
        with pytest.raises(TypeError, match="keys must be an iterable"):
            off.restore_prefix(7, [4])
