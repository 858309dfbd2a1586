"""LRU: evict the least recently used evictable block first.

The classic policy, as in vLLM's ``LRUCachePolicy``, but the order holds evictable blocks only:
pinned and pending blocks wait outside it and re-enter at the most-recently-used end when they
become evictable again, so eviction never walks past them.

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: its evictable keys move to the MRU end, ``keys[0]`` most recent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from itertools import islice

from kvtier.policies.base import CachePolicy, Key


class LRUPolicy(CachePolicy):
    """Least-recently-used eviction over evictable blocks.

    State: ``_order``, the evictable keys, least recent first (an ``OrderedDict`` whose values
    are unused). Every hook is O(1) per key; :meth:`evict` is O(k + protected keys skipped).
    """

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Key, None] = OrderedDict()
        self._orders = (self._order,)

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        # a plain loop: OrderedDict.update goes through the generic mapping protocol, slower
        order = self._order
        for key in reversed(keys):
            order[key] = None

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        order = self._order
        for key in keys:
            del order[key]

    def touch(self, keys: Sequence[Key]) -> None:
        order = self._order
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        order = self._order
        if protected:  # select from the LRU end, passing over protected keys
            victims = []
            examined = 0
            for key in order:
                examined += 1
                if key not in protected:
                    victims.append(key)
                    if len(victims) == n:
                        break
        else:
            victims = list(islice(order, n))
            examined = n
        for key in victims:  # commit
            del order[key]
        self.examined += examined
        return victims

    def snapshot(self) -> dict:
        return {"order": list(self._order)}

    def clear(self) -> None:
        self._order.clear()
        self.examined = 0
