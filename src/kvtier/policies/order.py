"""An eviction order in which pinned and pending blocks keep their place (logical recency).

A policy keeps its blocks in one or more orders, oldest (next to leave) first. The rule every
built-in policy follows: a block's place changes only when the block is *used* (stored,
touched, or used by a finished request); taking or releasing a pin and completing a store
never move it. So a non-evictable (*held*: pending or pinned) block stays in its order, and
eviction passes over it. Passing over the same held blocks at every eviction would cost
O(held) per call, so :class:`LogicalOrder` sets a held block aside the first time an eviction
meets it at the old end:

* ``live`` (an ``OrderedDict``): the blocks in their order, oldest first, held or not, except
  those set aside. Blocks enter at the new end only (:meth:`append`, :meth:`use`).
* ``aside`` (key -> sequence number): held blocks an eviction met at the old end, numbered in
  the order it met them. Because ``live`` only grows at its new end, every block aside is
  older than every block in ``live``, and the numbers give their order among themselves.
* ``heap``: the blocks aside that became evictable again, as ``(number, key)``, a min-heap
  (:mod:`heapq`); so they leave first, oldest first, exactly where they stood. Entries are
  invalidated lazily (a block used, removed or held again) and skipped when popped; the heap
  is rebuilt when it holds more than twice the blocks aside (plus 64).

Cost: every hook is O(1) per key (a release of a block aside: O(log aside)); :meth:`take`
examines the victims, the protected keys it passes, the held blocks it sets aside (each once
per hold) and stale heap entries (each paid for by the call that made it stale): O(k +
protected) amortized, whatever share of the blocks is held.

Policies read the fields directly in their hot loops (``live``, ``held``, ``pins``, ``aside``);
all of them together are the order's state. Not thread-safe (a policy is driven by one
manager).

A member is held when it is in ``held`` or in ``pins``: ``pins`` is an empty dict the order never writes, unless the policy gives it a
collection of its owner's (ARC under kvtier's manager reads the manager's pending set as
``held`` and its pin counts as ``pins``: :meth:`kvtier.policies.CachePolicy.share_held_state`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from heapq import heapify, heappop, heappush
from itertools import islice

from kvtier.policies.base import Key

_COMPACT_SLACK = 64  # heap entries allowed beyond twice the blocks aside


class LogicalOrder:
    """One eviction order over the blocks of a policy; held blocks keep their place.

    ``len(order)`` is the number of evictable blocks (members not held) and ``key in order``
    tells whether ``key`` is an evictable member: what :func:`kvtier.policies.base.
    count_eligible` needs. :meth:`has` tells membership whatever the state.

    Attributes:
        live: members in order, oldest first, except those set aside.
        held: members that are not evictable (pending or pinned).
        pins: more held members, read only (empty unless the policy shares its owner's pin
            counts here; see the module docstring).
        aside: held members an eviction met at the old end -> sequence number (see the module
            docstring); a member aside that is released stays aside until it leaves or is used.
        heap: ``(sequence number, key)`` of released members aside (lazy, may hold stale
            entries).
        parked: running count of blocks set aside (for :attr:`CachePolicy.examined`).
    """

    __slots__ = ("live", "held", "pins", "aside", "heap", "parked", "_next")

    def __init__(self) -> None:
        self.live: OrderedDict[Key, None] = OrderedDict()
        self.held: set[Key] = set()
        self.pins: dict[Key, int] = {}
        self.aside: dict[Key, int] = {}
        self.heap: list[tuple[int, Key]] = []
        self.parked = 0
        self._next = 0

    # -- queries --------------------------------------------------------------------------
    def __len__(self) -> int:
        """Evictable members."""
        return len(self.live) + len(self.aside) - len(self.held) - len(self.pins)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is an evictable member."""
        return ((key in self.live or key in self.aside) and key not in self.held
                and key not in self.pins)

    def has(self, key: Key) -> bool:
        """Whether ``key`` is a member (evictable or held)."""
        return key in self.live or key in self.aside

    def size(self) -> int:
        """Members, held ones included."""
        return len(self.live) + len(self.aside)

    def keys(self) -> list[Key]:
        """Every member in order, oldest first (aside first, by number). O(n log aside)."""
        aside = self.aside
        return sorted(aside, key=aside.__getitem__) + list(self.live)

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys())

    def snapshot(self) -> tuple[list[Key], frozenset[Key]]:
        """The members in order and the held ones: equal exactly when the order would
        behave the same (whether a block is aside or not changes nothing)."""
        return self.keys(), frozenset(self.held).union(self.pins)

    # -- changes --------------------------------------------------------------------------
    def append(self, key: Key, held: bool = False) -> None:
        """A new member at the new end (``held``: not evictable yet).

        Raises:
            ValueError: ``key`` is a member already (use :meth:`use` to move it).
        """
        if key in self.live or key in self.aside:
            raise ValueError(f"LogicalOrder.append: {key!r} is a member already (use() moves it)")
        self.live[key] = None
        if held:
            self.held.add(key)

    def use(self, key: Key) -> None:
        """A member's use: it moves to the new end (held or not)."""
        if key in self.live:
            self.live.move_to_end(key)
        else:
            del self.aside[key]  # its heap entry, if any, is now stale
            self.live[key] = None

    def discard(self, key: Key) -> bool:
        """Remove a member; return whether it was held."""
        if key in self.live:
            del self.live[key]
        else:
            del self.aside[key]
        if key in self.held:
            self.held.remove(key)
            return True
        return False

    def hold(self, keys: Iterable[Key]) -> None:
        """Members became non-evictable (pinned): they keep their place.

        Raises:
            KeyError: a key is not a member (nothing held; :meth:`hold_members` ignores
                non-members instead).
        """
        keys = list(keys)
        live, aside = self.live, self.aside
        for key in keys:
            if key not in live and key not in aside:
                raise KeyError(f"LogicalOrder.hold: {key!r} is not a member")
        self.held.update(keys)

    def hold_members(self, keys: Iterable[Key]) -> None:
        """:meth:`hold` for the keys of ``keys`` that are members; others are ignored."""
        live, aside, held = self.live, self.aside, self.held
        for key in keys:
            if key in live or key in aside:
                held.add(key)

    def discard_member(self, key: Key) -> None:
        """:meth:`discard` if ``key`` is a member; nothing otherwise."""
        if key in self.live or key in self.aside:
            self.discard(key)

    def release(self, keys: Collection[Key]) -> None:
        """Members became evictable (store completed, last pin released): they keep their
        place; those set aside meanwhile go back to the old end, in their order."""
        self.held.difference_update(keys)
        if self.aside:
            self.requeue(keys)

    def requeue(self, keys: Collection[Key]) -> None:
        """:meth:`release`'s second half: the members of ``keys`` set aside go back to the
        old end, in their order; for a policy whose orders share one held set, which it
        updates once (the keys must not be held any more)."""
        aside, heap = self.aside, self.heap
        # usually none of them was set aside: one C-level pass tells, not an aside.get per
        # key (vLLM spec policy log: ARC mark_evictable 567 -> 468 per block reference,
        # docs/performance.md, "Request mode, round 5")
        if not aside.keys().isdisjoint(keys):
            for key in keys:
                number = aside.get(key)
                if number is not None:
                    heappush(heap, (number, key))
        if len(heap) > 2 * len(aside) + _COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        # its own method: the comprehension's cells are not paid by every requeue (_CELLS,
        # kvtier/manager.py)
        held, pins = self.held, self.pins
        self.heap = [(n, k) for k, n in self.aside.items() if k not in held and k not in pins]
        heapify(self.heap)

    def clear(self) -> None:
        self.live.clear()
        self.held.clear()
        self.aside.clear()
        self.heap.clear()
        self.parked = 0
        self._next = 0

    # -- eviction -------------------------------------------------------------------------
    def _set_aside(self, key: Key) -> None:
        self.aside[key] = self._next
        self._next += 1
        self.parked += 1

    def pop_front(self) -> tuple[Key, int | None] | None:
        """Take the oldest evictable member out of the order, setting aside the held ones met
        first; return ``(key, number)`` (``number`` is None when it came from ``live``, for
        :meth:`restore_front`), or None when no member is evictable."""
        heap = self.heap
        pins = self.pins
        if heap:
            aside, held = self.aside, self.held
            while heap:
                number, key = heappop(heap)
                if aside.get(key) == number and key not in held and key not in pins:
                    del aside[key]
                    return key, number
        live, held = self.live, self.held
        while live:
            key = live.popitem(False)[0]
            if key in held or key in pins:
                self._set_aside(key)
            else:
                return key, None
        return None

    def pass_over(self, item: tuple[Key, int | None]) -> tuple[Key, int]:
        """A member taken by :meth:`pop_front` that the walk passes over (protected): its
        place, as a sequence number taken now, so that the held blocks the same walk sets
        aside after it stay behind it (put back at the front of ``live``, it would come after
        them). Give the returned items to :meth:`restore_front` once the walk is done. O(1)."""
        key, number = item
        if number is None:
            number = self._next
            self._next += 1
        return key, number

    def restore_front(self, taken: list[tuple[Key, int | None]]) -> None:
        """Put back members taken by :meth:`pop_front` (in the order taken) where they were:
        numbered ones (:meth:`pass_over`, or taken from the heap) aside in their place, as
        evictable; others at the front of ``live``."""
        live, aside, heap = self.live, self.aside, self.heap
        for key, number in reversed(taken):
            if number is None:
                live[key] = None
                live.move_to_end(key, last=False)
            else:
                aside[key] = number
                heappush(heap, (number, key))

    def take(self, n: int, protected: Collection[Key]) -> tuple[list[Key], int]:
        """Remove up to ``n`` evictable members not in ``protected``, oldest first; return
        them and the number of entries examined (victims, protected keys passed, held blocks
        set aside, stale heap entries). Protected keys keep their place."""
        victims: list[Key] = []
        examined = 0
        if n <= 0:
            return victims, examined
        heap, pins = self.heap, self.pins
        if heap:
            aside, held = self.aside, self.held
            passed = []  # protected entries, pushed back below
            while heap and len(victims) < n:
                entry = heappop(heap)
                examined += 1
                key = entry[1]
                if aside.get(key) != entry[0] or key in held or key in pins:
                    continue  # stale
                if key in protected:
                    passed.append(entry)
                    continue
                del aside[key]
                victims.append(key)
            for entry in passed:
                heappush(heap, entry)
        live, held = self.live, self.held
        if len(victims) == n or not live:
            return victims, examined
        if not protected:
            # the usual case, no held block among the oldest: one C-level slice (a Python loop
            # per victim cost +12 % instructions per replayed block, docs/performance.md)
            want = n - len(victims)
            chosen = list(islice(live, want))  # fewer when live is short: all of it
            if ((not held or held.isdisjoint(chosen))
                    and (not pins or pins.keys().isdisjoint(chosen))):
                for key in chosen:
                    del live[key]
                if victims:
                    victims += chosen
                    return victims, examined + len(chosen)
                return chosen, examined + len(chosen)
            # pop from the old end; held blocks met go aside
            while live and len(victims) < n:
                key = live.popitem(False)[0]
                examined += 1
                if key in held or key in pins:
                    self._set_aside(key)
                else:
                    victims.append(key)
            return victims, examined
        met: list[Key] = []
        want = n - len(victims)
        found = 0
        for key in live:  # select, then commit (no change while iterating)
            met.append(key)
            if key not in held and key not in pins and key not in protected:
                found += 1
                if found == want:
                    break
        examined += len(met)
        # every block met leaves live: victims for good, the others aside with their number,
        # protected ones straight back in the heap (evictable): the order is kept exactly
        aside = self.aside
        chosen: list[Key] = []
        for key in met:
            del live[key]
            if key in held or key in pins:
                self._set_aside(key)
            elif key in protected:
                self._set_aside(key)
                heappush(heap, (aside[key], key))
            else:
                chosen.append(key)
        victims += chosen
        return victims, examined


__all__ = ["LogicalOrder"]
