"""KVOffloader: the per-step glue between an inference engine, the manager and the copies.

An engine calls, on its own thread:

* :meth:`KVOffloader.offload` — "offload these blocks of this request": ``prepare_store`` then
  ``submit_store``; the store is completed (``complete_store``) when the copy finishes.
* :meth:`KVOffloader.lookup` / :meth:`KVOffloader.restore` (or both at once,
  :meth:`KVOffloader.restore_prefix`) — "how many leading blocks can you restore? restore them
  into these device blocks": ``lookup_prefix`` then ``prepare_load`` + ``submit_load``; the
  pins are released (``complete_load``) when the copy finishes.
* :meth:`KVOffloader.poll` each step (or :meth:`KVOffloader.wait`) — collects finished jobs
  and applies them to the manager.

Every pin and every pending store is released on every path: a failed copy
(``complete_store(success=False)`` / ``complete_load``), a submit that raises, and
:meth:`KVOffloader.reset_cache` with jobs in flight (it lets them finish first, since a copy
cannot be stopped half-way, then empties the tier).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from kvtier.dataplane.pool import HostBlockPool
from kvtier.dataplane.transfer import (
    LOAD,
    STORE,
    TransferEngine,
    TransferResult,
    _as_id_list,
    block_id_sequence,
)
from kvtier.manager import OffloadingManager

if TYPE_CHECKING:  # typing.Self is Python 3.11+; kvtier supports 3.10
    from typing_extensions import Self

__all__ = ["KVOffloader", "OffloadResult"]


class OffloadResult(NamedTuple):
    """A finished offload or restore job, as returned by :meth:`KVOffloader.poll`.

    Attributes:
        job_id: the int returned by :meth:`KVOffloader.offload` / :meth:`KVOffloader.restore`.
        kind: ``"store"`` (device -> tier) or ``"load"`` (tier -> device).
        ok: store: the blocks are readable in the tier; load: the device blocks hold the
            restored bytes. ``False`` when a copy failed (the device blocks of a failed load
            hold unspecified bytes: recompute them) or, for a store, when
            :meth:`KVOffloader.reset_cache` dropped the blocks.
        keys: the block keys of the job (for a store, only the keys that were copied).
    """

    job_id: int
    kind: str
    ok: bool
    keys: list[Hashable]


class KVOffloader:
    """Moves an engine's KV blocks to and from the offloaded tier.

    Args:
        manager: the tier's bookkeeping; its ``num_blocks`` must equal ``engine.pool``'s.
        engine: the transfer engine bound to the engine's KV cache and the host pool.

    Raises:
        TypeError: wrong argument types.
        ValueError: the manager and the pool disagree on the number of blocks.

    The offloader owns the manager's load pins and pending stores it creates; do not call
    ``complete_store`` / ``complete_load`` on the manager for its jobs. Not thread-safe: call
    it from one thread (the transfer engine's worker never touches the manager). Use it as a
    context manager (``with KVOffloader.create(...) as off:``): leaving the block, also by an
    exception, waits for the copies in flight, applies them and stops the copy thread. A
    program that exits without closing it keeps its exit status: the copy thread is stopped
    at interpreter exit (see :meth:`TransferEngine.close`).

    Example::

        with KVOffloader.create(kv_caches, num_blocks=4096) as off:  # per-layer tensors
            job = off.offload(block_hashes, device_block_ids)     # after a request's prefill
            n, job = off.restore_prefix(new_hashes, free_ids)     # a new request
            for r in off.wait():                                  # or off.poll() each step
                ...                                               # r.job_id, r.kind, r.ok
    """

    def __init__(self, manager: OffloadingManager, engine: TransferEngine) -> None:
        if not isinstance(manager, OffloadingManager):
            raise TypeError(f"manager must be an OffloadingManager, got {type(manager).__name__}")
        if not isinstance(engine, TransferEngine):
            raise TypeError(f"engine must be a TransferEngine, got {type(engine).__name__}")
        if manager.num_blocks != engine.pool.num_blocks:
            raise ValueError(
                f"manager.num_blocks ({manager.num_blocks}) != pool.num_blocks "
                f"({engine.pool.num_blocks}): every manager slot needs a pool block"
            )
        self.manager = manager
        self.engine = engine
        self._ids = itertools.count()
        self._jobs: dict[int, tuple[str, list[Hashable]]] = {}
        self._stashed: list[OffloadResult] = []
        #: new blocks (each once per call) whose store was refused because the tier was full
        #: of pinned/pending blocks
        self.refused_blocks = 0

    @classmethod
    def create(
        cls,
        kv_caches: torch.Tensor | Sequence[torch.Tensor],
        num_blocks: int,
        policy: Any = "lru",
        *,
        pin_memory: bool | None = None,
        staging_bytes: int = 32 * 2**20,
        max_bytes: int | None = None,
        **manager_kwargs: Any,
    ) -> KVOffloader:
        """Build the pool, the manager and the transfer engine for ``kv_caches``.

        The pool's ``block_shape`` is ``kv_caches.shape[1:]`` for one tensor, or
        ``[len(kv_caches), *kv_caches[0].shape[1:]]`` for several; its dtype is theirs.

        Args:
            kv_caches: see :class:`TransferEngine`.
            num_blocks: tier capacity in blocks (pool slots).
            policy, manager_kwargs: passed to :class:`~kvtier.OffloadingManager`.
            pin_memory, max_bytes: passed to :class:`HostBlockPool`.
            staging_bytes: passed to :class:`TransferEngine`.

        Raises:
            ValueError, TypeError, PoolAllocationError: from the three constructors.
        """
        if isinstance(kv_caches, torch.Tensor):
            first, block_shape = kv_caches, list(kv_caches.shape[1:])
        else:
            tensors = list(kv_caches)
            if not tensors or not isinstance(tensors[0], torch.Tensor):
                raise TypeError("kv_caches must be a tensor or a non-empty sequence of tensors")
            first, block_shape = tensors[0], [len(tensors), *tensors[0].shape[1:]]
        manager = OffloadingManager(num_blocks, policy, **manager_kwargs)
        pool = HostBlockPool(
            num_blocks, block_shape, first.dtype, pin_memory=pin_memory, max_bytes=max_bytes
        )
        engine = TransferEngine(kv_caches, pool, staging_bytes=staging_bytes)
        return cls(manager, engine)

    @property
    def pool(self) -> HostBlockPool:
        """The host block pool."""
        return self.engine.pool

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet returned by :meth:`poll`."""
        return len(self._jobs)

    # -- store path ------------------------------------------------------------------------
    def offload(
        self, keys: Sequence[Hashable], block_ids: Sequence[int], req_context: Any = None
    ) -> int | None:
        """Offload device blocks ``block_ids`` holding the blocks ``keys``.

        Keys already in the tier (ready or pending) are not copied again. The device blocks
        must stay untouched until the job is returned by :meth:`poll` (the copy reads them).

        Args:
            keys: block keys (e.g. chained block hashes), one per device block.
            block_ids: engine block ids, ``0 <= id < num_device_blocks``, same length.

        Returns:
            The job id, or ``None`` when nothing is copied: every key is already in the tier,
            or the tier cannot make room (too many pinned/pending blocks; counted in
            :attr:`refused_blocks`). With ``None`` the device blocks are free at once.

        Raises:
            ValueError: lengths differ, a block id is out of range, or the transfer engine is
                closed (nothing changed).
            TypeError: a key is not hashable or an id is not an int (nothing changed).
            Any error of ``engine.submit_store``: the new blocks are dropped again
                (``complete_store(success=False)``); blocks evicted to make room stay evicted.
        """
        ids = self._check_pairs(keys, block_ids)
        out = self.manager.prepare_store(keys, req_context)
        if out is None:  # nothing changed: the blocks refused are the call's new ones
            self.refused_blocks += len(set(self.manager.missing(keys)))
            return None
        if not out.keys_to_store:
            return None
        block_of: dict[Hashable, int] = {}
        for key, b in zip(keys, ids, strict=True):  # same length: _check_pairs
            block_of.setdefault(key, b)
        src = [block_of[key] for key in out.keys_to_store]
        job_id = next(self._ids)
        try:
            self.engine.submit_store(job_id, src, out.block_ids)
        except BaseException:
            self.manager.complete_store(out.keys_to_store, success=False)
            raise
        self._jobs[job_id] = (STORE, list(out.keys_to_store))
        return job_id

    # -- load path -------------------------------------------------------------------------
    def lookup(self, keys: Sequence[Hashable], req_context: Any = None) -> int:
        """How many leading ``keys`` can be restored now (``manager.lookup_prefix``)."""
        return self.manager.lookup_prefix(keys, req_context)

    def restore(
        self, keys: Sequence[Hashable], block_ids: Sequence[int], req_context: Any = None
    ) -> int | None:
        """Copy the stored blocks ``keys`` into device blocks ``block_ids``.

        The blocks are pinned in the tier (cannot be evicted) until the job is returned by
        :meth:`poll`; only then do the device blocks hold the bytes.

        Args:
            keys: keys of ready blocks (see :meth:`lookup`).
            block_ids: engine block ids to write, pairwise distinct, same length.

        Returns:
            The job id, or ``None`` when ``keys`` is empty.

        Raises:
            BlockStateError: a key is not stored or its store is in flight (nothing pinned).
            ValueError: lengths differ, a block id is out of range or repeated, or the
                transfer engine is closed (nothing changed).
            TypeError: a key is not hashable or an id is not an int.
        """
        ids = self._check_pairs(keys, block_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"block_ids {list(ids)} repeat a block: destinations must be distinct")
        if not ids:
            return None
        slots = self.manager.prepare_load(keys, req_context)
        job_id = next(self._ids)
        try:
            self.engine.submit_load(job_id, slots, ids)
        except BaseException:
            self.manager.complete_load(keys)
            raise
        self._jobs[job_id] = (LOAD, list(keys))
        return job_id

    def restore_prefix(
        self, keys: Sequence[Hashable], block_ids: Sequence[int], req_context: Any = None
    ) -> tuple[int, int | None]:
        """Restore the longest restorable prefix of ``keys`` into the leading ``block_ids``.

        Args:
            keys: the request's block keys, in order (any iterable; a generator is read
                once, before the lookup).
            block_ids: device blocks to fill (ints, or a 1-D integer tensor or numpy array);
                at most ``len(block_ids)`` blocks are restored.

        Returns:
            ``(n, job_id)``: ``n`` blocks (``keys[:n]`` into ``block_ids[:n]``) are being
            restored by job ``job_id`` (``None`` when ``n == 0``).

        Raises:
            as :meth:`restore`.
        """
        self._check_open()  # before the lookup, which counts in the manager's stats
        block_ids = block_id_sequence("block_ids", block_ids)
        if isinstance(keys, (str, bytes)):
            raise TypeError(f"keys must be an iterable of block keys, got {type(keys).__name__}")
        if not isinstance(keys, Sequence):  # a generator: read it once, before the lookup
            try:
                keys = list(keys)
            except TypeError:
                raise TypeError(
                    f"keys must be an iterable of block keys, got {type(keys).__name__}"
                ) from None
        self._check_restore_ids(block_ids, len(keys))  # before the lookup counts
        n = min(self.lookup(keys, req_context), len(block_ids))
        return n, self.restore(list(keys[:n]), list(block_ids[:n]), req_context)

    # -- completion ------------------------------------------------------------------------
    def poll(self) -> list[OffloadResult]:
        """Apply the finished jobs to the manager and return them (never blocks).

        A finished store calls ``complete_store(keys, success=ok)``; a finished load calls
        ``complete_load(keys)`` whatever its outcome.
        """
        results, self._stashed = self._stashed, []
        results.extend(self._apply(self.engine.poll()))
        return results

    def wait(self, timeout: float | None = None) -> list[OffloadResult]:
        """Wait for every job in flight (at most ``timeout`` seconds), then :meth:`poll`."""
        self.engine.wait(timeout)
        return self.poll()

    def _apply(self, finished: list[TransferResult]) -> list[OffloadResult]:
        out: list[OffloadResult] = []
        for job_id, ok in finished:
            kind, keys = self._jobs.pop(job_id)
            if kind == STORE:
                self.manager.complete_store(keys, success=ok)
            else:
                self.manager.complete_load(keys)
            out.append(OffloadResult(job_id, kind, ok, keys))
        return out

    def reset_cache(self, timeout: float | None = None) -> None:
        """Empty the tier, also with jobs in flight.

        Copies cannot be stopped half-way, so this waits for the jobs in flight, applies them
        (releasing their pins and pending stores), then calls ``manager.reset_cache()``. The
        finished jobs are returned by the next :meth:`poll`, stores with ``ok=False`` (their
        blocks are gone), loads with their copy's outcome.

        Raises:
            TimeoutError: the jobs did not finish within ``timeout`` seconds; nothing was
                reset (the jobs keep running and are reported by :meth:`poll` as usual).
        """
        if not self.engine.wait(timeout):
            raise TimeoutError(
                f"reset_cache: {self.engine.in_flight} transfer jobs still running after "
                f"{timeout} s; the tier was not reset"
            )
        applied = self._apply(self.engine.poll())
        self._stashed.extend(
            r._replace(ok=False) if r.kind == STORE else r for r in applied
        )
        self.manager.reset_cache()

    def close(self, timeout: float | None = None) -> list[OffloadResult]:
        """Wait for the jobs in flight, apply them, stop the transfer engine; returns them."""
        results = self.wait(timeout)
        self.engine.close(timeout)
        return results

    def __enter__(self) -> Self:  # a subclass's returns the subclass
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.engine.closed:
            raise ValueError("the offloader's transfer engine is closed: no job is accepted")

    def _check_restore_ids(self, block_ids: Sequence[int], count: int) -> None:
        """The ``block_ids`` a restore of ``count`` keys may use are ints in range and
        distinct (checked before a lookup or a promotion changes anything)."""
        ids = _as_id_list("block_ids", list(block_ids[:count]), self.engine.num_device_blocks,
                          "engine block id")
        if len(set(ids)) != len(ids):
            raise ValueError(f"block_ids {ids} repeat a block: destinations must be distinct")

    def _check_pairs(self, keys: Sequence[Hashable], block_ids: Sequence[int]) -> list[int]:
        self._check_open()  # before the manager is asked: a store might evict
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
            raise TypeError(f"keys must be a sequence of block keys, got {type(keys).__name__}")
        ids = _as_id_list("block_ids", block_ids, self.engine.num_device_blocks, "engine block id")
        if len(ids) != len(keys):
            raise ValueError(
                f"{len(keys)} keys but {len(ids)} block_ids: one device block per key"
            )
        for key in keys:
            try:
                hash(key)
            except TypeError:
                raise TypeError(f"block key {key!r} is not hashable") from None
        return ids
