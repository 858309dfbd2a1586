"""LFU with dynamic aging, O(1) per operation: frequency buckets, ties broken by recency.

Sources: the O(1) bucket structure of K. Shah, A. Mitra, D. Matani, "An O(1) algorithm for
implementing the LFU cache eviction scheme" (2010); the aging rule of LFU with Dynamic Aging,
M. Arlitt, L. Cherkasova, J. Dilley, R. Friedrich, T. Jin, "Evaluating content management
techniques for Web proxy caches" (HP Labs / WISP, 1999), with unit size and cost.

Each block has an integer priority ``K``. The cache keeps a *floor* ``L``: the priority of the
last victim (0 at first).

* A new block gets ``K = L + 1`` (one use, counted from the current floor).
* A touch adds one: ``K = K + 1``.
* Eviction takes the lowest ``K``; among equal ``K`` the least recently used (each bucket is an
  LRU list). ``L`` becomes the victim's ``K``.

This is the aging: every eviction that empties the lowest bucket raises ``L``, so a block that
was popular long ago but is no longer touched is caught up by the floor, while a new block
starts at the floor rather than at zero -- old counts fade instead of pinning a block forever
(plain LFU's known failure). It differs from LFU-DA's ``K = L + frequency`` on a hit (which
re-bases a block on the current floor and can jump any number of buckets) in adding one to the
block's own ``K``: a hit moves a block to the next bucket only, which is what keeps every
operation O(1).

The structure: ``WINDOW`` (256) buckets used as a ring, bucket ``K mod 256``, plus one int whose
bits say which buckets are non-empty. Every evictable ``K`` lies in ``[L, L + 255]``: the floor
is the minimum by construction, and ``K`` saturates at ``L + 255`` (an 8-bit counter above the
floor, like Redis's LFU counter). Finding the lowest non-empty bucket is a rotate and a
lowest-set-bit on a 256-bit int, O(1).

How it maps to the offloading contract:

* Buckets hold **evictable blocks only**. A pending or pinned block keeps its ``K`` outside
  them; a touch still adds one. When it becomes evictable (:meth:`block_evictable`) it enters
  the most recent end of bucket ``max(K, L)`` -- a block that sat pinned while the floor rose is
  aged like the others.
* :meth:`evict` walks buckets from the lowest, skipping protected keys, and plans the victims
  before changing anything: when fewer than ``n`` eligible blocks exist it returns ``None``
  with no change. The floor becomes the lowest of the last victim's ``K`` and the first skipped
  protected block's ``K``, so no evictable block is ever below it. Entries examined (added to
  :attr:`visited`) are the victims plus the protected keys skipped: O(k + protected), worst
  case.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvtier.policies.base import CachePolicy, Key

#: number of priority buckets (a power of two): K saturates at floor + WINDOW - 1
WINDOW = 256
_MOD = WINDOW - 1
_FULL = (1 << WINDOW) - 1


class LFUPolicy(CachePolicy):
    """LFU with dynamic aging (see the module docstring) over the evictable blocks of the tier.

    Attributes:
        floor: the aging floor ``L`` (priority of the last victim, in uses; starts at 0).

    State: ``_prio`` (every resident key -> priority ``K``), ``_held`` (pending or pinned key ->
    slot), ``_buckets`` (ring of ``WINDOW`` LRU lists of evictable key -> slot, oldest first)
    and ``_mask`` (bit ``i`` set when bucket ``i`` is non-empty). O(1) per touched key;
    :meth:`evict` is O(k + protected keys skipped).
    """

    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._prio: dict[Key, int] = {}
        self._held: dict[Key, int] = {}
        self._buckets: list[OrderedDict[Key, int]] = [OrderedDict() for _ in range(WINDOW)]
        self._mask = 0
        self.floor = 0

    # -- queries -------------------------------------------------------------------------
    def get(self, key: Key) -> int | None:
        k = self._prio.get(key)
        if k is None:
            return None
        slot = self._held.get(key)
        return self._buckets[k & _MOD][key] if slot is None else slot

    def __len__(self) -> int:
        return len(self._prio)

    def priority(self, key: Key) -> int | None:
        """The block's priority ``K`` (uses counted from the floor), or None if not resident."""
        return self._prio.get(key)

    def _lowest_from(self, k: int) -> int | None:
        """Lowest priority >= ``k`` whose bucket is non-empty (``k >= floor``), or None."""
        span = self.floor + WINDOW - k
        if span <= 0 or not self._mask:
            return None
        s = k & _MOD
        mask = self._mask
        rot = ((mask >> s) | (mask << (WINDOW - s))) & _FULL & ((1 << span) - 1)
        if not rot:
            return None
        return k + (rot & -rot).bit_length() - 1

    # -- state changes -------------------------------------------------------------------
    def insert(self, key: Key, slot: int) -> None:
        self._held[key] = slot
        self._prio[key] = self.floor + 1

    def remove(self, key: Key) -> None:
        k = self._prio.pop(key, None)
        if k is None:
            return
        if self._held.pop(key, None) is None:
            bucket = self._buckets[k & _MOD]
            del bucket[key]
            if not bucket:
                self._mask &= ~(1 << (k & _MOD))

    def block_evictable(self, key: Key, slot: int) -> None:
        self._held.pop(key, None)
        k = self._prio[key]
        if k < self.floor:
            k = self._prio[key] = self.floor
        i = k & _MOD
        self._buckets[i][key] = slot
        self._mask |= 1 << i

    def block_unevictable(self, key: Key) -> None:
        i = self._prio[key] & _MOD
        bucket = self._buckets[i]
        self._held[key] = bucket.pop(key)
        if not bucket:
            self._mask &= ~(1 << i)

    def touch(self, keys: Sequence[Key]) -> None:
        prio, held, buckets = self._prio, self._held, self._buckets
        floor = self.floor
        top = floor + WINDOW - 1
        mask = self._mask
        for key in reversed(keys):
            k = prio.get(key)
            if k is None:
                continue
            nk = (k if k > floor else floor) + 1
            if nk > top:
                nk = top
            prio[key] = nk
            if key in held:
                continue
            i = k & _MOD
            bucket = buckets[i]
            slot = bucket.pop(key)
            if not bucket:
                mask &= ~(1 << i)
            j = nk & _MOD
            buckets[j][key] = slot
            mask |= 1 << j
        self._mask = mask

    def evict(self, n: int, protected: Collection[Key]) -> list[tuple[Key, int]] | None:
        buckets = self._buckets
        victims: list[tuple[Key, int]] = []
        victim_prio: list[int] = []
        first_skipped: int | None = None
        visited = 0
        k = self._lowest_from(self.floor)
        while k is not None:
            for item in buckets[k & _MOD].items():
                visited += 1
                if item[0] in protected:
                    if first_skipped is None:
                        first_skipped = k
                    continue
                victims.append(item)
                victim_prio.append(k)
                if len(victims) == n:
                    break
            if len(victims) == n:
                break
            k = self._lowest_from(k + 1)
        self.visited += visited
        if len(victims) < n:
            return None
        prio = self._prio
        mask = self._mask
        for (key, _), vk in zip(victims, victim_prio):
            i = vk & _MOD
            bucket = buckets[i]
            del bucket[key]
            if not bucket:
                mask &= ~(1 << i)
            del prio[key]
        self._mask = mask
        last = victim_prio[-1]
        self.floor = last if first_skipped is None or last < first_skipped else first_skipped
        return victims

    def snapshot(self) -> dict:
        order = []
        k = self._lowest_from(self.floor)
        while k is not None:
            order.append((k, list(self._buckets[k & _MOD].items())))
            k = self._lowest_from(k + 1)
        return {
            "prio": dict(self._prio),
            "held": dict(self._held),
            "buckets": order,
            "floor": self.floor,
        }

    def clear(self) -> None:
        self._prio.clear()
        self._held.clear()
        for bucket in self._buckets:
            bucket.clear()
        self._mask = 0
        self.floor = 0
        self.visited = 0
