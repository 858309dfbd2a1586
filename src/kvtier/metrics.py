"""Prometheus metrics of kvtier's tiers: a prometheus_client custom collector.

:class:`TierCollector` reads ``stats()`` of any :class:`~kvtier.OffloadingManager` (the host
tier's bookkeeping) and any :class:`~kvtier.tiers.base.BlockTier` (disk, Redis, ...) at scrape
time and exposes them with a ``tier`` label. Nothing is counted twice: the collector holds no
counters of its own, so its values are exactly the sources' ``stats()`` at the scrape.

Names follow vLLM 0.33's tiering offloading metrics (``vllm:kv_offload_tiering_*``, label
``tier``) where one exists, with the ``kvtier:`` prefix instead of ``vllm:`` so both can live in
one process; docs/metrics.md has the full mapping. Counters are exposed with prometheus_client's
``_total`` suffix.

Usage::

    from prometheus_client import REGISTRY, start_http_server
    from kvtier.metrics import TierCollector

    REGISTRY.register(TierCollector(managers={"host": manager}, tiers=[redis_tier],
                                    tokens_per_block=16))
    start_http_server(9400)

Thread safety: ``collect`` runs on the scraping thread. A disk or Redis tier's ``stats()``
takes the tier's lock, and a :class:`~kvtier.threadsafe.ThreadSafeManager`'s runs under its
lock: each is one consistent snapshot. A plain :class:`~kvtier.OffloadingManager` (and a tier
stack, whose ``stats()`` reads its host manager) is not thread-safe and is read without a
lock, so a scrape may land inside an engine-thread call and see it half done: gauges may
disagree with one another, and ``stores_total`` (completed + failed + pending blocks) can read
low by the blocks of the ``complete_store`` in progress and come back up at the next scrape,
which Prometheus counts as a counter reset (``rate()`` / ``increase()`` jump by the whole
counter). Where the engine can call the manager through a ``ThreadSafeManager``, pass that
wrapper here (a ``KVOffloader`` or ``TierStack`` needs the plain manager).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import Collector
except ModuleNotFoundError as _exc:
    if (_exc.name or "").split(".")[0] != "prometheus_client":
        raise
    raise ModuleNotFoundError(
        "kvtier.metrics needs prometheus_client, which is not installed: "
        "pip install 'kvtier[metrics]'", name="prometheus_client") from None

from kvtier.checks import _as_int
from kvtier.manager import OffloadingManager
from kvtier.threadsafe import ThreadSafeManager
from kvtier.tiers.base import LatencyHistogram, TierStats

PREFIX = "kvtier:kv_offload_tiering_"
TIER_LABEL = "tier"  # vLLM's TIER_LABEL
_NAME_PREFIX = re.compile(r"(?:[a-zA-Z_:][a-zA-Z0-9_:]*)?")  # Prometheus metric-name syntax


class TierCollector(Collector):
    """A collector over managers and tiers, one ``tier`` label value each.

    Args:
        managers: ``{tier name: OffloadingManager or ThreadSafeManager}`` (e.g.
            ``{"host": m}``); a ThreadSafeManager is read under its lock (see the module
            docstring, "Thread safety").
        tiers: block tiers, labelled by their ``name``, and tier stacks: an object without a
            ``name`` whose ``stats()`` returns ``{tier name: TierStats}`` (e.g.
            ``kvtier.tiers.stack.TierStack``) contributes each tier (the host as TierStats:
            pass the stack's manager in ``managers`` instead for pinned/pending blocks).
        tokens_per_block: tokens per block; when given, ``hit_tokens`` = lookup hits x this
            (vLLM's block size). Without it hit tokens are not exported.
        prefix: metric name prefix (default ``"kvtier:kv_offload_tiering_"``): letters,
            digits, ``_`` and ``:``, not starting with a digit (Prometheus's name syntax).

    Raises:
        ValueError: two sources share a tier name, ``tokens_per_block`` is not an int >= 1,
            or ``prefix`` is not a valid metric-name prefix.
        TypeError: ``managers`` is not a mapping, a tier name of it is not a non-empty str,
            a manager is not an OffloadingManager, ``tiers`` is one tier rather than a list
            (or None), or a tier has no ``stats()``.
    """

    def __init__(
        self,
        managers: Mapping[str, OffloadingManager] | None = None,
        tiers: Iterable[Any] = (),
        *,
        tokens_per_block: int | None = None,
        prefix: str = PREFIX,
    ) -> None:
        if managers is not None and not isinstance(managers, Mapping):
            raise TypeError(
                "managers must be a mapping {tier name: manager}, e.g. {'host': manager}, "
                f"got {type(managers).__name__}")
        managers = dict(managers or {})
        for name, m in managers.items():
            if not isinstance(name, str) or not name:  # the label value: "" reads as no label
                raise TypeError(f"managers: tier name {name!r} must be a non-empty str")
            if not isinstance(m, (OffloadingManager, ThreadSafeManager)):
                raise TypeError(
                    f"managers[{name!r}] must be an OffloadingManager or a ThreadSafeManager "
                    f"(a KVOffloader's is .manager), got {type(m).__name__}"
                )
        if not isinstance(prefix, str) or not _NAME_PREFIX.fullmatch(prefix):
            # checked here: prometheus_client would fail at registration (5) or escape the
            # name into another one ("bad name-" -> "bad_name_...")
            raise ValueError(
                "prefix must be a str of letters, digits, '_' and ':' not starting with a "
                f"digit, got {prefix!r}")
        if callable(getattr(tiers, "stats", None)):  # one tier (or stack), not a list
            raise TypeError(f"tiers must be a list of tiers (e.g. [disk, redis]), got one "
                            f"{type(tiers).__name__}")
        if tiers is None:
            raise TypeError("tiers must be a list of tiers (e.g. [disk, redis]), got NoneType")
        sources = list(tiers)
        names = list(managers)
        for t in sources:
            if not callable(getattr(t, "stats", None)):
                raise TypeError(f"tier {t!r} has no stats() (a BlockTier or a tier stack)")
            name = getattr(t, "name", None)
            if isinstance(name, str):
                names.append(name)
                continue
            # a tier stack: stats() -> {tier name: TierStats}; its names are read once here
            per_tier = t.stats()
            if not isinstance(per_tier, Mapping):
                raise TypeError(
                    f"tier {t!r} has no name and its stats() is not a {{name: TierStats}} map"
                )
            names.extend(per_tier)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tier names must be unique per collector, repeated: {dupes}")
        if tokens_per_block is not None:  # numpy ints taken, as by OffloadingManager
            number = _as_int(tokens_per_block)
            if number is None or number < 1:
                raise ValueError(
                    f"tokens_per_block must be an int >= 1, got {tokens_per_block!r}")
            tokens_per_block = number
        self.managers = managers
        self.tiers = sources
        self.tokens_per_block = tokens_per_block
        self.prefix = prefix

    def describe(self):
        # names only (no stats() call at registration); prometheus_client uses this to detect
        # name clashes when the collector is registered
        return list(self._families().values())

    def _families(self) -> dict[str, Any]:
        p, lab = self.prefix, [TIER_LABEL]

        def c(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(p + name, doc, labels=lab)

        def g(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(p + name, doc, labels=lab)

        def h(name: str, doc: str) -> HistogramMetricFamily:
            return HistogramMetricFamily(p + name, doc, labels=lab)

        fams = {
            "chunk_queries": c("chunk_queries", "Block keys looked up in a tier (prefix lookups "
                               "count the hits plus the first miss), labeled by tier."),
            "chunk_hits": c("chunk_hits", "Block lookups that hit, labeled by tier."),
            "read_blocks": c("read_blocks", "Blocks asked for by reads (host tier: blocks "
                             "pinned for loading), labeled by tier."),
            "read_hit_blocks": c("read_hit_blocks", "Blocks a read returned verified, "
                                 "labeled by tier."),
            "read_errors": c("read_errors", "Blocks present but torn, corrupt or foreign "
                             "(answered as a miss), labeled by tier."),
            "stores": c("stores", "Blocks accepted for storing, labeled by tier."),
            "stores_completed": c("stores_completed", "Stores that completed (block readable), "
                                  "labeled by tier."),
            "store_failures": c("store_failures", "Stores that failed (I/O error, server down, "
                                "completed with success=False), labeled by tier."),
            "stores_skipped": c("stores_skipped", "Blocks dropped without trying (admission, "
                                "full queue, open breaker), labeled by tier."),
            "evictions": c("evictions", "Blocks the tier evicted, labeled by tier."),
            "read_bytes": c("read_bytes", "Bytes read from a tier, labeled by tier."),
            "write_bytes": c("write_bytes", "Bytes written to a tier, labeled by tier."),
            "read_time": c("read_time", "Time spent in reads, seconds, labeled by tier."),
            "write_time": c("write_time", "Time spent in writes, seconds, labeled by tier."),
            "backend_errors": c("backend_errors", "Backend calls that failed (timeouts, "
                                "refused connections, server errors), labeled by tier."),
            "breaker_opens": c("breaker_opens", "Times a tier's circuit breaker opened, "
                               "labeled by tier."),
            "read_latency_seconds": h("read_latency_seconds", "Latency of one read, seconds "
                                      "(disk tier: one block; Redis tier: one server call), "
                                      "labeled by tier."),
            "write_latency_seconds": h("write_latency_seconds", "Latency of one write, "
                                       "seconds (disk tier: a write call until its last "
                                       "block is written; Redis tier: one batch sent), "
                                       "labeled by tier."),
            "used_blocks": g("used_blocks", "Blocks held (pending and ready; absent where the "
                             "backend owns capacity), labeled by tier."),
            "pinned_blocks": g("pinned_blocks", "Blocks pinned by loads in flight, labeled by "
                               "tier."),
            "pending_blocks": g("pending_blocks", "Blocks whose store is in flight (accepted, "
                                "not yet readable), labeled by tier."),
            "capacity_blocks": g("capacity_blocks", "Capacity in blocks (absent where the "
                                 "backend owns capacity, e.g. Redis maxmemory), labeled by tier."),
            "usage_perc": g("usage_perc", "Fraction of capacity used (used / capacity), "
                            "labeled by tier."),
            "breaker_open": g("breaker_open", "1 while a tier's circuit breaker refuses calls, "
                              "else 0, labeled by tier."),
        }
        if self.tokens_per_block is not None:
            fams["hit_tokens"] = c("hit_tokens", "Tokens of the blocks lookups hit (hits x "
                                   "tokens per block), labeled by tier.")
        return fams

    def collect(self):
        fams = self._families()
        tpb = self.tokens_per_block

        def put(name: str, tier: str, value: float) -> None:
            fams[name].add_metric([tier], value)

        for tier, m in self.managers.items():
            s = m.stats()
            put("chunk_queries", tier, s.lookups)
            put("chunk_hits", tier, s.hits)
            if tpb is not None:
                put("hit_tokens", tier, s.hits * tpb)
            put("read_blocks", tier, s.loads)
            put("stores", tier, s.stores)
            put("stores_completed", tier, s.completed_stores)
            put("store_failures", tier, s.failed_stores)
            put("stores_skipped", tier, s.skipped_stores)
            put("evictions", tier, s.evictions)
            put("used_blocks", tier, s.used)
            put("pinned_blocks", tier, s.pinned)
            put("pending_blocks", tier, s.pending)
            put("capacity_blocks", tier, s.num_blocks)
            put("usage_perc", tier, s.used / s.num_blocks)

        def tier_stats(tier: str, s: TierStats) -> None:
            put("chunk_queries", tier, s.lookups)
            put("chunk_hits", tier, s.lookup_hits)
            if tpb is not None:
                put("hit_tokens", tier, s.lookup_hits * tpb)
            put("read_blocks", tier, s.reads)
            put("read_hit_blocks", tier, s.read_hits)
            put("read_errors", tier, s.read_errors)
            put("stores", tier, s.writes)
            put("stores_completed", tier, s.writes_completed)
            put("store_failures", tier, s.writes_failed)
            put("stores_skipped", tier, s.writes_skipped)
            put("evictions", tier, s.evictions)
            put("read_bytes", tier, s.bytes_read)
            put("write_bytes", tier, s.bytes_written)
            put("read_time", tier, s.read_latency.sum_s)
            put("write_time", tier, s.write_latency.sum_s)
            _histogram(fams["read_latency_seconds"], tier, s.read_latency)
            _histogram(fams["write_latency_seconds"], tier, s.write_latency)
            if s.capacity_blocks is not None:  # else the backend owns capacity (Redis)
                put("used_blocks", tier, s.used_blocks)
            put("pending_blocks", tier,
                max(s.writes - s.writes_completed - s.writes_failed, 0))
            if s.capacity_blocks:
                put("capacity_blocks", tier, s.capacity_blocks)
                put("usage_perc", tier, s.used_blocks / s.capacity_blocks)
            if hasattr(s, "backend_errors"):
                put("backend_errors", tier, s.backend_errors)
            if hasattr(s, "breaker_state"):
                put("breaker_opens", tier, s.breaker_opens)
                put("breaker_open", tier, 1 if s.breaker_state == "open" else 0)

        for t in self.tiers:
            st = t.stats()
            if isinstance(st, Mapping):  # a tier stack
                for tier, s in st.items():
                    tier_stats(tier, s)
            else:
                tier_stats(t.name, st)
        for fam in fams.values():
            if fam.samples:
                yield fam


def _histogram(fam: HistogramMetricFamily, tier: str, hist: LatencyHistogram) -> None:
    """Add ``hist`` (per-bucket counts) as cumulative Prometheus buckets."""
    buckets = []
    acc = 0
    # counts has one more entry than bounds (its last is the +Inf bucket, from hist.total)
    for bound, count in zip(hist.bounds, hist.counts, strict=False):
        acc += count
        buckets.append((_le(bound), acc))
    buckets.append(("+Inf", hist.total))
    fam.add_metric([tier], buckets, hist.sum_s)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
