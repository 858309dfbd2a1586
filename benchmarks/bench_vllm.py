"""Benchmark: a trace through vLLM 0.33's offloading managers, vLLM's policies vs kvtier's.

Usage::

    python benchmarks/bench_vllm.py [--trace PATH] [--capacity 4000,16000] [--inflight 0,32]
                                    [--policies lru,arc] [--repeats 3] [--json out.json]

Default trace: ../shared/traces/mooncake_conversation.jsonl beside the repository (the full
Mooncake conversation trace, 288,500 block references), else the embedded 500-request sample.
Every row replays the same trace with vLLM's scheduler call protocol
(:func:`kvtier.integrations.vllm_replay.replay_vllm`: per request ``on_new_request``, ``lookup``
per key up to the first miss, ``prepare_load`` of the hits, ``prepare_store`` of the rest,
``complete_load`` / ``complete_store`` when the request leaves the in-flight window of W
requests, ``on_request_finished``) through:

* ``vllm/<p>``: vLLM's ``CPUOffloadingManager`` with vLLM's own ``lru`` / ``arc`` policy
  (the built-in ``CPUOffloadingSpec``);
* ``vllm+kvtier/<p>``: vLLM's ``CPUOffloadingManager`` with kvtier's policy (``KVTierLRU``,
  ``KVTierARC``, ...: option 1 of docs/vllm.md);
* ``kvtier-spec/<p>``: ``KVTierOffloadingSpec``'s manager (option 2).

Printed per row: block hit ratio, stored blocks, evictions, store failures, ns per block
reference (wall time of the whole replay loop / block references: best and median of the
repeats, and the best process CPU time), and the speed-up of each row over vLLM's built-in
manager with the same policy family. Keys are converted to vLLM ``OffloadKey`` bytes before
timing. Timings are noisy on a shared machine: quote the best of several repeats.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path

from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvtier.integrations import vllm as kv
from kvtier.integrations.vllm_replay import offload_keys, replay_vllm
from kvtier.trace import embedded_sample_path, find_shared_trace, read_trace

REPO = Path(__file__).resolve().parents[1]
SHARED = find_shared_trace(REPO)


def managers(policy: str, capacity: int):
    """(row label, factory) for each manager of one policy family."""
    out = []
    if policy in ("lru", "arc"):
        out.append((f"vllm/{policy}", lambda: CPUOffloadingManager(capacity, policy)))
    cls = kv.policy_class_name(policy)
    out.append(
        (f"vllm+kvtier/{policy}", lambda: CPUOffloadingManager(capacity, cls, kv.MODULE_PATH))
    )
    out.append((f"kvtier-spec/{policy}", lambda: kv.KVTierOffloadingManager(capacity, policy)))
    return out


def run(kpr, policies, capacities, windows, repeats) -> list[dict]:
    rows = []
    for capacity in capacities:
        for inflight in windows:
            for policy in policies:
                for label, make in managers(policy, capacity):
                    walls, cpus, result = [], [], None
                    for _ in range(repeats):
                        manager = make()
                        gc.collect()
                        c0 = time.process_time_ns()
                        result = replay_vllm(manager, kpr, inflight=inflight)
                        cpus.append(time.process_time_ns() - c0)
                        walls.append(result.elapsed_ns)
                        del manager
                    refs = result.block_refs
                    rows.append(
                        {
                            "manager": label,
                            "policy": policy,
                            "capacity": capacity,
                            "inflight": inflight,
                            "block_refs": refs,
                            "hit_ratio": result.hit_ratio,
                            "stored_blocks": result.stored_blocks,
                            "evictions": result.evictions,
                            "store_failures": result.store_failures,
                            "ns_per_ref_best": min(walls) / refs,
                            "ns_per_ref_median": statistics.median(walls) / refs,
                            "cpu_ns_per_ref_best": min(cpus) / refs,
                        }
                    )
                    r = rows[-1]
                    print(
                        f"  {label:<22} cap {capacity:>6} W={inflight:<3} "
                        f"hit {100 * r['hit_ratio']:6.2f} %  "
                        f"{r['ns_per_ref_best']:>8.0f} ns/ref best "
                        f"{r['ns_per_ref_median']:>8.0f} median",
                        file=sys.stderr,
                        flush=True,
                    )
    # speed-up over vLLM's built-in manager with the same policy
    base = {
        (r["policy"], r["capacity"], r["inflight"]): r
        for r in rows
        if r["manager"].startswith("vllm/")
    }
    for r in rows:
        b = base.get((r["policy"], r["capacity"], r["inflight"]))
        r["speedup_vs_vllm"] = b["ns_per_ref_best"] / r["ns_per_ref_best"] if b else None
        r["hit_points_vs_vllm"] = 100 * (r["hit_ratio"] - b["hit_ratio"]) if b else None
    return rows


def print_table(rows) -> None:
    head = (
        f"{'manager':<22} {'blocks':>7} {'W':>3} {'hit %':>7} {'Δ pts':>6} {'stored':>8} "
        f"{'evicted':>8} {'fails':>5} {'ns/ref':>8} {'median':>8} {'cpu':>8} {'speed-up':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        sp = r["speedup_vs_vllm"]
        dp = r["hit_points_vs_vllm"]
        print(
            f"{r['manager']:<22} {r['capacity']:>7,} {r['inflight']:>3} "
            f"{100 * r['hit_ratio']:>7.2f} {'' if dp is None else f'{dp:+.2f}':>6} "
            f"{r['stored_blocks']:>8,} {r['evictions']:>8,} {r['store_failures']:>5} "
            f"{r['ns_per_ref_best']:>8.0f} {r['ns_per_ref_median']:>8.0f} "
            f"{r['cpu_ns_per_ref_best']:>8.0f} {'' if sp is None else f'{sp:.2f}x':>8}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--capacity", default="4000,16000", help="tier sizes in blocks")
    ap.add_argument("--inflight", default="0,32", help="in-flight windows W (requests)")
    ap.add_argument("--policies", default="lru,arc", help="kvtier policy names")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)

    path = args.trace or (SHARED if SHARED.is_file() else embedded_sample_path())
    kpr = offload_keys(read_trace(path))
    refs = sum(map(len, kpr))
    print(f"trace {path.name}: {len(kpr):,} requests, {refs:,} block refs; python "
          f"{platform.python_version()}, {platform.machine()}")
    rows = run(
        kpr,
        [p.strip() for p in args.policies.split(",") if p.strip()],
        [int(c) for c in args.capacity.split(",")],
        [int(w) for w in args.inflight.split(",")],
        args.repeats,
    )
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"trace": str(path), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
