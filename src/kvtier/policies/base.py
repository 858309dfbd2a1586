"""The cache-policy contract every eviction policy implements.

A policy only *orders* blocks and *chooses victims*. The :class:`~kvtier.OffloadingManager`
owns everything else: the key -> slot map, ref counts, the free-slot list, admission, events
and statistics. The manager tells the policy about every state change of a block through the
methods below, so a policy never has to scan the cache to find out what may be evicted.

Block life cycle, as the policy sees it::

    insert(key, slot)            -> resident, pending (store in flight), NOT evictable
    block_evictable(key, slot)   -> store completed, or last pin released: evictable,
                                    re-enters its list at the most-recently-used (MRU) end
    block_unevictable(key)       -> pinned by a load (ref count 0 -> 1): leaves the eviction
                                    order but keeps its list membership (T1/T2, queue, ...)
    remove(key)                  -> dropped without eviction (failed store); no ghost entry
    evict(n, protected)          -> n evictable, unprotected blocks leave, chosen by the policy

Rules every policy keeps (tested on every registered policy by ``tests/policies``):

* The eviction order is kept over **evictable blocks only**. Evicting k blocks therefore costs
  O(k + protected keys skipped), whatever the cache size and however many blocks are pinned or
  pending. Each internal list is walked at most once per :meth:`evict` call; the number of
  entries examined is added to :attr:`CachePolicy.visited` so tests can prove it.
* :meth:`evict` is atomic: it returns ``None`` and changes nothing (order, ghost lists,
  adaptive target) when it cannot find ``n`` victims.
* A call that names several keys (:meth:`touch`, and the manager's ``complete_load`` /
  ``complete_store`` which call :meth:`block_evictable` per key) applies them in reverse, so the
  call's first key ends up most recently used: a request names its blocks head first, and a
  prefix's head should outlive its tail.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import ClassVar

Key = Hashable


def protected_set(protected: Collection[Key]) -> Collection[Key]:
    """``protected`` as a collection with O(1) membership, each key once (copied only when it
    is not already a set, frozenset or dict)."""
    if isinstance(protected, (set, frozenset, dict)):
        return protected
    return set(protected)


def count_eligible(protected: Collection[Key], *orders: Collection[Key]) -> int:
    """Blocks in the disjoint evictable ``orders`` that are not protected: what an
    :meth:`CachePolicy.evict` may take. O(len(protected)), whatever the orders' sizes.

    ``protected`` must name each key once (see :func:`protected_set`).
    """
    eligible = sum(map(len, orders))
    for key in protected:
        for order in orders:
            if key in order:
                eligible -= 1
                break
    return eligible


class CachePolicy(ABC):
    """Abstract eviction policy over the blocks of one offloaded tier.

    Args:
        capacity: the tier's size in blocks (>= 1). Policies that keep ghost lists or
            adaptive targets size them from it.

    Raises:
        ValueError: ``capacity`` is not a positive int.

    Attributes:
        name: the registry name (``"lru"``, ``"arc"``, ...), set by each subclass.
        capacity: the tier's size in blocks.
        visited: running count of entries examined by :meth:`evict` (victims and skipped
            protected keys). Tests use it to check the O(k) bound; it is never reset except by
            :meth:`clear`.
    """

    name: ClassVar[str] = ""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int (blocks), got {capacity!r}")
        self.capacity = capacity
        self.visited = 0

    # -- queries -------------------------------------------------------------------------
    @abstractmethod
    def get(self, key: Key) -> int | None:
        """Return the slot of ``key`` if it is resident (any state), else ``None``."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident blocks (pending, pinned and evictable)."""

    # -- state changes the manager reports -----------------------------------------------
    @abstractmethod
    def insert(self, key: Key, slot: int) -> None:
        """A new block was allocated ``slot``; its store is in flight (pending, not evictable).

        The manager never inserts a key that is already resident.
        """

    def insert_many(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        """Batch form of :meth:`insert`, in order (the manager calls this one).

        The default calls :meth:`insert` per key; policies override it when a batch is cheaper.
        """
        insert = self.insert
        for key, slot in zip(keys, slots):
            insert(key, slot)

    def blocks_evictable(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        """Batch form of :meth:`block_evictable`, applied in the given order (the last key
        ends most recent). The manager passes a call's keys already reversed."""
        evictable = self.block_evictable
        for key, slot in zip(keys, slots):
            evictable(key, slot)

    def blocks_unevictable(self, keys: Sequence[Key]) -> None:
        """Batch form of :meth:`block_unevictable` (keys distinct)."""
        unevictable = self.block_unevictable
        for key in keys:
            unevictable(key)

    @abstractmethod
    def remove(self, key: Key) -> None:
        """Drop a resident, non-evictable block without evicting it (its store failed).

        No ghost entry is recorded: the block was never readable.
        """

    @abstractmethod
    def block_evictable(self, key: Key, slot: int) -> None:
        """``key`` became ready with ref count 0: it enters its list's MRU end."""

    @abstractmethod
    def block_unevictable(self, key: Key) -> None:
        """``key`` was pinned (ref count 0 -> 1): it leaves the eviction order."""

    @abstractmethod
    def touch(self, keys: Sequence[Key]) -> None:
        """Record a use of ``keys``, applied in reverse so ``keys[0]`` ends most recent.

        Keys that are not resident are ignored (policies with ghost lists may learn from
        them). Pending and pinned blocks may be touched.
        """

    def share_state(self, resident: Mapping[Key, int], pending: Collection[Key]) -> None:
        """The manager hands over its live key -> slot map of resident blocks and its live
        collection of pending keys, both read-only for the policy.

        Called by :class:`~kvtier.OffloadingManager` after it builds the policy and after each
        ``reset_cache``. The manager adds a key to both before :meth:`insert` /
        :meth:`insert_many`; discards it from ``pending`` before :meth:`block_evictable` /
        :meth:`blocks_evictable` / :meth:`remove` (and from ``resident`` before
        :meth:`remove`); and deletes :meth:`evict`'s victims from ``resident`` after the call
        returns. A policy may read them instead of keeping its own copies (one dict insert and
        delete per stored block saved). The default ignores them; a policy used without a
        manager is never called and keeps its own bookkeeping.
        """

    def on_store(self, keys: Sequence[Key]) -> None:
        """Called after each *successful* ``prepare_store`` with the call's full key list.

        ``keys`` is in the caller's order (head of the request first) and includes keys that
        were already resident. Order-agnostic policies ignore it (this default); prefix-aware
        policies learn parent -> child links from it.
        """

    @abstractmethod
    def evict(
        self, n: int, protected: Collection[Key]
    ) -> list[tuple[Key, int]] | None:
        """Choose and remove ``n`` evictable blocks not in ``protected``.

        Args:
            n: number of victims wanted (>= 1).
            protected: keys that must not be evicted: the keys named in the current
                ``prepare_store`` call that are already resident (the others cannot be victims
                anyway, so the manager leaves them out; usually it passes an empty
                collection). Pinned and pending blocks are never candidates.

        Returns:
            ``[(key, slot), ...]`` in eviction order, or ``None`` (and no state changed) if
            fewer than ``n`` eligible blocks exist.
        """

    @abstractmethod
    def snapshot(self) -> dict:
        """A comparable copy of the whole policy state (orders, ghost lists, targets).

        For tests and debugging: two snapshots are ``==`` exactly when the policy would behave
        the same from here on. Costs O(resident + ghost entries).
        """

    @abstractmethod
    def clear(self) -> None:
        """Forget every block, ghost entry and adaptive state (``reset_cache``)."""
