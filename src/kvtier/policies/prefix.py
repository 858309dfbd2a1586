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
``prepare_store``) call. A link is kept only while the child is resident, and a block keeps one
parent (a later call that names another parent replaces it): memory is O(resident blocks) and
is freed with the blocks. ``touch`` records a link only when both keys are resident (a request
touches its misses before storing them); ``on_store`` records every link of the call, so a
block stored after a block that was not stored (admission) is an orphan at once.

Orphans. A resident block is an orphan when some block on its chain of known parents is not
resident. When a block leaves (evicted, or its store failed) all its resident descendants
become orphans; when a block is inserted again, the resident descendants it reconnects stop
being orphans. Orphans are queued in the order they became orphans, each newly orphaned subtree
*tail first* (a request's tail before its head, so the part of a prefix most likely to be
reconnected stays longest). Only evictable orphans are in the queue; pinned and pending
orphans join it when they become evictable.

Eviction (:meth:`evict`): take unprotected orphans from the queue, then ask the inner policy for
the rest (with the chosen orphans added to ``protected``). If the inner policy cannot find them,
return ``None`` with nothing changed. Orphans leave the inner policy by ``block_unevictable`` +
``remove`` (no ghost entry: their eviction says nothing about the inner policy's lists).

Cost: links and touches are O(1) per key. Entries examined by :meth:`evict` (added to
:attr:`visited`) are the orphans examined plus what the inner policy examines: O(k +
protected), as the inner policy. Marking the descendants of a victim (or of a failed store) as
orphans, and un-marking them when their ancestor returns, costs O(descendants): each such block
is then first in line for eviction, so in a full tier this is paid by the evictions it saves
the inner policy. With the manager's request order a victim rarely has cached descendants (a
tail is older than its head in every built-in policy), and usually none.

Registered as ``prefix-<inner>`` for every built-in policy (``prefix-lru``, ``prefix-arc``,
``prefix-s3fifo``, ``prefix-sieve``, ``prefix-lfu``); wrap any other policy with
:func:`prefix_aware`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import ClassVar

from kvtier.policies.arc import ARCPolicy
from kvtier.policies.base import CachePolicy, Key
from kvtier.policies.lfu import LFUPolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.s3fifo import S3FIFOPolicy
from kvtier.policies.sieve import SievePolicy


_NO_PARENT = object()  # "no learned parent" (None is a valid block key)


class PrefixAwarePolicy(CachePolicy):
    """Orphans first, then the inner policy's choice (see the module docstring).

    Args:
        capacity: the tier's size in blocks (>= 1), passed on to the inner policy.
        inner: the inner policy class; defaults to the class attribute ``inner_class``.

    Raises:
        ValueError: ``capacity`` is not a positive int.
        TypeError: ``inner`` is not a :class:`CachePolicy` subclass.

    Attributes:
        inner: the inner policy instance (its state is part of :meth:`snapshot`).
    """

    name = "prefix"
    inner_class: ClassVar[type[CachePolicy]] = LRUPolicy

    def __init__(self, capacity: int, inner: type[CachePolicy] | None = None) -> None:
        super().__init__(capacity)
        inner_cls = self.inner_class if inner is None else inner
        if not (isinstance(inner_cls, type) and issubclass(inner_cls, CachePolicy)):
            raise TypeError(f"inner must be a CachePolicy subclass, got {inner_cls!r}")
        self.inner: CachePolicy = inner_cls(capacity)
        self._res: dict[Key, bool] = {}  # resident key -> evictable?
        self._parent: dict[Key, Key] = {}  # resident child -> parent
        self._children: dict[Key, dict[Key, None]] = {}  # parent -> resident children
        self._orphans: set[Key] = set()  # resident orphans, any state
        self._queue: OrderedDict[Key, None] = OrderedDict()  # evictable orphans, first out first

    # -- queries -------------------------------------------------------------------------
    def get(self, key: Key) -> int | None:
        return self.inner.get(key)

    def __len__(self) -> int:
        return len(self._res)

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
            if res[key]:
                queue[key] = None

    def _unmark(self, root: Key) -> None:
        orphans, queue = self._orphans, self._queue
        for key in self._subtree(root, False):
            orphans.discard(key)
            queue.pop(key, None)

    def _link(self, child: Key, parent: Key) -> None:
        old = self._parent.get(child, _NO_PARENT)
        if old is not _NO_PARENT and old == parent or child == parent:
            return
        if old is not _NO_PARENT:
            siblings = self._children[old]
            del siblings[child]
            if not siblings:
                del self._children[old]
        self._parent[child] = parent
        self._children.setdefault(parent, {})[child] = None
        cut = parent not in self._res or parent in self._orphans
        if cut != (child in self._orphans):
            if cut:
                self._mark(child)
            else:
                self._unmark(child)

    def _unlink(self, key: Key) -> bool:
        """Forget resident ``key``; return True when its descendants must become orphans."""
        del self._res[key]
        was_orphan = key in self._orphans
        if was_orphan:
            self._orphans.discard(key)
            self._queue.pop(key, None)
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

    # -- state changes -------------------------------------------------------------------
    def insert(self, key: Key, slot: int) -> None:
        self.inner.insert(key, slot)
        self._res[key] = False
        if key in self._children:
            self._reconnect(key)

    def insert_many(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        self.inner.insert_many(keys, slots)
        res, children = self._res, self._children
        for key in keys:
            res[key] = False
            if key in children:
                self._reconnect(key)

    def remove(self, key: Key) -> None:
        if key not in self._res:
            return
        self.inner.remove(key)
        if self._unlink(key):
            self._orphan_children([key])

    def block_evictable(self, key: Key, slot: int) -> None:
        self.inner.block_evictable(key, slot)
        self._res[key] = True
        if key in self._orphans:
            self._queue[key] = None

    def blocks_evictable(self, keys: Sequence[Key], slots: Sequence[int]) -> None:
        self.inner.blocks_evictable(keys, slots)
        res, orphans, queue = self._res, self._orphans, self._queue
        for key in keys:
            res[key] = True
            if key in orphans:
                queue[key] = None

    def block_unevictable(self, key: Key) -> None:
        self.inner.block_unevictable(key)
        self._res[key] = False
        self._queue.pop(key, None)

    def blocks_unevictable(self, keys: Sequence[Key]) -> None:
        self.inner.blocks_unevictable(keys)
        res, queue = self._res, self._queue
        for key in keys:
            res[key] = False
            if queue:
                queue.pop(key, None)

    def touch(self, keys: Sequence[Key]) -> None:
        self.inner.touch(keys)
        res, parents = self._res, self._parent
        prev = None
        for i, key in enumerate(keys):
            if i and key in res and prev in res and parents.get(key, _NO_PARENT) != prev:
                self._link(key, prev)
            prev = key

    def on_store(self, keys: Sequence[Key]) -> None:
        self.inner.on_store(keys)
        res, parents = self._res, self._parent
        prev = None
        for i, key in enumerate(keys):
            if i and key in res and parents.get(key, _NO_PARENT) != prev:
                self._link(key, prev)
            prev = key

    def evict(self, n: int, protected: Collection[Key]) -> list[tuple[Key, int]] | None:
        orphans: list[Key] = []
        visited = 0
        for key in self._queue:
            visited += 1
            if key in protected:
                continue
            orphans.append(key)
            if len(orphans) == n:
                break
        chosen: list[tuple[Key, int]] = []
        inner = self.inner
        if len(orphans) < n:
            shield: Collection[Key] = protected
            if orphans:
                shield = set(protected)
                shield.update(orphans)
            before = inner.visited
            got = inner.evict(n - len(orphans), shield)
            visited += inner.visited - before
            if got is None:
                self.visited += visited
                return None
            chosen = got
        self.visited += visited

        victims: list[tuple[Key, int]] = []
        for key in orphans:
            slot = inner.get(key)
            inner.block_unevictable(key)
            inner.remove(key)
            victims.append((key, slot))  # type: ignore[arg-type]
            self._unlink(key)
        cut = [key for key, _ in chosen if self._unlink(key)]
        victims.extend(chosen)
        if cut:
            self._orphan_children(cut)
        return victims

    def snapshot(self) -> dict:
        return {
            "inner": self.inner.snapshot(),
            "resident": dict(self._res),
            "parent": dict(self._parent),
            "children": {p: list(c) for p, c in self._children.items()},
            "orphans": set(self._orphans),
            "queue": list(self._queue),
        }

    def clear(self) -> None:
        self.inner.clear()
        for part in (self._res, self._parent, self._children, self._orphans, self._queue):
            part.clear()
        self.visited = 0


def prefix_aware(inner: type[CachePolicy], name: str | None = None) -> type[PrefixAwarePolicy]:
    """Return a :class:`PrefixAwarePolicy` subclass around ``inner``, constructible as
    ``cls(capacity)`` (register it with :func:`~kvtier.policies.register_policy`).

    Args:
        inner: any :class:`CachePolicy` subclass.
        name: the policy name; defaults to ``"prefix-" + inner.name``.

    Raises:
        TypeError: ``inner`` is not a :class:`CachePolicy` subclass.
    """
    if not (isinstance(inner, type) and issubclass(inner, CachePolicy)):
        raise TypeError(f"inner must be a CachePolicy subclass, got {inner!r}")
    policy_name = name or f"prefix-{inner.name}"
    return type(
        f"Prefix{inner.__name__}",
        (PrefixAwarePolicy,),
        {"name": policy_name, "inner_class": inner, "__module__": __name__,
         "__doc__": f"Prefix-aware eviction around {inner.__name__} (``{policy_name}``)."},
    )


# the registered wrappers: ``prefix-lru``, ``prefix-arc``, ``prefix-s3fifo``, ...
PrefixLRUPolicy = prefix_aware(LRUPolicy)
PrefixARCPolicy = prefix_aware(ARCPolicy)
PrefixS3FIFOPolicy = prefix_aware(S3FIFOPolicy)
PrefixSievePolicy = prefix_aware(SievePolicy)
PrefixLFUPolicy = prefix_aware(LFUPolicy)
