"""SIEVE: one FIFO queue, a visited bit per block and a moving hand.

Source: Y. Zhang, J. Yang, Y. Yue, Y. Vigfusson, K. V. Rashmi, "SIEVE is Simpler than LRU: an
Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI'24.

The algorithm: new blocks enter the queue's head; a hit only sets the block's visited bit (no
move). To evict, a hand walks from the tail (oldest) toward the head: a visited block has its bit
cleared and is passed, the first unvisited block is the victim, and the hand stays where the
victim was (it continues from the victim's newer neighbour next time). At the head the hand wraps
around to the tail.

How it maps to the offloading contract (each choice is also what keeps :meth:`evict` bounded):

* The queue holds **evictable blocks only**. A pending or pinned block is out of the queue; a
  touch still sets its visited bit, so a use while pinned is not lost. When it becomes evictable
  again (:meth:`mark_evictable`: store completed or last pin released) it re-enters at the
  queue's head, as a newly inserted block does -- the FIFO meaning of "the MRU end" (a
  call's keys enter tail first, so ``keys[0]`` ends at the head).
* The queue is kept as two ordered maps split at the hand: ``_ahead`` (the hand's block, then
  every newer block up to the head) and ``_behind`` (the blocks the hand has passed in this lap,
  oldest first). Passing a block moves it from the front of ``_ahead`` to the end of
  ``_behind``; the wrap-around swaps the two. Every step is O(1).
* A protected block (named in the current ``prepare_store``) is passed like a visited one, but
  its bit is left as it is.
* :meth:`evict` first counts the eligible blocks -- O(|protected|) -- and returns ``None``
  without touching anything (bits, hand, queue) when fewer than ``n`` exist (the base class's
  check). Otherwise it runs the hand and always succeeds.

Bound: within one :meth:`evict` call the hand makes at most one full lap plus the victims: once
it has passed every block all visited bits are clear, so every unprotected block it meets next is
a victim. Each queue entry is therefore examined at most twice per call, and the entries
examined (added to :attr:`examined`) are ``n`` victims + visited bits cleared + protected blocks
passed (each at most twice). Cleared bits are paid for by the touches that set them (one bit per
touch at most), so eviction is O(k + protected) amortized over touches, not worst case: a call
that meets ``m`` visited blocks examines ``m`` extra entries, as in the paper.

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: each resident key's visited bit is set, inserted ones included.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvtier.policies.base import CachePolicy, Key


class SievePolicy(CachePolicy):
    """SIEVE eviction (Zhang et al., NSDI'24) over the evictable blocks of the tier.

    State: ``_ahead`` / ``_behind`` (evictable keys, the queue split at the hand, see the
    module docstring), ``_held`` (pending or pinned keys) and ``_bits`` (keys whose visited
    bit is set, any state). O(1) per touched key; :meth:`evict` examines at most twice
    each queue entry (O(k + protected), amortized over touches).
    """

    name = "sieve"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._ahead: OrderedDict[Key, None] = OrderedDict()
        self._behind: OrderedDict[Key, None] = OrderedDict()
        self._held: set[Key] = set()
        self._bits: set[Key] = set()
        self._orders = (self._ahead, self._behind)  # the same two maps, whichever is ahead

    def _wrap(self) -> None:
        # invariant: the hand's side is empty only when the whole queue is
        if not self._ahead and self._behind:
            self._ahead, self._behind = self._behind, self._ahead

    # -- state changes -------------------------------------------------------------------
    def insert(self, keys: Sequence[Key]) -> None:
        self._held.update(keys)
        self._bits.difference_update(keys)

    def remove(self, keys: Sequence[Key]) -> None:
        self._held.difference_update(keys)
        self._bits.difference_update(keys)

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        self._held.difference_update(keys)
        ahead = self._ahead  # the head; _behind is empty if _ahead is
        for key in reversed(keys):
            ahead[key] = None

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        ahead, behind = self._ahead, self._behind
        for key in keys:
            if key in ahead:
                del ahead[key]
            else:
                del behind[key]
        self._held.update(keys)
        self._wrap()

    def touch(self, keys: Sequence[Key]) -> None:
        bits = self._bits
        ahead, behind, held = self._ahead, self._behind, self._held
        for key in keys:
            if key in ahead or key in behind or key in held:
                bits.add(key)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        ahead, behind = self._ahead, self._behind
        bits = self._bits
        victims: list[Key] = []
        examined = 0
        while len(victims) < n:
            if not ahead:
                ahead, behind = behind, ahead
            key = ahead.popitem(False)[0]
            examined += 1
            if key in bits:
                bits.discard(key)
                behind[key] = None
            elif key in protected:
                behind[key] = None
            else:
                victims.append(key)
        if not ahead:
            ahead, behind = behind, ahead
        self._ahead, self._behind = ahead, behind
        self.examined += examined
        return victims

    def snapshot(self) -> dict:
        # the hand's position is where _ahead starts: the queue read from the tail is
        # behind + ahead, and len(behind) says where the hand is
        return {
            "queue": list(self._behind) + list(self._ahead),
            "hand": len(self._behind),
            "held": set(self._held),
            "visited_bits": set(self._bits),
        }

    def clear(self) -> None:
        self._ahead.clear()
        self._behind.clear()
        self._held.clear()
        self._bits.clear()
        self.examined = 0
