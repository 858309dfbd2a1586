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

    def insert_many(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        self._held.update(zip(keys, slots))

    def remove(self, key: Key) -> None:
        if self._held.pop(key, None) is None:
            self._order.pop(key, None)

    def block_evictable(self, key: Key, slot: int) -> None:
        self._held.pop(key, None)
        self._order[key] = slot

    def blocks_evictable(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        # a plain loop: OrderedDict.update goes through the generic mapping protocol, slower
        held_pop, order = self._held.pop, self._order
        for key, slot in zip(keys, slots):
            held_pop(key, None)
            order[key] = slot

    def block_unevictable(self, key: Key) -> None:
        self._held[key] = self._order.pop(key)

    def blocks_unevictable(self, keys: Sequence[Key]) -> None:
        held, order_pop = self._held, self._order.pop
        for key in keys:
            held[key] = order_pop(key)

    def touch(self, keys: Sequence[Key]) -> None:
        order = self._order
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)

    def evict(self, n: int, protected: Collection[Key]) -> list[tuple[Key, int]] | None:
        # Pop from the LRU end. Protected keys popped on the way go back to the front in their
        # order afterwards; on failure every popped block goes back, so nothing changes.
        order = self._order
        popitem = order.popitem
        if n == 1 and order:  # the common single-victim case
            item = popitem(last=False)
            if item[0] not in protected:
                self.visited += 1
                return [item]
            order[item[0]] = item[1]
            order.move_to_end(item[0], last=False)
        popped = [popitem(last=False) for _ in range(min(n, len(order)))]
        if protected and any(key in protected for key, _ in popped):
            victims = [item for item in popped if item[0] not in protected]
            while len(victims) < n and order:
                item = popitem(last=False)
                popped.append(item)
                if item[0] not in protected:
                    victims.append(item)
        else:
            victims = popped
        self.visited += len(popped)
        ok = len(victims) == n
        if len(popped) != len(victims) or not ok:
            restore = popped if not ok else [it for it in popped if it[0] in protected]
            move_to_end = order.move_to_end
            for key, slot in reversed(restore):
                order[key] = slot
                move_to_end(key, last=False)
        return victims if ok else None

    def snapshot(self) -> dict:
        return {"order": list(self._order.items()), "held": dict(self._held)}

    def clear(self) -> None:
        self._order.clear()
        self._held.clear()
        self.visited = 0
