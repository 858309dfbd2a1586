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

* Buckets hold every resident block, pinned and pending ones included (logical recency: a
  block's place changes only when it is used, never by a pin or a completed store); a touch
  of a held block moves it to its next bucket like any other. An eviction walk that meets a
  held block sets it aside, O(1); when it becomes evictable again it re-enters the *oldest*
  end of bucket ``max(K, L)`` -- it was older than every block of its bucket when it was set
  aside, and a block that sat pinned while the floor rose is aged like the others. (Two
  blocks released into one bucket in the other order than they were set aside come back in
  release order: ties among them are not kept exactly.)
* :meth:`evict` walks buckets from the lowest, skipping protected keys, then commits the
  victims (the base class has checked that ``n`` eligible blocks exist). The floor becomes the lowest of the last victim's ``K`` and the first skipped
  protected block's ``K``, so no evictable block is ever below it. Entries examined (added to
  :attr:`examined`) are the victims plus the protected keys skipped: O(k + protected), worst
  case.

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: ``K + 1`` for each resident key, inserted ones included.
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

    State: ``_prio`` (every resident key -> priority ``K``), ``_held`` (pending or pinned
    keys), ``_aside`` (held keys an eviction walk met, out of the buckets), ``_buckets``
    (ring of ``WINDOW`` LRU lists of resident keys, oldest first)
    and ``_mask`` (bit ``i`` set when bucket ``i`` is non-empty). O(1) per touched key;
    :meth:`evict` is O(k + protected keys skipped).
    """

    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._prio: dict[Key, int] = {}
        self._held: set[Key] = set()
        self._aside: set[Key] = set()
        self._buckets: list[OrderedDict[Key, None]] = [OrderedDict() for _ in range(WINDOW)]
        self._mask = 0
        self.floor = 0

    def priority(self, key: Key) -> int | None:
        """The block's priority ``K`` (uses counted from the floor), or None if not resident."""
        return self._prio.get(key)

    def count_eligible(self, protected: Collection[Key] = ()) -> int:
        # evictable = resident and not held: no need to look through 256 buckets
        prio, held = self._prio, self._held
        eligible = len(prio) - len(held)
        for key in protected:
            if key in prio and key not in held:
                eligible -= 1
        return eligible

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
    def insert(self, keys: Sequence[Key]) -> None:
        self._held.update(keys)
        k = self.floor + 1
        prio = self._prio
        bucket = self._buckets[k & _MOD]
        for key in reversed(keys):  # keys[0] ends most recent
            prio[key] = k
            bucket[key] = None
        self._mask |= 1 << (k & _MOD)

    def _unbucket(self, key: Key) -> None:
        """Take ``key`` out of its bucket or out of the keys aside."""
        if key in self._aside:
            self._aside.remove(key)
            return
        i = self._prio[key] & _MOD
        bucket = self._buckets[i]
        del bucket[key]
        if not bucket:
            self._mask &= ~(1 << i)

    def remove(self, keys: Sequence[Key]) -> None:
        for key in keys:
            self._unbucket(key)
            del self._prio[key]
        self._held.difference_update(keys)

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        self._held.difference_update(keys)
        aside = self._aside
        if not aside:
            return
        prio, buckets, floor = self._prio, self._buckets, self.floor
        mask = self._mask
        for key in keys:
            if key in aside:  # back at the oldest end of bucket max(K, floor)
                aside.remove(key)
                k = prio[key]
                if k < floor:
                    k = prio[key] = floor
                i = k & _MOD
                bucket = buckets[i]
                bucket[key] = None
                bucket.move_to_end(key, last=False)
                mask |= 1 << i
        self._mask = mask

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        self._held.update(keys)

    def touch(self, keys: Sequence[Key]) -> None:
        prio, aside, buckets = self._prio, self._aside, self._buckets
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
            if key in aside:
                aside.remove(key)
            else:
                i = k & _MOD
                bucket = buckets[i]
                del bucket[key]
                if not bucket:
                    mask &= ~(1 << i)
            j = nk & _MOD
            buckets[j][key] = None
            mask |= 1 << j
        self._mask = mask

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        buckets = self._buckets
        victims: list[Key] = []
        victim_prio: list[int] = []
        met_held: list[tuple[Key, int]] = []
        first_skipped: int | None = None
        examined = 0
        held = self._held
        k = self._lowest_from(self.floor)
        while k is not None:  # select, lowest bucket first
            for key in buckets[k & _MOD]:
                examined += 1
                if key in held:  # set aside below: not met again
                    met_held.append((key, k))
                    continue
                if key in protected:
                    if first_skipped is None:
                        first_skipped = k
                    continue
                victims.append(key)
                victim_prio.append(k)
                if len(victims) == n:
                    break
            if len(victims) == n:
                break
            k = self._lowest_from(k + 1)
        self.examined += examined
        prio = self._prio
        mask = self._mask
        for key, vk in zip(victims, victim_prio):  # commit
            i = vk & _MOD
            bucket = buckets[i]
            del bucket[key]
            if not bucket:
                mask &= ~(1 << i)
            del prio[key]
        aside = self._aside
        for key, vk in met_held:
            i = vk & _MOD
            bucket = buckets[i]
            del bucket[key]
            if not bucket:
                mask &= ~(1 << i)
            aside.add(key)
        self._mask = mask
        last = victim_prio[-1]
        self.floor = last if first_skipped is None or last < first_skipped else first_skipped
        return victims

    def snapshot(self) -> dict:
        order = []
        k = self._lowest_from(self.floor)
        while k is not None:
            order.append((k, list(self._buckets[k & _MOD])))
            k = self._lowest_from(k + 1)
        return {
            "prio": dict(self._prio),
            "held": set(self._held),
            "aside": set(self._aside),
            "buckets": order,
            "floor": self.floor,
        }

    def clear(self) -> None:
        self._prio.clear()
        self._held.clear()
        self._aside.clear()
        for bucket in self._buckets:
            bucket.clear()
        self._mask = 0
        self.floor = 0
        self.examined = 0
