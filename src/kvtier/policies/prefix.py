"""Prefix-aware eviction: evict the blocks a prefix lookup can no longer reach first.

A KV block is only useful while every block before it in its prefix is cached too: a lookup
(``lookup_prefix``) stops at the first missing block, so once a block leaves the tier its cached
descendants cannot be hit until it comes back. Such blocks are *orphans*. This wrapper runs any
other policy (the *inner* policy, which keeps its own order) and evicts orphans before any block
the inner policy would choose. As far as we know no KV offloading system does this; the idea is
ours, built on the observation above (which is what makes radix-tree prefix caches, e.g.
SGLang's RadixAttention, Zheng et al. 2024, evict leaves only).

Links. The manager names a request's blocks head first, so the wrapper learns ``parent(key i) =
key i-1`` from the order of the keys in each :meth:`touch` and :meth:`on_store` (successful
``prepare_store``) call, a key named twice in one call counted at its first position (in
``on_store`` since session 17: ``[p, a, b, a]`` taught ``a -> b``, in place of ``a -> p``). A link is kept only while the child is resident, and a block keeps one
parent (a later call that names another parent replaces it): memory is O(resident blocks) and
is freed with the blocks. ``touch`` records a link only when both keys are resident (a request
touches its misses before storing them); ``on_store`` records every link of the call, so a
block stored after a block that was not stored (admission) is an orphan at once.

Orphans. A resident block is an orphan when some block on its chain of known parents is not
resident. When a block leaves (evicted, or its store failed) all its resident descendants
become orphans; when a block is inserted again, the resident descendants it reconnects stop
being orphans; so does a new link that closes a cycle of resident blocks (keys named in
another order by another call: ``[a, b]`` then ``[b, a]``; block hashes chained on their
prefix never do): every chain in it reaches no absent block (before session 17 the orphans
of such a cycle stayed orphans). Orphans are queued in the order they became orphans, each
newly orphaned subtree *tail first* (a request's tail before its head, so the part of a
prefix most likely to be reconnected stays longest). Pinned and pending orphans keep their
place in the queue (logical recency: a pin, its release or a completed store moves nothing;
the queue is a :class:`~kvtier.policies.order.LogicalOrder`).

Dead leaves. A *leaf* is a resident block that no call has named a key after since it was
stored: a block with no known child. Every stored request has one (its last stored block). In
an engine that stores full blocks only (vLLM) a turn's leaf is the parent of the next turn's
blocks and is reused like them; where the last block is a partial one (its hash changes once
the next turn fills it) leaves are dead and only take room from live blocks. The
:class:`~kvtier.policies.leaf_reuse.LeafReuseEstimator` measures online, per sampled store, how
often the leaf and its parent are named again; while leaves are clearly deader than their
parents the wrapper evicts leaves right after orphans (oldest evictable leaf first). Otherwise
it changes nothing: the inner policy's order is kept as is. ``leaf_mode="never"`` turns
demotion off (orphans only), ``"always"`` demotes every leaf (for comparisons).

Safeguard. Orphans and demoted leaves are evicted *out of the inner policy's order*; that pays
only when they are less likely to be hit again than the inner policy's own next victims. The
:class:`~kvtier.policies.prefix_duel.EvictionDuel` measures exactly that (ghost hits of each
rule's victims against the inner policy's, set dueling in the spirit of DIP) and turns a rule
off while its victims are hit more often; a rule that is off keeps recording its would-be
victims (they stay resident), so it is turned on again when it stops losing. ``guard=False``
turns the safeguard off (for comparisons); ``leaf_mode="always"`` bypasses it for leaves.

Request mode (the manager's ``on_request_finished``): the inner policy gets the request's
``on_request_finished`` as is; the wrapper learns links from its keys as from a ``touch``, and
its leaf estimator and duel see the keys the request did not insert (the new ones reached
them through the manager's store-time ``touch``).

Eviction (:meth:`evict`): take unprotected orphans from the queue (while the safeguard allows
the orphan rule), then, while demoting, unprotected leaves from the leaf queue (evictable leaves
in the order they were stored: a pin, its release or a completed store moves none; this said
"in the order they became evictable" until session 17, the rule before logical recency),
then ask the inner policy for the rest (with the chosen blocks added to ``protected``). A
rule the safeguard holds back picks the same blocks, which only leave its queue and are
recorded as virtual victims. The base class has checked that ``n`` eligible blocks exist (the
wrapper's evictable blocks are the inner policy's), so the inner policy always finds them.
Orphans and leaves leave the inner policy by ``mark_non_evictable`` + ``remove`` (no ghost
entry: their eviction says nothing about the inner policy's lists).

Cost: links, leaf flags, probe and ghost updates and touches are O(1) per key (amortized),
but for a new link from an orphan to an orphan parent, which walks the parent's chain of
known parents to tell whether it closes a cycle (O(chain length); not on the usual store).
Entries examined by :meth:`evict` (added to :attr:`examined`) are the orphans and leaves
examined (each queue walked at most once; a leaf already taken as an orphan is skipped, at most
k of them) plus what the inner policy examines: O(k + protected), as the inner policy. Memory:
leaf flags and the leaf queue hold resident blocks only; the probe at most ``capacity`` keys,
the duel's ghosts at most ``2 * capacity``; all are freed by :meth:`clear`. Marking the
descendants of a victim (or of a failed store) as orphans, and un-marking them when their
ancestor returns, costs O(descendants): each such block is then first in line for eviction, so
in a full tier this is paid by the evictions it saves the inner policy. With the manager's
request order a victim rarely has cached descendants (a tail is older than its head in every
built-in policy), and usually none.

Registered as ``prefix-<inner>`` for every built-in policy (``prefix-lru``, ``prefix-arc``,
``prefix-s3fifo``, ``prefix-sieve``, ``prefix-lfu``); wrap any other policy with
:func:`prefix_aware`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import ClassVar

from kvtier.policies.arc import ARCPolicy
from kvtier.policies.base import CachePolicy, Key
from kvtier.policies.leaf_reuse import LEAF_MIN_STORES, LeafReuseEstimator
from kvtier.policies.lfu import LFUPolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.order import LogicalOrder
from kvtier.policies.prefix_duel import INNER, EvictionDuel
from kvtier.policies.s3fifo import S3FIFOPolicy
from kvtier.policies.sieve import SievePolicy

_NO_PARENT = object()  # "no learned parent" (None is a valid block key)
# keys are compared as dict keys (hash, then identity or ==), never by a bare ==: numpy's
# np.float64(2.0) == (1, 2) is an array, whose truth value raises, and np.True_ == 2**70
# raises OverflowError
_NO_CHILDREN: dict = {}

LEAF_MODES = ("adaptive", "never", "always")
"""Accepted values of ``leaf_mode`` (see the module docstring, *Dead leaves*)."""

ORPHAN_RULE = 1
"""The orphan rule's class in the :class:`~kvtier.policies.prefix_duel.EvictionDuel`."""

LEAF_RULE = 2
"""The dead-leaf rule's class in the :class:`~kvtier.policies.prefix_duel.EvictionDuel`."""

__all__ = [
    "LEAF_MIN_STORES", "LEAF_MODES", "PrefixARCPolicy", "PrefixAwarePolicy", "PrefixLFUPolicy",
    "PrefixLRUPolicy", "PrefixS3FIFOPolicy", "PrefixSievePolicy", "prefix_aware",
]


class PrefixAwarePolicy(CachePolicy):
    """Orphans first, then (when demoted) dead leaves, then the inner policy's choice (see
    the module docstring).

    Args:
        capacity: the tier's size in blocks (>= 1), passed on to the inner policy; also the
            bound of the reuse probe (entries).
        inner: the inner policy class; defaults to the class attribute ``inner_class``.
        leaf_mode: ``"adaptive"`` (demote leaves only while their measured reuse is clearly
            below their parents'), ``"never"`` or ``"always"``; defaults to the class
            attribute ``leaf_mode`` (``"adaptive"``).
        guard: whether the safeguard (:mod:`~kvtier.policies.prefix_duel`) may hold back the
            orphan rule and the adaptive leaf rule while their victims are hit more often
            than the inner policy's; defaults to the class attribute ``guard`` (True).

    Raises:
        ValueError: ``capacity`` is not a positive int, or ``leaf_mode`` is not one of
            :data:`LEAF_MODES`.
        TypeError: ``inner`` is not a :class:`CachePolicy` subclass.

    Attributes:
        inner: the inner policy instance (its state is part of :meth:`snapshot`).
        leaf_mode: as given.
        guard: as given.
    """

    name = "prefix"
    inner_class: ClassVar[type[CachePolicy]] = LRUPolicy

    leaf_mode: ClassVar[str] = "adaptive"
    guard: ClassVar[bool] = True

    def __init__(
        self,
        capacity: int,
        inner: type[CachePolicy] | None = None,
        *,
        leaf_mode: str | None = None,
        guard: bool | None = None,
    ) -> None:
        super().__init__(capacity)
        inner_cls = self.inner_class if inner is None else inner
        if not (isinstance(inner_cls, type) and issubclass(inner_cls, CachePolicy)):
            raise TypeError(f"inner must be a CachePolicy subclass, got {inner_cls!r}")
        mode = self.leaf_mode if leaf_mode is None else leaf_mode
        if not isinstance(mode, str) or mode not in LEAF_MODES:
            raise ValueError(f"leaf_mode must be one of {', '.join(LEAF_MODES)}, got {mode!r}")
        guard = self.guard if guard is None else guard
        if not isinstance(guard, bool):
            raise ValueError(f"guard must be a bool, got {guard!r}")
        self.inner: CachePolicy = inner_cls(capacity)
        self._res: dict[Key, bool] = {}  # resident key -> evictable?
        self._parent: dict[Key, Key] = {}  # resident child -> parent
        self._children: dict[Key, dict[Key, None]] = {}  # parent -> resident children
        self._orphans: set[Key] = set()  # resident orphans, any state
        # resident orphans in the order they became orphans, first out first (pinned and
        # pending ones held in place: logical recency)
        self._queue = LogicalOrder()
        self.leaf_mode = mode
        self.guard = guard
        self._leaf: set[Key] = set()  # resident blocks with no known child, any state
        self._leafq = LogicalOrder()  # resident leaves, oldest stored first (held in place)
        self._fresh: dict[Key, None] = {}  # inserted, not yet classified by on_store
        self._leaf_est = LeafReuseEstimator(capacity, mode == "adaptive", mode == "always")
        self._duel = EvictionDuel(capacity, rules=2)

    # -- queries -------------------------------------------------------------------------
    def count_eligible(self, protected: Collection[Key] = ()) -> int:
        # the wrapper's evictable blocks are exactly the inner policy's
        return self.inner.count_eligible(protected)

    def is_orphan(self, key: Key) -> bool:
        """Whether resident ``key`` is unreachable by a prefix lookup (an ancestor is gone)."""
        return key in self._orphans

    def parent(self, key: Key) -> Key | None:
        """The learned parent of resident ``key``, or None."""
        return self._parent.get(key)

    # -- orphan bookkeeping ----------------------------------------------------------------
    def _subtree(self, root: Key, orphan: bool) -> list[Key]:
        """``root`` and its resident descendants whose orphan flag is ``not orphan``."""
        children, orphans = self._children, self._orphans
        nodes = [root]
        seen = {root}
        i = 0
        while i < len(nodes):
            for child in children.get(nodes[i], ()):
                if child not in seen and (child in orphans) != orphan:
                    seen.add(child)
                    nodes.append(child)
            i += 1
        return nodes

    def _mark(self, root: Key) -> None:
        nodes = self._subtree(root, True)
        orphans, queue, res = self._orphans, self._queue, self._res
        for key in reversed(nodes):  # reversed pre-order: every block after its descendants
            orphans.add(key)
            if not queue.has(key):
                queue.append(key, not res[key])

    def _unmark(self, root: Key) -> None:
        orphans, queue = self._orphans, self._queue
        for key in self._subtree(root, False):
            orphans.discard(key)
            queue.discard_member(key)

    def _link(self, child: Key, parent: Key) -> None:
        # (the callers checked that child is not linked to parent yet)
        try:
            if child == parent:  # a key named twice in a row
                return
        except Exception:  # noqa: BLE001 - == answered an array (see _NO_CHILDREN) or raised
            pass  # (np.True_ == 2**70: OverflowError): not equal as dict keys either
        old = self._parent.get(child, _NO_PARENT)
        if old is not _NO_PARENT:
            siblings = self._children[old]
            del siblings[child]
            if not siblings:
                del self._children[old]
        self._parent[child] = parent
        self._children.setdefault(parent, {})[child] = None
        cut = parent not in self._res or parent in self._orphans
        if cut and child in self._orphans and parent in self._res and self._closes_cycle(child):
            # the parent is an orphan through the child itself (its old, absent parent): the
            # new link closes a cycle of resident blocks, whose chains now reach no absent
            # block (keys named in another order by another call, e.g. [a, b] then [b, a]);
            # only an orphan re-linked to an orphan parent pays this walk
            cut = False
        if cut != (child in self._orphans):
            if cut:
                self._mark(child)
            else:
                self._unmark(child)

    def _closes_cycle(self, child: Key) -> bool:
        """Whether the chain of known parents from ``child`` (just linked) comes back to it
        with every block on the way resident. O(chain length)."""
        parents, res = self._parent, self._res
        start = {child: None}  # compared as a dict key (see _NO_CHILDREN)
        seen: dict[Key, None] = {}
        key = parents[child]
        while key in res and key not in seen:
            if key in start:
                return True
            seen[key] = None
            key = parents.get(key, _NO_PARENT)
            if key is _NO_PARENT:
                return False
        return False

    def _unlink(self, key: Key) -> bool:
        """Forget resident ``key``; return True when its descendants must become orphans."""
        del self._res[key]
        if key in self._leaf:
            self._leaf.discard(key)
            self._leafq.discard_member(key)
        self._fresh.pop(key, None)
        was_orphan = key in self._orphans
        if was_orphan:
            self._orphans.discard(key)
            self._queue.discard_member(key)
        parent = self._parent.pop(key, _NO_PARENT)
        if parent is not _NO_PARENT:
            siblings = self._children[parent]
            del siblings[key]
            if not siblings:
                del self._children[parent]
        return not was_orphan

    def _orphan_children(self, keys: list[Key]) -> None:
        orphans = self._orphans
        for key in keys:
            for child in list(self._children.get(key, ())):
                if child not in orphans:
                    self._mark(child)

    def _reconnect(self, key: Key) -> None:
        # a block (re)entering the tier has no parent link yet: its descendants are reachable
        orphans = self._orphans
        for child in list(self._children.get(key, ())):
            if child in orphans:
                self._unmark(child)

    # -- dead-leaf bookkeeping ---------------------------------------------------------------
    def is_leaf(self, key: Key) -> bool:
        """Whether resident ``key`` has had no known child since it was stored."""
        return key in self._leaf

    def leaf_stats(self) -> dict:
        """The reuse estimate behind leaf demotion, in sampled blocks: the decayed counts of
        sampled leaves and of their parents (``stored``), and of those named again by a touch
        while still in the probe (``reused``); ``demoting``: the current decision
        (:attr:`demoting`). See :mod:`~kvtier.policies.leaf_reuse`."""
        stats = self._leaf_est.stats()
        stats["demoting"] = self.demoting
        return stats

    def duel_stats(self) -> dict:
        """The safeguard's decayed counts: recorded victims and ghost hits of the inner
        policy's choice (``inner``), the orphan rule (``orphan``) and the leaf rule
        (``leaf``), and whether each rule is allowed. See :mod:`~kvtier.policies.prefix_duel`.
        """
        raw = self._duel.stats()
        names = {"inner": "inner", "rule1": "orphan", "rule2": "leaf"}
        return {part: {names[k]: v for k, v in counts.items()} for part, counts in raw.items()}

    @property
    def demoting(self) -> bool:
        """Whether leaves are evicted before the inner policy's choice right now: measured
        dead (or ``leaf_mode="always"``) and, in adaptive mode with the guard on, allowed by
        the safeguard."""
        if not self._leaf_est.demoting:
            return False
        return self.leaf_mode == "always" or not self.guard or self._duel.allowed[LEAF_RULE]

    def _has_child(self, key: Key) -> None:
        # a call named a key after ``key``: it is a parent, not a leaf (any more)
        self._leaf.discard(key)
        self._leafq.discard_member(key)

    def _sample_pair(self, keys: Sequence[Key]) -> None:
        """After a store: when the call stored both its last key (a leaf) and the key before it
        (its parent), hand the pair to the leaf estimator."""
        fresh = self._fresh
        tail = keys[-1] if keys else None
        if len(keys) >= 2 and tail in fresh and tail in self._leaf and keys[-2] in fresh:
            self._leaf_est.sample_pair(keys[-2], tail)
        fresh.clear()

    # -- state changes -------------------------------------------------------------------
    def insert(self, keys: Sequence[Key]) -> None:
        self.inner.insert(keys)
        res, children, fresh, leaf = self._res, self._children, self._fresh, self._leaf
        leafq = self._leafq
        for key in keys:
            res[key] = False
            fresh[key] = None
            if key in children:
                self._reconnect(key)
            else:
                leaf.add(key)
        for key in reversed(keys):  # stored: keys[0] ends newest
            if key in leaf:
                leafq.append(key, True)

    def remove(self, keys: Sequence[Key]) -> None:
        keys = [key for key in keys if key in self._res]
        if not keys:
            return
        self.inner.remove(keys)
        for key in keys:
            if self._unlink(key):
                self._orphan_children([key])

    def mark_evictable(self, keys: Sequence[Key]) -> None:
        self.inner.mark_evictable(keys)
        res = self._res
        for key in keys:
            res[key] = True
        self._queue.release(keys)  # in place (logical recency); a non-member is a no-op
        self._leafq.release(keys)

    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        self.inner.mark_non_evictable(keys)
        res = self._res
        for key in keys:
            res[key] = False
        self._queue.hold_members(keys)
        self._leafq.hold_members(keys)

    def touch(self, keys: Sequence[Key]) -> None:
        if len(keys) > 1 and len(set(keys)) != len(keys):
            # a key named twice in one call is one use at its first position
            # (CachePolicy.touch): [a, b, b, a] would teach the link b -> a
            keys = list(dict.fromkeys(keys))
        self.inner.touch(keys)
        self._learn_links(keys)
        self._leaf_est.on_touch(keys)
        self._duel.on_touch(keys, self._res)

    def on_request_finished(
        self, keys: Sequence[Key], inserted: Collection[Key], reused: Collection[Key]
    ) -> None:
        """Request mode: the inner policy gets the call as is (ARC tells reuse from
        insertion); the wrapper learns the request's links, and its leaf estimator and duel
        see the keys the request did not insert (its new keys were named, as absent keys,
        by the manager's store-time ``touch``; naming them again here would count this
        request's own new leaves as reused)."""
        self.inner.on_request_finished(keys, inserted, reused)
        self._learn_links(keys)
        if inserted:
            keys = [key for key in keys if key not in inserted]
        if keys:
            self._leaf_est.on_touch(keys)
            self._duel.on_touch(keys, self._res)

    def _learn_links(self, keys: Sequence[Key]) -> None:
        """Links and leaf flags from one use of ``keys`` (head first): a link where both
        keys are resident."""
        res, children, leaf = self._res, self._children, self._leaf
        last = len(keys) - 1
        prev = None
        for i, key in enumerate(keys):
            # (key's parent is prev) as a dict lookup: see _NO_CHILDREN
            if i and key in res and prev in res and key not in children.get(prev, _NO_CHILDREN):
                self._link(key, prev)
            if i < last and key in leaf:
                self._has_child(key)
            prev = key

    def on_store(self, keys: Sequence[Key]) -> None:
        self.inner.on_store(keys)
        # a key named twice in one store is one block at its first position, as in touch:
        # [p, a, b, a] would teach a -> b (a cycle) in place of a -> p. A call whose keys were
        # all inserted now (_fresh, distinct) has no repeat: no set built for the usual store
        if (len(keys) > 1 and len(self._fresh) != len(keys)
                and len(set(keys)) != len(keys)):
            keys = list(dict.fromkeys(keys))
        res, children, leaf = self._res, self._children, self._leaf
        last = len(keys) - 1
        prev = None
        for i, key in enumerate(keys):
            if i and key in res and key not in children.get(prev, _NO_CHILDREN):
                self._link(key, prev)
            if i < last and key in leaf:
                self._has_child(key)
            prev = key
        if self._fresh:
            self._sample_pair(keys)

    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        duel = self._duel
        guarded = self.guard
        examined = 0
        # the orphan rule's picks, then the leaf rule's: evicted when the rule is allowed,
        # else only recorded as virtual victims (see the module docstring, *Safeguard*)
        # (each pick leaves its queue: acted on, or recorded as a virtual victim below)
        orphans, examined = self._queue.take(n, protected)
        orphans_act = not guarded or duel.allowed[ORPHAN_RULE]
        taken = len(orphans) if orphans_act else 0
        leaves: list[Key] = []
        if taken < n and self._leafq and self._leaf_est.demoting:
            # an orphan leaf may already be picked: skip it
            skip: Collection[Key] = protected
            if orphans:
                skip = set(protected)
                skip.update(orphans)
            leaves, seen = self._leafq.take(n - taken, skip)
            examined += seen
        leaves_act = (not guarded or self.leaf_mode == "always"
                      or duel.allowed[LEAF_RULE])
        if leaves and leaves_act:
            act = orphans + leaves if orphans_act else leaves
        else:
            act = orphans if orphans_act else []
        chosen: list[Key] = []
        inner = self.inner
        if len(act) < n:  # n eligible blocks exist (checked), so the inner policy has these
            shield: Collection[Key] = protected
            if act:
                shield = set(protected)
                shield.update(act)
            before = inner.examined
            chosen = inner.evict(n - len(act), shield)  # type: ignore[assignment]
            examined += inner.examined - before
        self.examined += examined

        cut = []
        if act:  # orphans, then demoted leaves
            inner.mark_non_evictable(act)
            inner.remove(act)
            for key in act:
                if self._unlink(key) and key in self._children:  # a leaf has none; to be safe
                    cut.append(key)
        cut.extend(key for key in chosen if self._unlink(key))
        victims = act + chosen if chosen else act
        if cut:
            self._orphan_children(cut)
        if guarded:
            duel.record(chosen, INNER)
            if orphans:
                if orphans_act:
                    duel.record(orphans, ORPHAN_RULE)
                else:  # virtual victims (unless the inner policy took them): they left the
                    # queue when picked
                    res = self._res
                    orphans = [key for key in orphans if key in res]
                    duel.record(orphans, ORPHAN_RULE, virtual=True)
            if leaves and self.leaf_mode != "always":
                if leaves_act:
                    duel.record(leaves, LEAF_RULE)
                else:
                    res = self._res
                    leaves = [key for key in leaves if key in res]
                    duel.record(leaves, LEAF_RULE, virtual=True)
        return victims

    def snapshot(self) -> dict:
        snap = {
            "inner": self.inner.snapshot(),
            "resident": dict(self._res),
            "parent": dict(self._parent),
            "children": {p: list(c) for p, c in self._children.items()},
            "orphans": set(self._orphans),
            "queue": self._queue.snapshot(),
            "leaf": set(self._leaf),
            "leaf_queue": self._leafq.snapshot(),
            "fresh": list(self._fresh),
            "duel": self._duel.snapshot(),
        }
        snap.update(self._leaf_est.snapshot())  # probe, stored, reused, demoting
        snap["demoting"] = self.demoting
        return snap

    def clear(self) -> None:
        self.inner.clear()
        for part in (self._res, self._parent, self._children, self._orphans, self._queue,
                     self._leaf, self._leafq, self._fresh):
            part.clear()
        self._leaf_est.clear()
        self._duel.clear()
        self.examined = 0


def prefix_aware(
    inner: type[CachePolicy], name: str | None = None, leaf_mode: str = "adaptive",
    guard: bool = True,
) -> type[PrefixAwarePolicy]:
    """Return a :class:`PrefixAwarePolicy` subclass around ``inner``, constructible as
    ``cls(capacity)`` (register it with :func:`~kvtier.policies.register_policy`).

    Args:
        inner: any :class:`CachePolicy` subclass.
        name: the policy name; defaults to ``"prefix-" + inner.name``.
        leaf_mode: the class's default ``leaf_mode`` (:data:`LEAF_MODES`); ``"never"`` gives
            the orphans-only wrapper, ``"always"`` demotes every leaf (for comparisons).
        guard: the class's default ``guard``: False turns the safeguard off (the wrapper
            before it; for comparisons).

    Raises:
        TypeError: ``inner`` is not a :class:`CachePolicy` subclass, or is an offline policy
            (``needs_future``, e.g. ``BeladyPolicy``): the wrapper does not pass the trace's
            future on, so it would run without its oracle.
        ValueError: ``leaf_mode`` is not one of :data:`LEAF_MODES`, or ``guard`` is not a
            bool.
    """
    if not (isinstance(inner, type) and issubclass(inner, CachePolicy)):
        raise TypeError(f"inner must be a CachePolicy subclass, got {inner!r}")
    if getattr(inner, "needs_future", False):
        raise TypeError(
            f"inner {inner.__name__} is an offline policy (needs_future): the prefix-aware "
            "wrapper does not pass the trace's future on, so it would run without its oracle; "
            "replay it unwrapped"
        )
    if not isinstance(leaf_mode, str) or leaf_mode not in LEAF_MODES:
        raise ValueError(f"leaf_mode must be one of {', '.join(LEAF_MODES)}, got {leaf_mode!r}")
    if not isinstance(guard, bool):
        raise ValueError(f"guard must be a bool, got {guard!r}")
    policy_name = name or f"prefix-{inner.name}"
    return type(
        f"Prefix{inner.__name__}",
        (PrefixAwarePolicy,),
        {"name": policy_name, "inner_class": inner, "leaf_mode": leaf_mode, "guard": guard,
         "__module__": __name__,
         "__doc__": f"Prefix-aware eviction around {inner.__name__} (``{policy_name}``)."},
    )


# the registered wrappers: ``prefix-lru``, ``prefix-arc``, ``prefix-s3fifo``, ...
PrefixLRUPolicy = prefix_aware(LRUPolicy)
PrefixARCPolicy = prefix_aware(ARCPolicy)
PrefixS3FIFOPolicy = prefix_aware(S3FIFOPolicy)
PrefixSievePolicy = prefix_aware(SievePolicy)
PrefixLFUPolicy = prefix_aware(LFUPolicy)
