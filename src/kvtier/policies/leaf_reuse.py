"""Leaf-reuse estimator of the prefix-aware wrapper: are a request's last blocks dead?

A *leaf* is a resident block that no call has named a key after since it was stored (its
request's last stored block). In an engine that stores full blocks only (vLLM) a turn's leaf is
the parent of the next turn's blocks and is reused like them; in traces whose last block is a
partial one (its hash changes once the next turn fills it) leaves are dead. This estimator
measures online which case holds, so :class:`~kvtier.policies.prefix.PrefixAwarePolicy` may
propose to evict leaves early (its :class:`~kvtier.policies.prefix_duel.EvictionDuel` then
checks that doing so does not cost hits against the inner policy's own choice).

Method: matched-pair sampling in the spirit of DIP's set dueling (Qureshi et al., "Adaptive
Insertion Policies for High Performance Caching", ISCA'07, which compares a small sample of
sets run under each insertion policy). Each store that stores both its last key (a leaf) and
the key before it (its parent, the control) puts the two keys in a probe: a FIFO of keys only,
at most ``capacity`` entries, i.e. the last ``capacity / 2`` such stores. A key is *reused*
when a later touch names it while it is in the probe (it then leaves the probe). The probe
records keys whether or not they are still resident, and a request touches all its keys, hits
and misses, so evicting leaves cannot make their reuse look lower than it is (no
self-fulfilling demotion). For the same reason a pair stays sampled when its store fails
(``complete_store(success=False)``): whether the engine names a key again does not depend on
whether its bytes reached the tier. Counts per class are halved every :data:`LEAF_WINDOW` pairs.
:attr:`LeafReuseEstimator.demoting` is true when at least :data:`LEAF_MIN_STORES` pairs are
counted and ``(r_leaf + LEAF_Z * sqrt(r_leaf) + 1) / s_leaf < LEAF_RATIO * r_parent /
s_parent`` (``r``: reused, ``s``: stored): the leaves' rate, taken at the pessimistic end of
its sampling noise (a Poisson bound), is below half the parents'. The four constants are
generic statistics choices, not tuned on any trace: a window of ~1,000 pairs and a floor of
256 (standard error of a rate below 3 points), a ~98 % one-sided bound and "less than half".

Cost: O(1) per sampled pair; :meth:`LeafReuseEstimator.on_touch` one dict lookup per key while
the probe is not empty. Memory: the probe, at most ``capacity`` keys. Not thread-safe (as the
policies).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from kvtier.policies.base import Key

LEAF_RATIO = 0.5
"""Leaves are demoted when their reuse rate is below this share of the other blocks' rate."""

LEAF_Z = 2.0
"""Standard deviations added to the leaves' reuse count before comparing (one-sided, ~98 %)."""

LEAF_MIN_STORES = 256
"""Stores of each class needed (in the decayed counts) before leaves may be demoted."""

LEAF_WINDOW = 1024
"""A class's counts are halved when its stores reach this many, so old traffic fades."""


class LeafReuseEstimator:
    """Online estimate of how often leaves are named again, against their parents.

    Args:
        capacity: bound of the probe in keys (>= 1; the wrapper passes the tier's size).
        adaptive: when False, :attr:`demoting` is fixed at ``fixed`` and nothing is measured
            decisions-wise (the counts are still kept, for :meth:`stats`).
        fixed: the value of :attr:`demoting` when not ``adaptive``.

    Attributes:
        demoting: whether leaves are measured dead (see the module docstring).
    """

    __slots__ = ("capacity", "adaptive", "fixed", "demoting", "_probe", "_stored", "_reused")

    def __init__(self, capacity: int, adaptive: bool = True, fixed: bool = False) -> None:
        self.capacity = capacity
        self.adaptive = adaptive
        self.fixed = fixed
        self._probe: OrderedDict[Key, int] = OrderedDict()  # sampled key -> class, <= capacity
        self._stored = [0, 0]  # sampled stores per class (0 = parent, 1 = leaf), decayed
        self._reused = [0, 0]  # of those, named again by a touch while in the probe
        self.demoting: bool = fixed if not adaptive else False

    def _decide(self) -> None:
        if not self.adaptive:
            return
        s_inner, s_leaf = self._stored
        r_inner, r_leaf = self._reused
        self.demoting = (
            s_leaf >= LEAF_MIN_STORES
            and s_inner >= LEAF_MIN_STORES
            and (r_leaf + LEAF_Z * math.sqrt(r_leaf) + 1) * s_inner
            < LEAF_RATIO * r_inner * s_leaf
        )

    def sample_pair(self, parent: Key, leaf: Key) -> None:
        """A store stored ``leaf`` (its last key) and ``parent`` (the key before it)."""
        probe, stored, reused = self._probe, self._stored, self._reused
        for key, cls in ((parent, 0), (leaf, 1)):
            probe.pop(key, None)
            probe[key] = cls
        if stored[1] >= LEAF_WINDOW:
            for counts in (stored, reused):
                counts[0] //= 2
                counts[1] //= 2
        stored[0] += 1
        stored[1] += 1
        for _ in range(len(probe) - self.capacity):
            probe.popitem(False)
        self._decide()

    def on_touch(self, keys: Sequence[Key]) -> None:
        """A touch named ``keys``: count the sampled ones as reused (they leave the probe)."""
        probe = self._probe
        if not probe:
            return
        reused = self._reused
        hit = False
        for key in keys:
            cls = probe.pop(key, None)
            if cls is not None:
                reused[cls] += 1
                hit = True
        if hit:
            self._decide()

    def stats(self) -> dict:
        """The decayed counts of sampled leaves and parents (``stored``), of those named again
        while in the probe (``reused``), and the current decision (``demoting``)."""
        return {
            "stored": {"parent": self._stored[0], "leaf": self._stored[1]},
            "reused": {"parent": self._reused[0], "leaf": self._reused[1]},
            "demoting": self.demoting,
        }

    def snapshot(self) -> dict:
        return {
            "probe": list(self._probe.items()),
            "stored": list(self._stored),
            "reused": list(self._reused),
            "demoting": self.demoting,
        }

    def clear(self) -> None:
        self._probe.clear()
        self._stored = [0, 0]
        self._reused = [0, 0]
        self.demoting = self.fixed if not self.adaptive else False
