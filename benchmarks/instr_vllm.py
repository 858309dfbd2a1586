"""Instructions per block reference of the vLLM replay (callgrind), and where they go.

Timings on a shared 2-core host vary by +-50 %; instruction counts do not. Each case runs
:func:`kvtier.integrations.vllm_replay.replay_vllm` (W in-flight requests) under
``valgrind --tool=callgrind --instr-atstart=no``; a tiny C helper (compiled here with gcc, from
valgrind's ``callgrind.h``) switches instrumentation on just before the replay and off after it,
so imports, trace parsing and set-up are not counted. Cases:

* ``vllm``: vLLM's ``CPUOffloadingManager`` with vLLM's own policy (``lru`` / ``arc``);
* ``spec``: :class:`kvtier.integrations.vllm.KVTierOffloadingManager` (option 2);
* ``layers``: the ``spec`` replay once (uninstrumented) with recorders on the kvtier manager and
  on its policy, then each call log replayed alone under callgrind on a fresh object, and on an
  object with the same methods and empty bodies. ``policy`` = policy log (real - empty),
  ``manager`` = manager log (real - empty) - policy, ``adapter + driver`` = spec - manager -
  policy: the vLLM-facing layer (key handling, per-request state, vLLM's output objects,
  Python call overhead between the layers) and the replay loop itself.

Usage::

    python benchmarks/instr_vllm.py [--trace PATH] [--policy arc] [--capacity 4000,16000]
                                    [--inflight 32] [--cases vllm,spec,layers]

Needs valgrind (with its headers) and gcc. Slow: a full-trace case takes 3-10 minutes of CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import os
import pickle
import sys
import tempfile
from pathlib import Path

from callgrind_toggle import build_helper, count, run_calls  # benchmarks/ (the script's folder)

REPO = Path(__file__).resolve().parents[1]


def shared_trace() -> Path:
    """The full conversation trace (``kvtier.trace.find_shared_trace``)."""
    # not at the top: the measured child may run an old src tree
    from kvtier.trace import find_shared_trace

    return find_shared_trace(REPO)


POLICY_METHODS = ("insert", "remove", "mark_evictable", "mark_non_evictable", "touch",
                  "_evict", "evict", "on_request_finished")
MANAGER_METHODS = ("lookup", "prepare_load", "touch", "complete_load", "prepare_store",
                   "complete_store", "ref_count", "missing", "on_new_request",
                   "on_request_finished")


def _keys(trace: Path, work: Path) -> Path:
    """The trace's vLLM keys, pickled once (key objects shared as in the replay)."""
    out = work / "keys.pkl"
    if not out.exists():
        from kvtier.integrations.vllm_replay import offload_keys
        from kvtier.trace import read_trace

        out.write_bytes(pickle.dumps(offload_keys(read_trace(trace))))
    return out


def _record(obj, names, log) -> None:
    """Wrap ``obj``'s methods ``names`` so each outermost call is appended to ``log``."""
    depth = [0]
    for name in names:
        orig = getattr(obj, name)

        def wrapper(*args, _orig=orig, _name=name, **kw):
            if depth[0] == 0:
                log.append((_name, tuple(list(a) if isinstance(a, list) else a for a in args), kw))
            depth[0] += 1
            try:
                return _orig(*args, **kw)
            finally:
                depth[0] -= 1

        setattr(obj, name, wrapper)


def _empty(names):
    """An object whose methods ``names`` take anything and do nothing."""
    return type("Empty", (), {n: (lambda self, *a, **k: None) for n in names})()


def run_case(args) -> None:
    """Child process (under callgrind): one measured replay; prints REFS."""
    cg = ctypes.CDLL(args.helper)
    what, policy, capacity = args.run
    capacity = int(capacity)
    if what in ("vllm", "spec"):
        logging.getLogger("vllm").setLevel(logging.ERROR)
        from kvtier.integrations import vllm as kv
        from kvtier.integrations.vllm_replay import replay_vllm

        kpr = pickle.loads(Path(args.keys).read_bytes())
        if what == "vllm":
            from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

            manager = CPUOffloadingManager(capacity, policy)
        else:
            manager = kv.KVTierOffloadingManager(capacity, policy)
        gc.collect()
        cg.cg_start()
        result = replay_vllm(manager, kpr, inflight=args.inflight)
        cg.cg_stop()
        print("REFS", result.block_refs, "HITS", result.hit_blocks, file=sys.stderr)
        return
    # a layer log: "policy", "policy-empty", "manager", "manager-empty"
    import kvtier
    from kvtier.policies import get_policy

    logs = pickle.loads(Path(args.keys).read_bytes())
    if what.startswith("policy"):
        log = logs["policy"]
        obj = _empty(POLICY_METHODS) if what.endswith("empty") else get_policy(policy)(capacity)
    else:
        log = logs["manager"]
        obj = (_empty(MANAGER_METHODS) if what.endswith("empty")
               else kvtier.OffloadingManager(capacity, policy))
    run_calls(args.helper, [(getattr(obj, name), a, kw) for name, a, kw in log], logs["refs"])


def record_layers(kpr_path: Path, policy: str, capacity: int, inflight: int, out: Path) -> None:
    from kvtier.integrations import vllm as kv
    from kvtier.integrations.vllm_replay import replay_vllm

    kpr = pickle.loads(kpr_path.read_bytes())
    spec = kv.KVTierOffloadingManager(capacity, policy)
    m = spec.manager
    manager_log: list = []
    policy_log: list = []
    _record(m.policy, POLICY_METHODS, policy_log)
    if m._insert is not None:  # bound at construction
        m._insert = m.policy.insert
    _record(m, MANAGER_METHODS, manager_log)
    spec._lookup = m.lookup
    # the adapter's lookup is the manager's vllm_lookup, bound per instance: through the
    # class's lookup (and _lookup, recorded) instead, so the manager log has every lookup
    vars(spec).pop("lookup", None)
    vars(spec).pop("complete_load", None)  # the same for these two (bound when events
    vars(spec).pop("complete_store", None)  # are off)
    result = replay_vllm(spec, kpr, inflight=inflight)
    out.write_bytes(pickle.dumps(
        {"refs": result.block_refs, "manager": manager_log, "policy": policy_log}
    ))


def callgrind(work: Path, helper: Path, data: Path, case: tuple, inflight: int) -> tuple[int, int]:
    """(instructions, block refs) of one case under callgrind."""
    args = ["--run", *map(str, case), "--helper", str(helper), "--keys", str(data),
            "--inflight", str(inflight)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return count(str(Path(__file__).resolve()), args, env, work, ".".join(map(str, case)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--policy", default="arc", help="lru or arc (vLLM has both)")
    ap.add_argument("--capacity", default="4000,16000")
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--cases", default="vllm,spec,layers")
    ap.add_argument("--run", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    ap.add_argument("--keys", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        run_case(args)
        return 0
    trace = args.trace or shared_trace()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        helper = build_helper(work)
        kpr = _keys(trace, work)
        print(f"trace {trace.name}, policy {args.policy}, W={args.inflight}; "
              "instructions per block reference (callgrind)")
        for capacity in (int(c) for c in args.capacity.split(",")):
            row = {}
            for case in ("vllm", "spec"):
                if case in cases:
                    ir, refs = callgrind(work, helper, kpr, (case, args.policy, capacity),
                                         args.inflight)
                    row[case] = ir / refs
                    print(f"  {capacity:>6} {case:<6} {row[case]:>9,.0f}", flush=True)
            if "vllm" in row and "spec" in row:
                print(f"  {capacity:>6} vLLM / spec: {row['vllm'] / row['spec']:.2f}x")
            if "layers" in cases:
                logs = work / f"logs.{capacity}.pkl"
                record_layers(kpr, args.policy, capacity, args.inflight, logs)
                per = {}
                for part in ("policy", "policy-empty", "manager", "manager-empty"):
                    ir, refs = callgrind(work, helper, logs, (part, args.policy, capacity),
                                         args.inflight)
                    per[part] = ir / refs
                policy = per["policy"] - per["policy-empty"]
                manager = per["manager"] - per["manager-empty"] - policy
                print(f"  {capacity:>6} layers: policy {policy:,.0f}, manager {manager:,.0f}"
                      + (f", adapter + driver {row['spec'] - policy - manager:,.0f}"
                         if "spec" in row else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
