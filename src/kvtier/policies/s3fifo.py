"""S3-FIFO: a small FIFO, a main FIFO, a ghost FIFO and a 2-bit frequency per block.

Source: J. Yang, Y. Zhang, Z. Qiu, Y. Yue, K. V. Rashmi, "FIFO queues are all you need for
cache eviction", SOSP'23 (Algorithm 1), checked against libCacheSim's ``S3FIFO`` (the authors'
simulator) for the details the paper leaves open.

The algorithm, in blocks (every block has size 1):

* A new block enters the small queue S (10 % of the capacity), unless its key is in the ghost
  queue G, in which case it enters the main queue M (the rest of the capacity) directly.
  While the tier is filling up (no eviction yet), a block that finds S full enters M: this is
  libCacheSim's refinement of the paper's algorithm (the paper's version would let S grow past
  its share and then drain it); it only changes the first fill. A call's keys take S's room
  tail first, so a request's head goes to M and its tail to S, which is evicted first: the
  tail leaves before the head from the first fill on, as in every built-in policy.
* A hit adds 1 to the block's frequency, capped at 3 (2 bits). Nothing moves.
* To evict one block: if M holds more than its share, or S is empty, evict from M, else from S.

  - From S: take S's oldest block; if its frequency is at least 2 (``MOVE_TO_MAIN``, as in the
    paper's ``freq > 1`` and libCacheSim's default threshold) it moves to M's tail with its
    frequency reset to 0 and the next oldest is tried; otherwise it is the victim and its key
    enters G.
  - From M: take M's oldest block; if its frequency is above 0 it is reinserted at M's tail
    with the frequency lowered by one (FIFO-reinsertion, i.e. CLOCK with a 2-bit counter);
    otherwise it is the victim (no ghost entry).

* G holds the keys of the blocks most recently evicted from S, at most 90 % of the capacity
  (the size of M), oldest dropped first.

How it maps to the offloading contract:

* S and M keep their FIFO order over every resident block, pinned and pending ones included
  (:class:`~kvtier.policies.order.LogicalOrder`): a block's place is set when it is stored (a
  call's keys enter tail first, so ``keys[0]`` ends newest) or moved by the algorithm itself
  (promotion to M, reinsertion in M), never by a pin or a completed store. Membership (S or
  M) and frequency are kept while a block is pending or pinned, and a touch of a pending or
  pinned block still counts. An eviction walk that meets a held block sets it aside in O(1);
  it comes back at its place when it becomes evictable. The share test ("M holds more than
  its share") counts every resident block of M, pinned and pending included, like ARC's list
  sizes.
* If the chosen queue has no eligible block (all pinned, pending or protected), eviction falls
  back to the other queue. A protected block that would be evicted stays at the head of its
  queue (it is passed over, not moved: in front of the held blocks the same walk sets aside
  after it, :meth:`~kvtier.policies.order.LogicalOrder.pass_over`; before session 17 it went
  back to the front of the live order, behind them); one that would be promoted or
  reinserted is, as usual.
* The ghost check happens when the block is inserted, after the eviction that makes room for
  it (as in the paper). G is trimmed to its bound in :meth:`on_store`, after the whole
  ``prepare_store`` call, and at the start of :meth:`evict`: so a key evicted by the same call
  is found as in libCacheSim, which checks G before evicting.
* :meth:`evict` counts the eligible blocks first -- O(|protected|) -- and returns ``None``
  without changing anything (queues, frequencies, ghost) when fewer than ``n`` exist
  (the base class's check); otherwise it always succeeds.

Bound: S is walked at most once per call (each block met is promoted or evicted or, if
protected, passed once). M is a FIFO with reinsertion: a block met with frequency ``f`` is
reinserted at most ``f <= 3`` times before it can be a victim, so within one call each entry of
M is examined at most 4 times. The entries examined (added to :attr:`examined`) are the ``n``
victims, the protected blocks passed, the promotions from S (one per block stored) and the
reinsertions in M, each of which uses up one unit of frequency that a touch added: eviction is
O(k + protected) amortized over stores and touches, not worst case.

Request mode (the manager's ``on_request_finished``): the base class's default, one ``touch``
of the request's keys: +1 frequency for each resident key, inserted ones included (counting
reused keys only, as ARC does, measured worse: docs/manager.md, "Request mode").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from kvtier.policies.base import CachePolicy, Key
from kvtier.policies.order import LogicalOrder

#: frequency cap (2-bit counter)
MAX_FREQ = 3
#: a block leaving S with at least this frequency moves to M
MOVE_TO_MAIN = 2
#: S's share of the capacity
SMALL_RATIO = 0.1
#: G's bound, as a share of the capacity
GHOST_RATIO = 0.9


class S3FIFOPolicy(CachePolicy):
    """S3-FIFO eviction (Yang et al., SOSP'23) over the evictable blocks of the tier.

    Args:
        capacity: the tier's size in blocks (>= 1). S gets ``max(1, int(0.1 * capacity))``
            blocks, M the rest; G remembers up to ``int(0.9 * capacity)`` keys.

    Raises:
        ValueError: ``capacity`` is not a positive int.

    State: resident membership ``_in_small`` / ``_in_main`` (sets, every resident block),
    FIFO orders ``_small`` / ``_main`` (:class:`~kvtier.policies.order.LogicalOrder`, oldest
    first, held blocks in place), ``_freq`` (key -> 0..3)
    and the ghost queue ``_ghost`` (oldest first). O(1) per touched key;
    :meth:`evict` is O(k + protected) amortized (see the module docstring).
    """

    name = "s3fifo"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.small_capacity = max(1, int(capacity * SMALL_RATIO))
        self.main_capacity = capacity - self.small_capacity
        self.ghost_capacity = int(capacity * GHOST_RATIO)
        self._in_small: set[Key] = set()
        self._in_main: set[Key] = set()
        self._small = LogicalOrder()
        self._main = LogicalOrder()
        self._freq: dict[Key, int] = {}
        self._ghost: OrderedDict[Key, None] = OrderedDict()
        self._has_evicted = False
        self._orders = (self._small, self._main)

    @property
    def small_size(self) -> int:
        """|S| in blocks: resident blocks in the small queue (pinned and pending included)."""
        return len(self._in_small)

    @property
    def main_size(self) -> int:
        """|M| in blocks: resident blocks in the main queue (pinned and pending included)."""
        return len(self._in_main)

    def _trim_ghost(self) -> None:
        ghost = self._ghost
        limit = self.ghost_capacity
        while len(ghost) > limit:
            ghost.popitem(False)

    # -- state changes -------------------------------------------------------------------
    def insert(self, keys: Sequence[Key]) -> None:
        in_small, in_main, freq, ghost = self._in_small, self._in_main, self._freq, self._ghost
        small, main = self._small, self._main
        for key in reversed(keys):  # tail first: while S is filling, the tail takes its room
            if ghost.pop(key, 0) is None or (
                not self._has_evicted and len(in_small) >= self.small_capacity
            ):
                in_main.add(key)
                main.append(key, True)
            else:
                in_small.add(key)
                small.append(key, True)
            freq[key] = 0

    def remove(self, keys: Sequence[Key]) -> None:
        for key in keys:
            del self._freq[key]
            if key in self._in_small:
                self._in_small.remove(key)
                self._small.discard(key)
            else:
                self._in_main.remove(key)
                self._main.discard(key)

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        self._small.release(keys)  # a key not held in a queue is a no-op there
        self._main.release(keys)

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        in_small, small_held, main_held = self._in_small, self._small.held, self._main.held
        for key in keys:
            if key in in_small:
                small_held.add(key)
            else:
                main_held.add(key)

    def touch(self, keys: Sequence[Key]) -> None:
        freq = self._freq
        # a key named twice in one call is one use (CachePolicy.touch); the counts do not
        # depend on the order, so a set does
        for key in set(keys) if len(keys) > 1 else keys:
            f = freq.get(key)
            if f is not None and f < MAX_FREQ:
                freq[key] = f + 1

    def on_store(self, keys: Sequence[Key]) -> None:
        self._trim_ghost()

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        self._trim_ghost()
        small, main = self._small, self._main
        in_small, in_main, freq, ghost = self._in_small, self._in_main, self._freq, self._ghost
        main_capacity = self.main_capacity
        victims: list[Key] = []
        small_passed: list = []
        main_passed: list = []
        examined = -small.parked - main.parked  # blocks set aside count as examined
        while len(victims) < n:
            if (len(in_main) <= main_capacity or not len(main)) and len(small):
                # evict from S: promote frequent blocks until one leaves
                found = False
                while True:
                    item = small.pop_front()
                    if item is None:
                        break
                    key = item[0]
                    examined += 1
                    if freq[key] >= MOVE_TO_MAIN:
                        in_small.remove(key)
                        in_main.add(key)
                        main.append(key)
                        freq[key] = 0
                    elif key in protected:
                        small_passed.append(small.pass_over(item))
                    else:
                        in_small.remove(key)
                        del freq[key]
                        ghost[key] = None
                        victims.append(key)
                        found = True
                        break
                if found:
                    continue
            # evict from M: reinsert blocks with frequency left until one leaves
            while True:
                item = main.pop_front()
                if item is None:
                    break
                key = item[0]
                examined += 1
                f = freq[key]
                if f > 0:
                    freq[key] = f - 1
                    main.append(key)
                elif key in protected:
                    main_passed.append(main.pass_over(item))
                else:
                    in_main.remove(key)
                    del freq[key]
                    victims.append(key)
                    break
        # protected blocks passed over keep their place at the head of their queue
        small.restore_front(small_passed)
        main.restore_front(main_passed)
        self._has_evicted = True
        self.examined += examined + small.parked + main.parked
        return victims

    def snapshot(self) -> dict:
        return {
            "in_small": set(self._in_small),
            "in_main": set(self._in_main),
            "small": self._small.keys(),
            "main": self._main.keys(),
            "held": self._small.held | self._main.held,
            "freq": dict(self._freq),
            "ghost": list(self._ghost),
            "has_evicted": self._has_evicted,
        }

    def clear(self) -> None:
        for part in (self._in_small, self._in_main, self._small, self._main, self._freq,
                     self._ghost):
            part.clear()
        self._has_evicted = False
        self.examined = 0
