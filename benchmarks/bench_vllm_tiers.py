"""kvtier's disk / Redis tiers inside vLLM 0.33's TieringOffloadingManager vs. the bare tiers.

Engine 1 (a real ``TieringOffloadingSpec`` manager, CPU primary tier in shared memory) offloads
``--chunks`` chunks of ``--chunk-mib`` MiB of one request: ``prepare_store``, the primary rows
filled (standing in for the GPU->CPU copy), ``complete_store``, then engine steps until vLLM's
cascade job to the secondary tier has finished (``has_pending_work()`` false). Engine 2 (fresh
CPU tier, same tier) looks the request's chunks up step by step as vLLM's scheduler does until
all are promoted (RETRY -> HIT_PENDING -> HIT). Each is compared with the same bytes through the
bare :class:`~kvtier.tiers.base.BlockTier` (``write`` + ``flush``; ``read``), in the same
run, alternating bare / vLLM each repeat; the best of ``--repeats`` is printed in GB/s and the
ratio vLLM-path / bare, plus the engine steps the promotion took and the per-step poll time.

    python benchmarks/bench_vllm_tiers.py                         # disk tier, 64 x 2 MiB
    python benchmarks/bench_vllm_tiers.py --tier redis            # starts a redis-server
    python benchmarks/bench_vllm_tiers.py --tier redis --redis-url redis://host:6379/0

Needs vLLM 0.33 importable (scheduler side only; no GPU).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.tiers.disk import DiskTier
from kvtier.tiers.redis import RedisTier

MODULE = "kvtier.integrations.vllm_tiers"
_END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def make_manager(chunk_bytes: int, chunks: int, entry: dict):
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": chunks * chunk_bytes, "secondary_tiers": [dict(entry)]},
        engine_id=f"kvtier-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        model=OffloadingModelConfig(name="bench/model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False),
    )
    return TieringOffloadingSpec(cfg).get_manager()


def data(n: int, nbytes: int, seed: str) -> tuple[list[bytes], list[bytes]]:
    keys = [make_offload_key(hashlib.sha256(f"{seed}/{i}".encode()).digest(), 0)
            for i in range(n)]
    blocks = [os.urandom(nbytes) for _ in range(n)]
    return keys, blocks


STEP_S = 0.005  # set by --step-ms: the engine's model-execution time between scheduler steps


def vllm_store(m, keys, blocks) -> float:
    ctx = ReqContext(req_id=f"w-{uuid.uuid4().hex[:6]}")
    m.on_new_request(ctx)
    out = m.prepare_store(keys, ctx)
    view = m.primary_tier.get_kv_memoryview()
    stride = view.strides[0]
    with view.cast("B") as flat:
        for cid, b in zip(out.store_spec.chunk_ids, blocks):
            flat[int(cid) * stride:int(cid) * stride + len(b)] = b
    t0 = time.perf_counter()
    m.complete_store(out.keys_to_store, ctx)
    while m.has_pending_work():
        m.on_schedule_end(_END)
        time.sleep(STEP_S)
    m.on_schedule_end(_END)
    dt = time.perf_counter() - t0
    m.on_request_finished(ctx)
    return dt


def vllm_promote(m, keys) -> tuple[float, int, float]:
    """Seconds until every key is a primary HIT, engine steps taken, mean seconds per step
    spent in the manager's calls (lookups + on_schedule_end)."""
    ctx = ReqContext(req_id=f"r-{uuid.uuid4().hex[:6]}")
    m.on_new_request(ctx)
    t0 = time.perf_counter()
    steps = 0
    in_manager = 0.0
    while True:
        s0 = time.perf_counter()
        # as vLLM's scheduler: scan past RETRY / HIT_PENDING, stop at a MISS
        pending = False
        for k in keys:
            result = m.lookup(k, ctx)
            if result is LookupResult.MISS:
                raise RuntimeError("a stored chunk was not found")
            pending |= result is not LookupResult.HIT
        if not pending:
            in_manager += time.perf_counter() - s0
            break
        m.on_schedule_end(_END)
        in_manager += time.perf_counter() - s0
        steps += 1
        time.sleep(STEP_S)
    dt = time.perf_counter() - t0
    m.on_request_finished(ctx)
    m.on_schedule_end(_END)
    return dt, steps, in_manager / max(steps, 1)


def bare_round(tier, keys, blocks, from_buffer: bool) -> tuple[float, float]:
    if from_buffer:  # as the vLLM path: views of one shared buffer, which the tier copies
        buf = bytearray(b"".join(blocks))
        n = len(blocks[0])
        blocks = [memoryview(buf)[i * n:(i + 1) * n] for i in range(len(blocks))]
    t0 = time.perf_counter()
    tier.write(keys, blocks)
    tier.flush()
    w = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = tier.read(keys)
    r = time.perf_counter() - t0
    assert all(o is not None for o in out), "bare tier lost blocks"
    return w, r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", choices=("disk", "redis"), default="disk")
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--chunk-mib", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=5.0,
                    help="pause between engine steps (the model's forward pass), ms")
    ap.add_argument("--bare-from-buffer", action="store_true",
                    help="the bare tier writes views of one bytearray (copied by the tier, as "
                         "the vLLM path's rows are) instead of bytes it keeps by reference")
    ap.add_argument("--dir", default=None, help="disk tier parent directory (default: a temp)")
    ap.add_argument("--redis-url", default=None, help="default: start redis-server here")
    args = ap.parse_args()
    global STEP_S
    STEP_S = args.step_ms / 1e3
    chunk = int(args.chunk_mib * (1 << 20))
    n = args.chunks
    gb = n * chunk / 1e9
    work = Path(tempfile.mkdtemp(prefix="kvtier-bench-vllm-", dir=args.dir))
    server = None
    try:
        if args.tier == "redis" and args.redis_url is None:
            port = free_port()
            server = subprocess.Popen(
                [shutil.which("redis-server") or "redis-server", "--port", str(port),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru",
                 "--dir", str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            args.redis_url = f"redis://127.0.0.1:{port}/0"
        best = {"bare_w": 1e9, "bare_r": 1e9, "v_w": 1e9, "v_r": 1e9}
        steps_seen, poll = [], []
        for rep in range(args.repeats):
            keys, blocks = data(n, chunk, f"bare{rep}-{uuid.uuid4().hex}")
            if args.tier == "disk":
                bare = DiskTier(work / f"bare{rep}", n, chunk)
            else:
                bare = RedisTier(args.redis_url, block_bytes=chunk, fingerprint="bench-bare",
                                 namespace=f"bare{rep}{uuid.uuid4().hex[:6]}")
            w, r = bare_round(bare, keys, blocks, args.bare_from_buffer)
            bare.close()
            best["bare_w"], best["bare_r"] = min(best["bare_w"], w), min(best["bare_r"], r)

            keys, blocks = data(n, chunk, f"vllm{rep}-{uuid.uuid4().hex}")
            if args.tier == "disk":
                entry = {"type": "KvtierDiskTier", "module_path": MODULE,
                         "directory": str(work / f"v{rep}"), "capacity_blocks": n}
            else:
                entry = {"type": "KvtierRedisTier", "module_path": MODULE,
                         "url": args.redis_url, "namespace": f"v{rep}{uuid.uuid4().hex[:6]}"}
            m1 = make_manager(chunk, n, entry)
            try:
                w = vllm_store(m1, keys, blocks)
            finally:
                m1.shutdown()
            m2 = make_manager(chunk, n, entry)
            try:
                r, steps, per_step = vllm_promote(m2, keys)
            finally:
                m2.shutdown()
            best["v_w"], best["v_r"] = min(best["v_w"], w), min(best["v_r"], r)
            steps_seen.append(steps)
            poll.append(per_step)
        print(f"{args.tier} tier, {n} chunks x {args.chunk_mib:g} MiB ({gb:.3f} GB), "
              f"best of {args.repeats}")
        for what, bk, vk in (("write", "bare_w", "v_w"), ("read", "bare_r", "v_r")):
            b, v = gb / best[bk], gb / best[vk]
            print(f"  {what:5s}  bare BlockTier {b:6.2f} GB/s {n / best[bk]:8.0f} blocks/s | "
                  f"through vLLM {v:6.2f} GB/s {n / best[vk]:8.0f} blocks/s | ratio {v / b:.2f}")
        print(f"  promotion: engine steps until all {n} chunks HIT: {steps_seen}; "
              f"scheduler time per step in the manager: "
              f"{min(poll) * 1e3:.3f} ms (best), {max(poll) * 1e3:.3f} ms (worst)")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
