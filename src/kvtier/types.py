"""Value types returned by the :class:`~kvtier.OffloadingManager`."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple


class LookupResult(enum.Enum):
    """Answer of :meth:`OffloadingManager.lookup` for one block key."""

    MISS = 0
    """Not stored in the tier."""
    HIT = 1
    """Stored and readable (its store completed)."""
    HIT_PENDING = 2
    """Stored, but its write is still in flight: not readable yet."""


class PrepareStoreOutput(NamedTuple):
    """Result of a successful :meth:`OffloadingManager.prepare_store`.

    Attributes:
        keys_to_store: keys that were allocated a slot, in the call's order (keys already
            stored, duplicates and keys refused by admission are left out).
        block_ids: the slot id (0 <= id < num_blocks) of each key in ``keys_to_store``; the
            caller writes the block's bytes there, then calls ``complete_store``.
        evicted_keys: keys evicted to make room, in eviction order.

    The three lists are fresh objects, the caller's to change: nothing in the manager or its
    events refers to them.
    """

    keys_to_store: list[Hashable]
    block_ids: list[int]
    evicted_keys: list[Hashable]


class OffloadingEvent(NamedTuple):
    """A change in which blocks the tier holds, for an engine's KV-cache event stream.

    Attributes:
        keys: the blocks concerned, in the order of the call that produced the event: a
            tuple of the event's own, so nothing a caller does to a returned list (e.g.
            :attr:`PrepareStoreOutput.evicted_keys`) changes it.
        removed: ``True`` when the blocks were evicted, ``False`` when they became readable.
    """

    keys: tuple[Hashable, ...]
    removed: bool


@dataclass(frozen=True)
class ManagerStats:
    """Snapshot of the manager's counters (since creation or ``reset_cache``) and block counts.

    Counters: ``lookups`` (keys looked up), ``hits`` (HIT), ``pending_hits`` (HIT_PENDING),
    ``misses``, ``stores`` (blocks allocated by prepare_store), ``completed_stores``,
    ``failed_stores`` (blocks whose store completed with success=False), ``skipped_stores``
    (keys refused by admission), ``evictions`` (blocks), ``loads`` (pins taken).
    Block counts: ``used`` = pending + ready; ``pinned`` (ready, ref count > 0),
    ``evictable`` (ready, ref count 0), ``free`` = num_blocks - used.
    Request mode (docs/manager.md): ``requests_open`` (requests open now),
    ``requests_finished`` (uses applied, early ones included), ``requests_finished_early``
    (finished by the ``max_open_requests`` cap), ``late_finishes`` (finishes of a request
    already finished early, ignored).
    """

    num_blocks: int
    lookups: int
    hits: int
    pending_hits: int
    misses: int
    stores: int
    completed_stores: int
    failed_stores: int
    skipped_stores: int
    evictions: int
    loads: int
    used: int
    pending: int
    pinned: int
    evictable: int
    free: int
    requests_open: int = 0
    requests_finished: int = 0
    requests_finished_early: int = 0
    late_finishes: int = 0

    @property
    def hit_ratio(self) -> float:
        """HIT lookups / lookups (0.0 when nothing was looked up)."""
        return self.hits / self.lookups if self.lookups else 0.0
