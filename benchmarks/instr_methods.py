"""Instructions per block reference of each kvtier manager / policy method on vLLM's spec path.

``instr_vllm.py --cases layers`` splits the spec replay into policy, manager and adapter; this
splits the first two per method. It records the spec replay's call logs once (the recorders of
``instr_vllm.py``'s ``layers`` case: :class:`kvtier.integrations.vllm.KVTierOffloadingManager`
in request mode, W in-flight requests), then for each ``SRC`` folder and each ``layer:method``
replays the whole log on a fresh object under ``valgrind --tool=callgrind
--collect-atstart=no``, with collection toggled on around every call of that method only (a
tiny C helper from valgrind's ``callgrind.h``). A manager method's count includes the policy
calls it makes. The log is recorded with this checkout's code; every ``SRC`` must accept the
same calls and give the same answers (same hits, stores and evictions).

Usage::

    python benchmarks/instr_methods.py --trace PATH [--policy arc] [--capacity 4000]
        [--inflight 32] [--methods policy:_evict,manager:prepare_store] SRC [SRC ...]

Prints, per ``SRC`` and method: calls, instructions per block reference and per call. Needs
valgrind (with its headers), gcc and vLLM. One method on 1,000 requests takes ~20-40 s.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import pickle
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("manager:lookup,manager:prepare_load,manager:complete_load,manager:prepare_store,"
           "manager:complete_store,manager:on_new_request,manager:on_request_finished,"
           "policy:insert,policy:touch,policy:_evict,policy:on_request_finished,"
           "policy:mark_evictable")
HELPER_C = "#include <valgrind/callgrind.h>\nvoid toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"


def _helper(work: Path) -> Path:
    (work / "toggle.c").write_text(HELPER_C)
    out = work / "libtoggle.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(work / "toggle.c")],
                   check=True)
    return out


def _record(trace: Path, policy: str, capacity: int, inflight: int, out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import logging

    logging.getLogger("vllm").setLevel(logging.ERROR)
    import instr_vllm  # the layers case's recorders

    from kvtier.integrations.vllm_replay import offload_keys
    from kvtier.trace import read_trace

    keys = out.with_suffix(".keys")
    keys.write_bytes(pickle.dumps(offload_keys(read_trace(trace))))
    instr_vllm.record_layers(keys, policy, capacity, inflight, out)


def _run(log: str, layer: str, method: str, policy: str, capacity: int, helper: str) -> None:
    """Child (under callgrind): the log's calls, collection on around ``method``'s only."""
    import kvtier
    from kvtier.policies import get_policy

    logs = pickle.loads(Path(log).read_bytes())
    obj = (get_policy(policy)(capacity) if layer == "policy"
           else kvtier.OffloadingManager(capacity, policy))
    calls = [(getattr(obj, name), args, kw, name == method) for name, args, kw in logs[layer]]
    toggle = ctypes.CDLL(helper).toggle
    gc.collect()
    gc.disable()
    for f, args, kw, counted in calls:
        if counted:
            toggle()
            f(*args, **kw)
            toggle()
        else:
            f(*args, **kw)
    print("REFS", logs["refs"], "CALLS", sum(c[3] for c in calls), file=sys.stderr)


def _count(src: str, log: Path, layer: str, method: str, args, helper: Path,
           work: Path) -> tuple[int, int, int]:
    out = work / f"cg.{layer}.{method}.{abs(hash(src))}"
    cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
           f"--callgrind-out-file={out}", sys.executable, str(Path(__file__).resolve()),
           "--child", str(log), layer, method, args.policy, str(args.capacity), str(helper)]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=src), check=False)
    found = re.search(r"REFS (\d+) CALLS (\d+)", proc.stderr)
    if proc.returncode or not found or not out.exists():
        raise RuntimeError(f"{src} {layer}:{method} failed:\n{proc.stderr[-3000:]}")
    total = int(re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE).group(1))
    out.unlink()
    return total, int(found.group(1)), int(found.group(2))


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        log, layer, method, policy, capacity, helper = sys.argv[2:8]
        _run(log, layer, method, policy, int(capacity), helper)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--policy", default="arc")
    ap.add_argument("--capacity", type=int, default=4000)
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--methods", default=METHODS, help="layer:method,... (layer: manager, "
                    "policy)")
    ap.add_argument("--jobs", type=int, default=2, help="callgrind runs at once")
    ap.add_argument("src", nargs="*", default=[str(REPO / "src")])
    args = ap.parse_args(argv)
    methods = [m.split(":", 1) for m in args.methods.split(",") if m.strip()]
    for layer, _ in methods:
        if layer not in ("manager", "policy"):
            ap.error(f"--methods: layer must be manager or policy, got {layer!r}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        helper = _helper(work)
        log = work / "log.pkl"
        _record(args.trace, args.policy, args.capacity, args.inflight, log)
        jobs = [(src, layer, method) for src in args.src for layer, method in methods]
        with ThreadPoolExecutor(args.jobs) as ex:
            results = list(ex.map(lambda j: _count(j[0], log, j[1], j[2], args, helper, work),
                                  jobs))
    print(f"{args.trace.name}, {args.policy} {args.capacity} blocks, W={args.inflight}: "
          "instructions per block reference (callgrind, collection around one method)")
    for (src, layer, method), (total, refs, calls) in zip(jobs, results):
        print(f"  {src[-30:]:>30} {layer:<8} {method:<20} calls {calls:>7,} "
              f"per ref {total / refs:>8,.0f}  per call {total / max(calls, 1):>9,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
