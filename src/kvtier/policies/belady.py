"""Belady / MIN: evict the block whose next use is furthest in the future (offline).

Source: L. A. Belady, "A study of replacement algorithms for a virtual-storage computer", IBM
Systems Journal 5(2), 1966 (MIN, optimal for demand paging: Mattson et al., IBM Systems
Journal 9(2), 1970). It needs the whole trace up front, so it is an *offline* policy: a
capacity-planning bound to measure online policies against, not something an engine can run.

The future comes from a :class:`~kvtier.oracle.NextUseOracle` bound with :meth:`bind`; the
replay (:func:`kvtier.replay.replay` with ``policy="belady"``) builds it from the trace and
advances its clock (see :mod:`kvtier.oracle` for the hand-off). The policy only orders
evictable blocks and chooses victims, like every policy:

* order: a max-heap of evictable blocks keyed by ``(next use, recency)``; a block's entry is
  pushed when it becomes evictable and again when it is touched (its next use changed), and
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

Porting note: the policy uses slots only to return them from :meth:`evict` (the 4th item of a
heap entry); a keys-only contract drops that item and nothing else changes.

Without a bound oracle every next use is unknown (``NEVER``) and the recency tie-break alone
decides: the policy then evicts exactly like ``lru`` (tested), which is what the manager tests
that run every registered policy see.

Exactness: under ``--protocol get`` (one get-with-insert per reference) this is MIN, and its
hits equal a brute-force optimum (``tests/policies/test_belady.py``). Under the ``prefix``
protocol a block hits only while every block before it in the request hits, so furthest next
use is a heuristic there; docs/policies.md gives the measured distance to brute force.

Not thread-safe (the manager serialises calls).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

from kvtier.policies.base import CachePolicy, Key, count_eligible, protected_set

if TYPE_CHECKING:
    from kvtier.oracle import NextUseOracle

_NEVER = (1 << 62) - 1  # == kvtier.oracle.NEVER (not imported: keeps this file standalone)


class BeladyPolicy(CachePolicy):
    """Belady's MIN over evictable blocks, reading next uses from a bound oracle.

    State: ``_entry`` (evictable key -> its live heap entry ``(-next_use, seq, key, slot)``;
    ``seq`` is a counter, so entries never compare keys and equal next uses go least recent
    first), ``_heap`` (live and stale entries), ``_resident`` (key -> slot, the manager's map
    when shared).
    """

    name = "belady"
    needs_future = True
    """Replays must bind a :class:`~kvtier.oracle.NextUseOracle` (whole trace up front)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._entry: dict[Key, tuple] = {}
        self._heap: list[tuple] = []
        self._seq = 0
        self._next_use: Mapping[Key, int] = {}
        self._oracle: NextUseOracle | None = None
        self._resident: Mapping[Key, int] = {}
        self._own_state = True

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
        for key, entry in list(self._entry.items()):
            self._push(key, entry[3])

    # -- queries -------------------------------------------------------------------------
    def get(self, key: Key) -> int | None:
        return self._resident.get(key)

    def __len__(self) -> int:
        return len(self._resident)

    def share_state(self, resident: Mapping[Key, int], pending: Collection[Key]) -> None:
        self._resident = resident
        self._own_state = False

    # -- the order -----------------------------------------------------------------------
    def _push(self, key: Key, slot: int) -> None:
        self._seq += 1
        entry = (-self._next_use.get(key, _NEVER), self._seq, key, slot)
        self._entry[key] = entry
        heappush(self._heap, entry)
        self._compact()

    def _push_many(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        # one loop, one compaction check: block_evictable per key was 1/3 of the replay time
        get = self._next_use.get
        entries = self._entry
        heap = self._heap
        seq = self._seq
        for key, slot in zip(keys, slots):
            seq += 1
            entry = (-get(key, _NEVER), seq, key, slot)
            entries[key] = entry
            heappush(heap, entry)
        self._seq = seq
        self._compact()

    def _compact(self) -> None:
        heap = self._heap
        if len(heap) > 2 * len(self._entry) + 64:  # mostly stale: rebuild from live entries
            heap[:] = self._entry.values()
            heapify(heap)

    def insert(self, key: Key, slot: int) -> None:
        if self._own_state:
            self._resident[key] = slot  # type: ignore[index]

    def insert_many(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        if self._own_state:
            self._resident.update(zip(keys, slots))  # type: ignore[attr-defined]

    def remove(self, key: Key) -> None:
        if self._own_state:
            self._resident.pop(key, None)  # type: ignore[attr-defined]
        self._entry.pop(key, None)

    def block_evictable(self, key: Key, slot: int) -> None:
        self._push(key, slot)

    def blocks_evictable(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        self._push_many(keys, slots)

    def block_unevictable(self, key: Key) -> None:
        del self._entry[key]  # its heap entry goes stale

    def touch(self, keys: Sequence[Key]) -> None:
        entry = self._entry
        live = [(key, old[3]) for key in reversed(keys) if (old := entry.get(key)) is not None]
        if live:
            self._push_many([k for k, _ in live], [s for _, s in live])

    def evict(self, n: int, protected: Collection[Key]) -> list[tuple[Key, int]] | None:
        entry = self._entry
        if protected:
            protected = protected_set(protected)
            if count_eligible(protected, entry) < n:
                return None
        elif len(entry) < n:
            return None
        heap = self._heap
        victims: list[tuple[Key, int]] = []
        skipped: list[tuple] = []
        while len(victims) < n:
            item = heappop(heap)
            key = item[2]
            if entry.get(key) is not item:
                continue  # stale: the block was touched, pinned or evicted since
            self.visited += 1
            if key in protected:
                skipped.append(item)
                continue
            del entry[key]
            victims.append((key, item[3]))
        for item in skipped:
            heappush(heap, item)
        if self._own_state:
            resident = self._resident
            for key, _ in victims:
                del resident[key]  # type: ignore[attr-defined]
        return victims

    def snapshot(self) -> dict:
        live = sorted(self._entry.values())
        held = {key: slot for key, slot in self._resident.items() if key not in self._entry}
        return {"order": [(key, slot, -neg) for neg, _, key, slot in live], "held": held}

    def clear(self) -> None:
        self._entry.clear()
        self._heap.clear()
        self._seq = 0
        if self._own_state:
            self._resident.clear()  # type: ignore[attr-defined]
        self.visited = 0
