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
  held block at the old end of a bucket sets it aside with a sequence number, O(1); the
  numbers follow the walk, which reads each bucket oldest first, so among the blocks set aside
  from one bucket they keep the bucket's order. When such a block becomes evictable again it
  goes into a min-heap by ``(max(K, L), number)``: it is older than every block still in
  bucket ``max(K, L)`` (they entered it later, or were behind it), and the walk takes heap
  entries of a level before that level's bucket. So it comes back exactly where it stood,
  whatever order the pins are released in; a block that sat pinned while the floor passed
  its ``K`` is aged like the others (it re-enters at ``L``, older than ``L``'s own blocks).
  A protected block the walk meets goes the same way (aside and straight into the heap), so
  the blocks behind it keep their order too. Heap entries are invalidated lazily (a block
  used, removed, held again) and the heap is rebuilt when it holds more than twice the
  blocks aside (plus 64).
* :meth:`evict` walks levels from the floor up, each level's heap entries first, then its
  bucket from the old end (the base class has checked that ``n`` eligible blocks exist, so the
  walk always succeeds and changes the state as it goes). The floor becomes the lowest of the
  last victim's ``K`` and the first skipped protected block's ``K``, so no evictable block is
  ever below it. Entries examined (added to :attr:`examined`) are the victims, the protected
  keys passed, the held blocks set aside (each once per hold) and stale heap entries (each
  paid for by the call that made it stale): O(k + protected) amortized, whatever share of the
  blocks is held.

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: ``K + 1`` for each resident key, inserted ones included.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from heapq import heapify, heappop, heappush

from kvtier.policies.base import CachePolicy, Key, count_unheld

#: number of priority buckets (a power of two): K saturates at floor + WINDOW - 1
WINDOW = 256
_MOD = WINDOW - 1
_FULL = (1 << WINDOW) - 1
_COMPACT_SLACK = 64  # heap entries allowed beyond twice the blocks aside


class LFUPolicy(CachePolicy):
    """LFU with dynamic aging (see the module docstring) over the evictable blocks of the tier.

    Attributes:
        floor: the aging floor ``L`` (priority of the last victim, in uses; starts at 0).

    State: ``_prio`` (every resident key -> priority ``K``), ``_held`` (pending or pinned
    keys), ``_aside`` (keys an eviction walk took out of their bucket without evicting them ->
    sequence number), ``_heap`` (``(level, number, key)`` of evictable keys aside; lazy),
    ``_buckets`` (ring of ``WINDOW`` LRU lists of resident keys, oldest first) and ``_mask``
    (bit ``i`` set when bucket ``i`` is non-empty). O(1) per touched key (a release of a key
    aside: O(log aside)); :meth:`evict` is O(k + protected keys skipped) amortized.
    """

    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._prio: dict[Key, int] = {}
        self._held: set[Key] = set()
        self._aside: dict[Key, int] = {}
        self._heap: list[tuple[int, int, Key]] = []
        self._next = 0
        self._buckets: list[OrderedDict[Key, None]] = [OrderedDict() for _ in range(WINDOW)]
        self._mask = 0
        self.floor = 0

    def priority(self, key: Key) -> int | None:
        """The block's priority ``K`` (uses counted from the floor), or None if not resident."""
        return self._prio.get(key)

    def count_eligible(self, protected: Collection[Key] = ()) -> int:
        # evictable = resident and not held: no need to look through 256 buckets
        return count_unheld(protected, self._prio, self._held)

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
            del self._aside[key]  # its heap entry, if any, is now stale
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
        prio, floor, heap = self._prio, self.floor, self._heap
        for key in keys:
            number = aside.get(key)
            if number is not None:  # back where it stood: level max(K, floor), by number
                k = prio[key]
                if k < floor:
                    k = prio[key] = floor
                heappush(heap, (k, number, key))
        if len(heap) > 2 * len(aside) + _COMPACT_SLACK:
            self._compact_heap()

    def _compact_heap(self) -> None:
        """Rebuild the heap from the released blocks aside, dropping stale entries. Its own
        method: a comprehension over ``mark_evictable``'s locals would make them cells, built
        at every call on Python 3.11."""
        aside, held, prio = self._aside, self._held, self._prio
        self._heap = [(prio[k], n, k) for k, n in aside.items() if k not in held]
        heapify(self._heap)

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        self._held.update(keys)

    def touch(self, keys: Sequence[Key]) -> None:
        prio, aside, buckets = self._prio, self._aside, self._buckets
        floor = self.floor
        top = floor + WINDOW - 1
        mask = self._mask
        # a key named twice in one call is one use at its first position (CachePolicy.touch);
        # a set tests it cheaper than a dict (docs/policies.md, "Repeated keys in one touch")
        if len(keys) > 1 and len(set(keys)) != len(keys):
            keys = list(dict.fromkeys(keys))
        for key in reversed(keys):
            k = prio.get(key)
            if k is None:
                continue
            nk = (k if k > floor else floor) + 1
            if nk > top:
                nk = top
            prio[key] = nk
            if key in aside:
                del aside[key]  # its heap entry, if any, is now stale
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
        buckets, prio, held, aside, heap = (
            self._buckets, self._prio, self._held, self._aside, self._heap)
        victims: list[Key] = []
        passed: list[tuple[int, int, Key]] = []  # protected, back into the heap at the end
        first_skipped: int | None = None
        last = self.floor
        examined = 0
        number = self._next
        k = self.floor
        while len(victims) < n:
            while heap:  # drop stale entries at the top
                hk, hn, key = heap[0]
                if aside.get(key) == hn and prio[key] == hk and key not in held:
                    break
                heappop(heap)
                examined += 1
            lk = self._lowest_from(k)
            if heap and (lk is None or heap[0][0] <= lk):
                # a released block aside is older than every block of its level's bucket
                entry = heappop(heap)
                examined += 1
                k, key = entry[0], entry[2]
                if key in protected:
                    passed.append(entry)
                    if first_skipped is None:
                        first_skipped = k
                    continue
                del aside[key]
                del prio[key]
                victims.append(key)
                last = k
                continue
            k = lk  # not None: n eligible blocks exist (the base class counted them)
            i = k & _MOD
            bucket = buckets[i]
            # select in bucket k from its old end, then commit (no change while iterating:
            # popping each key cost +14 % per evicted block, docs/performance.md, "Set-aside")
            want = n - len(victims)
            chosen: list[Key] = []
            met_aside: list[Key] = []  # held or protected, in the bucket's order
            for key in bucket:
                examined += 1
                if key in held or key in protected:
                    met_aside.append(key)
                else:
                    chosen.append(key)
                    if len(chosen) == want:
                        break
            for key in chosen:
                del bucket[key]
                del prio[key]
            for key in met_aside:
                del bucket[key]
                aside[key] = number
                if key not in held:  # protected: evictable, straight into the heap
                    passed.append((k, number, key))
                    if first_skipped is None:
                        first_skipped = k
                number += 1
            if chosen:
                victims += chosen
                last = k
            if not bucket:
                self._mask &= ~(1 << i)
        for entry in passed:
            heappush(heap, entry)
        self._next = number
        self.examined += examined
        self.floor = last if first_skipped is None or last < first_skipped else first_skipped
        return victims

    def snapshot(self) -> dict:
        """``buckets``: ``(K, keys oldest first)`` per non-empty level from the floor up, blocks
        aside in their place (a held one at level ``max(K, floor)``, where it would re-enter);
        equal exactly when the policy would behave the same."""
        floor, prio = self.floor, self._prio
        aside_at: dict[int, list[tuple[int, Key]]] = {}
        for key, number in self._aside.items():
            aside_at.setdefault(max(prio[key], floor), []).append((number, key))
        levels = set(aside_at)
        k = self._lowest_from(floor)
        while k is not None:
            levels.add(k)
            k = self._lowest_from(k + 1)
        order = [
            (k, [key for _, key in sorted(aside_at.get(k, []), key=lambda e: e[0])]
             + list(self._buckets[k & _MOD]))
            for k in sorted(levels)
        ]
        return {
            "prio": dict(prio),
            "held": set(self._held),
            "buckets": order,
            "floor": floor,
        }

    def clear(self) -> None:
        self._prio.clear()
        self._held.clear()
        self._aside.clear()
        self._heap.clear()
        self._next = 0
        for bucket in self._buckets:
            bucket.clear()
        self._mask = 0
        self.floor = 0
        self.examined = 0
