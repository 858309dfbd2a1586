"""LRU: evict the least recently used evictable block first.

The classic policy, as in vLLM's ``LRUCachePolicy``, with logical recency: a block's place
changes only when it is used -- stored (:meth:`insert`, the call's ``keys[0]`` ends most
recent), touched, or used by a finished request -- never when a pin is taken or released or
its store completes. Pinned and pending blocks keep their place in the order; eviction passes
over them at O(1) amortized each (:class:`~kvtier.policies.order.LogicalOrder`).

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: they move to the MRU end (pinned or not), ``keys[0]`` most recent.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvtier.policies.base import CachePolicy, Key
from kvtier.policies.order import LogicalOrder


class LRUPolicy(CachePolicy):
    """Least-recently-used eviction, logical recency.

    State: ``_order``, a :class:`~kvtier.policies.order.LogicalOrder` of every resident key,
    least recent first (pinned and pending ones held in place). Every hook is O(1) per key;
    :meth:`evict` is O(k + protected keys skipped) amortized.
    """

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order = LogicalOrder()
        self._orders = (self._order,)

    def insert(self, keys: Sequence[Key]) -> None:
        # a plain loop: OrderedDict.update goes through the generic mapping protocol, slower
        live = self._order.live
        for key in reversed(keys):
            live[key] = None
        self._order.held.update(keys)

    def remove(self, keys: Sequence[Key]) -> None:
        discard = self._order.discard
        for key in keys:
            discard(key)

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        order = self._order
        if order.aside:
            order.release(keys)
        else:  # nothing set aside: only the held flags change (one C-level set operation)
            order.held.difference_update(keys)

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        self._order.held.update(keys)

    def touch(self, keys: Sequence[Key]) -> None:
        order = self._order
        live, aside = order.live, order.aside
        for key in reversed(keys):
            if key in live:
                live.move_to_end(key)
            elif aside and key in aside:
                order.use(key)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        order = self._order
        if n == 1 and not order.aside and not protected:  # no heap entry is current
            # the usual one-key store, inline: the LRU end, unless held (then LogicalOrder.take)
            live = order.live
            key = next(iter(live))
            if key not in order.held:
                del live[key]
                self.examined += 1
                return [key]
        victims, examined = order.take(n, protected)
        self.examined += examined
        return victims

    def snapshot(self) -> dict:
        return {"order": self._order.keys(), "held": set(self._order.held)}

    def clear(self) -> None:
        self._order.clear()
        self.examined = 0
