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
  falls back to the other list before giving up; each list is walked at most once per call.
* A pending block touched again stays in T1 (it has not been read yet).
* Ghost lists are bounded to ``capacity`` entries each (oldest dropped).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from itertools import islice

from kvtier.policies.base import CachePolicy, Key


def _take(
    items: Iterator[tuple[Key, int]], want: int, protected: Collection[Key]
) -> tuple[list[tuple[Key, int]], int, bool]:
    """Take up to ``want`` unprotected items from ``items`` (an iterator over one list).

    Returns ``(taken, entries examined, whether the list ran out)``. The common case, no
    protected key among the first ``want`` entries, is one C-level slice.
    """
    if want <= 0:
        return [], 0, False
    taken = list(islice(items, want))
    visited = len(taken)
    if protected and any(item[0] in protected for item in taken):
        taken = [item for item in taken if item[0] not in protected]
        for item in items:
            visited += 1
            if item[0] not in protected:
                taken.append(item)
                if len(taken) == want:
                    break
        else:
            return taken, visited, True
        return taken, visited, False
    return taken, visited, visited < want


class ARCPolicy(CachePolicy):
    """Adaptive Replacement Cache over the evictable blocks of the tier.

    State: the resident map ``_resident`` (key -> slot of every resident block, T1 and T2,
    pinned and pending included) with ``_t2_resident`` (the resident keys of T2; T1 is the
    rest), evictable orders ``_t1`` / ``_t2`` (key -> slot, least recent first), ghost lists
    ``_b1`` / ``_b2`` (least recent first), the set of pending keys, and ``target`` (adaptive
    target size of T1, in blocks, within ``[0, capacity]``). O(1) per touched key;
    :meth:`evict` is O(k + protected keys skipped).
    """

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # The resident map and the pending set: standalone the policy keeps them itself; under
        # a manager it reads the manager's own key -> slot map and pending set (share_state),
        # which saves a dict insert and delete, and a set add and discard, per stored block
        self._resident: Mapping[Key, int] = {}
        self._pending: Collection[Key] = set()
        self._own_state = True
        self._t2_resident: set[Key] = set()
        self._t1: OrderedDict[Key, int] = OrderedDict()
        self._t2: OrderedDict[Key, int] = OrderedDict()
        self._b1: OrderedDict[Key, None] = OrderedDict()
        self._b2: OrderedDict[Key, None] = OrderedDict()
        self.target: float = 0.0

    # -- queries -------------------------------------------------------------------------
    def get(self, key: Key) -> int | None:
        return self._resident.get(key)

    def __len__(self) -> int:
        return len(self._resident)

    @property
    def t1_size(self) -> int:
        """|T1| in blocks: resident blocks seen once (pinned and pending included)."""
        return len(self._resident) - len(self._t2_resident)

    @property
    def t2_size(self) -> int:
        """|T2| in blocks: resident blocks seen at least twice."""
        return len(self._t2_resident)

    # -- state changes -------------------------------------------------------------------
    def share_state(self, resident: Mapping[Key, int], pending: Collection[Key]) -> None:
        self._resident = resident
        self._pending = pending
        self._own_state = False

    def insert(self, key: Key, slot: int) -> None:
        if self._own_state:
            self._resident[key] = slot  # type: ignore[index]
            self._pending.add(key)  # type: ignore[attr-defined]
        if key in self._b1:
            del self._b1[key]
            self._t2_resident.add(key)
        elif key in self._b2:
            del self._b2[key]
            self._t2_resident.add(key)

    def insert_many(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        if self._own_state:
            self._resident.update(zip(keys, slots))  # type: ignore[attr-defined]
            self._pending.update(keys)  # type: ignore[attr-defined]
        b1, b2 = self._b1, self._b2
        if b1.keys().isdisjoint(keys) and b2.keys().isdisjoint(keys):
            return  # no ghost hit: every key is in T1, which is the resident keys not in T2
        t2_resident = self._t2_resident
        for key in keys:
            if key in b1:
                del b1[key]
                t2_resident.add(key)
            elif key in b2:
                del b2[key]
                t2_resident.add(key)

    def remove(self, key: Key) -> None:
        if self._own_state:
            self._pending.discard(key)  # type: ignore[attr-defined]
            self._resident.pop(key, None)  # type: ignore[attr-defined]
        if key in self._t2_resident:
            self._t2_resident.discard(key)
            self._t2.pop(key, None)
        else:
            self._t1.pop(key, None)

    def block_evictable(self, key: Key, slot: int) -> None:
        if self._own_state:
            self._pending.discard(key)  # type: ignore[attr-defined]
        if key in self._t2_resident:
            self._t2[key] = slot
        else:
            self._t1[key] = slot

    def blocks_evictable(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        if self._own_state:
            self._pending.difference_update(keys)  # type: ignore[attr-defined]
        t2_resident = self._t2_resident
        # usually every key is in the same list (a request's new blocks, or its loaded prefix):
        # one membership test per key in C, then a plain loop
        if t2_resident.isdisjoint(keys):
            order = self._t1
        elif t2_resident.issuperset(keys):
            order = self._t2
        else:
            t1, t2 = self._t1, self._t2
            for key, slot in zip(keys, slots):
                if key in t2_resident:
                    t2[key] = slot
                else:
                    t1[key] = slot
            return
        for key, slot in zip(keys, slots):
            order[key] = slot

    def block_unevictable(self, key: Key) -> None:
        if key in self._t1:
            del self._t1[key]
        else:
            del self._t2[key]

    def blocks_unevictable(self, keys: Sequence[Key]) -> None:
        t1, t2 = self._t1, self._t2
        for key in keys:
            if key in t1:
                del t1[key]
            else:
                del t2[key]

    def touch(self, keys: Sequence[Key]) -> None:
        t1, t2, resident, t2_resident = self._t1, self._t2, self._resident, self._t2_resident
        b1, b2, pending = self._b1, self._b2, self._pending
        for key in reversed(keys):
            # resident first: a missed key then costs three membership tests, not four
            if key in resident:
                if key in t2:
                    t2.move_to_end(key)
                # a T2 block that is pinned or pending needs nothing; a pending T1 block stays
                # in T1 (it has not been read yet)
                elif key not in t2_resident and key not in pending:
                    t2_resident.add(key)
                    slot = t1.pop(key, None)
                    if slot is not None:  # evictable: to T2's MRU end (a pinned one waits)
                        t2[key] = slot
            # ghost hits adapt the target (conditional expressions, not min/max: builtin
            # calls that parse keyword arguments each time)
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

    def evict(self, n: int, protected: Collection[Key]) -> list[tuple[Key, int]] | None:
        # The per-victim rule ("from T1 while |T1| - T1 victims so far >= floor(target), else
        # from T2; fall back to the other list when the preferred one has no eligible block")
        # unrolls into three phases over two iterators, so each list is walked at most once:
        #   1. T1, while it is preferred: at most |T1| - floor(target) + 1 victims;
        #   2. T2 (preferred from then on, or the fallback once T1 is exhausted);
        #   3. T1 again (fallback once T2 is exhausted), continuing where phase 1 stopped.
        if protected:
            victims = self._evict_one(protected) if n == 1 else self._evict_protected(n, protected)
        elif n == 1:  # the usual one-key store: the first block of the preferred list
            t1, t2 = self._t1, self._t2
            t1_size = len(self._resident) - len(self._t2_resident)
            if t1 and (t1_size >= math.floor(self.target) or not t2):
                item = t1.popitem(False)
                ghost = self._b1
            elif t2:
                item = t2.popitem(False)
                self._t2_resident.remove(item[0])
                ghost = self._b2
            else:
                return None
            ghost[item[0]] = None
            if len(ghost) > self.capacity:
                ghost.popitem(False)
            self.visited += 1
            victims = [item]
        else:
            victims = self._evict_unprotected(n)
        if victims is not None and self._own_state:
            resident = self._resident
            for key, _ in victims:
                del resident[key]  # type: ignore[attr-defined]
        return victims

    def _evict_protected(
        self, n: int, protected: Collection[Key]
    ) -> list[tuple[Key, int]] | None:
        """:meth:`evict` of several victims around protected keys: the three phases, each
        walking its list's iterator with :func:`_take`."""
        t1_items = iter(self._t1.items())
        t2_items = iter(self._t2.items())
        t1_quota = max(0, self.t1_size - math.floor(self.target) + 1)
        want = min(n, t1_quota)
        t1_victims, visited, t1_exhausted = _take(t1_items, want, protected)
        want = n - len(t1_victims)
        t2_victims, seen, _ = _take(t2_items, want, protected)
        visited += seen
        want -= len(t2_victims)
        late_t1: list[tuple[Key, int]] = []
        if want and not t1_exhausted:
            late_t1, seen, _ = _take(t1_items, want, protected)
            visited += seen
        self.visited += visited
        if want > len(late_t1):
            return None

        # commit: victims leave T1/T2 and go to the MRU end of their ghost list
        t1, b1, t2, b2 = self._t1, self._b1, self._t2, self._b2
        t2_resident = self._t2_resident
        for part in (t1_victims, late_t1):
            for key, _ in part:
                del t1[key]
                b1[key] = None
        for key, _ in t2_victims:
            del t2[key]
            t2_resident.remove(key)
            b2[key] = None
        self._trim_ghosts()
        return t1_victims + t2_victims + late_t1

    def _evict_unprotected(self, n: int) -> list[tuple[Key, int]] | None:
        """:meth:`evict` with no protected key (the usual call): the same three phases.

        Every block in T1's and T2's order is eligible, so the number each phase takes follows
        from the sizes, and the victims are popped straight off the LRU ends (in the order the
        phases take them: phase 3 continues phase 1 on T1).
        """
        t1, t2 = self._t1, self._t2
        len_t1, len_t2 = len(t1), len(t2)
        # from_t1 = min(n, max(0, |T1| - floor(target) + 1), len_t1); from_t2 = min(n -
        # from_t1, len_t2); late_t1 = min(n - from_t1 - from_t2, len_t1 - from_t1), spelled
        # out: builtin min/max parse keyword arguments on every call
        from_t1 = len(self._resident) - len(self._t2_resident) - math.floor(self.target) + 1
        if from_t1 > n:
            from_t1 = n
        if from_t1 > len_t1:
            from_t1 = len_t1
        if from_t1 < 0:
            from_t1 = 0
        from_t2 = n - from_t1
        if from_t2 > len_t2:
            from_t2 = len_t2
        late_t1 = n - from_t1 - from_t2
        if late_t1 > len_t1 - from_t1:
            late_t1 = len_t1 - from_t1
        self.visited += from_t1 + from_t2 + late_t1
        if from_t1 + from_t2 + late_t1 < n:
            return None

        victims = []
        capacity = self.capacity
        for order, ghost, count in ((t1, self._b1, from_t1 + late_t1), (t2, self._b2, from_t2)):
            if not count:
                continue
            pop = order.popitem
            taken = [pop(False) for _ in range(count)]  # the LRU end, least recent first
            # each victim goes to the MRU end of its ghost list, which is trimmed to the
            # capacity; when the list is already full each victim pushes out its oldest key
            if len(ghost) == capacity:
                trim = ghost.popitem
                for key, _ in taken:
                    ghost[key] = None
                    trim(False)
            else:
                for key, _ in taken:
                    ghost[key] = None
                for _ in range(len(ghost) - capacity):
                    ghost.popitem(False)
            if order is t2:
                self._t2_resident.difference_update(dict(taken))
            victims += taken
        if late_t1:  # phase 3's T1 victims come after T2's
            return victims[:from_t1] + victims[from_t1 + late_t1 :] + victims[from_t1 : from_t1 + late_t1]
        return victims

    def _trim_ghosts(self) -> None:
        """Trim each ghost list to the capacity, oldest first."""
        capacity = self.capacity
        for ghost in (self._b1, self._b2):
            for _ in range(len(ghost) - capacity):
                ghost.popitem(False)

    def _evict_one(self, protected: Collection[Key]) -> list[tuple[Key, int]] | None:
        """:meth:`evict` for one victim with protected keys: the same rule, without the batch
        bookkeeping."""
        lists = [(self._t1, self._b1), (self._t2, self._b2)]
        if self.t1_size < math.floor(self.target):  # T1 below target: prefer T2
            lists.reverse()
        visited = 0
        for order, ghost in lists:
            for item in order.items():
                visited += 1
                key = item[0]
                if key not in protected:
                    del order[key]
                    if order is self._t2:
                        self._t2_resident.remove(key)
                    ghost[key] = None
                    if len(ghost) > self.capacity:
                        ghost.popitem(False)
                    self.visited += visited
                    return [item]
        self.visited += visited
        return None

    def snapshot(self) -> dict:
        resident, t2_resident = self._resident, self._t2_resident
        return {
            "t1_all": {key: slot for key, slot in resident.items() if key not in t2_resident},
            "t2_all": {key: resident[key] for key in t2_resident},
            "t1": list(self._t1.items()),
            "t2": list(self._t2.items()),
            "b1": list(self._b1),
            "b2": list(self._b2),
            "pending": set(self._pending),
            "target": self.target,
        }

    def clear(self) -> None:
        for part in (self._t2_resident, self._t1, self._t2, self._b1, self._b2):
            part.clear()
        if self._own_state:  # shared ones are the manager's to reset
            self._resident.clear()  # type: ignore[attr-defined]
            self._pending.clear()  # type: ignore[attr-defined]
        self.target = 0.0
        self.visited = 0
