"""Store / load bandwidth of the kvtier transfer engine against a plain ``tensor.copy_``.

Moves ``--blocks`` blocks of ``--block-mib`` MiB (default 1,000 x 2 MiB = 2 GiB) between a
paged KV cache (``--layers`` per-layer tensors, or one tensor with ``--single``) and a
``HostBlockPool``, through ``TransferEngine.submit_store`` / ``submit_load`` + ``wait``. The
engine-side block ids are a random permutation (as an engine's free list hands them out); the
pool slots are those a fresh ``OffloadingManager`` allocates (consecutive), or a random
permutation with ``--scatter`` (a tier after many evictions).

Baseline: one plain contiguous ``dst.copy_(src)`` of the same number of bytes on the same
machine (CPU: host -> host; CUDA: device -> pinned host for stores, pinned host -> device for
loads). Every repeat times baseline and engine back to back; the medians are reported, in
GB/s (10^9 bytes per second), with the ratio engine / baseline (target >= 0.8).

    python benchmarks/bench_transfer.py                       # CPU, 1000 x 2 MiB
    python benchmarks/bench_transfer.py --device cuda         # on a GPU machine
    python benchmarks/bench_transfer.py --scatter --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch

from kvtier import OffloadingManager
from kvtier.dataplane import HostBlockPool, TransferEngine


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    dtype = torch.float16
    block_elems = int(args.block_mib * 2**20) // 2
    if block_elems % args.layers:
        raise SystemExit(f"--block-mib {args.block_mib} is not divisible into {args.layers} layers")
    layer_elems = block_elems // args.layers
    # [layers, 2, block_tokens, kv_heads, head_dim]-like: keep a realistic inner shape
    inner = [2, 16, max(1, layer_elems // (2 * 16 * 128)), 128]
    if 2 * 16 * inner[2] * 128 != layer_elems:
        inner = [layer_elems]
    n = args.blocks
    num_dev = n + 16
    torch.manual_seed(0)
    if args.single:
        kv = torch.randn(num_dev, args.layers, *inner, device=device).to(dtype)
        kv_list = [kv]
    else:
        kv_list = [torch.randn(num_dev, *inner, device=device).to(dtype) for _ in range(args.layers)]
    pool = HostBlockPool(n, [args.layers, *inner], dtype)
    engine = TransferEngine(kv_list[0] if args.single else kv_list, pool,
                            staging_bytes=int(args.staging_mib * 2**20))
    manager = OffloadingManager(n)
    keys = [("blk", i) for i in range(n)]
    slots = manager.prepare_store(keys).block_ids
    if args.scatter:
        random.Random(1).shuffle(slots)
    rng = random.Random(0)
    src_ids = rng.sample(range(num_dev), n)
    dst_ids = rng.sample(range(num_dev), n)
    nbytes = n * pool.block_nbytes

    # baseline buffers: the same bytes, contiguous
    flat = n * block_elems
    if device.type == "cuda":
        dev_buf = torch.randn(flat, device=device).to(dtype)
        host_buf = torch.empty(flat, dtype=dtype, pin_memory=True)
        base_store = lambda: host_buf.copy_(dev_buf, non_blocking=True)  # noqa: E731
        base_load = lambda: dev_buf.copy_(host_buf, non_blocking=True)  # noqa: E731
    else:
        src_buf = torch.randn(flat).to(dtype)
        dst_buf = torch.zeros(flat, dtype=dtype)
        base_store = lambda: dst_buf.copy_(src_buf)  # noqa: E731
        base_load = lambda: src_buf.copy_(dst_buf)  # noqa: E731

    job = iter(range(10**9))

    def store():
        engine.submit_store(next(job), src_ids, slots)
        engine.wait()
        assert all(r.ok for r in engine.poll())

    def load():
        engine.submit_load(next(job), slots, dst_ids)
        engine.wait()
        assert all(r.ok for r in engine.poll())

    for fn in (base_store, store, base_load, load):  # warm up: page faults, allocator
        _timed(fn, device)
    times: dict[str, list[float]] = {"base_store": [], "store": [], "base_load": [], "load": []}
    for _ in range(args.repeats):
        times["base_store"].append(_timed(base_store, device))
        times["store"].append(_timed(store, device))
        times["base_load"].append(_timed(base_load, device))
        times["load"].append(_timed(load, device))
    # correctness spot check of the last load: slot slots[i] was copied to block dst_ids[i]
    for i in (0, n // 2, n - 1):
        b = dst_ids[i]
        want = kv_list[0][b] if args.single else torch.stack([t[b] for t in kv_list])
        assert torch.equal(pool.tensor[slots[i]], want.cpu())
    engine.close()

    gbs = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    best = {k: nbytes / min(v) / 1e9 for k, v in times.items()}
    return {
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "blocks": n,
        "block_bytes": pool.block_nbytes,
        "bytes": nbytes,
        "layers": args.layers,
        "layout": "single tensor" if args.single else "one tensor per layer",
        "pool_slots": "scattered" if args.scatter else "consecutive",
        "pinned": pool.pinned,
        "repeats": args.repeats,
        "median_GBps": gbs,
        "best_GBps": best,
        "store_ratio": gbs["store"] / gbs["base_store"],
        "load_ratio": gbs["load"] / gbs["base_load"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--block-mib", type=float, default=2.0)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--single", action="store_true", help="one KV tensor instead of per-layer")
    ap.add_argument("--scatter", action="store_true", help="random pool slots")
    ap.add_argument("--staging-mib", type=float, default=32.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args(argv)
    res = run(args)
    m = res["median_GBps"]
    print(f"{res['device']}: {res['blocks']} blocks x {res['block_bytes'] / 2**20:.2f} MiB "
          f"({res['layout']}, {res['pool_slots']} pool slots, pinned={res['pinned']}), "
          f"median of {res['repeats']}")
    print(f"  store {m['store']:.2f} GB/s vs copy_ {m['base_store']:.2f} GB/s -> "
          f"{res['store_ratio']:.2f}x")
    print(f"  load  {m['load']:.2f} GB/s vs copy_ {m['base_load']:.2f} GB/s -> "
          f"{res['load_ratio']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
