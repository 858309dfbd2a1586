"""Disk tier write / read throughput against plain sequential buffered file I/O.

Writes ``--blocks`` distinct random blocks of ``--block-mib`` MiB (default 128 x 2 MiB =
256 MiB) through :class:`kvtier.tiers.disk.DiskTier` (``write`` in batches of ``--batch``
blocks, then ``flush``: every block durable per ``--fsync`` and readable) and reads them back
(``read`` in batches: pread + xxh3 verification), and compares with the same bytes written
and read sequentially by a plain buffered file (``open(..., "wb").write(block)`` per block,
then ``flush``; with ``--fsync batch`` also one ``os.fsync``; reads ``f.read(block_bytes)``
per block, each batch of blocks held until the next, as the tier's caller holds them) on the same file system, in the same run. Every repeat runs raw and tier back to
back (raw first, then tier, alternating which file system state each sees); the best of
``--repeats`` is reported, in GB/s (10^9 bytes/s) and blocks/s, with the ratio tier / raw
(target >= 0.7), and the CPU seconds per GB (process time of all threads, best of the
repeats: steadier than wall time on a busy host).

``--full`` fills the tier with ``--blocks`` other blocks first (not timed), so every timed
write evicts one and reuses its slot: the steady state of a full tier (with ``--fsync
batch``, each batch then also syncs the evicted blocks' zeroed records before their slots'
data is overwritten).

``--cold`` drops the files' pages from the page cache (fsync + ``posix_fadvise(DONTNEED)``)
before each read, so reads come from the device; otherwise reads are served from the page
cache (what a tier re-reading recent blocks sees).

    python benchmarks/bench_tiers_disk.py                      # 2 MiB blocks, fsync none
    python benchmarks/bench_tiers_disk.py --block-mib 1 --cold
    python benchmarks/bench_tiers_disk.py --fsync batch --dir /mnt/nvme/bench --json out.json
    python benchmarks/bench_tiers_disk.py --fsync batch --full     # every write evicts
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kvtier.tiers.disk import DiskTier


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_write(path: Path, blocks: list[bytes], fsync: bool) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for b in blocks:
            f.write(b)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    return time.perf_counter() - t0


def raw_read(path: Path, n: int, nbytes: int, batch: int) -> float:
    """Read the blocks back in order, holding each batch's blocks as the tier's caller does
    (a batch of new ``bytes`` objects, released before the next batch)."""
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        for i in range(0, n, batch):
            got = [f.read(nbytes) for _ in range(min(batch, n - i))]
            if any(len(b) != nbytes for b in got):
                raise RuntimeError("short read")
    return time.perf_counter() - t0


def tier_write(tier: DiskTier, keys: list[int], blocks: list[bytes], batch: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(keys), batch):
        tier.write(keys[i : i + batch], blocks[i : i + batch])
    if not tier.flush(600):
        raise RuntimeError("tier writes did not finish")
    return time.perf_counter() - t0


def tier_read(tier: DiskTier, keys: list[int], batch: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(keys), batch):
        got = tier.read(keys[i : i + batch])
        if any(b is None for b in got):
            raise RuntimeError("a block failed to read back")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--block-mib", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=16, help="blocks per write()/read() call")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--fsync", choices=["none", "batch"], default="none")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="read from the device, not the cache")
    ap.add_argument("--full", action="store_true", help="fill the tier first (not timed): "
                    "every timed write evicts a block and reuses its slot")
    ap.add_argument("--dir", type=Path, default=None, help="file system to test (default: a "
                    "temporary folder under the current directory)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    nbytes = int(args.block_mib * 2**20)
    base = Path(tempfile.mkdtemp(prefix="kvtier-bench-", dir=args.dir or Path.cwd()))
    try:
        blocks = [os.urandom(nbytes) for _ in range(args.blocks)]
        total = nbytes * args.blocks
        best = {"raw_write": 1e9, "tier_write": 1e9, "raw_read": 1e9, "tier_read": 1e9}
        cpu: dict[str, float] = {}  # process CPU seconds (all threads), best of the repeats
        for rep in range(args.repeats):
            raw = base / f"raw{rep}.dat"
            tdir = base / f"tier{rep}"
            tier = DiskTier(tdir, args.blocks, nbytes, fsync=args.fsync, workers=args.workers)
            keys = list(range(args.blocks))
            if args.full:  # other keys, same bytes: the timed writes evict them all
                tier_write(tier, [args.blocks + k for k in keys], blocks, args.batch)
            pairs = [("raw_write", lambda: raw_write(raw, blocks, args.fsync == "batch")),
                     ("tier_write", lambda: tier_write(tier, keys, blocks, args.batch))]
            if rep % 2:
                pairs.reverse()
            for name, fn in pairs:
                c0 = time.process_time()
                best[name] = min(best[name], fn())
                cpu[name] = min(cpu.get(name, 1e9), time.process_time() - c0)
            if args.cold:
                _drop_cache(raw)
                _drop_cache(tdir / "blocks.dat")
            pairs = [("raw_read", lambda: raw_read(raw, args.blocks, nbytes, args.batch)),
                     ("tier_read", lambda: tier_read(tier, keys, args.batch))]
            if rep % 2:
                pairs.reverse()
            for name, fn in pairs:
                c0 = time.process_time()
                best[name] = min(best[name], fn())
                cpu[name] = min(cpu.get(name, 1e9), time.process_time() - c0)
            tier.close()
            raw.unlink()
            shutil.rmtree(tdir)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = {"block_bytes": nbytes, "blocks": args.blocks, "batch": args.batch,
           "workers": args.workers, "fsync": args.fsync, "cold": args.cold, "full": args.full,
           "repeats": args.repeats}
    print(f"disk tier vs plain buffered file I/O: {args.blocks} x {args.block_mib:g} MiB "
          f"({total / 1e6:,.0f} MB), batch {args.batch}, {args.workers} workers, fsync "
          f"{args.fsync}{', full tier (every write evicts)' if args.full else ''}, reads "
          f"{'from the device' if args.cold else 'from the page cache'}; "
          f"best of {args.repeats}")
    print(f"{'':8}{'raw GB/s':>10}{'tier GB/s':>11}{'tier blocks/s':>15}{'tier/raw':>10}"
          f"{'raw CPU s/GB':>14}{'tier CPU s/GB':>15}")
    for op in ("write", "read"):
        raw_s, tier_s = best[f"raw_{op}"], best[f"tier_{op}"]
        ratio = raw_s / tier_s
        raw_cpu, tier_cpu = cpu[f"raw_{op}"] / total * 1e9, cpu[f"tier_{op}"] / total * 1e9
        out[op] = {"raw_gbps": total / raw_s / 1e9, "tier_gbps": total / tier_s / 1e9,
                   "tier_blocks_per_s": args.blocks / tier_s,
                   "raw_blocks_per_s": args.blocks / raw_s, "ratio": ratio,
                   "raw_cpu_s_per_gb": raw_cpu, "tier_cpu_s_per_gb": tier_cpu}
        print(f"{op:8}{total / raw_s / 1e9:10.2f}{total / tier_s / 1e9:11.2f}"
              f"{args.blocks / tier_s:15,.0f}{ratio:10.2f}{raw_cpu:14.3f}{tier_cpu:15.3f}"
              + ("" if ratio >= 0.7 else "  < 0.7"))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
