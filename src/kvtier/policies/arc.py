"""ARC: Adaptive Replacement Cache (Megiddo & Modha, FAST'03), with logical recency.

T1 holds blocks seen once, T2 blocks seen again; the ghost lists B1 and B2 remember the keys
recently evicted from each (keys only, no data). A touch that hits B1 means T1 was too small,
so the adaptive target size of T1 grows; a B2 hit shrinks it. Eviction takes from T1 while T1
is at or above its target, else from T2.

Differences from the paper and from vLLM's ``ARCCachePolicy``, all required by the offloading
contract:

* Logical recency: T1 and T2 hold every resident block, pinned and pending ones included, in
  :class:`~kvtier.policies.order.LogicalOrder` s; a block's place changes only when it is
  used (stored, touched, or used by a finished request), never when a pin is taken or
  released or its store completes. A use of a pinned T1 block moves it to T2 at once.
* When the preferred list has no eligible victim (all pinned, pending or protected), eviction
  falls back to the other list; each list is walked at most once per call.
* A touch of a pending block in T1 refreshes it within T1 (it has not been read yet).
* Ghost lists are bounded to ``capacity`` entries each (oldest dropped).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Collection, Sequence
from itertools import islice

from kvtier.policies.base import CachePolicy, Key
from kvtier.policies.order import LogicalOrder


class ARCPolicy(CachePolicy):
    """Adaptive Replacement Cache over the blocks of the tier, logical recency.

    State: the orders ``_t1`` / ``_t2`` (:class:`~kvtier.policies.order.LogicalOrder`,
    least recent first, held blocks in place; a key is in T1 or T2 exactly when it is in that
    order's ``live`` or ``aside``, and resident exactly when it is in one of the two) sharing
    one held set ``_held`` (the pending and pinned keys of both lists), ``_pinned`` (the
    resident keys pinned at least once since they were stored: a block is pending exactly
    when it is held and not in it), ``_pins`` (empty: see below), the ghost lists ``_b1`` / ``_b2`` (keys, least recent
    first), and ``target`` (adaptive target size of T1, in blocks, within
    ``[0, capacity]``). O(1) per key; :meth:`evict` is O(k + protected keys skipped)
    amortized.

    Under kvtier's manager (:meth:`share_held_state`) ARC keeps no held keys of its own:
    ``_held`` (and both orders' ``held``) is the manager's set of pending keys, ``_pins`` (and
    both orders' ``pins``) its dict of pin counts, and ``_pinned`` stays empty (a block is
    pending exactly when it is in ``_held``). A block is held when it is in ``_held`` or in
    ``_pins`` in both modes.
    """

    name = "arc"
    # every path of _evict skips held keys, read from the shared pending set and pins (the
    # one-victim loop, the several-victims isdisjoint tests, LogicalOrder.take): the manager
    # does not check them again (CachePolicy's "Victims the manager trusts"; proved by
    # tests/policies/test_arc.py's property tests)
    checks_shared_victims = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # residency is the orders' own membership, and "pending" is held and not pinned
        # since stored: a store writes each key once, to T1's order (batch eviction ARC
        # 5,757 -> 5,036 instructions per evicted block, docs/performance.md, "ARC hot paths",
        # fourth round); pins are rarer than stores, so they pay for the pending rule
        self._pinned: set[Key] = set()
        self._t1 = LogicalOrder()
        self._t2 = LogicalOrder()
        self._b1: OrderedDict[Key, None] = OrderedDict()
        self._b2: OrderedDict[Key, None] = OrderedDict()
        # one held set for both lists (keys are in one list only): a completed store or a
        # released pin leaves it in one C-level call, not one per list (call log W = 32:
        # 10,306 -> 9,964 instructions per block reference, docs/performance.md, "ARC hot
        # paths"); so the orders' own __len__ does not count a list's evictable blocks, and
        # count_eligible is ARC's own
        self._held = self._t2.held = self._t1.held
        self._pins = self._t2.pins = self._t1.pins  # empty unless shared
        # held keys read from the manager's own collections (share_held_state): insert,
        # mark_evictable and mark_non_evictable do no per-key set work (docs/performance.md,
        # "Request mode, round 6")
        self._shared = False
        self._target = 0.0
        # floor(target) as an int, kept beside it: _evict compares ints, no int/float compare
        # and no math.floor call (one-key store + complete 21,191 -> 20,801 instructions,
        # docs/performance.md, "ARC hot paths", third round)
        self._floor = 0
        # a copy of the keys of the last touch that found none of them resident nor in a
        # ghost list, until the next insert: only a resident key can enter a ghost list, so
        # an insert of the same keys needs no ghost test (see insert)
        self._no_ghosts: list[Key] | None = None

    @property
    def target(self) -> float:
        """Adaptive target size of T1, in blocks, within ``[0, capacity]``."""
        return self._target

    @target.setter
    def target(self, value: float) -> None:
        self._target = value
        self._floor = math.floor(value)

    @property
    def t1_size(self) -> int:
        """|T1| in blocks: resident blocks seen once (pinned and pending included)."""
        return len(self._t1.live) + len(self._t1.aside)

    @property
    def t2_size(self) -> int:
        """|T2| in blocks: resident blocks seen at least twice."""
        return len(self._t2.live) + len(self._t2.aside)

    # -- shared held state (CachePolicy.share_held_state) ---------------------------------
    def share_held_state(self, pending: set[Key], pins: dict[Key, int]) -> bool:
        """Read held blocks from the manager's ``pending`` set and ``pins`` dict from now on
        (until :meth:`clear`); refused (``False``) while ARC holds any block, whose held state
        would be lost."""
        if self._t1.live or self._t1.aside or self._t2.live or self._t2.aside:
            return False
        t1, t2 = self._t1, self._t2
        self._held = t1.held = t2.held = pending
        self._pins = t1.pins = t2.pins = pins
        self._pinned.clear()
        self._shared = True
        return True

    def _unshare(self) -> None:
        """Own held state again (empty): the manager's collections are dropped."""
        t1, t2 = self._t1, self._t2
        self._held = t1.held = t2.held = set()
        self._pins = t1.pins = t2.pins = {}
        self._shared = False

    # -- state changes -------------------------------------------------------------------
    def insert(self, keys: Sequence[Key]) -> None:
        if len(keys) == 1:
            key = keys[0]
            if key not in self._b1 and key not in self._b2:
                # one new key to T1 spelled out (one-key store + complete: 25,811 -> 23,819
                # instructions, docs/performance.md, "ARC hot paths")
                self._no_ghosts = None  # valid until the next insert (see touch)
                self._t1.live[key] = None
                if not self._shared:  # shared: the manager's pending set has it already
                    self._held.add(key)
                return
        no_ghosts, self._no_ghosts = self._no_ghosts, None
        try:
            same = no_ghosts is not None and (keys is no_ghosts or keys == no_ghosts)
        except Exception:  # noqa: BLE001 - a key's == answered an array (np.float64(2.0) == (1, 2)) or
            same = False  # raised (np.True_ == 2**70): other keys
        if same:
            # request mode: the store's new keys were just touched (ghost learning) and are in
            # no ghost list: straight to T1, no ghost test per key (vLLM spec policy log:
            # insert 1,775 -> 1,474 per block reference, docs/performance.md, "Request mode,
            # round 3")
            t1_live = self._t1.live
            for key in reversed(keys):  # keys[0] ends most recent
                t1_live[key] = None
            if not self._shared:
                self._held.update(keys)
            return
        # one loop for ghost hits and order: cheaper than C-level set operations for the few
        # keys of a store call (docs/performance.md, "Contract refactor")
        b1, b2, t1_live = self._b1, self._b2, self._t1.live
        if (not b1 or b1.keys().isdisjoint(keys)) and (not b2 or b2.keys().isdisjoint(keys)):
            # no ghost hit (tested in C): every key to T1, no per-key ghost test (batch
            # eviction ARC 5,700 -> 5,613 instructions per block, docs/performance.md, "ARC
            # hot paths", third round)
            for key in reversed(keys):  # keys[0] ends most recent
                t1_live[key] = None
            if not self._shared:
                self._held.update(keys)
            return
        t2_live = self._t2.live
        for key in reversed(keys):  # keys[0] ends most recent
            if key in b1:  # a key stored while in B1 or B2 enters T2
                del b1[key]
                t2_live[key] = None
            elif key in b2:
                del b2[key]
                t2_live[key] = None
            else:
                t1_live[key] = None
        # held (pending): one C-level set update (a set.add per key cost 6x the instructions
        # of the old insert, docs/performance.md)
        if not self._shared:
            self._held.update(keys)

    def remove(self, keys: Sequence[Key]) -> None:
        t1, t2 = self._t1, self._t2
        for key in keys:
            if t2.has(key):
                t2.discard(key)
            else:
                t1.discard(key)
        if self._pinned:  # a store that fails was never pinned: usually nothing to clean
            self._pinned.difference_update(keys)

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        if self._shared:  # the manager took the keys out of its pending set or pins
            if self._t1.aside:
                self._t1.requeue(keys)
            if self._t2.aside:
                self._t2.requeue(keys)
            return
        if self._t1.aside or self._t2.aside:  # blocks set aside by a walk go back in place
            # the shared held set once, then each list with blocks aside (was release on
            # both: two held-set passes and two frames; vLLM spec policy log:
            # mark_evictable 567 -> 468 per block reference with LogicalOrder.requeue's
            # check, docs/performance.md, "Request mode, round 5")
            self._held.difference_update(keys)
            if self._t1.aside:
                self._t1.requeue(keys)
            if self._t2.aside:
                self._t2.requeue(keys)
            return
        # no loop: the keys leave the (shared) held set in C (a loop with a set.discard per
        # key: +362 instructions per block reference of a replay, docs/performance.md, "ARC
        # hot paths"); one key by discard, not difference_update (a METH_VARARGS call that
        # iterates a list: one-key store + complete 21,706 -> 21,191, same section, third
        # round)
        if len(keys) == 1:
            self._held.discard(keys[0])
        else:
            self._held.difference_update(keys)

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        # pinned, so ready: not pending (see touch). One key by add, not update (a
        # METH_VARARGS call that iterates a list: one-key load + release 10,187 -> 9,026,
        # docs/performance.md, "ARC hot paths", fourth round)
        if self._shared:  # the manager's pins say it (it does not call this hook then)
            return
        if len(keys) == 1:
            key = keys[0]
            self._pinned.add(key)
            self._held.add(key)
        else:
            self._pinned.update(keys)
            self._held.update(keys)

    def touch(self, keys: Sequence[Key]) -> None:
        t1, t2 = self._t1, self._t2
        t1_live, t2_live = t1.live, t2.live
        t1_aside, t2_aside = t1.aside, t2.aside
        aside = bool(t1_aside or t2_aside)  # usually not: one test per missed key, not two
        # (keys[0] first: a touch of resident keys pays one test, not a C call)
        if (len(keys) >= 8 and keys[0] not in t1_live and keys[0] not in t2_live
                and t1_live.keys().isdisjoint(keys) and t2_live.keys().isdisjoint(keys)
                and not (aside and (t1_aside.keys() & keys or t2_aside.keys() & keys))):
            # no key resident (request mode's ghost learning of a store's new keys): only
            # ghost hits do anything, so they are found in C and the loop walks them alone
            # (vLLM spec policy log: touch 924 -> 732 instructions per block reference,
            # docs/performance.md, "Request mode, round 3")
            b1, b2 = self._b1, self._b2
            hits = b1.keys() & keys if b1 else set()
            if b2:
                hits |= b2.keys() & keys
            if not hits:
                self._no_ghosts = list(keys)  # for the insert that usually follows
                return
            keys = list(filter(hits.__contains__, keys))  # the loop below, on them alone
            repeats = len(keys) != len(hits)
        else:
            repeats = None  # not known yet: looked at the call's first ghost hit
        held, pinned = self._held, self._pinned
        b1, b2 = self._b1, self._b2
        # a ghost key named twice in one call adapts the target once, at its first (most
        # recent) position (CachePolicy.touch: one use per call, there; the walk is tail
        # first, so at its last occurrence met: the clamps at 0 and the capacity make the
        # order of adaptations matter). The call is checked for repeats once, at its first
        # ghost hit, and only a call with repeats counts the occurrences left to meet
        # (`left`, a Counter of the keys; none of a ghost key's occurrences is met before the
        # call's first ghost hit): ~16 ghost hits per call that has one, and a set test + add
        # per hit cost replay arc 4000 W=0 +69 instructions per block reference
        # (docs/policies.md, "Repeated keys in one touch")
        left = None
        for key in reversed(keys):
            # the live orders first: a resident key usually costs one or two membership
            # tests, a missed key four (no block aside) or six
            if key in t2_live:
                t2_live.move_to_end(key)
            elif key in t1_live:
                # pending (held, and not pinned since it was stored: a pin marks it, so
                # completing a store costs no per-key write, -478 instructions per block
                # reference, docs/performance.md, "ARC hot paths"): refreshed within T1
                # (not read yet)
                if key in held and key not in pinned:
                    t1_live.move_to_end(key)
                else:  # seen again: to T2's MRU end, pinned or not (one held set for both
                    del t1_live[key]  # lists: a held key stays held)
                    t2_live[key] = None
            elif aside and key in t2_aside:
                t2.use(key)
            elif aside and key in t1_aside:
                if key in held and key not in pinned:  # pending: refreshed within T1
                    t1.use(key)
                else:  # seen again: to T2, held or not (one held set for both lists;
                    del t1_aside[key]  # its heap entry, if any, is now stale)
                    t2_live[key] = None
            # ghost hits adapt the target (conditional expressions, not min/max: builtin
            # calls that parse keyword arguments each time, docs/performance.md)
            # (the B1 and B2 branches repeat their repeat check: one branch for both, testing
            # the list again, cost replay arc 4000 W=0 8,983 -> 9,035, docs/policies.md)
            elif key in b1:  # T1 was too small: target += max(1, |B2| / |B1|), <= capacity
                b1.move_to_end(key)
                if repeats is None:
                    repeats = len(set(keys)) != len(keys)
                if repeats:
                    if left is None:
                        left = Counter(keys)
                    count = left[key] - 1
                    left[key] = count
                    if count:
                        continue  # named again nearer the head: adapts there, once
                step = len(b2) / len(b1)
                target = self._target + (step if step > 1.0 else 1.0)
                target = target if target < self.capacity else float(self.capacity)
                self._target = target
                self._floor = int(target)  # target >= 0: int() is floor
            elif key in b2:  # T2 was too small: target -= max(1, |B1| / |B2|), >= 0
                b2.move_to_end(key)
                if repeats is None:
                    repeats = len(set(keys)) != len(keys)
                if repeats:
                    if left is None:
                        left = Counter(keys)
                    count = left[key] - 1
                    left[key] = count
                    if count:
                        continue  # named again nearer the head: adapts there, once
                step = len(b1) / len(b2)
                target = self._target - (step if step > 1.0 else 1.0)
                target = target if target > 0.0 else 0.0
                self._target = target
                self._floor = int(target)  # target >= 0: int() is floor

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        # none resident (the hook's contract): touch's residency passes skipped, only ghost
        # hits do anything (docs/performance.md, "Request mode, round 6")
        b1, b2 = self._b1, self._b2
        if (not b1 or b1.keys().isdisjoint(keys)) and (not b2 or b2.keys().isdisjoint(keys)):
            # no ghost hit, tested without building the hit sets (vLLM spec replay,
            # docs/performance.md, "Request mode, round 8"). For the insert that usually
            # follows, not copied: the manager's own new-key list, unchanged until that insert
            self._no_ghosts = keys
            return
        hits = b1.keys() & keys if b1 else set()
        if b2:
            hits |= b2.keys() & keys
        self.touch(list(filter(hits.__contains__, keys)))  # the ghost hits alone

    # -- request mode (issue #11 section 2) --------------------------------------------------
    def on_request_finished(
        self, keys: Sequence[Key], inserted: Collection[Key], reused: Collection[Key]
    ) -> None:
        """One finished request's use (vLLM 0.33's ``ARCCachePolicy.on_request_finished``):
        only a block the request really reused counts as seen again.

        For ``keys`` tail first (so ``keys[0]`` ends most recent): a reused key in T1 moves
        to T2's MRU end (pinned or not), a reused key in T2 moves to T2's MRU end; a key only
        inserted by the request is refreshed in place (the MRU end of its own list, T1 or
        T2); keys no longer resident, and keys neither inserted nor reused, are ignored.
        Ghost lists and the target are not changed here (the manager's store-time ``touch``
        of new keys is where request mode learns from ghost hits). O(len(keys)).
        """
        t1, t2 = self._t1, self._t2
        t1_live, t2_live, t1_aside, t2_aside = t1.live, t2.live, t1.aside, t2.aside
        aside = bool(t1_aside or t2_aside)
        # LogicalOrder.use / append / discard spelled out for the usual case (a block in its
        # live order): a Python call less per key (request-mode call log 16,105 -> 15,749
        # instructions per block reference), and the live orders asked first: a key in one
        # is resident and in that list, so the usual key costs 3 membership tests, not 6
        # (vLLM spec policy log: 1,980 -> 1,424 per block reference, docs/performance.md,
        # "Request mode, round 3")
        # covered: every key inserted or reused (the usual request; inserted and reused are
        # disjoint subsets of keys, see CachePolicy.on_request_finished, so the counts tell),
        # which spares the per-key `in inserted` test and, for a T2 key, every set test; the
        # move_to_end methods bound once (vLLM spec policy log: on_request_finished 1,451 ->
        # 1,218 per block reference at 4,000 blocks; 1,311 with the methods looked up per
        # key; 1,176 with the covered case as a second copy of this loop, not worth 17 lines:
        # docs/performance.md, "Request mode, round 5")
        covered = len(inserted) + len(reused) == len(keys)
        to_end1, to_end2 = t1_live.move_to_end, t2_live.move_to_end
        for key in reversed(keys):
            if key in t1_live:
                if key in reused:  # T1 -> T2's MRU end, pinned or not (one held set for
                    del t1_live[key]  # both lists: a held key stays held)
                    t2_live[key] = None
                elif covered or key in inserted:  # only inserted: refreshed within T1
                    to_end1(key)
            elif key in t2_live:
                if covered or key in reused or key in inserted:  # to T2's MRU end
                    to_end2(key)
            elif aside and (covered or key in reused or key in inserted):  # set aside, or absent
                if key in t2_aside:
                    t2.use(key)
                elif key in t1_aside:
                    if key in reused:  # to T2, held or not (one held set for both lists)
                        del t1_aside[key]
                        t2_live[key] = None
                    else:
                        t1.use(key)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        # The per-victim rule: from T1 while |T1| minus the T1 victims so far >= floor(target),
        # else from T2; the other list when the preferred one has no eligible block. It
        # unrolls into three phases, so each list is walked at most once:
        #   1. T1, while it is preferred: at most quota = |T1| - floor(target) + 1 victims;
        #   2. T2 (preferred from then on, or the fallback once T1 is exhausted);
        #   3. T1 again (fallback once T2 is exhausted), continuing where phase 1 stopped.
        t1, t2 = self._t1, self._t2
        if n == 1 and not protected and not t1.aside and not t2.aside:
            # the usual one-key store: the preferred list's LRU end (its own branch: 32,580 ->
            # ~20,000 instructions per one-key store + complete, docs/performance.md). Nothing
            # is aside, so no heap entry is current: the list's first evictable block is the
            # oldest block of live that is not held.
            # quota > 0 is |T1| >= floor(target), ints (see _floor); nothing aside: |T1| is
            # the size of its live order
            if len(t1.live) >= self._floor:
                order, ghost = t1, self._b1
            else:
                order, ghost = t2, self._b2
            live, held = order.live, self._held
            while live:  # the oldest, setting held blocks met aside
                key = live.popitem(False)[0]
                if key not in held and key not in self._pins:
                    if self._pinned:  # a victim leaves the pinned keys (empty until a load)
                        self._pinned.discard(key)
                    ghost[key] = None
                    if len(ghost) > self.capacity:
                        ghost.popitem(False)
                    self.examined += 1
                    return [key]
                order._set_aside(key)
                self.examined += 1
            # every block of the preferred list is held, now aside: the phases below take
            # the victim from the other list
        elif not protected:
            # several victims, all from one list's old end, none held, and no block set aside
            # there that became evictable again (request mode's usual eviction, ~24
            # victims): LogicalOrder.take's usual case spelled out, the victims leaving
            # their order and entering the ghost list in one loop (vLLM spec policy log:
            # _evict 2,543 -> 2,336 per block reference, docs/performance.md, "Request mode,
            # round 5"); anything else goes to the phases below, nothing changed yet
            quota = len(t1.live) + len(t1.aside) - self._floor + 1
            if quota >= n:
                live, ghost = (None if t1.heap else t1.live), self._b1
            elif quota <= 0:
                live, ghost = (None if t2.heap else t2.live), self._b2
            else:
                live = None
            if live is not None:
                # the victims, named `first` (the phases' first take, here the only one): a
                # new local would cost the one-victim path above ~8 instructions a call
                # (one-key store + complete, docs/performance.md, "Request mode, round 5")
                first = list(islice(live, n))
                if (len(first) == n and self._held.isdisjoint(first)
                        and (not self._pins or self._pins.keys().isdisjoint(first))):
                    if len(ghost) >= self.capacity >= n:
                        # a full ghost list drops its oldest entry per victim: the same as
                        # adding them all and trimming (no victim is a ghost: a resident key
                        # is in no ghost list; full-ghost case alone: 2,473 -> 2,405)
                        pop = ghost.popitem
                        for key in first:
                            del live[key]
                            pop(False)
                            ghost[key] = None
                    else:
                        for key in first:
                            del live[key]
                            ghost[key] = None
                        if len(ghost) > self.capacity:
                            for _ in range(len(ghost) - self.capacity):
                                ghost.popitem(False)
                    if self._pinned:
                        self._pinned.difference_update(first)
                    self.examined += n
                    return first
        quota = len(t1.live) + len(t1.aside) - self._floor + 1
        first, examined = t1.take(quota if quota < n else n, protected)
        from_t2: list[Key] = []
        late: list[Key] = []
        # a take call only for a phase with victims left to find (call log W = 32: 10,371 ->
        # 10,306 instructions per block reference, docs/performance.md, "ARC hot paths")
        if len(first) < n:
            from_t2, seen = t2.take(n - len(first), protected)
            examined += seen
            if len(first) + len(from_t2) < n:
                late, seen = t1.take(n - len(first) - len(from_t2), protected)
                examined += seen
        self.examined += examined
        from_t1 = first + late if late else first
        # commit: victims (out of their orders already) go to the MRU end of B1 / B2, each
        # ghost list trimmed to the capacity, and leave the pinned keys
        b1, b2, capacity = self._b1, self._b2, self.capacity
        for key in from_t1:
            b1[key] = None
        if len(b1) > capacity:
            for _ in range(len(b1) - capacity):
                b1.popitem(False)  # positional: no keyword parsing (docs/performance.md)
        pinned = self._pinned
        if from_t2:
            for key in from_t2:
                b2[key] = None
            if len(b2) > capacity:
                for _ in range(len(b2) - capacity):
                    b2.popitem(False)
            if pinned:
                pinned.difference_update(from_t1, from_t2)
            return first + from_t2 + late if late else first + from_t2
        if pinned:
            pinned.difference_update(from_t1)
        return from_t1

    def count_eligible(self, protected: Collection[Key] = ()) -> int:
        # the orders share one held set, so their own __len__ does not count a list's
        # evictable blocks: resident minus held, less the evictable protected keys
        t1, t2, held, pins = self._t1, self._t2, self._held, self._pins
        # the sizes read here, not by LogicalOrder.size: two frames less per evict call
        # (vLLM spec replay, docs/performance.md, "Request mode, round 5"); held and pins are
        # disjoint (a pending block cannot be pinned)
        eligible = (len(t1.live) + len(t1.aside) + len(t2.live) + len(t2.aside)
                    - len(held) - len(pins))
        if not protected:
            return eligible
        for key in protected:
            if key not in held and key not in pins and (t1.has(key) or t2.has(key)):
                eligible -= 1
        return eligible

    def snapshot(self) -> dict:
        t1, t2, held, pinned = self._t1, self._t2, self._held, self._pinned
        return {
            "t1_all": set(t1.live) | set(t1.aside),
            "t2_all": set(t2.live) | set(t2.aside),
            "t1": t1.keys(),
            "t2": t2.keys(),
            "held": set(held) | set(self._pins),
            "b1": list(self._b1),
            "b2": list(self._b2),
            "pending": {key for key in held if key not in pinned},
            "target": self.target,
        }

    def clear(self) -> None:
        if self._shared:  # the manager's collections are left alone (it shares new ones)
            self._unshare()
        for part in (self._pinned, self._t1, self._t2, self._b1, self._b2):
            part.clear()
        self._target = 0.0
        self._floor = 0
        self.examined = 0
        self._no_ghosts = None
