"""Prefix-aware wrapper: links, orphans first (tail first), rescue, bounded link memory."""

from __future__ import annotations

import pytest

from kvtier import OffloadingManager, available_policies, get_policy
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.prefix import PrefixAwarePolicy, PrefixLRUPolicy, prefix_aware


def keys_of(victims):
    return [key for key, _ in victims]


def chain(p, keys, first_slot=0):
    """Store ``keys`` as one request: insert, on_store, then evictable in reverse."""
    slots = list(range(first_slot, first_slot + len(keys)))
    for key, slot in zip(keys, slots):
        p.insert(key, slot)
    p.on_store(keys)
    for key, slot in reversed(list(zip(keys, slots))):
        p.block_evictable(key, slot)


def test_descendants_of_a_victim_are_evicted_first_tail_first():
    p = PrefixLRUPolicy(16)
    chain(p, ["x"], 9)
    chain(p, list("abcd"))  # LRU: x d c b a; links b->a, c->b, d->c
    assert [p.parent(k) for k in "abcd"] == [None, "a", "b", "c"]
    p.touch(list("bcd"))  # LRU: x a d c b
    assert keys_of(p.evict(1, {"x"})) == ["a"]  # inner LRU's choice
    assert all(p.is_orphan(k) for k in "bcd") and not p.is_orphan("x")
    # orphans before the inner policy's choice (x is LRU-oldest), the request's tail first
    assert keys_of(p.evict(2, ())) == ["d", "c"]
    assert keys_of(p.evict(2, ())) == ["b", "x"]
    assert p.snapshot()["parent"] == {} and p.snapshot()["children"] == {}


def test_a_returning_parent_reconnects_its_descendants():
    p = PrefixLRUPolicy(16)
    chain(p, ["x"], 9)
    chain(p, list("abc"))
    p.touch(list("bc"))  # LRU: x a c b
    assert keys_of(p.evict(1, {"x"})) == ["a"]
    p.insert("a", 0)  # stored again: b and c are reachable again
    assert not p.is_orphan("b") and not p.is_orphan("c")
    p.on_store(["a"])
    p.block_evictable("a", 0)
    assert keys_of(p.evict(1, ())) == ["x"]


def test_failed_store_orphans_the_blocks_after_it_and_pinned_orphans_wait():
    m = OffloadingManager(8, policy="prefix-lru")
    out = m.prepare_store(["p", "q", "r"])
    m.complete_store(["q", "r"])  # q, r ready; p still in flight
    m.prepare_load(["q"])  # q pinned
    m.complete_store(["p"], success=False)  # p dropped: q and r are orphans
    pol = m.policy
    assert pol.is_orphan("q") and pol.is_orphan("r")
    m.complete_store(m.prepare_store(["s", "t"]).keys_to_store)
    # r first (orphan; q is pinned); then the inner LRU's oldest
    assert m.prepare_store(list(range(6))).evicted_keys == ["r", "t"]
    m.complete_load(["q"])  # q evictable again, still an orphan: next to go
    m.complete_store(list(range(6)))
    assert m.prepare_store(["z"]).evicted_keys == ["q"]
    assert out is not None


def test_evict_is_atomic():
    p = PrefixLRUPolicy(16)
    chain(p, list("abcd"))
    p.touch(list("bcd"))
    p.evict(1, ())  # a: b, c, d orphans
    snap, inner_snap = p.snapshot(), p.inner.snapshot()
    assert p.evict(3, {"b"}) is None
    assert p.snapshot() == snap and p.inner.snapshot() == inner_snap


def test_link_memory_is_freed_with_the_blocks():
    m = OffloadingManager(50, policy="prefix-arc")
    for r in range(200):
        keys = [0] + [(r, i) for i in range(10)]
        hits = m.lookup_prefix(keys)
        m.touch(keys)
        out = m.prepare_store(keys[hits:])
        m.complete_store(out.keys_to_store)
    pol = m.policy
    assert len(pol.snapshot()["parent"]) <= len(m)
    assert sum(len(c) for c in pol.snapshot()["children"].values()) <= len(m)


def test_registered_wrappers_and_factory():
    names = available_policies()
    for inner in ("lru", "arc", "s3fifo", "sieve", "lfu"):
        assert f"prefix-{inner}" in names
        cls = get_policy(f"prefix-{inner}")
        assert cls(10).inner.name == inner
    cls = prefix_aware(ARCPolicy, "my-prefix-arc")
    assert cls.name == "my-prefix-arc" and isinstance(cls(4).inner, ARCPolicy)
    with pytest.raises(TypeError):
        prefix_aware(int)
    with pytest.raises(TypeError):
        PrefixAwarePolicy(4, inner=dict)
