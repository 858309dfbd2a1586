"""RedisTier throughput and failure latency against redis-py's raw pipeline on the same server.

Starts its own redis-server on a loopback port (temporary directory, no persistence,
``maxmemory`` large enough for the data) unless ``--url`` names one, then measures:

1. **write / read throughput** of ``--blocks`` blocks of ``--block-mib`` MiB (random bf16 KV,
   i.e. torch.randn in bfloat16, or os.urandom without torch) in batches of ``--batch``
   blocks: RedisTier ``write`` + ``flush`` and ``read``, against redis-py's raw ``MSET`` /
   ``MGET`` of the same bytes in the same batches (no header, no checksum). Every repeat times
   raw and tier back to back; medians in GB/s (10^9 bytes/s) and blocks/s, with the ratio
   tier / raw (target >= 0.7).
2. **prefix lookup** of ``--prefix`` keys (default 1,000, all present): one call of
   ``lookup_prefix`` in ``script`` mode (one EVALSHA) and ``pipeline`` mode (one pipeline of
   EXISTS), and a raw EXISTS pipeline; median milliseconds.
3. **compression**: zstd level 1 ratio and speed on the same bf16 blocks (is it worth it?).
4. **server stopped** (kill -9) and **server hung** (SIGSTOP): latency of ``lookup_prefix``
   over ``--fail-calls`` calls against ``timeout_s`` (default 0.05 s): max, p99, median.

    python benchmarks/bench_tiers_redis.py                  # 64 x 2 MiB, 5 repeats
    python benchmarks/bench_tiers_redis.py --block-mib 1 --blocks 128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time

import redis

from kvtier.tiers.redis import RedisTier


def start_server(tmp: str) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found (apt-get install redis-server), or pass --url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", "",
         "--appendonly", "no", "--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    r = redis.Redis(port=port)
    for _ in range(200):
        try:
            r.ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def make_blocks(n: int, nbytes: int) -> list[bytes]:
    try:
        import torch

        g = torch.Generator().manual_seed(0)
        return [
            (torch.randn(nbytes // 2, generator=g) * 0.5).to(torch.bfloat16)
            .view(torch.uint8).numpy().tobytes()
            for _ in range(n)
        ]
    except ImportError:
        return [os.urandom(nbytes) for _ in range(n)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(args: argparse.Namespace) -> dict:
    nbytes = int(args.block_mib * 2**20)
    blocks = make_blocks(args.blocks, nbytes)
    total = nbytes * args.blocks
    tmp = tempfile.mkdtemp(prefix="kvtier-bench-redis-")
    proc = None
    url = args.url
    if url is None:
        proc, port = start_server(tmp)
        url = f"redis://127.0.0.1:{port}/0"
    out: dict = {"url": "own server" if args.url is None else "given", "block_bytes": nbytes,
                 "blocks": args.blocks, "batch": args.batch}
    try:
        raw = redis.Redis.from_url(url, socket_timeout=30)
        tier = RedisTier(url, block_bytes=nbytes, fingerprint="bench", namespace="bench",
                         write_batch_bytes=args.batch * (nbytes + 64),
                         max_queue_bytes=(args.blocks + 1) * (nbytes + 64))
        keys = list(range(args.blocks))
        rkeys = [f"raw:{k}".encode() for k in keys]
        batches = [range(i, min(i + args.batch, args.blocks))
                   for i in range(0, args.blocks, args.batch)]
        res = {"raw_write": [], "tier_write": [], "raw_read": [], "tier_read": []}
        for rep in range(args.repeats + 1):  # the first repeat warms up
            raw.flushdb()
            t0 = time.perf_counter()
            for b in batches:
                raw.mset({rkeys[i]: blocks[i] for i in b})
            t_rw = time.perf_counter() - t0
            t0 = time.perf_counter()
            for b in batches:
                tier.write([keys[i] for i in b], [blocks[i] for i in b])
            assert tier.flush(300)
            t_tw = time.perf_counter() - t0
            t0 = time.perf_counter()
            for b in batches:
                got = raw.mget([rkeys[i] for i in b])
                assert got[0] is not None
            t_rr = time.perf_counter() - t0
            t0 = time.perf_counter()
            for b in batches:
                got = tier.read([keys[i] for i in b])
                assert got[0] is not None
            t_tr = time.perf_counter() - t0
            if rep:
                res["raw_write"].append(t_rw)
                res["tier_write"].append(t_tw)
                res["raw_read"].append(t_rr)
                res["tier_read"].append(t_tr)
        assert tier.read(keys[:1]) == blocks[:1]
        s = tier.stats()
        assert s.read_errors == 0 and s.writes_failed == 0 and s.writes_skipped == 0
        for k, v in res.items():
            med = statistics.median(v)
            out[k] = {"s": med, "GB_per_s": total / med / 1e9, "blocks_per_s": args.blocks / med}
        out["write_ratio"] = out["tier_write"]["GB_per_s"] / out["raw_write"]["GB_per_s"]
        out["read_ratio"] = out["tier_read"]["GB_per_s"] / out["raw_read"]["GB_per_s"]
        tier.close()

        # prefix lookup of --prefix present keys
        small = {m: RedisTier(url, block_bytes=64, fingerprint="bench-lookup",
                              namespace="benchl", lookup_mode=m, timeout_s=1.0)
                 for m in ("script", "pipeline")}
        pkeys = list(range(args.prefix))
        small["script"].write(pkeys, [bytes(64)] * args.prefix)
        assert small["script"].flush(60)
        lk = {"script": [], "pipeline": [], "raw_exists_pipeline": []}
        prk = [small["script"].redis_key(k) for k in pkeys]
        for _ in range(args.repeats * 4 + 1):
            for m, t in small.items():
                t0 = time.perf_counter()
                n = t.lookup_prefix(pkeys)
                lk[m].append(time.perf_counter() - t0)
                assert n == args.prefix, (m, n)
            t0 = time.perf_counter()
            p = raw.pipeline(transaction=False)
            for k in prk:
                p.exists(k)
            assert all(p.execute())
            lk["raw_exists_pipeline"].append(time.perf_counter() - t0)
        out["prefix_lookup_ms"] = {m: statistics.median(v[1:]) * 1e3 for m, v in lk.items()}
        out["prefix_keys"] = args.prefix
        for t in small.values():
            t.close()

        # Redis memory per block, raw and zstd (INFO used_memory before/after writing them)
        mem = {}
        for codec in ("none", "zstd"):
            raw.flushdb()
            before = raw.info("memory")["used_memory"]
            t = RedisTier(url, block_bytes=nbytes, fingerprint="bench", namespace="mem",
                          compression=codec, max_queue_bytes=(args.blocks + 1) * (nbytes + 64))
            t.write(keys, blocks)
            assert t.flush(300) and t.stats().writes_completed == args.blocks
            mem[codec] = (raw.info("memory")["used_memory"] - before) / args.blocks
            t.close()
        raw.flushdb()
        out["redis_memory_per_block"] = mem

        # compression on the same blocks
        try:
            import zstandard

            c = zstandard.ZstdCompressor(level=1)
            sample = blocks[: min(8, len(blocks))]
            t0 = time.perf_counter()
            packed = [c.compress(b) for b in sample]
            dt = time.perf_counter() - t0
            out["zstd1"] = {
                "ratio": sum(map(len, sample)) / sum(map(len, packed)),
                "compress_GB_per_s": sum(map(len, sample)) / dt / 1e9,
            }
        except ImportError:
            pass

        # failure latency: hung (SIGSTOP) and stopped (kill -9) server
        if proc is not None:
            ft = RedisTier(url, block_bytes=64, fingerprint="bench-lookup", namespace="benchl",
                           timeout_s=args.timeout, breaker_cooldown_s=0.1)
            ft.write(pkeys[:16], [bytes(64)] * 16)
            assert ft.flush(10) and ft.lookup_prefix(pkeys[:16]) == 16
            for label, sig in (("hung", signal.SIGSTOP), ("stopped", signal.SIGKILL)):
                proc.send_signal(sig)
                if sig == signal.SIGKILL:
                    proc.wait()
                lat = []
                st0 = ft.stats()
                for _ in range(args.fail_calls):
                    t0 = time.perf_counter()
                    assert ft.lookup_prefix(pkeys[:16]) == 0
                    lat.append(time.perf_counter() - t0)
                    time.sleep(0.005)
                st = ft.stats()
                out[f"lookup_when_{label}_ms"] = {
                    "timeout": args.timeout * 1e3, "max": max(lat) * 1e3,
                    "p99": pct(lat, 0.99) * 1e3, "median": statistics.median(lat) * 1e3,
                    "calls": len(lat), "backend_errors": st.backend_errors - st0.backend_errors,
                    "calls_refused": st.calls_refused - st0.calls_refused,
                }
                if sig == signal.SIGSTOP:
                    proc.send_signal(signal.SIGCONT)
                    time.sleep(0.2)
                    while ft.lookup_prefix(pkeys[:16]) != 16:
                        time.sleep(0.05)
            ft.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="an existing server (default: start one on loopback)")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-mib", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=16, help="blocks per MSET/MGET")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=0.05)
    ap.add_argument("--fail-calls", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = run(args)
    mib = args.block_mib
    print(f"RedisTier vs raw redis-py, {args.blocks} x {mib:g} MiB blocks, batches of "
          f"{args.batch}, median of {args.repeats}")
    for op in ("write", "read"):
        r, t = out[f"raw_{op}"], out[f"tier_{op}"]
        print(f"  {op:5s}  raw {r['GB_per_s']:6.2f} GB/s {r['blocks_per_s']:8.0f} blocks/s   "
              f"tier {t['GB_per_s']:6.2f} GB/s {t['blocks_per_s']:8.0f} blocks/s   "
              f"ratio {out[f'{op}_ratio']:.2f} (target >= 0.7)")
    pl = out["prefix_lookup_ms"]
    print(f"  prefix lookup of {out['prefix_keys']} keys, one round trip: script "
          f"{pl['script']:.2f} ms, pipeline {pl['pipeline']:.2f} ms, raw EXISTS pipeline "
          f"{pl['raw_exists_pipeline']:.2f} ms")
    mem = out["redis_memory_per_block"]
    print(f"  Redis memory per {mib:g} MiB block: raw {mem['none'] / 2**20:.3f} MiB, "
          f"zstd {mem['zstd'] / 2**20:.3f} MiB (INFO used_memory)")
    if "zstd1" in out:
        z = out["zstd1"]
        print(f"  zstd level 1 on these blocks: ratio {z['ratio']:.3f}, "
              f"{z['compress_GB_per_s']:.2f} GB/s compress (one core)")
    for label in ("hung", "stopped"):
        f = out.get(f"lookup_when_{label}_ms")
        if f:
            print(f"  server {label}: lookup max {f['max']:.1f} ms, p99 {f['p99']:.1f} ms, "
                  f"median {f['median']:.3f} ms over {f['calls']} calls (timeout "
                  f"{f['timeout']:.0f} ms; {f['backend_errors']} failed calls, "
                  f"{f['calls_refused']} refused by the open breaker)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
