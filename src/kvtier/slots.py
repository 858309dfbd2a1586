"""The slot allocator of one tier: which of the ``num_blocks`` slots are free.

Fresh (never used) slots are handed out first, in order ``0, 1, 2, ...``; after that, freed
slots, most recently freed first. Nothing is allocated per slot up front, so a huge tier that
stays mostly empty costs no memory. Not thread-safe: only its manager calls it, which takes
no lock either (one thread, or a ``kvtier.threadsafe.ThreadSafeManager``).
"""

from __future__ import annotations

from kvtier.checks import check_positive_int


class SlotAllocator:
    """Free slots of a tier of ``num_blocks`` slots (ids ``0 .. num_blocks - 1``).

    Args:
        num_blocks: the tier's size in blocks (>= 1).

    Raises:
        ValueError: ``num_blocks`` is not a positive int.

    Attributes:
        num_blocks: as given.
        next_fresh: slots ``0 .. next_fresh - 1`` have been handed out at least once.
        free: freed slots, the next one handed out last (a plain list: callers that free many
            slots extend it directly, see :meth:`release`).

    The caller keeps the count of used slots: :meth:`take_one` and :meth:`take` must only be
    asked for slots that are free (``num_blocks - used``).
    """

    __slots__ = ("free", "next_fresh", "num_blocks")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_positive_int("num_blocks", num_blocks, "blocks")
        self.next_fresh = 0
        self.free: list[int] = []

    def take_one(self) -> int:
        """One free slot: a fresh one first, else the most recently freed."""
        slot = self.next_fresh
        if slot < self.num_blocks:
            self.next_fresh = slot + 1
            return slot
        return self.free.pop()

    def take(self, n: int) -> list[int]:
        """``n`` free slots (``n >= 1``): fresh ones first, then freed ones, most recent first."""
        start = self.next_fresh
        fresh = self.num_blocks - start  # never-used slots left
        if fresh > n:
            fresh = n
        slots = list(range(start, start + fresh))
        self.next_fresh = start + fresh
        if fresh < n:
            free = self.free
            reused = n - fresh
            slots.extend(reversed(free[-reused:]))
            del free[-reused:]
        return slots

    def release(self, slots: list[int]) -> None:
        """Give ``slots`` back (each must be in use); the last one is handed out first."""
        self.free.extend(slots)

    def reset(self) -> None:
        """Every slot free and fresh again."""
        self.next_fresh = 0
        self.free.clear()
