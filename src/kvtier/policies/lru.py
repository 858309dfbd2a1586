"""LRU: evict the least recently used evictable block first.

The classic policy, as in vLLM's ``LRUCachePolicy``, but the order holds evictable blocks only:
pinned and pending blocks wait outside it and re-enter at the most-recently-used end when they
become evictable again, so eviction never walks past them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvtier.policies.base import CachePolicy, Key


class LRUPolicy(CachePolicy):
    """Least-recently-used eviction over evictable blocks.

    State: ``_order`` (evictable key -> slot, least recent first) and ``_held`` (pending or
    pinned key -> slot). Every operation is O(1) per key; :meth:`evict` is O(k + protected
    keys skipped).
    """

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Key, int] = OrderedDict()
        self._held: dict[Key, int] = {}

    def get(self, key: Key) -> int | None:
        slot = self._order.get(key)
        return self._held.get(key) if slot is None else slot

    def __len__(self) -> int:
        return len(self._order) + len(self._held)

    def insert(self, key: Key, slot: int) -> None:
        self._held[key] = slot

    def remove(self, key: Key) -> None:
        if self._held.pop(key, None) is None:
            self._order.pop(key, None)

    def block_evictable(self, key: Key, slot: int) -> None:
        self._held.pop(key, None)
        self._order[key] = slot

    def block_unevictable(self, key: Key) -> None:
        self._held[key] = self._order.pop(key)

    def touch(self, keys: Sequence[Key]) -> None:
        order = self._order
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)

    def evict(self, n: int, protected: Collection[Key]) -> list[tuple[Key, int]] | None:
        victims: list[tuple[Key, int]] = []
        visited = 0
        for item in self._order.items():
            visited += 1
            if item[0] in protected:
                continue
            victims.append(item)
            if len(victims) == n:
                break
        self.visited += visited
        if len(victims) < n:
            return None
        order = self._order
        for key, _ in victims:
            del order[key]
        return victims

    def snapshot(self) -> dict:
        return {"order": list(self._order.items()), "held": dict(self._held)}

    def clear(self) -> None:
        self._order.clear()
        self._held.clear()
        self.visited = 0
