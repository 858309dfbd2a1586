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
* ``driver``: the replay loop alone (context for both rows, not part of the target): the
  same :func:`~kvtier.integrations.vllm_replay.replay_vllm` call sequence against
  :class:`AnswerStub`, which answers what vLLM's manager (``driver-vllm``) or the spec
  (``driver-spec``) answered in an uninstrumented replay (recorded first); printed with the
  ``vllm`` / ``spec`` rows less it, and their ratio.

Usage::

    python benchmarks/instr_vllm.py [--trace PATH] [--policy arc] [--capacity 4000,16000]
                                    [--inflight 32] [--cases vllm,spec,layers,driver]

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


class AnswerStub:
    """A stand-in for a vLLM manager that answers the replay driver what a real manager
    answered (``answers``: per request, the number of leading HIT lookups, whether
    ``prepare_store`` was called and its output, as :func:`record_answers` recorded them),
    at the least cost per call, so that a replay against it counts the driver's own work.
    C-level callables where the driver ignores the answer (``operator.is_`` for the
    two-argument calls, ``id`` for ``on_request_finished``); ``lookup`` a bound ``dict.get``
    of the current request's HIT keys (a miss answers the context, which is not HIT); two
    Python frames per request: ``on_new_request`` (refills that dict) and ``prepare_store``
    (the next recorded output). Those frames and C calls are the stub's, not the driver's:
    the count is an upper bound of the driver's share. (The HIT keys' hashes are computed
    when the stub is built, before counting: hashing a key is the manager's work.)"""

    def __init__(self, keys_per_request: list, answers: list) -> None:
        from operator import is_

        from vllm.v1.kv_offload.base import LookupResult

        hit = LookupResult.HIT
        # one dict per request, built from the replay's own key objects (hashes cached)
        hit_keys = iter([dict.fromkeys(keys[:h], hit)
                         for keys, (h, _, _) in zip(keys_per_request, answers)]).__next__
        outs = iter([out for _, called, out in answers if called]).__next__
        current: dict = {}
        clear, update = current.clear, current.update

        def on_new_request(ctx, _clear=clear, _update=update, _next=hit_keys):
            _clear()
            _update(_next())

        def prepare_store(keys, ctx, _next=outs):
            return _next()

        self.on_new_request = on_new_request
        self.lookup = current.get
        self.prepare_load = self.complete_load = self.complete_store = is_
        self.prepare_store = prepare_store
        self.on_request_finished = id


def _manager(what: str, policy: str, capacity: int):
    """vLLM's ``CPUOffloadingManager`` (``what`` "vllm") or the spec (``"spec"``)."""
    if what == "vllm":
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        return CPUOffloadingManager(capacity, policy)
    from kvtier.integrations import vllm as kv

    return kv.KVTierOffloadingManager(capacity, policy)


def record_answers(kpr_path: Path, what: str, policy: str, capacity: int, inflight: int,
                   out: Path) -> None:
    """Replay (uninstrumented) through the real manager ``what`` and pickle, with the keys,
    what the driver acts on: per request the number of leading HIT lookups, whether
    ``prepare_store`` was called and its output (``None``: failed), for :class:`AnswerStub`."""
    from vllm.v1.kv_offload.base import LookupResult

    from kvtier.integrations.vllm_replay import replay_vllm

    kpr = pickle.loads(kpr_path.read_bytes())
    real = _manager(what, policy, capacity)
    answers: list = []  # per request [leading HITs, prepare_store called, its output]

    class Recorder:  # the real manager's answers, per request
        def on_new_request(self, ctx):
            answers.append([0, False, None])
            return real.on_new_request(ctx)

        def lookup(self, key, ctx):
            r = real.lookup(key, ctx)
            if r is LookupResult.HIT:
                answers[-1][0] += 1
            return r

        def prepare_store(self, keys, ctx):
            result = real.prepare_store(keys, ctx)
            answers[-1][1] = True
            if result is not None:  # the driver reads these two
                answers[-1][2] = _Out(list(result.keys_to_store), list(result.evicted_keys))
            return result

        def __getattr__(self, name):
            return getattr(real, name)

    result = replay_vllm(Recorder(), kpr, inflight=inflight)
    out.write_bytes(pickle.dumps({"keys": kpr, "answers": [tuple(a) for a in answers],
                                  "counts": result.counts()}))


class _Out:
    """A recorded ``prepare_store`` output: the two fields the driver reads."""

    __slots__ = ("evicted_keys", "keys_to_store")

    def __init__(self, keys_to_store: list, evicted_keys: list) -> None:
        self.keys_to_store = keys_to_store
        self.evicted_keys = evicted_keys


def run_case(args) -> None:
    """Child process (under callgrind): one measured replay; prints REFS."""
    cg = ctypes.CDLL(args.helper)
    what, policy, capacity = args.run
    capacity = int(capacity)
    if what.startswith("driver"):
        logging.getLogger("vllm").setLevel(logging.ERROR)
        from kvtier.integrations.vllm_replay import replay_vllm

        data = pickle.loads(Path(args.keys).read_bytes())
        stub = AnswerStub(data["keys"], data["answers"])
        gc.collect()
        cg.cg_start()
        result = replay_vllm(stub, data["keys"], inflight=args.inflight)
        cg.cg_stop()
        if result.counts() != data["counts"]:  # the same calls as the recorded replay
            raise RuntimeError(f"stub replay counts {result.counts()} != {data['counts']}")
        print("REFS", result.block_refs, "HITS", result.hit_blocks, file=sys.stderr)
        return
    if what in ("vllm", "spec"):
        logging.getLogger("vllm").setLevel(logging.ERROR)
        from kvtier.integrations.vllm_replay import replay_vllm

        kpr = pickle.loads(Path(args.keys).read_bytes())
        manager = _manager(what, policy, capacity)
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
            if "driver" in cases:
                drv = {}
                for real in ("vllm", "spec"):
                    data = work / f"answers.{real}.{capacity}.pkl"
                    record_answers(kpr, real, args.policy, capacity, args.inflight, data)
                    ir, refs = callgrind(work, helper, data,
                                         (f"driver-{real}", args.policy, capacity),
                                         args.inflight)
                    drv[real] = ir / refs
                    print(f"  {capacity:>6} driver ({real}'s answers) {drv[real]:>9,.0f}"
                          + (f"; {real} less it {row[real] - drv[real]:,.0f}"
                             if real in row else ""), flush=True)
                if "vllm" in row and "spec" in row:
                    print(f"  {capacity:>6} vLLM / spec without the driver: "
                          f"{(row['vllm'] - drv['vllm']) / (row['spec'] - drv['spec']):.2f}x")
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
