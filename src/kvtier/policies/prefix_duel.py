"""The prefix-aware wrapper's safeguard: its out-of-order victims duel the inner policy's.

:class:`~kvtier.policies.prefix.PrefixAwarePolicy` evicts some blocks before the inner policy's
choice: orphans (a prefix lookup cannot reach them) and, while they are measured dead, leaves
(:mod:`kvtier.policies.leaf_reuse`). Each such *rule* is a bet: evicting block X out of order
keeps the inner policy's next victim Y resident a while longer. It wins when X is less likely to
be hit again soon than Y. The leaf estimator only compares leaves with their parents, and the
orphan rule assumes an orphan stays unreachable; on traffic where that is wrong (leaves reused
often but less than their parents, inner victims that are deader still, tiny tiers) the bet
loses. This module measures the bet directly and turns a rule off while it loses.

Method: set dueling (Qureshi et al., "Adaptive Insertion Policies for High Performance
Caching", ISCA'07) adapted to a fully associative tier, where sets cannot be split between two
policies without one of them borrowing the other's space. Instead each eviction is a sample, as
in ARC's ghost lists (Megiddo & Modha, FAST'03): every victim enters a ghost record with its
class (0: the inner policy's choice; 1, 2, ...: a rule's choice) and the eviction clock. A ghost
*hits* when a later touch names the key within :data:`horizon <EvictionDuel.horizon>`
(``capacity``) evictions and every key before it in the touch is resident (so keeping it would
have given a prefix hit; a key after a miss would be stored again whatever the policy). A rule's
rate ``h_r / e_r`` (ghost hits per recorded victim) is the hits its victims cost; the inner
class's rate ``h_0 / e_0`` is what one more block of room would have earned at the cold end of
the inner order. A ghost hit scores the prefix hits it gives: one for the block plus one for each
resident block after it in the touch up to the next missing one (keeping the head of a chain
keeps its cached tail reachable). A rule is allowed (:meth:`allows`) while ``h_r / e_r <=
DUEL_RATIO * h_0 / e_0``, once both classes have :data:`DUEL_MIN` recorded victims (before
that: allowed, the rule's own default). :data:`DUEL_RATIO` (one half: "clearly lower") is a
margin for what the score does not see: a block the wrapper evicts leaves the inner policy
without a ghost entry of its own (S3-FIFO's G, ARC's B1), and the equal horizon of both classes
is exact for LRU only (a block's remaining life in the inner order is unknown to the wrapper).

While a rule is not allowed its picks are still recorded, as *virtual* victims that stay
resident (DIP keeps its leader sets on both policies for the same reason): a virtual victim
that is hit within the horizon is a hit the rule would have cost. So a rule that stops losing
(the traffic changed) is allowed again, and measuring costs no hits. Counts per class are
halved when the class reaches :data:`DUEL_WINDOW` victims, so old traffic fades.

The constants are generic, not tuned on any trace: the horizon is one tier's worth of
evictions (ARC's ghost bound), 256 victims per class before the duel decides (a rate's
standard error below 3 points), a window of 4,096 victims (at a rate of 5 % its standard error
is under 0.4 points) and "at most half" (as the leaf estimator's ``LEAF_RATIO``).

Cost: O(1) per recorded victim (amortized: expired ghosts leave in order); :meth:`on_touch` one
dict lookup per key while ghosts exist, plus a residency test per key up to the first miss.
Memory: the ghosts of the last ``capacity`` evictions plus the virtual victims recorded in the
same span: at most ``2 * capacity`` keys. Not thread-safe (as the policies).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence

from kvtier.policies.base import Key

INNER = 0
"""Class of the inner policy's own victims."""

DUEL_MIN = 256
"""Recorded victims each class needs (decayed counts) before a rule can be turned off."""

DUEL_WINDOW = 4096
"""A class's counts are halved when its recorded victims reach this many."""

DUEL_RATIO = 0.5
"""A rule is allowed while its victims' ghost-hit rate is at most this share of the inner
policy's victims' rate: "clearly lower", a margin for what the ghost rates do not see (see the
module docstring)."""

_VIRTUAL = 4  # value bit: the victim was only picked, not evicted (it stays resident)
_SHIFT = 3  # value = eviction clock << _SHIFT | _VIRTUAL? | class (classes 0..3)


class EvictionDuel:
    """Ghost-hit rates of the inner policy's victims against each rule's (module docstring).

    Args:
        capacity: the tier's size in blocks (>= 1): the horizon, in evictions.
        rules: number of rules (1..3); rule classes are ``1..rules``.

    Attributes:
        horizon: evictions a ghost stays countable (``capacity``).
        allowed: ``allowed[r]`` is whether rule ``r`` may act now (index 0 unused, True).
    """

    __slots__ = ("horizon", "allowed", "_ghost", "_clock", "_evicted", "_hits")

    def __init__(self, capacity: int, rules: int = 2) -> None:
        if not 1 <= rules <= 3:
            raise ValueError(f"rules must be 1..3, got {rules!r}")
        self.horizon = capacity
        self.allowed = [True] * (rules + 1)
        self._ghost: OrderedDict[Key, int] = OrderedDict()  # key -> clock << 3 | flags
        self._clock = 0  # real evictions so far
        self._evicted = [0] * (rules + 1)  # recorded victims per class, decayed
        self._hits = [0] * (rules + 1)  # of those, ghost hits

    def allows(self, rule: int) -> bool:
        """Whether rule ``rule`` may evict out of the inner order now."""
        return self.allowed[rule]

    def _decide(self) -> None:
        e, h = self._evicted, self._hits
        if e[INNER] < DUEL_MIN:
            return
        for rule in range(1, len(e)):
            if e[rule] >= DUEL_MIN:
                # rate_rule <= DUEL_RATIO * rate_inner, cross-multiplied
                self.allowed[rule] = h[rule] * e[INNER] <= DUEL_RATIO * h[INNER] * e[rule]

    def record(self, keys: Sequence[Key], cls: int, virtual: bool = False) -> None:
        """``keys`` were evicted (or, ``virtual``, only picked) as class ``cls`` victims."""
        if keys:
            self._record(keys, cls, virtual)

    def _record(self, keys: Sequence[Key], cls: int, virtual: bool) -> None:
        ghost = self._ghost
        pop = ghost.pop
        if not virtual:
            self._clock += len(keys)
        value = self._clock << _SHIFT | (_VIRTUAL if virtual else 0) | cls
        for key in keys:
            pop(key, None)
            ghost[key] = value
        e = self._evicted
        if e[cls] >= DUEL_WINDOW:
            e[cls] //= 2
            self._hits[cls] //= 2
        e[cls] += len(keys)
        # expired ghosts leave, oldest first (amortized one per recorded key); one iterator
        # for the scan, deletions after it (an iterator per key cost ~2,000 instructions)
        oldest = (self._clock - self.horizon) << _SHIFT
        expired = []
        for first in ghost:
            if ghost[first] >= oldest:
                break
            expired.append(first)
        for first in expired:
            del ghost[first]
        self._decide()

    def on_touch(self, keys: Sequence[Key], resident: Container[Key]) -> None:
        """A touch named ``keys`` (head first); ``resident`` answers residency now.

        A ghost named here leaves the record. It scores when every key before it is resident
        (or itself a scoring ghost) and it is still in the state its record says (an evicted
        victim not stored again, a virtual one still resident): one hit for itself plus one per
        resident key after it up to the next missing key or ghost, the prefix hits that keeping
        it gives (or, for a virtual victim, that evicting it would have cost).
        """
        ghost = self._ghost
        if not ghost:
            return
        pop = ghost.pop
        ok = True
        hits = self._hits
        cls = -1  # class of the ghost the current run of resident keys is credited to
        scored = False
        for key in keys:
            value = pop(key, None)
            if value is None:
                if ok:
                    if key not in resident:
                        ok = False
                    elif cls >= 0:
                        hits[cls] += 1
                continue
            is_res = key in resident
            if ok and is_res == bool(value & _VIRTUAL):
                cls = value & 3
                hits[cls] += 1
                scored = True
            elif not is_res:
                ok = False
            else:
                cls = -1  # a resident, stale ghost: its run is nobody's
        if scored:
            self._decide()

    def stats(self) -> dict:
        """Per class (``"inner"``, then ``"rule1"``, ...): decayed recorded victims and ghost
        hits; plus ``allowed`` per rule."""
        names = ["inner"] + [f"rule{r}" for r in range(1, len(self._evicted))]
        return {
            "evicted": dict(zip(names, self._evicted, strict=True)),
            "hits": dict(zip(names, self._hits, strict=True)),
            "allowed": dict(zip(names[1:], self.allowed[1:], strict=True)),
        }

    def snapshot(self) -> dict:
        return {
            "ghost": list(self._ghost.items()),
            "clock": self._clock,
            "evicted": list(self._evicted),
            "hits": list(self._hits),
            "allowed": list(self.allowed),
        }

    def clear(self) -> None:
        self._ghost.clear()
        self._clock = 0
        self._evicted = [0] * len(self._evicted)
        self._hits = [0] * len(self._hits)
        self.allowed = [True] * len(self.allowed)
