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
  A block gets a queue number the first time the hand passes it or sets it aside (a counter;
  the hand meets never-examined blocks in the order they entered the queue, so numbers
  follow the queue), and keeps it while resident; never-examined blocks, all at the head end, have
  none (a victim never needs one; numbering every stored block, with the heap checked at every
  step, cost +16 % per evicted block: docs/performance.md, "Set-aside blocks in LFU and
  SIEVE"). So the queue is the numbered blocks in number order, then the
  others; the hand's position is the number of the last block it passed or set aside in
  this lap (``_hand``; -1 at the tail), or, once it has evicted a block never examined, the
  highest number handed out: every numbered block is behind it then, held blocks set aside
  in an earlier lap included (before session 17 it kept the last number it passed, and such
  a block, released, was met next as if still ahead: the hand went back to the tail).
* The queue is kept as two ordered maps split at the hand: ``_ahead`` (blocks the hand has not
  examined in this lap, up to the head) and ``_behind`` (the blocks it has passed in this lap),
  both in queue order. Passing a block moves it from the front of ``_ahead`` to the end of
  ``_behind``; the wrap-around at the head swaps the two. Every step is O(1).
* When the hand meets a held (pending or pinned) block it sets it aside, O(1), bit and number
  kept, so it is not met again while it stays held. When it becomes evictable again it goes
  into one of two min-heaps by number: ahead of the hand (number above ``_hand``) or behind
  it. The hand takes the lower number of ``_ahead``'s front and the ahead-heap's top, and the
  heaps swap at the wrap like the maps; so the block is met again exactly at its place in the
  queue, whatever order the pins are released in. Heap entries are invalidated lazily (a
  block removed or held again) and the heaps are rebuilt when they hold more than twice the
  blocks aside (plus 64). One approximation: the hand wraps when no block it has not examined
  is left ahead of it; a held block set aside in an earlier lap that lies ahead counts as
  passed (the hand could only pass it), so a block stored just then is met after the wrap.
* A protected block (named in the current ``prepare_store``) is passed like a visited one, but
  its bit is left as it is.
* :meth:`evict` first counts the eligible blocks -- O(|protected|) -- and returns ``None``
  without touching anything (bits, hand, queue) when fewer than ``n`` exist (the base class's
  check). Otherwise it runs the hand and always succeeds.

Bound: within one :meth:`evict` call the hand makes at most one full lap plus the victims: once
it has passed every block all visited bits are clear, so every unprotected block it meets next is
a victim. Each queue entry is therefore examined at most twice per call, and the entries
examined (added to :attr:`examined`) are ``n`` victims + visited bits cleared + protected blocks
passed (each at most twice) + held blocks set aside (each once per hold) + stale heap entries
(each paid for by the call that made it stale). Cleared bits are
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
from heapq import heapify, heappop, heappush

from kvtier.policies.base import CachePolicy, Key

_COMPACT_SLACK = 64  # heap entries allowed beyond twice the blocks aside


class SievePolicy(CachePolicy):
    """SIEVE eviction (Zhang et al., NSDI'24) over the evictable blocks of the tier.

    State: ``_ahead`` / ``_behind`` (resident key -> queue number, the queue split at the hand,
    see the module docstring), ``_aside`` (held keys the hand met -> queue number),
    ``_ahead_heap`` / ``_behind_heap`` (``(number, key)`` of evictable keys aside, lazy),
    ``_hand``, ``_held`` (pending or pinned keys) and ``_bits`` (keys whose visited bit is set,
    any state). O(1) per touched key (a release of a key aside: O(log aside));
    :meth:`evict` examines at most twice each queue entry (O(k + protected), amortized over
    touches and holds).
    """

    name = "sieve"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._ahead: OrderedDict[Key, int | None] = OrderedDict()
        self._behind: OrderedDict[Key, int] = OrderedDict()
        self._aside: dict[Key, int] = {}
        self._ahead_heap: list[tuple[int, Key]] = []
        self._behind_heap: list[tuple[int, Key]] = []
        self._hand = -1
        self._next = 0
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

    def _next_from_heap(self) -> int | None:
        """Drop stale entries at the ahead-heap's top; return its top's number or None."""
        heap, aside, held = self._ahead_heap, self._aside, self._held
        while heap:
            number, key = heap[0]
            if aside.get(key) == number and key not in held:
                return number
            heappop(heap)
            self.examined += 1
        return None

    def _wrap(self) -> None:
        # invariant kept between calls: nothing left ahead of the hand only when the whole
        # queue is behind it, i.e. the hand is back at the tail
        if not self._ahead and self._next_from_heap() is None:
            self._ahead, self._behind = self._behind, self._ahead
            self._ahead_heap, self._behind_heap = self._behind_heap, self._ahead_heap
            self._hand = -1

    # -- state changes -------------------------------------------------------------------
    def insert(self, keys: Sequence[Key]) -> None:
        self._bits.difference_update(keys)
        self._held.update(keys)
        ahead = self._ahead  # the head; only empty if nothing is ahead of the hand
        if not ahead:
            self._wrap()
            ahead = self._ahead
        for key in reversed(keys):
            ahead[key] = None  # numbered when the hand first passes it

    def remove(self, keys: Sequence[Key]) -> None:
        ahead, behind, aside = self._ahead, self._behind, self._aside
        for key in keys:
            if key in ahead:
                del ahead[key]
            elif key in behind:
                del behind[key]
            else:
                del aside[key]  # its heap entry, if any, is now stale
        self._held.difference_update(keys)
        self._bits.difference_update(keys)
        self._wrap()

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        self._held.difference_update(keys)
        aside = self._aside
        if not aside:
            return
        hand, ahead_heap, behind_heap = self._hand, self._ahead_heap, self._behind_heap
        for key in keys:
            number = aside.get(key)
            if number is not None:  # met again exactly at its place in the queue
                heappush(ahead_heap if number > hand else behind_heap, (number, key))
        if len(ahead_heap) + len(behind_heap) > 2 * len(aside) + _COMPACT_SLACK:
            self._compact_heaps()

    def _compact_heaps(self) -> None:
        """Rebuild both heaps from the released blocks aside, dropping stale entries. Its own
        method: comprehensions over ``mark_evictable``'s locals would make them cells, built
        at every call on Python 3.11."""
        aside, held, hand = self._aside, self._held, self._hand
        self._ahead_heap[:] = [(n, k) for k, n in aside.items() if k not in held and n > hand]
        self._behind_heap[:] = [(n, k) for k, n in aside.items() if k not in held and n <= hand]
        heapify(self._ahead_heap)
        heapify(self._behind_heap)

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
        hand = self._hand
        number = self._next  # the next queue number to hand out
        while len(victims) < n:
            if self._ahead_heap and (ahead or self._next_from_heap() is not None):
                # a released block aside may be next: one step at a time, the lower number
                # of the heap's top and _ahead's front (unnumbered: never examined, later)
                top = self._next_from_heap()
                front = ahead[next(iter(ahead))] if ahead else None
                if top is not None and (front is None or top < front):
                    key = heappop(self._ahead_heap)[1]  # met again at its place
                    del aside[key]
                    at = top
                else:
                    key, at = ahead.popitem(False)
                    if at is None:
                        at, number = number, number + 1
                examined += 1
                hand = at
                if key in held:  # aside, not met again while held
                    aside[key] = at
                elif key in bits:
                    bits.discard(key)
                    behind[key] = at
                elif key in protected:
                    behind[key] = at
                else:
                    victims.append(key)
                continue
            if not ahead:  # the hand reached the head: back to the tail
                ahead, behind = self._ahead, self._behind = behind, ahead
                self._ahead_heap, self._behind_heap = self._behind_heap, self._ahead_heap
                hand = -1
                continue
            # nothing aside ahead of the hand: run down _ahead (checking the heap at every
            # step was part of a +16 % per evicted block, docs/performance.md, "Set-aside")
            while ahead:
                key, at = ahead.popitem(False)
                examined += 1
                if key in held or key in bits or key in protected:
                    if at is None:  # numbered when first passed (a victim needs no number)
                        at, number = number, number + 1
                    hand = at
                    if key in held:  # aside, not met again while held
                        aside[key] = at
                    else:  # visited (its bit cleared) or protected: passed
                        bits.discard(key)
                        behind[key] = at
                else:
                    victims.append(key)
                    if at is not None:
                        hand = at
                    if len(victims) == n:
                        break
            if at is None:  # the last block met, a victim, was never examined: the hand is
                hand = number - 1  # past every numbered block, those set aside in an
                # earlier lap included (module docstring); once per run down _ahead, not per
                # victim (per victim: batch sieve 10000 +2.7 % instructions per evicted block)
        self._next = number
        self._hand = hand
        self.examined += examined
        self._wrap()
        return victims

    def snapshot(self) -> dict:
        """``queue``: every resident key from the tail, blocks aside in their place; ``hand``:
        how many of them the hand has passed in this lap. Equal exactly when the policy
        would behave the same."""
        numbered = sorted(
            [(n, k) for k, n in self._behind.items()]
            + [(n, k) for k, n in self._ahead.items() if n is not None]
            + [(n, k) for k, n in self._aside.items()],
            key=lambda e: e[0],
        )
        fresh = [k for k, n in self._ahead.items() if n is None]  # all at the head end
        return {
            "queue": [k for _, k in numbered] + fresh,
            "hand": sum(1 for n, _ in numbered if n <= self._hand),
            "held": set(self._held),
            "visited_bits": set(self._bits),
        }

    def clear(self) -> None:
        self._ahead.clear()
        self._behind.clear()
        self._aside.clear()
        self._ahead_heap.clear()
        self._behind_heap.clear()
        self._hand = -1
        self._next = 0
        self._held.clear()
        self._bits.clear()
        self.examined = 0
