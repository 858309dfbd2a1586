"""Admission: which new blocks a tier accepts.

:class:`AdmissionTracker` counts lookups per key (in a bounded LRU of keys) and admits a key
to ``prepare_store`` once it has been looked up ``threshold`` times, so one-off blocks do not
push out blocks that are reused. This is the "admit on the N-th request" rule of web and CDN
caches (e.g. the bloom-filter "one-hit wonder" filter of Maggs & Sitaraman, "Algorithmic
nuggets in content delivery", SIGCOMM CCR 2015), with exact counts for the keys remembered.
Not thread-safe (as the manager that calls it: one thread, or a ``ThreadSafeManager``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from kvtier.checks import check_positive_int


class AdmissionTracker:
    """Lookup counts of the last ``max_size`` keys seen, and the admission rule over them.

    Args:
        threshold: lookups a key needs before it is admitted (>= 2; 1 would admit everything,
            for which the manager keeps no tracker).
        max_size: keys remembered (>= 1); the least recently looked-up key is forgotten first.

    Raises:
        ValueError: ``threshold`` < 2 or ``max_size`` < 1 (or not ints).
    """

    __slots__ = ("_counts", "max_size", "threshold")

    def __init__(self, threshold: int, max_size: int) -> None:
        threshold = check_positive_int("store_threshold", threshold)
        if threshold < 2:
            raise ValueError(f"an admission threshold must be >= 2 lookups, got {threshold!r}")
        self.threshold = threshold
        self.max_size = check_positive_int("max_tracker_size", max_size, "keys")
        self._counts: OrderedDict[Hashable, int] = OrderedDict()

    def record(self, keys: Sequence[Hashable]) -> None:
        """Count one lookup of each of ``keys``. O(len(keys)).

        Keys are counted in the call's order, so its last key ends most recent; a call that
        names more keys than the tracker holds is counted tail first instead, so the trim
        keeps its head (the blocks a prefix lookup reaches first), not its tail.

        Raises:
            TypeError: a key is not hashable (nothing is counted).
        """
        for key in keys:
            hash(key)  # validate every key before counting any
        counts = self._counts
        if len(keys) > self.max_size:
            # counted head first, the trim below would drop the call's own head and keep
            # only its tail, which a prefix lookup never reaches (rare: the default tracker
            # holds 64,000 keys)
            keys = keys[::-1]
        for key in keys:
            counts[key] = counts.pop(key, 0) + 1
        while len(counts) > self.max_size:
            counts.popitem(False)

    def admit(self, keys: list[Hashable]) -> list[Hashable]:
        """The keys of ``keys`` looked up at least ``threshold`` times, in order."""
        counts, threshold = self._counts, self.threshold
        return [key for key in keys if counts.get(key, 0) >= threshold]

    def count(self, key: Hashable) -> int:
        """Lookups of ``key`` remembered (0 if forgotten or never seen)."""
        return self._counts.get(key, 0)

    def items(self) -> list[tuple[Hashable, int]]:
        """``(key, lookups)`` pairs, least recently looked up first (a fresh list)."""
        return list(self._counts.items())

    def clear(self) -> None:
        """Forget every count."""
        self._counts.clear()
