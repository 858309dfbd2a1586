"""LRU: evict the least recently used evictable block first.

The classic policy, as in vLLM's ``LRUCachePolicy``, but the order holds evictable blocks only:
pinned and pending blocks wait outside it and re-enter at the most-recently-used end when they
become evictable again, so eviction never walks past them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

from kvtier.policies.base import CachePolicy, Key


class LRUPolicy(CachePolicy):
    """Least-recently-used eviction over evictable blocks.

    State: ``_order`` (evictable key -> slot, least recent first) and ``_resident`` (key ->
    slot of every resident block: the manager's own map when shared, see
    :meth:`~kvtier.policies.base.CachePolicy.share_state`). Every operation is O(1) per key;
    :meth:`evict` is O(k + protected keys skipped).
    """

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Key, int] = OrderedDict()
        self._resident: Mapping[Key, int] = {}
        self._own_state = True

    def get(self, key: Key) -> int | None:
        return self._resident.get(key)

    def __len__(self) -> int:
        return len(self._resident)

    def share_state(self, resident: Mapping[Key, int], pending: Collection[Key]) -> None:
        self._resident = resident
        self._own_state = False

    def insert(self, key: Key, slot: int) -> None:
        if self._own_state:
            self._resident[key] = slot  # type: ignore[index]

    def insert_many(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        if self._own_state:
            self._resident.update(zip(keys, slots))  # type: ignore[attr-defined]

    def remove(self, key: Key) -> None:
        if self._own_state:
            self._resident.pop(key, None)  # type: ignore[attr-defined]
        self._order.pop(key, None)

    def block_evictable(self, key: Key, slot: int) -> None:
        self._order[key] = slot

    def blocks_evictable(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        # a plain loop: OrderedDict.update goes through the generic mapping protocol, slower
        order = self._order
        for key, slot in zip(keys, slots):
            order[key] = slot

    def block_unevictable(self, key: Key) -> None:
        del self._order[key]

    def blocks_unevictable(self, keys: Sequence[Key]) -> None:
        order = self._order
        for key in keys:
            del order[key]

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
            item = popitem(False)  # positional: no keyword parsing per call
            if item[0] not in protected:
                self.visited += 1
                if self._own_state:
                    del self._resident[item[0]]  # type: ignore[attr-defined]
                return [item]
            order[item[0]] = item[1]
            order.move_to_end(item[0], last=False)
        available = len(order)
        popped = [popitem(False) for _ in range(n if n < available else available)]
        if protected and any(key in protected for key, _ in popped):
            victims = [item for item in popped if item[0] not in protected]
            while len(victims) < n and order:
                item = popitem(False)
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
        if not ok:
            return None
        if self._own_state:
            resident = self._resident
            for key, _ in victims:
                del resident[key]  # type: ignore[attr-defined]
        return victims

    def snapshot(self) -> dict:
        order = self._order
        held = {key: slot for key, slot in self._resident.items() if key not in order}
        return {"order": list(order.items()), "held": held}

    def clear(self) -> None:
        self._order.clear()
        if self._own_state:  # a shared map is the manager's to reset
            self._resident.clear()  # type: ignore[attr-defined]
        self.visited = 0
