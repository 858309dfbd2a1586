"""SIEVE: one FIFO queue, a visited bit per block and a moving hand.

Source: Y. Zhang, J. Yang, Y. Yue, Y. Vigfusson, K. V. Rashmi, "SIEVE is Simpler than LRU: an
Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI'24.

The algorithm: new blocks enter the queue's head; a hit only sets the block's visited bit (no
move). To evict, a hand walks from the tail (oldest) toward the head: a visited block has its bit
cleared and is passed, the first unvisited block is the victim, and the hand stays where the
victim was (it continues from the victim's newer neighbour next time). At the head the hand wraps
around to the tail.

How it maps to the offloading contract (each choice is also what keeps :meth:`evict` bounded):

* The queue holds every resident block, pinned and pending ones included: a block's place is
  set when it is stored (a call's keys enter tail first, so ``keys[0]`` ends at the head) and
  never moved by a pin or a completed store; a touch sets the visited bit whatever the state.
  When the hand meets a held (pending or pinned) block it sets it aside, O(1), bit kept; when
  that block becomes evictable again it re-enters just behind the hand, i.e. where the hand
  met it if the hand has not moved on since, else after the blocks the hand passed meanwhile
  (a FIFO with a hand has no O(1) way back to the exact spot; this errs on keeping the block
  longer, and at most by one lap).
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
passed (each at most twice) + held blocks set aside (each once per hold). Cleared bits are
paid for by the touches that set them (one bit per touch at most), so eviction is
O(k + protected) amortized over touches and holds, not worst case: a call that meets ``m``
visited blocks examines ``m`` extra entries, as in the paper.

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: each resident key's visited bit is set, inserted ones included (counting
reused keys only, as ARC does, measured worse: docs/manager.md, "Request mode").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvtier.policies.base import CachePolicy, Key


class SievePolicy(CachePolicy):
    """SIEVE eviction (Zhang et al., NSDI'24) over the evictable blocks of the tier.

    State: ``_ahead`` / ``_behind`` (resident keys, the queue split at the hand, see the
    module docstring), ``_aside`` (held keys the hand met), ``_held`` (pending or pinned
    keys) and ``_bits`` (keys whose visited bit is set, any state). O(1) per touched key; :meth:`evict` examines at most twice
    each queue entry (O(k + protected), amortized over touches).
    """

    name = "sieve"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._ahead: OrderedDict[Key, None] = OrderedDict()
        self._behind: OrderedDict[Key, None] = OrderedDict()
        self._aside: set[Key] = set()
        self._held: set[Key] = set()
        self._bits: set[Key] = set()

    def count_eligible(self, protected: Collection[Key] = ()) -> int:
        # evictable = in the queue or aside, and not held
        ahead, behind, aside, held = self._ahead, self._behind, self._aside, self._held
        eligible = len(ahead) + len(behind) + len(aside) - len(held)
        for key in protected:
            if (key in ahead or key in behind or key in aside) and key not in held:
                eligible -= 1
        return eligible

    def _wrap(self) -> None:
        # invariant: the hand's side is empty only when the whole queue is
        if not self._ahead and self._behind:
            self._ahead, self._behind = self._behind, self._ahead

    # -- state changes -------------------------------------------------------------------
    def insert(self, keys: Sequence[Key]) -> None:
        self._bits.difference_update(keys)
        self._held.update(keys)
        ahead = self._ahead  # the head; _behind is empty if _ahead is
        for key in reversed(keys):
            ahead[key] = None

    def remove(self, keys: Sequence[Key]) -> None:
        ahead, behind, aside = self._ahead, self._behind, self._aside
        for key in keys:
            if key in ahead:
                del ahead[key]
            elif key in behind:
                del behind[key]
            else:
                aside.remove(key)
        self._held.difference_update(keys)
        self._bits.difference_update(keys)
        self._wrap()

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        self._held.difference_update(keys)
        aside = self._aside
        if aside:
            back = [key for key in keys if key in aside]
            if back:  # just behind the hand (see the module docstring)
                aside.difference_update(back)
                queue = self._behind if self._ahead else self._ahead
                for key in back:
                    queue[key] = None

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        self._held.update(keys)

    def touch(self, keys: Sequence[Key]) -> None:
        bits = self._bits
        ahead, behind, aside = self._ahead, self._behind, self._aside
        for key in keys:
            if key in ahead or key in behind or key in aside:
                bits.add(key)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        ahead, behind = self._ahead, self._behind
        bits, held, aside = self._bits, self._held, self._aside
        victims: list[Key] = []
        examined = 0
        while len(victims) < n:
            if not ahead:
                ahead, behind = behind, ahead
            key = ahead.popitem(False)[0]
            examined += 1
            if key in held:
                aside.add(key)
            elif key in bits:
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
            "aside": set(self._aside),
            "held": set(self._held),
            "visited_bits": set(self._bits),
        }

    def clear(self) -> None:
        self._ahead.clear()
        self._behind.clear()
        self._aside.clear()
        self._held.clear()
        self._bits.clear()
        self.examined = 0
