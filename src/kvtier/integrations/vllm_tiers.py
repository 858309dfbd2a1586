"""kvtier's disk and Redis tiers as secondary tiers of vLLM 0.33's ``TieringOffloadingSpec``.

vLLM's tiering offloading keeps a CPU *primary* tier that the GPU reads and writes, and any
number of *secondary* tiers below it (``kv_connector_extra_config["secondary_tiers"]``). A
secondary tier implements vLLM's ``SecondaryTierManager`` contract
(``vllm/v1/kv_offload/tiering/base.py``) and is loaded by
``SecondaryTierFactory.get_tier_class``: an entry ``{"type": "<class name>", "module_path":
"<module>", ...}`` imports ``<module>.<class name>`` and passes the entry's other keys to the
class's constructor. This module holds two such classes:

* :class:`KvtierDiskTier` -- a :class:`kvtier.tiers.disk.DiskTier` (fixed-size slots,
  checksummed, index persisted across restarts, kvtier eviction policy);
* :class:`KvtierRedisTier` -- a :class:`kvtier.tiers.redis.RedisTier` (shared between engines,
  values with a verified header, circuit breaker).

``--kv-transfer-config`` example (docs/tiers.md, "vLLM secondary tiers", has the full list of
options)::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [
          {"type": "KvtierDiskTier", "module_path": "kvtier.integrations.vllm_tiers",
           "directory": "/mnt/nvme/kvtier", "capacity_blocks": 20000},
          {"type": "KvtierRedisTier", "module_path": "kvtier.integrations.vllm_tiers",
           "url": "redis://cache:6379/0"}]}}

How vLLM's contract maps onto the :class:`~kvtier.tiers.base.BlockTier` API:

* **Keys.** vLLM's ``OffloadKey`` (bytes: block hash + 4-byte KV-cache group index) is used
  as the kvtier block key as it is (``bytes``; :func:`~kvtier.tiers.base.encode_key` makes it
  ``b"b" + key``). vLLM's block hashes do not depend on the model, so the tier is namespaced by
  a *layout fingerprint* built from vLLM's ``OffloadingConfig`` (model name, KV dtype, tokens
  per hash, blocks per chunk, the KV-cache groups, the parallel sizes, canonical/replicated
  layout, chunk bytes; :func:`vllm_layout_fingerprint`): the disk tier lives in a
  sub-directory named by its 64-bit id, the Redis tier uses it as its fingerprint.
* **Bytes.** One vLLM *chunk* (``blocks_per_chunk`` GPU blocks of every worker, row ``c`` of
  the primary tier's memoryview, ``primary_kv_view.strides[0]`` bytes) is one kvtier block.
  A store copies row ``chunk_ids[i]`` out (the primary slots are pinned by vLLM until the job
  finishes); a load copies verified bytes into the newly allocated rows.
* **Asynchrony.** ``submit_store`` / ``submit_load`` only enqueue: one I/O thread per tier runs
  the jobs, loads (a request waits for them) before stores, each kind in submission order
  (``BlockTier.write`` then ``flush``, so a store job finishes when its blocks
  are readable -- durable per the disk tier's ``fsync``; ``BlockTier.read`` then the copy into
  the primary rows). ``lookup`` is vLLM's non-blocking ``AsyncLookupManager``: the first call
  for a key answers ``RETRY``; the keys asked in one engine step are checked in one
  ``BlockTier.lookup_prefix`` call per request on the lookup thread (one Redis round trip),
  and later calls answer ``HIT``/``MISS``. ``get_finished_jobs`` returns the finished jobs;
  ``drain_jobs`` waits for the I/O thread.
* **Failures.** A block that fails verification (torn, corrupt, foreign) or vanished (evicted by
  Redis) is not copied: the load job reports ``success=False`` with the keys that did load in
  ``successful_keys``, and the failed keys are remembered as a miss (vLLM then recomputes
  them). A store job is ``success=False`` when the tier failed or dropped a block (I/O error,
  Redis down or its queue full, or a disk tier that could not make room for all of the job's
  blocks and kept its head). Nothing raises into the scheduler for a backend failure.
* **Recency.** A ``touch`` of vLLM's tiering manager reaches the disk tier's policy (queued;
  applied by the tier's threads before its next job or lookup); Redis keeps its own LRU/LFU.
  vLLM 0.33's ``OffloadingConnector`` never calls ``touch``, so in serving the disk tier's
  order comes from its writes and the promotions it serves (reads are uses); chunks reused
  from the CPU tier are not refreshed on disk (docs/tiers.md).
* **Metrics.** Every job reports ``transfer_time`` (seconds on the I/O thread) and
  ``transfer_bytes``, which vLLM turns into ``vllm:kv_offload_tiering_read_bytes`` /
  ``_read_time`` / ``_write_bytes`` / ``_write_time`` and the job-failure counters; vLLM itself
  counts ``chunk_queries`` / ``chunk_hits`` from the lookups. kvtier's own counters
  (:data:`KVTIER_METRICS`) come from :meth:`get_stats` with a ``tier`` label = the tier type.

Thread safety: vLLM calls every method under its manager lock (never concurrently). Inside, a
tier's :class:`~kvtier.tiers.base.BlockTier` is used by two threads of its own (the lookup
thread and the I/O thread), serialised by one lock for the disk tier (not thread-safe; a lookup
may wait behind a job's write there) and not for the Redis tier (thread-safe); the scheduler
thread never waits for I/O except in ``drain_jobs`` and ``shutdown`` (``get_stats`` reads the
counters the I/O thread saved after its last job). vLLM's tier-poll thread is not used
(``tolerates_off_thread_polling`` stays ``False``).

Requires vLLM 0.33 (``pip install kvtier[vllm]``); importing this module without vLLM raises
``ImportError``. Only the scheduler side is involved: secondary tiers never touch the GPU.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import xxhash

from kvtier.integrations import require_vllm

require_vllm(__name__)  # names the install command when vLLM is missing

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import (
    TIER_LABEL,
    JobResult,
    SecondaryTierManager,
    TransferJob,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.manager import MAX_BLOCKS
from kvtier.policies import CachePolicy, get_policy
from kvtier.tiers.base import BlockTier, TierStats, join_fingerprint_fields
from kvtier.tiers.disk import FSYNC_MODES, DiskTier, DiskTierError
from kvtier.tiers.redis import RedisTier

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = [
    "KVTIER_METRICS",
    "KvtierDiskTier",
    "KvtierRedisTier",
    "KvtierSecondaryTier",
    "vllm_layout_fingerprint",
]

logger = logging.getLogger(__name__)

MODULE_PATH = __name__
"""The ``module_path`` to put in a ``secondary_tiers`` entry."""

KVTIER_METRICS: dict[str, str] = {
    "vllm:kv_offload_kvtier_read_errors": "read_errors",
    "vllm:kv_offload_kvtier_writes_failed": "writes_failed",
    "vllm:kv_offload_kvtier_writes_skipped": "writes_skipped",
    "vllm:kv_offload_kvtier_evictions": "evictions",
}
"""Counters a kvtier secondary tier adds to vLLM's metrics (name -> :class:`TierStats`
field), each with a ``tier`` label (the tier type, e.g. ``KvtierDiskTier``)."""

_METRIC_DOCS = {
    "read_errors": "Blocks a kvtier secondary tier held but that failed verification "
                   "(torn, corrupt or foreign) and were read as a miss.",
    "writes_failed": "Blocks a kvtier secondary tier failed to write (I/O error, server down).",
    "writes_skipped": "Blocks a kvtier secondary tier did not write: already present, no room, "
                      "or (Redis) dropped while its breaker was open or its queue full.",
    "evictions": "Blocks a kvtier secondary tier evicted to make room (disk tier).",
}


def vllm_layout_fingerprint(offloading_spec: OffloadingSpec, block_bytes: int,
                            extra: dict[str, Any] | None = None) -> str:
    """The canonical model/layout fingerprint of the bytes vLLM hands to a secondary tier.

    Built from ``offloading_spec.config`` (vLLM's ``OffloadingConfig``): model name, KV dtype,
    tokens per hash, blocks per chunk, each KV-cache group (tokens per block and layer names),
    world/tp/pp/pcp/dcp sizes, the replicated and canonical layout flags and the KV-cache layout,
    plus ``block_bytes`` (bytes per chunk) and the user's ``extra`` fields (e.g. a model revision),
    sorted by name. Two engines share blocks only when their fingerprints are equal.

    Raises:
        ValueError: ``extra`` is not a dict of str keys to str/int/float/bool values.
    """
    fields = _fingerprint_fields(offloading_spec, block_bytes)
    fields.update(_check_extra(extra))
    return join_fingerprint_fields(fields)  # separators in values escaped: injective


def _fingerprint_fields(offloading_spec: OffloadingSpec, block_bytes: int) -> dict[str, Any]:
    cfg = offloading_spec.config
    par = cfg.parallel
    groups = ";".join(f"{g.tokens_per_block}:{','.join(g.layer_names)}" for g in cfg.groups)
    return {
        "engine": "vllm",
        "model": cfg.model.name,
        "dtype": cfg.model.dtype,
        "tokens_per_hash": cfg.cache.tokens_per_hash,
        "blocks_per_chunk": cfg.cache.blocks_per_chunk,
        "groups": xxhash.xxh3_64_hexdigest(groups.encode()),
        "world_size": par.world_size,
        "tp": par.tp_size,
        "pp": par.pp_size,
        "pcp": par.pcp_size,
        "dcp": par.dcp_size,
        "replicated": bool(cfg.replicated_layout),
        "canonical": bool(cfg.canonical_layout),
        "kv_cache_layout": cfg.kv_cache_layout,
        "chunk_bytes": block_bytes,
    }


def _check_extra(extra: Any) -> dict[str, Any]:
    if extra is None:
        return {}
    if not isinstance(extra, dict) or not all(
        isinstance(k, str) and k and isinstance(v, (str, int, float, bool))
        for k, v in extra.items()
    ):
        raise ValueError(
            f"fingerprint_extra must be a dict of non-empty str keys to str/int/float/bool "
            f"values (e.g. {{\"revision\": \"abc123\"}}), got {extra!r}"
        )
    return {f"extra.{k}": v for k, v in extra.items()}


def _check_positive_int(tier: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{tier}: {name} must be a positive int, got {value!r}")
    return value


def _check_common(tier: str, fingerprint_extra: Any, enable_kv_events: Any,
                  locality: Any) -> None:
    """The options both tiers take, checked before the tier touches vLLM's buffer."""
    try:
        _check_extra(fingerprint_extra)
    except ValueError as exc:
        raise ValueError(f"{tier}: {exc}") from None
    if not isinstance(enable_kv_events, bool):  # the JSON string "false" is truthy
        # a config error, ValueError as every other option's
        raise ValueError(  # noqa: TRY004
            f"{tier}: enable_kv_events must be a bool, got {enable_kv_events!r}")
    if locality is not None and (not isinstance(locality, str)
                                 or locality not in Locality.__members__):
        raise ValueError(f"{tier}: locality must be LOCAL or REMOTE, got {locality!r}")


def _check_seconds(tier: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{tier}: {name} must be a number of seconds > 0, got {value!r}")
    return float(value)


@dataclass
class _Job:
    job: TransferJob
    keys: list[OffloadKey]
    rows: list[int]


class _PrefixLookup(AsyncLookupManager):
    """vLLM's async lookup manager over one ``BlockTier.lookup_prefix`` call per request and
    step (keys in the order the scheduler asked them, i.e. prefix order): the first ``n`` keys
    are present, the rest answered absent (a present key after an absent one is a miss, which
    vLLM recomputes)."""

    def __init__(self, owner: KvtierSecondaryTier, tier_type: str) -> None:
        self._owner = owner
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        n = self._owner._lookup_prefix(keys)
        return [True] * n + [False] * (len(keys) - n)


class KvtierSecondaryTier(SecondaryTierManager):
    """The vLLM ``SecondaryTierManager`` over any kvtier :class:`BlockTier` (base of
    :class:`KvtierDiskTier` and :class:`KvtierRedisTier`, which build the tier from the
    ``secondary_tiers`` entry). See the module docstring for the mapping.

    Raises (constructor): ValueError for a bad option (named) or an unknown one.
    """

    _config_name: ClassVar[str] = "kvtier tier"

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        enable_kv_events: bool = False,
        locality: str | None = None,
    ) -> None:
        if type(self) is KvtierSecondaryTier:
            raise TypeError("KvtierSecondaryTier is the base class: configure KvtierDiskTier or "
                            "KvtierRedisTier in secondary_tiers")
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else type(self)._locality
        self._tier: BlockTier  # set by the subclass before _start()
        self._events: list[OffloadingEvent] | None = None
        if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events:
            self._events = []
        self._rows = self._row_view(primary_kv_view)

    _locality: ClassVar[Locality | None] = None
    _tier_threadsafe: ClassVar[bool] = False  # may lookup_prefix run beside a job?
    _forwards_touch: ClassVar[bool] = False  # does touch() reach the tier's own policy?

    @staticmethod
    def _row_view(view: memoryview) -> memoryview:
        """A 1-D byte view over the primary tier (row ``c`` at ``c * strides[0]``)."""
        return view if view.ndim == 1 and view.format == "B" else view.cast("B")

    def _start(self, tier: BlockTier) -> None:
        """Start the tier's lookup and I/O threads over ``tier`` (called by subclasses)."""
        if tier.block_bytes != self.block_size_bytes:
            raise ValueError(
                f"{self.tier_type}: tier block size {tier.block_bytes} differs from the "
                f"primary tier's chunk size {self.block_size_bytes}"
            )
        self._tier = tier
        self._io_lock = threading.Lock()  # the BlockTier is used by one thread at a time
        # lookups take the lock too unless the tier is thread-safe (Redis): then a lookup
        # never waits behind a job's write
        self._lookup_lock: Any = (contextlib.nullcontext() if self._tier_threadsafe
                                  else self._io_lock)
        self._snapshot = tier.stats()  # counters after the last job, for get_stats
        # queued jobs; loads (promotions, a request waits for them) go before stores
        # (cascades, background work), each queue in submission order
        self._loads: collections.deque[_Job] = collections.deque()
        self._stores: collections.deque[_Job] = collections.deque()
        self._stopping = False
        # vLLM's touch() batches, applied to the tier's policy by whichever of the tier's
        # threads next holds the I/O lock (deque appends/pops are thread-safe); bounded
        self._touches: collections.deque[list[OffloadKey]] = collections.deque(maxlen=4096)
        # finished jobs, from the I/O thread: (result, keys of a failed promotion, keys of a
        # store job the tier holds); the scheduler thread turns the last into the job's
        # stored event in get_finished_jobs (the event list is the scheduler thread's alone:
        # an append from the I/O thread could land in a list take_events had already
        # returned and its caller read, and the event was lost; newcomer review, session 17)
        self._finished: queue.SimpleQueue[
            tuple[JobResult, list[OffloadKey], list[OffloadKey]]] = queue.SimpleQueue()
        self._pending = 0  # jobs submitted and not yet returned by get_finished_jobs
        self._idle = threading.Condition()
        self._in_io = 0  # jobs submitted and not yet finished by the I/O thread
        self._reported = TierStats(name=tier.name)  # counters already sent to vLLM
        self._closed = False
        self._io_thread = threading.Thread(target=self._io_loop, daemon=True,
                                           name=f"kvtier-vllm-{self.tier_type}")
        self._io_thread.start()
        self._lookups = _PrefixLookup(self, self.tier_type)

    @property
    def tier(self) -> BlockTier:
        """The kvtier tier behind this vLLM tier (for tests and operators; do not use it from
        another thread while vLLM runs)."""
        return self._tier

    # -- vLLM's contract (scheduler thread, under vLLM's manager lock) -----------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def _submit(self, job: TransferJob) -> None:
        """Queue ``job`` for the I/O thread.

        Raises:
            RuntimeError: the tier is shut down (its I/O thread is gone: the job would never
                run); ValueError: keys and chunk ids differ in number. Nothing queued then.
        """
        if self._closed:
            raise RuntimeError(f"job {job.job_id}: secondary tier {self.tier_type} is shut "
                               f"down; it takes no more jobs")
        keys = list(job.keys)
        rows = [int(c) for c in job.chunk_ids]
        if len(keys) != len(rows):
            raise ValueError(f"job {job.job_id}: {len(keys)} keys but {len(rows)} chunk_ids")
        self._pending += 1
        with self._idle:
            self._in_io += 1
            (self._loads if job.is_promotion else self._stores).append(_Job(job, keys, rows))
            self._idle.notify_all()

    def touch(self, keys, req_context: ReqContext) -> None:
        """Queue a use of ``keys`` for the tier's policy, where the tier has one (disk);
        applied before its next job or lookup. At most 4096 batches wait; older ones are
        dropped. (vLLM 0.33's connector never calls it: see the module docstring.)"""
        if self._forwards_touch and keys:
            self._touches.append(list(keys))

    def _apply_touches(self) -> None:
        """Under the I/O lock: give queued touches to the disk tier's policy, oldest first."""
        while self._touches:
            try:
                keys = self._touches.popleft()
            except IndexError:
                return
            self._tier.manager.touch(keys)  # type: ignore[attr-defined]

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out: list[JobResult] = []
        while True:
            try:
                result, failed_loads, stored = self._finished.get_nowait()
            except queue.Empty:
                break
            self._pending -= 1
            if stored and self._events is not None:
                self._events.append(OffloadingEvent(keys=stored, medium=self.medium,
                                                    removed=False, locality=self.locality))
            if failed_loads:
                # vLLM would otherwise keep answering HIT from the cached verdict
                self._lookups.mark_miss(failed_loads)
            out.append(result)
        return out

    def has_pending_work(self) -> bool:
        return self._pending > 0

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        events, self._events = self._events, []
        return events

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._in_io == 0)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lookups.shutdown()
        with self._idle:  # the I/O thread finishes the queued jobs, then stops
            self._stopping = True
            self._idle.notify_all()
        self._io_thread.join()
        with self._io_lock:
            self._tier.close()
        self._release_rows()

    def _release_rows(self) -> None:
        """Drop our export of the primary tier's shared-memory buffer (so vLLM can unmap it)."""
        if self._rows is not self._primary_kv_view:
            self._rows.release()

    # -- metrics -----------------------------------------------------------------------------
    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return {
            name: OffloadingCounterMetadata(documentation=_METRIC_DOCS[field],
                                            labelnames=(TIER_LABEL,))
            for name, field in KVTIER_METRICS.items()
        }

    def get_stats(self):
        """kvtier's counters (:data:`KVTIER_METRICS`) increased since the last call."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        now = self._snapshot  # taken by the I/O thread: the scheduler never waits for I/O
        stats = OffloadingConnectorStats()
        for name, field in KVTIER_METRICS.items():
            delta = getattr(now, field) - getattr(self._reported, field)
            if delta > 0:
                stats.increase_counter(name, delta, (self.tier_type,))
            setattr(self._reported, field, getattr(now, field))
        return stats

    # -- the tier's own threads --------------------------------------------------------------
    def _lookup_prefix(self, keys: list[OffloadKey]) -> int:
        """Lookup thread: leading ``keys`` readable in the tier (0 on a backend failure)."""
        with self._lookup_lock:
            try:
                if self._forwards_touch:
                    self._apply_touches()
                return self._tier.lookup_prefix(keys)
            except Exception:  # a closed tier at shutdown: answer miss, never raise
                logger.exception("%s: lookup failed", self.tier_type)
                return 0

    def _io_loop(self) -> None:
        while True:
            with self._idle:
                self._idle.wait_for(lambda: self._loads or self._stores or self._stopping)
                if self._loads:
                    item = self._loads.popleft()
                elif self._stores:
                    item = self._stores.popleft()
                else:
                    return
            stored: list[OffloadKey] = []
            try:
                if self._forwards_touch:
                    with self._io_lock:
                        self._apply_touches()
                if item.job.is_promotion:
                    result, failed = self._load(item)
                else:
                    (result, stored), failed = self._store(item), []
            except Exception:  # misuse or a bug: fail the job, keep the engine running
                logger.exception("%s: job %s failed", self.tier_type, item.job.job_id)
                result, failed = JobResult(job_id=item.job.job_id, success=False), (
                    item.keys if item.job.is_promotion else [])
            self._finished.put((result, failed, stored))
            with self._idle:
                self._in_io -= 1
                self._idle.notify_all()

    def _store_failed(self, before: TierStats, after: TierStats) -> int:
        """Blocks of one store job that the tier failed to write (subclasses add drops)."""
        return after.writes_failed - before.writes_failed

    def _store(self, item: _Job) -> tuple[JobResult, list[OffloadKey]]:
        """I/O thread: write one store job; its result and the job's keys the tier holds
        (for the stored event, sent by :meth:`get_finished_jobs`)."""
        bb = self.block_size_bytes
        rows = self._rows
        t0 = time.perf_counter()
        with self._io_lock:
            before = self._tier.stats()
            # vLLM keeps these primary rows pinned until the job is returned, so views suffice;
            # the tier copies them before write() returns
            self._tier.write(item.keys, [rows[r * bb:(r + 1) * bb] for r in item.rows])
            self._tier.flush()
            after = self._tier.stats()
            self._snapshot = after
            if hasattr(type(self._tier), "__contains__"):  # the disk: asked without I/O
                # a job succeeds when the tier holds all of its chunks (vLLM's JobResult:
                # "False if all or some failed"): the disk keeps a job's head when it cannot
                # make room for all of it, and skips the chunks it holds already
                stored = [k for k in item.keys if k in self._tier]
                failed = len(set(item.keys)) - len(set(stored))
            else:
                failed = self._store_failed(before, after)
                stored = [] if failed else list(item.keys)
        elapsed = time.perf_counter() - t0
        # the bytes this job wrote: 0 when every chunk was there already, which vLLM's
        # back-pressure detector skips (None would make it assume the whole job's bytes)
        written = after.bytes_written - before.bytes_written
        return JobResult(job_id=item.job.job_id, success=failed == 0, transfer_time=elapsed,
                         transfer_bytes=written), stored

    def _load(self, item: _Job) -> tuple[JobResult, list[OffloadKey]]:
        bb = self.block_size_bytes
        rows = self._rows
        t0 = time.perf_counter()
        with self._io_lock:
            datas = self._tier.read(item.keys)
            self._snapshot = self._tier.stats()
        ok: list[OffloadKey] = []
        failed: list[OffloadKey] = []
        for key, row, data in zip(item.keys, item.rows, datas, strict=True):
            if data is None:
                failed.append(key)
                continue
            rows[row * bb:(row + 1) * bb] = data
            ok.append(key)
        elapsed = time.perf_counter() - t0
        if failed:
            return JobResult(job_id=item.job.job_id, success=False,
                             successful_keys=tuple(ok) if ok else None,
                             transfer_time=elapsed, transfer_bytes=len(ok) * bb or None), failed
        return JobResult(job_id=item.job.job_id, success=True, transfer_time=elapsed,
                         transfer_bytes=len(ok) * bb), []


def _reject_unknown(tier: str, unknown: dict[str, Any], accepted: Iterable[str]) -> None:
    if unknown:
        raise ValueError(
            f"{tier}: unknown option(s) {', '.join(sorted(unknown))} in its secondary_tiers "
            f"entry; accepted: {', '.join(sorted(accepted))}"
        )


class KvtierDiskTier(KvtierSecondaryTier):
    """kvtier's :class:`~kvtier.tiers.disk.DiskTier` as a vLLM secondary tier.

    ``secondary_tiers`` entry: ``{"type": "KvtierDiskTier", "module_path":
    "kvtier.integrations.vllm_tiers", ...}`` with

    * ``directory`` (str, required): parent directory; the tier lives in
      ``<directory>/vllm-<fingerprint id, 16 hex>/`` (created), so engines of different models
      or layouts never share slots. A restarted engine with the same layout finds the blocks
      whose writes had completed.
    * ``capacity_blocks`` (int from 1 to 2**31 - 1, required): slots, each one vLLM chunk
      (``primary_kv_view.strides[0]`` bytes). The file ``blocks.dat`` is capacity x chunk bytes.
    * ``policy`` (str, default ``"lru"``): kvtier eviction policy of the slots (``lru``,
      ``arc``, ``s3fifo``, ``sieve``, ``lfu``, ...; see docs/policies.md).
    * ``fsync`` (``"none"`` default, or ``"batch"``): see :class:`DiskTier`; with ``"batch"`` a
      store job finishes only after its blocks are ``fdatasync``-ed.
    * ``workers`` (int >= 1, default 4): the disk tier's writer/reader threads.
    * ``fingerprint_extra`` (dict, optional): more fingerprint fields (e.g. a model revision).
    * ``enable_kv_events`` (bool), ``locality`` (``"LOCAL"``/``"REMOTE"``): as vLLM's ``fs``
      tier.

    Raises:
        ValueError: a missing, bad or unknown option (named).
        kvtier.tiers.disk.DiskTierError: the directory is already open (another process or
            DiskTier), or its tier was made with another ``capacity_blocks`` (named with the
            old value and the directory to delete for a fresh start).
    """

    medium: ClassVar[Medium] = Medium.STORAGE
    _locality = Locality.LOCAL
    _forwards_touch = True  # vLLM's touch() reaches the slots' policy
    _OPTIONS = ("directory", "capacity_blocks", "policy", "fsync", "workers",
                "fingerprint_extra", "enable_kv_events", "locality")

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        directory: str | None = None,
        capacity_blocks: int | None = None,
        policy: str = "lru",
        fsync: str = "none",
        workers: int = 4,
        fingerprint_extra: dict[str, Any] | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
        **unknown: Any,
    ) -> None:
        name = tier_type
        _reject_unknown(name, unknown, self._OPTIONS)
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise ValueError(f"{name}: directory (a path) is required, got {directory!r}")
        if capacity_blocks is None:
            raise ValueError(f"{name}: capacity_blocks (slots of one vLLM chunk each) is "
                             "required")
        _check_positive_int(name, "capacity_blocks", capacity_blocks)
        if capacity_blocks > MAX_BLOCKS:  # DiskTier's limit, named as the operator wrote it
            raise ValueError(f"{name}: capacity_blocks must be at most {MAX_BLOCKS:,} (slots "
                             f"of one vLLM chunk each), got {capacity_blocks:,}")
        _check_positive_int(name, "workers", workers)
        if fsync not in FSYNC_MODES:
            raise ValueError(f"{name}: fsync must be one of {', '.join(FSYNC_MODES)}, "
                             f"got {fsync!r}")
        if isinstance(policy, str) and policy:
            try:
                offline = getattr(get_policy(policy), "needs_future", False)
            except ValueError as exc:
                raise ValueError(f"{name}: policy: {exc}") from None
            if offline:
                raise ValueError(f"{name}: policy {policy!r} is offline (it needs each "
                                 "block's next use): use it in 'kvtier replay'")
        elif not (isinstance(policy, type) and issubclass(policy, CachePolicy)):
            raise ValueError(f"{name}: policy must be a kvtier policy name, got {policy!r}")
        _check_common(name, fingerprint_extra, enable_kv_events, locality)
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector,
                         enable_kv_events=enable_kv_events, locality=locality)
        fingerprint = vllm_layout_fingerprint(offloading_spec, self.block_size_bytes,
                                              fingerprint_extra)
        self.fingerprint = fingerprint
        fp_id = xxhash.xxh3_64_hexdigest(fingerprint.encode())
        self.path = Path(directory) / f"vllm-{fp_id}"
        try:  # from here on a failure gives vLLM its buffer back (no view of ours kept)
            self.path.mkdir(parents=True, exist_ok=True)  # e.g. directory is a file
            layout_file = self.path / "vllm_layout.json"
            if not layout_file.exists():  # for operators: what these blocks are
                tmp = layout_file.with_suffix(".tmp")
                tmp.write_text(json.dumps({"fingerprint": fingerprint}, indent=1) + "\n")
                os.replace(tmp, layout_file)
            # e.g. DiskTierError: the directory is open in another engine
            tier = DiskTier(self.path, capacity_blocks, self.block_size_bytes, policy=policy,
                            fsync=fsync, workers=workers, name=f"{tier_type}")
        except DiskTierError as exc:
            self._release_rows()
            old = exc.differences.get("num_blocks", (None,))[0]
            if old is None:
                raise
            # the operator wrote capacity_blocks, not DiskTier's num_blocks
            raise DiskTierError(
                f"{name}: capacity_blocks is {capacity_blocks}, but the disk tier in "
                f"{self.path} was made with capacity_blocks {old}: set it back to {old}, or "
                "delete that directory to start the tier empty (its blocks are lost)") from None
        except BaseException:
            self._release_rows()
            raise
        try:
            self._start(tier)
        except BaseException:
            tier.close()
            self._release_rows()
            raise


class KvtierRedisTier(KvtierSecondaryTier):
    """kvtier's :class:`~kvtier.tiers.redis.RedisTier` as a vLLM secondary tier, shared by
    every engine (on any machine) with the same layout fingerprint.

    ``secondary_tiers`` entry: ``{"type": "KvtierRedisTier", "module_path":
    "kvtier.integrations.vllm_tiers", ...}`` with

    * ``url`` (str): ``redis://[user:pass@]host:port/db``, ``rediss://...`` (TLS), ``unix://``;
      omitted: ``$KVTIER_REDIS_URL`` (``$KVTIER_REDIS_PASSWORD`` fills a missing password). The
      password is never logged.
    * ``namespace`` (str, default ``"kvtier"``), ``cluster`` (bool, Redis Cluster),
      ``compression`` (``"none"``/``"zstd"``), ``ttl_s`` (int seconds or null).
    * ``timeout_s`` (default 0.05: lookups), ``read_timeout_s`` (0.5), ``write_timeout_s``
      (2.0): seconds, see :class:`RedisTier`; ``max_queue_bytes``, ``breaker_failures``,
      ``breaker_cooldown_s``.
    * ``fingerprint_extra`` (dict, optional): more fingerprint fields (e.g. a model revision);
      the rest of the fingerprint comes from vLLM's config (:func:`vllm_layout_fingerprint`).
    * ``enable_kv_events`` (bool), ``locality`` (default ``"REMOTE"``).

    A store job fails when any of its blocks was dropped (breaker open, queue full) or failed;
    a Redis server that is down makes lookups answer miss within ``timeout_s``.

    Raises:
        ValueError: a missing, bad or unknown option (named; the URL's password redacted).
    """

    medium: ClassVar[Medium] = Medium.CPU  # the server's memory
    # a remote store, not this host's memory: vLLM's hit-source metric must not say "host"
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED
    _locality = Locality.REMOTE
    _tier_threadsafe = True  # RedisTier: every method may be called from any thread
    _PASSTHROUGH = ("namespace", "cluster", "compression", "ttl_s", "timeout_s",
                    "read_timeout_s", "write_timeout_s", "max_queue_bytes", "breaker_failures",
                    "breaker_cooldown_s")
    _OPTIONS = ("url", "fingerprint_extra", "enable_kv_events", "locality") + _PASSTHROUGH

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        url: str | None = None,
        fingerprint_extra: dict[str, Any] | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
        **options: Any,
    ) -> None:
        name = tier_type
        unknown = {k: v for k, v in options.items() if k not in self._PASSTHROUGH}
        _reject_unknown(name, unknown, self._OPTIONS)
        if url is not None and (not isinstance(url, str) or not url):
            raise ValueError(f"{name}: url must be a redis:// or rediss:// URL string")
        if url is None and not os.environ.get("KVTIER_REDIS_URL"):
            raise ValueError(f"{name}: url is required (or set $KVTIER_REDIS_URL)")
        for opt in ("timeout_s", "read_timeout_s", "write_timeout_s", "breaker_cooldown_s"):
            if opt in options:
                _check_seconds(name, opt, options[opt])
        for opt in ("max_queue_bytes", "breaker_failures"):
            if opt in options:
                _check_positive_int(name, opt, options[opt])
        _check_common(name, fingerprint_extra, enable_kv_events, locality)
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector,
                         enable_kv_events=enable_kv_events, locality=locality)
        self.fingerprint = vllm_layout_fingerprint(offloading_spec, self.block_size_bytes,
                                                   fingerprint_extra)
        try:
            tier = RedisTier.from_url(url, block_bytes=self.block_size_bytes,
                                      fingerprint=self.fingerprint, name=tier_type, **options)
        except (ValueError, TypeError) as exc:
            self._release_rows()
            raise ValueError(f"{name}: {exc}") from None
        except BaseException:
            self._release_rows()
            raise
        logger.info("%s: Redis tier %s", tier_type, tier)  # repr redacts the password
        try:
            self._start(tier)
        except BaseException:
            tier.close()
            self._release_rows()
            raise

    def _store_failed(self, before: TierStats, after: TierStats) -> int:
        # the Redis tier never skips a present block: every skip is a drop
        return (after.writes_failed - before.writes_failed
                + after.writes_skipped - before.writes_skipped)

