"""Instructions per block reference of the manager alone, on a recorded call log (callgrind).

``instr_count.py``'s replay cases run the whole trace twice per version (set-up alone, then
set-up plus work) and take minutes each under valgrind. For comparing variants of the
manager or a policy this records once, with the code on ``PYTHONPATH``, the calls
:func:`kvtier.replay.replay` makes to its :class:`kvtier.OffloadingManager` on the first
``--requests`` requests of a trace (``--protocol`` prefix or request), then replays that log on a fresh manager
of each ``src`` folder under ``valgrind --tool=callgrind --instr-atstart=no``, counting only the
replay of the log (a tiny C helper, compiled here with gcc from valgrind's ``callgrind.h``,
switches instrumentation on and off). Each version runs the same calls with the same
arguments; the replay driver, trace parsing and imports are not counted.

Usage::

    python benchmarks/instr_calllog.py --trace PATH [--policy arc] [--capacity 16000]
        [--inflight 0] [--requests 5000] [--protocol prefix] SRC [SRC ...]

e.g. ``SRC`` = ``src`` and the ``src`` of a ``git worktree add /tmp/old <commit>`` checkout
(the old code must accept the same manager calls). Prints instructions per block reference
per ``SRC``. Needs valgrind (with its headers) and gcc.
"""

from __future__ import annotations

import argparse
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


METHODS = ("lookup_prefix", "touch", "prepare_load", "complete_load", "prepare_store",
           "complete_store", "on_new_request", "on_request_finished")


def record(trace: Path, policy: str, capacity: int, inflight: int, requests: int,
           protocol: str, out: Path) -> None:
    """Replay the first ``requests`` requests and pickle the manager calls they make."""
    import kvtier.replay as replay_module
    from kvtier.trace import read_trace

    reqs = list(read_trace(trace))[:requests]
    log: list = []
    base = replay_module.OffloadingManager

    class Recorder(base):  # type: ignore[misc, valid-type]
        pass

    for name in METHODS:
        def method(self, *args, _name=name, **kw):
            # lists copied: the caller may reuse them
            log.append((_name, tuple(list(a) if isinstance(a, list) else a for a in args), kw))
            return getattr(base, _name)(self, *args, **kw)

        setattr(Recorder, name, method)
    replay_module.OffloadingManager = Recorder
    try:
        options = replay_module.ReplayOptions(inflight=inflight, protocol=protocol)
        replay_module.replay(reqs, policy, capacity, options)
    finally:
        replay_module.OffloadingManager = base
    refs = sum(len(r.keys) for r in reqs)
    out.write_bytes(pickle.dumps({"refs": refs, "log": log, "policy": policy,
                                  "capacity": capacity}))


def run_log(path: Path, helper: Path) -> None:
    """Child process (under callgrind): the log's calls on a fresh manager; prints REFS."""
    import kvtier

    data = pickle.loads(path.read_bytes())
    m = kvtier.OffloadingManager(data["capacity"], data["policy"])
    run_calls(helper, [(getattr(m, name), args, kw) for name, args, kw in data["log"]],
              data["refs"])


def measure(log: Path, helper: Path, src: str, work: Path) -> float:
    env = dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0")
    ir, refs = count(str(Path(__file__).resolve()),
                     ["--run", str(log), "--helper", str(helper)], env, work, "calllog")
    return ir / refs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="*", help="src folders to compare (default: this checkout's)")
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--policy", default="arc")
    ap.add_argument("--capacity", type=int, default=16_000)
    ap.add_argument("--inflight", type=int, default=0)
    ap.add_argument("--requests", type=int, default=5_000)
    ap.add_argument("--protocol", default="prefix", choices=("prefix", "request"))
    ap.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--helper", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        run_log(args.run, args.helper)
        return 0
    if args.trace is None:
        args.trace = shared_trace()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        helper = build_helper(work)
        log = work / "calls.pkl"
        record(args.trace, args.policy, args.capacity, args.inflight, args.requests,
               args.protocol, log)
        print(f"{args.trace.name}, first {args.requests} requests, {args.protocol} protocol, "
              f"{args.policy} {args.capacity} blocks, W={args.inflight}: manager instructions "
              "per block reference (callgrind)")
        for src in args.src or [str(REPO / "src")]:
            print(f"  {src}: {measure(log, helper, src, work):,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
