"""The cache-policy contract every eviction policy implements.

A policy orders **keys** and picks victims; nothing else. The
:class:`~kvtier.OffloadingManager` owns slots, residency, pending stores, pins, admission,
events and statistics, and tells the policy about every state change of a block through the
hooks below, so a policy never scans the cache to find out what may be evicted.

The hooks (vLLM 0.33's ``CachePolicy`` names where it has one; 10 in all)::

    insert(keys)              new blocks, store in flight: resident, NOT evictable; stored is
                              a use: they take their place in the order
    mark_evictable(keys)      store completed, or last pin released: evictable, NOT moved
    mark_non_evictable(keys)  pinned by a load (ref count 0 -> 1): not evictable, keeps its
                              place and its other state (list membership, frequency, ...)
    remove(keys)              non-evictable blocks dropped without eviction (failed store):
                              no ghost entry, the block was never readable
    touch(keys)               a use; keys may be absent (ghost lists may learn from them),
                              pending or pinned
    on_store_miss(keys)       request mode's ghost learning: a use of a ``prepare_store``'s
                              new keys (distinct, none resident) before its eviction and
                              ``insert``. Default: ``touch(keys)``
    on_store(keys)            after each successful ``prepare_store``, its full key list
    on_request_finished(keys, inserted, reused)
                              request mode (the manager's ``on_request_finished``): the one
                              use of a finished request; ``keys`` the distinct keys it loaded
                              or named in ``prepare_store``, head first (a tuple; they may be
                              absent, pending or pinned by now), ``inserted`` those it newly
                              stored and did not reuse, ``reused`` those it loaded or found
                              ready (sets, subsets of ``keys``; the manager's own, dropped
                              after the call: read them, do not keep them). Default:
                              ``touch(keys)``
    evict(n, protected)       n evictable blocks not in ``protected`` leave; returns their keys
    clear()                   forget everything (``reset_cache``)

**Key order, the one rule.** Every hook receives its keys in the caller's order, head of the
request first, each key once (``touch`` excepted: it may repeat keys and name absent ones).
A hook that uses blocks (``insert``, ``touch``, ``on_request_finished``) leaves ``keys[0]``
the most recent: a request names its blocks head first, and a prefix's head should outlive its
tail.

**Recency is logical.** A block's place in the order changes only when it is used (stored,
touched, used by a finished request); pins, their release and completed stores never move
it. Pinned and pending blocks therefore stay in the order: see
:class:`~kvtier.policies.order.LogicalOrder` for how eviction passes over them at O(1)
amortized each.

**Shared held state (opt-in).** A policy keeps its own record of which blocks are held
(pending or pinned) from ``insert``, ``mark_evictable`` and ``mark_non_evictable``, while the
manager keeps the same facts in its own collections. The manager offers them once, after it
builds them (construction, ``reset_cache``): :meth:`CachePolicy.share_held_state` ``(pending,
pins)``. A policy that answers ``True`` reads held blocks there instead of keeping a copy, and
the manager then keeps them current *before* every hook it calls: ``pending`` (a set: the keys
whose store is in flight; a key is in it when ``insert`` is called and out of it when
``mark_evictable`` or ``remove`` is called for that store) and ``pins`` (a dict: pinned key ->
pin count, pinned keys only; out of it when ``mark_evictable`` is called for the last pin).
The two are disjoint. The manager still calls every hook but ``mark_non_evictable`` (a pin
changes nothing a sharing policy keeps); ``mark_evictable`` still comes at every completed
store and last released pin (a policy may have set the blocks aside). The policy never
changes the two collections, and drops them at :meth:`CachePolicy.clear` (the manager shares
new ones). Default: ``False``, the policy keeps its own (and a policy used without a manager,
e.g. inside vLLM's own manager, always does).

**Victims the manager trusts.** The manager checks every answer of ``evict``: ``n`` distinct
stored keys, none protected, pending or pinned (``PolicyError`` otherwise). The pending and
pin checks of a several-victim answer (the one-victim path keeps its two membership tests)
are skipped for one kind of policy only, one that makes them itself on the same
collections: the policy's *own class* (not a base class: a subclass may change the victim
choice) sets :attr:`CachePolicy.checks_shared_victims` to ``True``, the class is shipped in
kvtier (its module is in the ``kvtier`` package), and the policy accepted
:meth:`CachePolicy.share_held_state`. Such a class declares that its ``_evict`` never returns a
key in the shared ``pending`` set or ``pins`` dict (it reads them to skip held blocks anyway);
kvtier's tests prove it (property tests over random explicit and request-mode calls with many
pins and stores in flight, tests/policies/test_arc.py). The count, distinctness, residency and
protected checks stay for every policy. A user's policy is checked in full, declared or not,
and so is any subclass of a shipped policy (the declaration is not inherited: a subclass may
change the victim choice). ARC is the one such class (vLLM spec replay: see
docs/performance.md, "Request mode, round 8").

**One eviction shape.** :meth:`CachePolicy.evict` belongs to this base class: it counts the
eligible blocks (evictable and not protected, O(|protected|)) and returns ``None``, with
nothing changed, when there are fewer than ``n``; otherwise it calls the policy's
:meth:`CachePolicy._evict`, which selects exactly ``n`` victims over its order(s) and commits
them (it never fails). The count comes from :attr:`CachePolicy._orders`, the collections
that together hold exactly the policy's evictable keys (a policy whose evictable keys are
not a few collections overrides :meth:`CachePolicy.count_eligible`).

Rules every policy keeps (tested on every registered policy by ``tests/policies``):

* Evicting k blocks costs O(k + protected keys skipped) amortized, whatever the cache size and
  however many blocks are pinned or pending (each held block in the way is examined once per
  hold). The entries :meth:`CachePolicy._evict` examines are added to
  :attr:`CachePolicy.examined` so tests can prove the bound.
* Thread safety: none. A policy is driven by one manager, which takes no lock either: call
  the manager from one thread, or share it as ``kvtier.threadsafe.ThreadSafeManager``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Hashable, Sequence
from typing import Any, ClassVar

from kvtier.checks import check_positive_int

Key = Hashable


def protected_set(protected: Collection[Key]) -> Collection[Key]:
    """``protected`` as a collection with O(1) membership, each key once (copied only when it
    is not already a set, frozenset or dict)."""
    if isinstance(protected, (set, frozenset, dict)):
        return protected
    return set(protected)


def count_eligible(protected: Collection[Key], *orders: Collection[Key]) -> int:
    """Keys in the disjoint ``orders`` that are not in ``protected``. O(len(protected)),
    whatever the orders' sizes. ``protected`` must name each key once (see
    :func:`protected_set`)."""
    eligible = sum(map(len, orders))
    for key in protected:
        for order in orders:
            if key in order:
                eligible -= 1
                break
    return eligible


def count_unheld(protected: Collection[Key], members: Collection[Key],
                 held: Collection[Key]) -> int:
    """Keys of ``members`` neither ``held`` (a subset of ``members``) nor ``protected``: for a
    policy that keeps all its blocks in one map and its held ones in one set (LFU).
    O(len(protected)). ``protected`` must name each key once (see :func:`protected_set`)."""
    eligible = len(members) - len(held)
    for key in protected:
        if key in members and key not in held:
            eligible -= 1
    return eligible


def _frozen(value: Any) -> Any:
    """A comparable copy of ``value`` for :meth:`CachePolicy.snapshot` (dict order kept)."""
    snapshot = getattr(value, "snapshot", None)
    if callable(snapshot):  # a policy (wrapped), a LogicalOrder
        return snapshot()
    if isinstance(value, dict):  # OrderedDict included: order matters for an eviction order
        return [(key, _frozen(item)) for key, item in value.items()]
    if isinstance(value, (set, frozenset)):
        return frozenset(value)
    if isinstance(value, (list, tuple)):
        return [_frozen(item) for item in value]
    return value


class CachePolicy(ABC):
    """Abstract eviction policy over the blocks of one offloaded tier (see the module
    docstring for the hooks and their rules).

    Args:
        capacity: the tier's size in blocks (>= 1). Policies that keep ghost lists or
            adaptive targets size them from it.

    Raises:
        ValueError: ``capacity`` is not a positive int.

    Attributes:
        name: the registry name (``"lru"``, ``"arc"``, ...), set by each subclass.
        capacity: the tier's size in blocks.
        examined: running count of entries :meth:`_evict` examined (victims, skipped
            protected keys, and whatever else the policy walks past). Tests use it to check
            the O(k) bound; only :meth:`clear` resets it.
        checks_shared_victims: class-level declaration (``False`` here): ``True`` in a
            class shipped in kvtier whose ``_evict``, reading the manager's shared held state,
            never returns a pending or pinned key; the manager then skips those two checks of
            its answers (see "Victims the manager trusts" in the module docstring).
        _orders: the collections (each with ``len`` and ``in``) that together hold exactly
            the evictable keys, each once; set by the subclass, read by
            :meth:`count_eligible`.
    """

    name: ClassVar[str] = ""
    # see "Victims the manager trusts" in the module docstring: read from the policy's own
    # class only (type(policy).__dict__), never inherited
    checks_shared_victims: ClassVar[bool] = False
    _orders: tuple[Collection[Key], ...] = ()

    def __init__(self, capacity: int) -> None:
        self.capacity = check_positive_int("capacity", capacity, "blocks")
        self.examined = 0

    # -- hooks the manager calls ------------------------------------------------------------
    def share_held_state(self, pending: set[Key], pins: dict[Key, int]) -> bool:
        """Offer the manager's own record of held blocks (see "Shared held state" in the
        module docstring): ``pending`` the keys whose store is in flight, ``pins`` pinned key
        -> pin count. Return ``True`` to read them from now on (until :meth:`clear`): the
        manager then keeps them current before every hook and no longer calls
        :meth:`mark_non_evictable`. The policy must not change them. Default: ``False`` (the
        policy keeps its own from the hooks)."""
        return False

    def insert(self, keys: Sequence[Key]) -> None:  # noqa: B027 - optional hook
        """New blocks, not resident before; their stores are in flight (not evictable). A
        store is a use: they take their place in the order, ``keys[0]`` the most recent.
        Default: nothing."""

    @abstractmethod
    def mark_evictable(self, keys: Sequence[Key]) -> None:
        """Resident blocks became evictable (store completed, or last pin released): they
        are eligible again where they stand (logical recency: not moved)."""

    @abstractmethod
    def mark_non_evictable(self, keys: Sequence[Key]) -> None:
        """Evictable blocks were pinned: not eligible until released; they keep their place
        and the rest of their state."""

    def remove(self, keys: Sequence[Key]) -> None:  # noqa: B027 - optional hook
        """Resident, non-evictable blocks leave without eviction (a failed store): no ghost
        entry. Default: nothing."""

    def touch(self, keys: Sequence[Key]) -> None:  # noqa: B027 - optional hook
        """A use of ``keys`` (``keys[0]`` ends most recent). Absent keys are allowed and
        ignored unless the policy learns from them; pending and pinned blocks may be touched.
        A key named several times in one call is one use of it, at its first (most recent)
        position: the call must leave the state the call without the repeats leaves (as
        vLLM 0.33's LRU and ARC, which move a resident key once per call; a request that
        names a block twice used it once). Checked on every registered policy by
        ``tests/policies/test_contract.py``. Default: nothing (an order that ignores uses,
        e.g. FIFO)."""

    def on_store_miss(self, keys: Sequence[Key]) -> None:
        """Request mode's ghost learning (vLLM 0.33's ``on_store_miss``): a use of ``keys``,
        distinct and none of them resident (the new keys of a ``prepare_store`` that will
        succeed, before its eviction and ``insert``). ``keys`` is the manager's own list,
        unchanged until that ``insert`` (a policy may keep it until then). Default:
        ``self.touch(keys)``; a policy that can skip its residency tests for such keys (ARC)
        overrides it."""
        self.touch(keys)

    def on_store(self, keys: Sequence[Key]) -> None:  # noqa: B027 - optional hook
        """After each successful ``prepare_store``, with the call's full key list in the
        caller's order, including keys already resident. Default: nothing."""

    def on_request_finished(
        self, keys: Sequence[Key], inserted: Collection[Key], reused: Collection[Key]
    ) -> None:
        """One finished request's use of the tier (request mode, vLLM 0.33's
        ``CachePolicy.on_request_finished``), called once per request by the manager's
        ``on_request_finished``.

        Args:
            keys: the distinct keys the request loaded or named in ``prepare_store`` (stored
                by it, or found ready), head of the request first. They may since have been
                evicted (absent), be pending or pinned.
            inserted: the keys of ``keys`` this request newly stored and did not also reuse.
            reused: the keys of ``keys`` it loaded, or named in ``prepare_store`` while they
                were ready; a key it stored itself and then read again is not reused.

            ``inserted`` and ``reused`` are sets with O(1) membership (``set``, or a dict's
            ``keys()`` view: a :class:`collections.abc.Set`; the manager passes its request
            record's own collections, not copies: a policy must not keep or change them).

        Default: one use, ``self.touch(keys)`` (``keys[0]`` ends most recent). A policy that
        tells a first use from a reuse (ARC) overrides it.
        """
        self.touch(keys)

    def evict(self, n: int, protected: Collection[Key] = ()) -> list[Key] | None:
        """Evict ``n`` evictable blocks not in ``protected``, chosen by the policy.

        Not overridden by policies (they implement :meth:`_evict`).

        Args:
            n: number of victims wanted (>= 1).
            protected: keys that must not be evicted (the manager passes the keys of the
                current ``prepare_store`` that are already resident, usually none);
                ``None`` protects nothing, as ``()``.
                Pinned and pending blocks are never candidates.

        Returns:
            The ``n`` victims' keys in eviction order, or ``None`` (and no state changed)
            when fewer than ``n`` eligible blocks exist.

        Raises:
            TypeError: ``n`` is not an int (a bool is not a count).
            ValueError: ``n`` < 1. Nothing changed in either case.
        """
        if n.__class__ is not int:  # also refuses bool (a subclass); ~40 instructions a call
            if isinstance(n, bool) or not hasattr(n, "__index__"):
                raise TypeError(f"{type(self).__name__}.evict: n must be an int count of "
                                f"victims, got {n!r}")
            n = n.__index__()  # a numpy integer
        if n < 1:
            raise ValueError(f"{type(self).__name__}.evict: n must be >= 1, got {n}")
        if protected is None:  # nothing protected (before: ARC took it so, the others raised)
            protected = ()
        elif protected:
            protected = protected_set(protected)
        if self.count_eligible(protected) < n:
            return None
        return self._evict(n, protected)

    @abstractmethod
    def _evict(self, n: int, protected: Collection[Key]) -> list[Key]:
        """Select exactly ``n`` evictable keys not in ``protected`` over the policy's
        order(s) and commit their eviction; return them in eviction order.

        Called by :meth:`evict` only when ``n`` such keys exist, with ``protected`` empty or
        a collection with O(1) membership. Adds the entries examined to :attr:`examined`.
        """

    @abstractmethod
    def clear(self) -> None:
        """Forget every block, ghost entry and adaptive state, and reset :attr:`examined`
        (``reset_cache``)."""

    # -- queries ----------------------------------------------------------------------------
    def count_eligible(self, protected: Collection[Key] = ()) -> int:
        """Evictable keys not in ``protected`` (a set, frozenset or dict when not empty):
        what :meth:`evict` may take. O(len(protected))."""
        return count_eligible(protected, *self._orders)

    def snapshot(self) -> dict:
        """A comparable copy of the whole policy state, for tests and debugging: two
        snapshots are ``==`` exactly when the policy would behave the same from here on.

        The default copies every instance attribute but :attr:`examined` (dicts as lists of
        items, order kept); policies override it with readable names. O(state).
        """
        return {
            name: _frozen(value)
            for name, value in vars(self).items()
            if name not in ("examined", "_orders")
        }


__all__ = ["CachePolicy", "Key", "count_eligible", "count_unheld", "protected_set"]
