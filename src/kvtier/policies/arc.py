"""ARC: Adaptive Replacement Cache (Megiddo & Modha, FAST'03), over evictable blocks.

T1 holds blocks seen once, T2 blocks seen again; the ghost lists B1 and B2 remember the keys
recently evicted from each (keys only, no data). A touch that hits B1 means T1 was too small,
so the adaptive target size of T1 grows; a B2 hit shrinks it. Eviction takes from T1 while T1
is at or above its target, else from T2.

Differences from the paper and from vLLM's ``ARCCachePolicy``, all required by the offloading
contract:

* T1 and T2 each keep their eviction order over *evictable* blocks only. Their sizes, used for
  the target comparison, count every resident block (pinned and pending included).
* When the preferred list has no eligible victim (all pinned, pending or protected), eviction
  falls back to the other list; each list is walked at most once per call.
* A pending block touched again stays in T1 (it has not been read yet).
* Ghost lists are bounded to ``capacity`` entries each (oldest dropped).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from itertools import islice

from kvtier.policies.base import CachePolicy, Key


def _take(keys: Iterator[Key], want: int, protected: Collection[Key]) -> tuple[list[Key], int]:
    """Up to ``want`` keys of ``keys`` (an iterator over one list) not in ``protected``, and
    the number of entries examined. The common case, no protected key among the first
    ``want``, is one C-level slice."""
    if want <= 0:
        return [], 0
    taken = list(islice(keys, want))
    if not protected or not any(map(protected.__contains__, taken)):
        return taken, len(taken)
    examined = len(taken)
    taken = [key for key in taken if key not in protected]
    for key in keys:
        examined += 1
        if key not in protected:
            taken.append(key)
            if len(taken) == want:
                break
    return taken, examined


class ARCPolicy(CachePolicy):
    """Adaptive Replacement Cache over the evictable blocks of the tier.

    State: ``_resident`` (every resident key, T1 and T2, pinned and pending included),
    ``_t2_keys`` (the resident keys of T2; T1 is the rest), ``_pending`` (resident keys whose
    store is in flight), the evictable orders ``_t1`` / ``_t2`` and the ghost lists ``_b1`` /
    ``_b2`` (keys, least recent first), and ``target`` (adaptive target size of T1, in blocks,
    within ``[0, capacity]``). O(1) per key; :meth:`evict` is O(k + protected keys skipped).
    """

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._resident: set[Key] = set()
        self._pending: set[Key] = set()
        self._t2_keys: set[Key] = set()
        self._t1: OrderedDict[Key, None] = OrderedDict()
        self._t2: OrderedDict[Key, None] = OrderedDict()
        self._b1: OrderedDict[Key, None] = OrderedDict()
        self._b2: OrderedDict[Key, None] = OrderedDict()
        self.target: float = 0.0
        self._orders = (self._t1, self._t2)

    @property
    def t1_size(self) -> int:
        """|T1| in blocks: resident blocks seen once (pinned and pending included)."""
        return len(self._resident) - len(self._t2_keys)

    @property
    def t2_size(self) -> int:
        """|T2| in blocks: resident blocks seen at least twice."""
        return len(self._t2_keys)

    # -- state changes -------------------------------------------------------------------
    def insert(self, keys: Sequence[Key]) -> None:
        self._resident.update(keys)
        self._pending.update(keys)
        b1, b2 = self._b1, self._b2
        if b1.keys().isdisjoint(keys) and b2.keys().isdisjoint(keys):
            return  # no ghost hit: every key is in T1, which is the resident keys not in T2
        t2_keys = self._t2_keys
        for key in keys:  # a key stored while in B1 or B2 enters T2
            if key in b1:
                del b1[key]
                t2_keys.add(key)
            elif key in b2:
                del b2[key]
                t2_keys.add(key)

    def remove(self, keys: Sequence[Key]) -> None:
        self._resident.difference_update(keys)
        self._pending.difference_update(keys)
        self._t2_keys.difference_update(keys)

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        if self._pending:
            self._pending.difference_update(keys)
        t2_keys = self._t2_keys
        # usually every key is in the same list (a request's new blocks, or its loaded prefix):
        # one membership test per key in C, then a plain loop
        if t2_keys.isdisjoint(keys):
            order = self._t1
        elif t2_keys.issuperset(keys):
            order = self._t2
        else:
            t1, t2 = self._t1, self._t2
            for key in reversed(keys):
                if key in t2_keys:
                    t2[key] = None
                else:
                    t1[key] = None
            return
        for key in reversed(keys):
            order[key] = None

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        t1, t2 = self._t1, self._t2
        for key in keys:
            if key in t1:
                del t1[key]
            else:
                del t2[key]

    def touch(self, keys: Sequence[Key]) -> None:
        t1, t2, resident, t2_keys = self._t1, self._t2, self._resident, self._t2_keys
        b1, b2, pending = self._b1, self._b2, self._pending
        for key in reversed(keys):
            # resident first: a missed key then costs three membership tests, not four
            if key in resident:
                if key in t2:
                    t2.move_to_end(key)
                # a T2 block that is pinned or pending needs nothing; a pending T1 block stays
                # in T1 (it has not been read yet)
                elif key not in t2_keys and key not in pending:
                    t2_keys.add(key)
                    if key in t1:  # evictable: to T2's MRU end (a pinned one waits)
                        del t1[key]
                        t2[key] = None
            # ghost hits adapt the target (conditional expressions, not min/max: builtin
            # calls that parse keyword arguments each time, docs/performance.md)
            elif key in b1:  # T1 was too small: target += max(1, |B2| / |B1|), <= capacity
                step = len(b2) / len(b1)
                target = self.target + (step if step > 1.0 else 1.0)
                self.target = target if target < self.capacity else float(self.capacity)
                b1.move_to_end(key)
            elif key in b2:  # T2 was too small: target -= max(1, |B1| / |B2|), >= 0
                step = len(b1) / len(b2)
                target = self.target - (step if step > 1.0 else 1.0)
                self.target = target if target > 0.0 else 0.0
                b2.move_to_end(key)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        # One walk over two iterators. The per-victim rule ("from T1 while |T1| minus the T1
        # victims so far >= floor(target), else from T2; fall back to the other list when the
        # preferred one has no eligible block") unrolls into three phases, so each list is
        # walked at most once:
        #   1. T1, while it is preferred: at most |T1| - floor(target) + 1 victims;
        #   2. T2 (preferred from then on, or the fallback once T1 is exhausted);
        #   3. T1 again (fallback once T2 is exhausted), continuing where phase 1 stopped.
        t1, t2 = self._t1, self._t2
        t1_keys = iter(t1)
        quota = len(self._resident) - len(self._t2_keys) - math.floor(self.target) + 1
        first, examined = _take(t1_keys, quota if quota < n else n, protected)
        from_t2, seen = _take(iter(t2), n - len(first), protected)
        examined += seen
        late, seen = _take(t1_keys, n - len(first) - len(from_t2), protected)
        self.examined += examined + seen

        # commit: victims leave T1 / T2 for the MRU end of B1 / B2, trimmed to the capacity
        b1, b2 = self._b1, self._b2
        for key in first:
            del t1[key]
            b1[key] = None
        for key in late:
            del t1[key]
            b1[key] = None
        for key in from_t2:
            del t2[key]
            b2[key] = None
        victims = first + from_t2 + late if late or from_t2 else first
        if from_t2:
            self._t2_keys.difference_update(from_t2)
        self._resident.difference_update(victims)
        capacity = self.capacity
        for ghost in (b1, b2):
            for _ in range(len(ghost) - capacity):
                ghost.popitem(False)  # positional: no keyword parsing (docs/performance.md)
        return victims

    def snapshot(self) -> dict:
        t2_keys = self._t2_keys
        return {
            "t1_all": {key for key in self._resident if key not in t2_keys},
            "t2_all": set(t2_keys),
            "t1": list(self._t1),
            "t2": list(self._t2),
            "b1": list(self._b1),
            "b2": list(self._b2),
            "pending": set(self._pending),
            "target": self.target,
        }

    def clear(self) -> None:
        for part in (self._resident, self._pending, self._t2_keys, self._t1, self._t2,
                     self._b1, self._b2):
            part.clear()
        self.target = 0.0
        self.examined = 0
