"""TieredOffloader: a :class:`~kvtier.dataplane.KVOffloader` with block tiers below host memory.

It composes an existing offloader (host pool + manager + transfer engine) with a
:class:`~kvtier.tiers.stack.TierStack`; the offloader itself is not changed. The engine calls
the same four methods as on the offloader:

* :meth:`TieredOffloader.offload` — as ``KVOffloader.offload``; under write-back the host's
  victims (copied out of their slots inside the host policy's ``evict``, before the store's
  copy can overwrite them) are written to the lower tiers.
* :meth:`TieredOffloader.restore_prefix` — tiered lookup; blocks found below the host are read
  (verified), promoted into host slots (``prepare_store`` / pool write / ``complete_store``),
  then the whole prefix is restored to the device by the offloader.
* :meth:`TieredOffloader.poll` / :meth:`TieredOffloader.wait` — as the offloader's; under
  write-through each completed host store is written to the lower tiers.
* :meth:`TieredOffloader.take_events` / :meth:`TieredOffloader.stats` — per tier.

Not thread-safe: one engine thread, like the offloader.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kvtier.dataplane.offloader import KVOffloader, OffloadResult
from kvtier.dataplane.transfer import block_id_sequence
from kvtier.tiers.base import BlockTier, TierStats
from kvtier.tiers.stack import TieredLookup, TierEvent, TierStack

if TYPE_CHECKING:  # typing.Self is Python 3.11+; kvtier supports 3.10
    from typing_extensions import Self

__all__ = ["TieredOffloader"]


class TieredOffloader:
    """Host tier (an offloader) plus ``lower`` block tiers, top down.

    Args:
        offloader: the host tier. Build its manager with ``enable_events=True`` to get host
            events. Its pool must be a CPU tensor (it always is: host memory).
        lower: e.g. ``[DiskTier(...), RedisTier(...)]``; each ``block_bytes`` must equal
            ``offloader.pool.block_nbytes``.
        demotion: ``"write-back"`` (host victims go down) or ``"write-through"`` (every
            completed host store goes down).

    Raises:
        TypeError, ValueError: as :class:`~kvtier.tiers.stack.TierStack`.

    Thread safety: none, as :class:`~kvtier.dataplane.KVOffloader`: call it from one thread
    (the engine's); the lower tiers' own threads (disk writers, the Redis writer) never call
    back into it.
    """

    def __init__(self, offloader: KVOffloader, lower: Sequence[BlockTier], *,
                 demotion: str = "write-back") -> None:
        if not isinstance(offloader, KVOffloader):
            raise TypeError(f"offloader must be a KVOffloader, got {type(offloader).__name__}")
        pool = offloader.pool
        # [num_blocks, block_nbytes] uint8 view of the pool: slot bytes without a copy
        self._slots = pool.tensor.view(-1).view(torch.uint8).view(pool.num_blocks, -1).numpy()
        self.offloader = offloader
        self._undelivered: list[OffloadResult] = []  # see _deliver
        self.stack = TierStack(offloader.manager, lower, pool.block_nbytes, self._read_slot,
                               self._write_slot, demotion=demotion)

    def _read_slot(self, slot: int) -> bytes:
        return self._slots[slot].tobytes()

    def _write_slot(self, slot: int, data: Any) -> None:
        self._slots[slot] = memoryview(data).cast("B")

    @property
    def lower(self) -> list[BlockTier]:
        return self.stack.lower

    # -- engine calls ----------------------------------------------------------------------
    def offload(self, keys: Sequence[Hashable], block_ids: Sequence[int],
                req_context: Any = None) -> int | None:
        """``KVOffloader.offload``, then the write-back of the blocks it evicted.

        Raises:
            as ``KVOffloader.offload``, and ``TypeError`` / ``ValueError`` for a key a lower
            tier cannot store (e.g. a tuple, or a disk key over 216 bytes), ``ValueError``
            (disk) / ``RuntimeError`` (Redis) for a lower tier already closed, before
            anything changed: such a block could never be demoted. What the write-back
            raises after the host took the store (``RuntimeError`` for a victim's unreadable
            slot, a lower tier's write error) carries the store's job id as ``job_id``
            (``None`` when the host stored nothing): its copy runs and :meth:`poll` returns
            its result as usual.
        """
        self._check_keys(keys)
        job = None
        try:
            job = self.offloader.offload(keys, block_ids, req_context)
        finally:
            try:
                self.stack.flush_demotions()
            except Exception as exc:
                # the store was taken and its copy runs: the caller still needs its job id
                exc.job_id = job  # type: ignore[attr-defined]
                raise
        return job

    def _check_keys(self, keys: Sequence[Hashable]) -> None:
        """Every lower tier is open and accepts every key (checked before the host stores
        them: a victim a lower tier refuses at demotion time would be lost, and the error
        would replace the offload's job id while its copy runs)."""
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
            raise TypeError(f"keys must be a sequence of block keys, got {type(keys).__name__}")
        for tier in self.stack.lower:
            tier.check_keys(keys)

    def lookup(self, keys: Sequence[Hashable]) -> TieredLookup:
        """Leading blocks available in some tier and where (:meth:`TierStack.lookup`)."""
        return self.stack.lookup(keys)

    def restore_prefix(self, keys: Sequence[Hashable], block_ids: Sequence[int],
                       req_context: Any = None) -> tuple[int, int | None, TieredLookup]:
        """Restore the longest prefix of ``keys`` held by any tier into ``block_ids``.

        Returns:
            ``(n, job_id, found)``: ``keys[:n]`` are being restored into ``block_ids[:n]`` by
            job ``job_id`` (``None`` when ``n == 0``); ``found`` says which tier served each
            run (``n`` may be shorter than ``found.hits``: a block that failed verification
            below, a host without room for the promotion, or fewer ``block_ids``).

        Raises:
            ValueError / TypeError: the offloader is closed, or a block id that a restore of
                ``keys`` may use is out of range, repeated or not an int, or (as
                :meth:`offload`) a lower tier is closed or cannot take one of those keys:
                before anything changed (no lookup counted, nothing promoted).
            as ``KVOffloader.restore`` otherwise (nothing is pinned then; promoted blocks
            stay in the host).
        """
        block_ids = block_id_sequence("block_ids", block_ids)  # ints, a tensor or an array
        keys = list(keys)[: len(block_ids)]
        # before the lookup and the promotion, which evict host blocks and demote them
        self.offloader._check_open()
        self.offloader._check_restore_ids(block_ids, len(keys))
        self._check_keys(keys)  # a lower tier's error would come after the host's lookup
        found = self.stack.lookup(keys)
        try:
            n = self.stack.promote(keys, found)
        finally:
            self.stack.flush_demotions()
        job = self.offloader.restore(keys[:n], list(block_ids[:n]), req_context)
        return n, job, found

    def poll(self) -> list[OffloadResult]:
        """``KVOffloader.poll``; under write-through the completed stores go down.

        Raises:
            RuntimeError: a lower tier's ``write`` raised (e.g. the tier was closed), named
                with its error (:meth:`TierStack.stored`; the other tiers were written): the
                jobs are applied to the host all the same, and the next :meth:`poll` or
                :meth:`wait` returns them (their blocks do not go down to that tier).
        """
        return self._deliver(self.offloader.poll())

    def wait(self, timeout: float | None = None) -> list[OffloadResult]:
        """``KVOffloader.wait``; under write-through the completed stores go down (raises
        as :meth:`poll`)."""
        return self._deliver(self.offloader.wait(timeout))

    def _deliver(self, fresh: list[OffloadResult]) -> list[OffloadResult]:
        """``fresh`` (and results an earlier call could not return) after the write-through
        of ``fresh``'s stores; when that raises, every result is kept for the next call:
        the jobs are applied to the host already, and a caller that never saw a job's
        result would never free its device blocks."""
        results, self._undelivered = self._undelivered, []
        results.extend(fresh)
        try:
            self._stored(fresh)
        except BaseException:
            self._undelivered = results
            raise
        return results

    def _stored(self, results: list[OffloadResult]) -> None:
        keys = [k for r in results if r.kind == "store" and r.ok for k in r.keys]
        if keys:
            self.stack.stored(keys)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the lower tiers' writes (demotions included); ``False`` when ``timeout``
        seconds (for the whole call, :meth:`TierStack.flush`) passed first."""
        return self.stack.flush(timeout)

    def take_events(self) -> list[TierEvent]:
        """Stored/removed events of every tier, with the tier name."""
        return self.stack.take_events()

    def stats(self) -> dict[str, TierStats]:
        """Per-tier counters, top down (``"host"`` first)."""
        return self.stack.stats()

    def close(self, timeout: float | None = None) -> list[OffloadResult]:
        """Finish the host's jobs (write-through applied), then stop the copy thread and
        close the lower tiers, each step also when an earlier one raised.

        Returns:
            the host's finished jobs, as :meth:`wait`, and, when that wait timed out, the
            jobs that finished during the offloader's close (its own wait, as long again;
            write-through applied too, before the lower tiers close). A job still running
            when the copy thread's stop times out is returned by a later :meth:`poll`
            (under write-through that poll raises first, the lower tiers being closed, and
            the next returns it, as :meth:`poll` says).

        Raises:
            what :meth:`wait` raises (its results are kept, as :meth:`poll` says), what
            ``KVOffloader.close`` raises, or the ``RuntimeError`` of
            :meth:`TierStack.close` (a tier that could not be closed or took no pending
            block). When only closing (or the write-through of the jobs that finished
            during the offloader's close) raised, no result taken from the host is lost:
            the error carries them as ``results`` and the next :meth:`poll` returns them
            too.
        """
        results: list[OffloadResult] | None = None
        try:
            results = self.wait(timeout)
        finally:
            try:
                try:
                    # jobs that finished after wait timed out: the offloader's close waits
                    # for them and returns them
                    late = self.offloader.close(timeout)
                    if results is None:  # wait raised: its results wait for the next poll
                        self._undelivered = self._deliver(late)
                    else:
                        results = results + self._deliver(late)
                finally:
                    self.stack.close()
            except BaseException as exc:
                if results is not None:  # taken from the host already: keep them
                    self._undelivered = results + self._undelivered
                    exc.results = list(self._undelivered)  # type: ignore[attr-defined]
                raise
        return results

    def __enter__(self) -> Self:  # a subclass's returns the subclass
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
