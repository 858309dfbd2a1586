"""Belady / MIN: evict the block whose next use is furthest in the future (offline).

Source: L. A. Belady, "A study of replacement algorithms for a virtual-storage computer", IBM
Systems Journal 5(2), 1966 (MIN, optimal for demand paging: Mattson et al., IBM Systems
Journal 9(2), 1970). It needs the whole trace up front, so it is an *offline* policy: a
capacity-planning bound to measure online policies against, not something an engine can run.

The future comes from a :class:`~kvtier.oracle.NextUseOracle` bound with :meth:`bind`; the
replay (:func:`kvtier.replay.replay` with ``policy="belady"``) builds it from the trace and
advances its clock (see :mod:`kvtier.oracle` for the hand-off). The policy only orders
evictable blocks and chooses victims, like every policy:

* order: a max-heap of evictable blocks keyed by ``(next use, recency)``, where recency is
  the block's last use (stored or touched; logical recency: pins and completed stores do not
  count); a block's entry is pushed when it becomes evictable and again when it is touched
  (its next use changed), and
  older entries of the same block are left in the heap and skipped when popped (lazy
  deletion, :mod:`heapq`). The heap is rebuilt from the live entries when it holds more than
  twice as many entries as evictable blocks (plus 64), so it stays O(evictable blocks).
* victim: the evictable, unprotected block with the furthest next use; blocks never used
  again (next use :data:`~kvtier.oracle.NEVER`) first, the least recently used of them first.
  Cost per victim O(log n) amortized (each stale entry was paid for by the push that made it).

A block's heap key is read from the oracle when it becomes evictable and when it is touched,
so the caller must touch every referenced key after advancing the oracle (both replay
protocols touch all of a request's keys); a referenced key that is not touched keeps its old
key until it is touched or becomes evictable again.

Without a bound oracle every next use is unknown (``NEVER``) and the recency tie-break alone
decides: the policy then evicts exactly like ``lru`` (tested), which is what the manager tests
that run every registered policy see. Since that is not what a user asking for Belady
expects, the first eviction without an oracle raises a ``RuntimeWarning`` ("belady has no
oracle bound ...", once per process under Python's default warning filter); only the replay
binds one. The vLLM spec refuses ``kvtier_policy="belady"`` outright (an engine has no
future).

Exactness: under ``--protocol get`` (one get-with-insert per reference) this is MIN, and its
hits equal a brute-force optimum (``tests/policies/test_belady.py``). Under the ``prefix``
protocol a block hits only while every block before it in the request hits, so furthest next
use is a heuristic there; docs/policies.md gives the measured distance to brute force.

Not thread-safe (as the manager that drives it: one thread, or a ``ThreadSafeManager``).

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: each resident key's next use is read from the oracle again.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

from kvtier.policies.base import CachePolicy, Key

if TYPE_CHECKING:
    from kvtier.oracle import NextUseOracle

UNBOUND_WARNING = ("belady has no oracle bound (BeladyPolicy.bind(NextUseOracle), done by "
                   "kvtier.replay): with no future known it evicts exactly as lru")
_NEVER = (1 << 62) - 1  # == kvtier.oracle.NEVER (not imported: keeps this file standalone)


class BeladyPolicy(CachePolicy):
    """Belady's MIN over evictable blocks, reading next uses from a bound oracle.

    State: ``_stamp`` (resident key -> its last use, a counter: entries never compare keys and
    equal next uses go least recent first), ``_entry`` (evictable key -> its live heap entry
    ``(-next_use, stamp, key)``) and ``_heap`` (live and stale entries).
    """

    name = "belady"
    needs_future = True
    """Replays must bind a :class:`~kvtier.oracle.NextUseOracle` (whole trace up front)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._stamp: dict[Key, int] = {}
        self._entry: dict[Key, tuple] = {}
        self._orders = (self._entry,)
        self._heap: list[tuple] = []
        self._seq = 0
        self._next_use: Mapping[Key, int] = {}
        self._oracle: NextUseOracle | None = None

    def bind(self, oracle: NextUseOracle) -> None:
        """Read next uses from ``oracle`` from now on (its ``next_use`` map, live).

        Raises:
            TypeError: ``oracle`` has no ``next_use`` mapping.
        """
        next_use = getattr(oracle, "next_use", None)
        if not isinstance(next_use, Mapping):
            raise TypeError(f"bind() needs a NextUseOracle (with a next_use map), got {oracle!r}")
        self._oracle = oracle
        self._next_use = next_use
        # entries pushed before the binding carry stale next uses: re-key them
        self._push_many(list(self._entry))

    # -- the order -----------------------------------------------------------------------
    def _push_many(self, keys: Sequence[Key]) -> None:
        """(Re-)enter evictable ``keys`` with their current next use and last use."""
        # one loop, one compaction check: a push per key was 1/3 of the replay time
        get = self._next_use.get
        stamp = self._stamp
        entries = self._entry
        heap = self._heap
        for key in keys:
            entry = (-get(key, _NEVER), stamp[key], key)
            entries[key] = entry
            heappush(heap, entry)
        if len(heap) > 2 * len(entries) + 64:  # mostly stale: rebuild from live entries
            heap[:] = entries.values()
            heapify(heap)

    def _use(self, keys: Sequence[Key]) -> None:
        """A use of resident ``keys``: ``keys[0]`` ends most recent."""
        stamp = self._stamp
        seq = self._seq
        for key in reversed(keys):
            seq += 1
            stamp[key] = seq
        self._seq = seq

    def insert(self, keys: Sequence[Key]) -> None:
        self._use(keys)

    def remove(self, keys: Sequence[Key]) -> None:
        stamp = self._stamp
        for key in keys:
            del stamp[key]

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        self._push_many(keys)

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        entry = self._entry
        for key in keys:
            del entry[key]  # its heap entry goes stale

    def touch(self, keys: Sequence[Key]) -> None:
        stamp = self._stamp
        used = [key for key in keys if key in stamp]
        if used:
            self._use(used)
            entry = self._entry
            evictable = [key for key in used if key in entry]
            if evictable:
                self._push_many(evictable)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        if self._oracle is None:  # no future known: LRU order (module doc); say so
            warnings.warn(UNBOUND_WARNING, RuntimeWarning, stacklevel=3)
        entry = self._entry
        heap = self._heap
        victims: list[Key] = []
        skipped: list[tuple] = []
        examined = 0
        while len(victims) < n:
            item = heappop(heap)
            key = item[2]
            if entry.get(key) is not item:
                continue  # stale: the block was touched, pinned or evicted since
            examined += 1
            if key in protected:
                skipped.append(item)
                continue
            del entry[key]
            del self._stamp[key]
            victims.append(key)
        for item in skipped:
            heappush(heap, item)
        self.examined += examined
        return victims

    def snapshot(self) -> dict:
        live = sorted(self._entry.values())
        return {"order": [(key, -neg) for neg, _, key in live]}

    def clear(self) -> None:
        self._stamp.clear()
        self._entry.clear()
        self._heap.clear()
        self._seq = 0
        self.examined = 0
