"""Block hit % of vLLM 0.33's offloading manager with vLLM's or kvtier's policy under the call
timing of a serving engine, not the replay protocol's.

Under ``vllm serve`` a request's load and store copies complete some steps after its
``prepare_load`` / ``prepare_store``, and the request keeps running (decoding) for many more
steps before ``on_request_finished``: its blocks are evictable before its use is applied.
:func:`kvtier.integrations.vllm_replay.replay_vllm` (the replay protocol) completes and
finishes a request together, W requests later. Here the copies complete ``--transfer-lag``
requests later and the request finishes ``--inflight`` requests later; each request's keys
carry their token positions (``ReqContext.set_offload_key_position``, 512 tokens a block), as
vLLM's scheduler sets them. Keys are the trace's block hashes (``offload_keys``).

Policies: ``vllm-lru`` / ``vllm-arc`` (vLLM's own), a kvtier policy name (option 1: the kvtier
policy inside vLLM's ``CPUOffloadingManager``), or ``spec-NAME`` (option 2:
:class:`kvtier.integrations.vllm.KVTierOffloadingManager`).

Usage (docs/vllm.md, "LRU"; session 17)::

    python benchmarks/vllm_serving_timing.py --trace /work/shared/traces/mooncake_conversation.jsonl \\
        --capacity 4000,16000 --inflight 32 --transfer-lag 1 --policies vllm-lru,lru,vllm-arc,arc

Needs vLLM 0.33 (``pip install --no-deps vllm==0.33.0`` plus the test extras).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import deque
from pathlib import Path

from kvtier.trace import find_shared_trace, read_trace

TOKENS_PER_BLOCK = 512  # the Mooncake traces' block size


def replay_serving(manager, keys_per_request, inflight: int, transfer_lag: int) -> dict:
    """Replay ``keys_per_request`` through a vLLM ``OffloadingManager``: per request a prefix
    lookup, the load of its hits and the store of the rest; the copies complete
    ``transfer_lag`` requests later, the request finishes ``inflight`` requests later.
    Returns block refs, hits, stored and evicted blocks and failed stores."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    hit = LookupResult.HIT
    copies: deque = deque()
    running: deque = deque()
    refs = hits = stored = evicted = failures = 0
    for i, keys in enumerate(keys_per_request):
        ctx = ReqContext(str(i))
        for j, key in enumerate(keys):
            ctx.set_offload_key_position(key, TOKENS_PER_BLOCK * (j + 1))
        manager.on_new_request(ctx)
        h = 0
        for key in keys:
            if manager.lookup(key, ctx) is not hit:
                break
            h += 1
        if h:
            manager.prepare_load(keys[:h], ctx)
        to_store: list = []
        if h < len(keys):
            out = manager.prepare_store(keys[h:], ctx)
            if out is None:
                failures += 1
            else:
                to_store = out.keys_to_store
                stored += len(to_store)
                evicted += len(out.evicted_keys)
        refs += len(keys)
        hits += h
        copies.append((ctx, keys[:h], to_store))
        running.append(ctx)
        while len(copies) > transfer_lag:
            c, loaded, written = copies.popleft()
            if loaded:
                manager.complete_load(set(loaded), c)
            if written:
                manager.complete_store(set(written), c)
        while len(running) > inflight:
            manager.on_request_finished(running.popleft())
    return {"refs": refs, "hits": hits, "stored": stored, "evicted": evicted,
            "failures": failures}


def make_manager(name: str, capacity: int):
    """vLLM's manager with vLLM's policy (``vllm-*``), with a kvtier policy (option 1), or
    kvtier's manager (``spec-*``, option 2)."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvtier.integrations import vllm as kv

    if name.startswith("vllm-"):
        return CPUOffloadingManager(capacity, name[5:])
    if name.startswith("spec-"):
        return kv.KVTierOffloadingManager(capacity, name[5:])
    return CPUOffloadingManager(capacity, kv.policy_class_name(name), kv.MODULE_PATH)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--capacity", default="4000,16000", help="blocks, comma-separated")
    ap.add_argument("--inflight", type=int, default=32, help="requests running at once")
    ap.add_argument("--transfer-lag", type=int, default=1,
                    help="requests between a request's prepare calls and its copies' completion")
    ap.add_argument("--policies", default="vllm-lru,lru,vllm-arc,arc")
    ap.add_argument("--requests", type=int, default=None, help="first N requests only")
    args = ap.parse_args(argv)
    if args.inflight < 0 or args.transfer_lag < 0 or args.transfer_lag > args.inflight:
        ap.error("need 0 <= --transfer-lag <= --inflight")
    logging.getLogger("vllm").setLevel(logging.ERROR)
    from kvtier.integrations.vllm_replay import offload_keys

    trace = args.trace or find_shared_trace(Path(__file__).resolve().parents[1])
    requests = read_trace(trace)
    if args.requests is not None:
        requests = [r for _, r in zip(range(args.requests), requests)]
    kpr = offload_keys(requests)
    print(f"trace {Path(trace).name}, W={args.inflight}, copies complete "
          f"{args.transfer_lag} request(s) later")
    for capacity in (int(c) for c in args.capacity.split(",")):
        for name in args.policies.split(","):
            t0 = time.perf_counter()
            r = replay_serving(make_manager(name, capacity), kpr, args.inflight,
                               args.transfer_lag)
            print(f"{capacity:>7} {name:12} block hit % {100 * r['hits'] / r['refs']:6.2f}  "
                  f"stored {r['stored']:,}  evicted {r['evicted']:,}  store failures "
                  f"{r['failures']:,}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
