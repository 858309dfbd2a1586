"""Prefix-aware wrapper: links, orphans first (tail first), rescue, bounded link memory; dead
leaves demoted only when measured dead (synthetic chat traces with live and with dead tails)."""

from __future__ import annotations

import random

import pytest

from kvtier import OffloadingManager, available_policies, get_policy
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.prefix import (
    LEAF_MIN_STORES,
    PrefixAwarePolicy,
    PrefixLRUPolicy,
    prefix_aware,
)
from kvtier.replay import replay
from kvtier.trace import Request


def keys_of(victims):
    return victims


def chain(p, keys, first_slot=0):
    """Store ``keys`` as one request, as the manager does: insert (``keys[0]`` ends most
    recent), on_store, then the store completes."""
    p.insert(keys)
    p.on_store(keys)
    p.mark_evictable(keys)


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
    p.insert(["a"])  # stored again: b and c are reachable again
    assert not p.is_orphan("b") and not p.is_orphan("c")
    p.on_store(["a"])
    p.mark_evictable(["a"])
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


def test_a_link_that_closes_a_cycle_of_resident_blocks_ends_their_orphan_state():
    # an orphan is a block whose chain of known parents reaches a block that is not resident
    m = OffloadingManager(4, policy="prefix-lru")
    m.prepare_store(["r", "a"])
    m.complete_store(["a"])
    m.complete_store(["r"], success=False)  # r dropped: a is an orphan
    p = m.policy
    assert p.is_orphan("a")
    m.complete_store(m.prepare_store(["a", "b"]).keys_to_store)  # b -> a: an orphan too
    m.complete_store(m.prepare_store(["x"]).keys_to_store)
    m.touch(["b", "a"])  # a -> b: the chains of a and b are a, b, a, ...: all resident
    assert (p.parent("a"), p.parent("b")) == ("b", "a")
    assert not p.is_orphan("a") and not p.is_orphan("b")  # were both still orphans
    m.complete_store(m.prepare_store(["y"]).keys_to_store)  # LRU, oldest first: x a b y
    assert m.prepare_store(["z"]).evicted_keys == ["x"]  # was a, evicted as an orphan
    # evicting a member of the cycle orphans the others, as any block's descendants
    m.complete_store(["z"])
    m.touch(["y", "z"])  # LRU: a b z y (z's parent y)
    assert m.prepare_store(["w"]).evicted_keys == ["a"]
    assert p.is_orphan("b") and not p.is_orphan("z")


def test_a_key_named_twice_in_one_store_is_linked_at_its_first_position():
    # as in touch: [p, a, b, a] is the request p, a, b (it taught a -> b, a cycle, in place
    # of a -> p, and b was not a leaf)
    ends = []
    for keys in (["p", "a", "b", "a"], ["p", "a", "b"]):
        m = OffloadingManager(8, policy="prefix-lru")
        m.complete_store(m.prepare_store(keys).keys_to_store)
        p = m.policy
        assert (p.parent("a"), p.parent("b")) == ("p", "a")
        assert p.is_leaf("b") and not p.is_leaf("a")
        m.touch(["a", "b"])  # LRU: p b a
        assert m.prepare_store([f"x{i}" for i in range(6)]).evicted_keys == ["p"]
        assert p.is_orphan("a") and p.is_orphan("b")  # their prefix's head is gone
        ends.append(p.snapshot())
    assert ends[0] == ends[1]


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


def test_an_offline_inner_policy_is_refused():
    """Found by a newcomer session: ``prefix_aware(BeladyPolicy)`` built a class without
    ``needs_future``, so replay ran it without the trace's future (as LRU, with only a
    warning). The wrapper does not pass the future on, so it refuses an offline policy."""
    from kvtier.policies.belady import BeladyPolicy

    with pytest.raises(TypeError, match="BeladyPolicy is an offline policy"):
        prefix_aware(BeladyPolicy)


# -- dead leaves ---------------------------------------------------------------------------

AlwaysLRU = prefix_aware(LRUPolicy, "prefix-lru-always", leaf_mode="always")
NeverLRU = prefix_aware(LRUPolicy, "prefix-lru-never", leaf_mode="never")


def test_demoted_leaves_go_after_orphans_and_before_the_inner_choice():
    p = AlwaysLRU(16)
    chain(p, list("abc"))  # leaf c (evictable first of its chain)
    chain(p, list("de"))  # leaf e
    p.touch(list("abc"))  # LRU: e d c b a
    assert [p.is_leaf(k) for k in "abcde"] == [False, False, True, False, True]
    snap = p.snapshot()
    assert snap["leaf_queue"] == (["c", "e"], frozenset())
    # leaves, oldest evictable first, then the inner LRU's choice
    assert keys_of(p.evict(3, ())) == ["c", "e", "d"]

    q = NeverLRU(16)  # the same sequence without demotion: plain LRU order
    chain(q, list("abc"))
    chain(q, list("de"))
    q.touch(list("abc"))
    assert keys_of(q.evict(3, ())) == ["e", "d", "c"]


def test_a_leaf_named_before_another_key_is_no_longer_a_leaf():
    p = AlwaysLRU(16)
    chain(p, list("abc"))
    chain(p, list("de"))  # LRU: c b a e d; leaf queue: c, e
    p.touch(["c", "x"])  # c has a child now (x, not resident): not a leaf
    assert not p.is_leaf("c") and p.is_leaf("e")
    assert keys_of(p.evict(1, ())) == ["e"]
    assert keys_of(p.evict(1, ())) == ["b"]  # inner LRU (c was touched: most recent)


def test_protected_and_pinned_leaves_are_skipped_and_evict_stays_atomic():
    m = OffloadingManager(6, policy=AlwaysLRU)
    for keys in (["a", "b"], ["c", "d"], ["e", "f"]):
        m.complete_store(m.prepare_store(keys).keys_to_store)
    pol = m.policy
    assert pol.snapshot()["leaf_queue"] == (["b", "d", "f"], frozenset())
    m.prepare_load(["b"])
    # pinned: keeps its place in the leaf queue (logical recency), not eligible
    assert pol.snapshot()["leaf_queue"] == (["b", "d", "f"], frozenset({"b"}))
    before = m.snapshot()
    assert pol.evict(5, ("f",)) is None  # 4 eligible: a, c, d, e
    assert m.snapshot() == before
    pol.examined = 0
    # d is protected (named in the call); f is the only free leaf; then LRU: a (b pinned,
    # keeps its place in both orders and is set aside when a walk meets it: examined once in
    # the leaf queue, once in the inner LRU)
    out = m.prepare_store(["d", "x", "y"])
    assert out.evicted_keys == ["f", "a"]
    assert pol.examined <= 2 + 1 + 2


def test_leaf_memory_is_bounded_and_freed():
    m = OffloadingManager(40, policy="prefix-lru")
    for r in range(300):
        keys = [0] + [(r, i) for i in range(5)] + [(r, "tail")]
        hits = m.lookup_prefix(keys)
        m.touch(keys)
        out = m.prepare_store(keys[hits:])
        m.complete_store(out.keys_to_store)
    snap = m.policy.snapshot()
    assert len(snap["probe"]) <= 40
    assert snap["leaf"] <= set(m.snapshot()["slot_of"])
    assert set(snap["leaf_queue"][0]) <= snap["leaf"] and snap["fresh"] == []
    m.reset_cache()
    assert m.policy.snapshot() == OffloadingManager(40, policy="prefix-lru").policy.snapshot()


def test_a_store_call_without_keys_or_pair_samples_nothing():
    p = PrefixLRUPolicy(8)
    p.insert(["a"])
    p.on_store([])  # no keys: nothing to sample, the inserted block is classified anyway
    p.insert(["b"])
    p.on_store(["b"])  # a single stored key has no parent in the call: no pair
    assert p.leaf_stats()["stored"] == {"parent": 0, "leaf": 0}
    chain(p, ["c", "d"], 2)
    assert p.leaf_stats()["stored"] == {"parent": 1, "leaf": 1}
    assert p.snapshot()["probe"] == [("c", 0), ("d", 1)] and p.snapshot()["fresh"] == []


def test_leaf_mode_is_validated():
    with pytest.raises(ValueError, match="leaf_mode"):
        PrefixLRUPolicy(4, leaf_mode="sometimes")
    with pytest.raises(ValueError, match="leaf_mode"):
        prefix_aware(LRUPolicy, leaf_mode="")
    assert PrefixLRUPolicy(4).leaf_mode == "adaptive" and not PrefixLRUPolicy(4).demoting
    assert AlwaysLRU(4).demoting and not NeverLRU(4, leaf_mode="never").demoting


def conversations(dead_tails: bool, seed: int = 7, n_conv: int = 400) -> list[Request]:
    """Synthetic multi-turn chat: each turn repeats the conversation so far (behind a 2-block
    system prompt) and adds 2-6 full blocks. With ``dead_tails`` every turn also ends in a
    partial block whose key is new each turn (as in the Mooncake trace): the next turn fills it,
    so its hash changes and the old one is never named again. Turns of different conversations
    interleave at random."""
    rng = random.Random(seed)
    state = {c: [] for c in range(n_conv)}  # conversation -> its full blocks so far
    turns_left = {c: rng.randint(1, 8) for c in range(n_conv)}
    out = []
    active = list(range(n_conv))
    turn = 0
    while active:
        c = rng.choice(active[:40])  # ~40 live conversations at a time
        turn += 1
        body = state[c]
        start = len(body)  # (a generator reading len(body) as it grew named blocks twice)
        body.extend((c, start + j) for j in range(rng.randint(2, 6)))
        keys = ["sys0", "sys1"] + list(body)
        if dead_tails:
            keys.append((c, "partial", turn))
        out.append(Request(keys, 512 * len(keys) - (256 if dead_tails else 0), None, None))
        turns_left[c] -= 1
        if not turns_left[c]:
            active.remove(c)
    return out


def drive(trace, policy, capacity):
    """The replay's prefix protocol (W = 0), returning (hits, the manager, demoting flags)."""
    m = OffloadingManager(capacity, policy)
    hits, flags = 0, []
    for req in trace:
        keys = req.keys
        h = m.lookup_prefix(keys)
        m.touch(keys)
        if h:
            m.prepare_load(keys[:h])
        out = m.prepare_store(keys[h:]) if h < len(keys) else None
        if h:
            m.complete_load(keys[:h])
        if out is not None:
            m.complete_store(out.keys_to_store)
        hits += h
        flags.append(getattr(m.policy, "demoting", False))
    return hits, m, flags


NeverARC = prefix_aware(ARCPolicy, "prefix-arc-never", leaf_mode="never")


def lru_and_prefix_lru(dead_tails, capacity):
    """The synthetic conversations, LRU's hits on them, and prefix-LRU's hits, demotion flags
    and leaf statistics."""
    trace = conversations(dead_tails=dead_tails)
    lru_hits, _, _ = drive(trace, "lru", capacity)
    hits, m, flags = drive(trace, "prefix-lru", capacity)
    return trace, lru_hits, hits, flags, m.policy.leaf_stats()


# the synthetic traces have 6,931 (live) and 8,702 (dead tails) distinct blocks
@pytest.mark.parametrize("capacity", [100, 300, 1000])
def test_live_tails_are_never_demoted_and_the_wrapper_matches_its_inner_policy(capacity):
    trace, lru_hits, hits, flags, stats = lru_and_prefix_lru(False, capacity)
    assert stats["stored"]["leaf"] >= LEAF_MIN_STORES  # enough evidence was gathered
    assert not any(flags)
    assert hits == lru_hits  # no orphans arise under LRU here: exactly LRU
    assert replay(trace, "prefix-lru", capacity).hit_blocks == lru_hits
    # ARC: demotion never kicks in, so exactly the orphans-only wrapper (orphans do arise)
    hits, m, flags = drive(trace, "prefix-arc", capacity)
    assert not any(flags) and hits == drive(trace, NeverARC, capacity)[0]


@pytest.mark.parametrize("capacity", [100, 300, 1000])
def test_dead_tails_are_demoted_and_the_wrapper_beats_its_inner_policy(capacity):
    trace, lru_hits, hits, flags, stats = lru_and_prefix_lru(True, capacity)
    assert stats["reused"]["leaf"] == 0 and stats["reused"]["parent"] > 0
    first = flags.index(True)
    assert first < len(trace) // 4 and all(flags[first:])  # learnt early, never undone
    assert hits > lru_hits
    arc_hits = replay(trace, "arc", capacity).hit_blocks
    prefix_arc_hits = replay(trace, "prefix-arc", capacity).hit_blocks
    assert prefix_arc_hits > arc_hits
    assert drive(trace, NeverARC, capacity)[0] < prefix_arc_hits


def test_demotion_does_not_hide_the_reuse_of_live_leaves():
    # forced demotion evicts every leaf at once, yet the probe still sees leaves reused as
    # often as their parents: the measurement does not depend on residency
    trace = conversations(dead_tails=False)
    _, m, _ = drive(trace, AlwaysLRU, 300)
    stats = m.policy.leaf_stats()
    r_leaf = stats["reused"]["leaf"] / stats["stored"]["leaf"]
    r_inner = stats["reused"]["parent"] / stats["stored"]["parent"]
    assert r_inner > 0.1 and abs(r_leaf - r_inner) < 0.05


# -- the safeguard (policies/prefix_duel.py) -----------------------------------------------

from kvtier.policies.prefix_duel import DUEL_MIN, DUEL_RATIO, EvictionDuel  # noqa: E402


def test_duel_counts_a_ghost_hit_only_when_the_keys_before_it_are_resident():
    d = EvictionDuel(100, rules=2)
    d.record(["a", "b"], 0)  # inner victims
    d.record(["x"], 2)  # a leaf-rule victim
    d.on_touch(["h", "a", "x"], {"h"})  # a counted (h resident); x counted (a was a ghost hit)
    d.on_touch(["b"], {"h"})  # b: first key, counted
    assert d.stats()["hits"] == {"inner": 2, "rule1": 0, "rule2": 1}
    d.record(["y"], 2)
    d.on_touch(["gone", "y"], {"h"})  # y follows a miss: stored again anyway, not counted
    assert d.stats()["hits"]["rule2"] == 1 and d.snapshot()["ghost"] == []


def test_duel_virtual_victims_count_while_resident_and_stale_ghosts_do_not():
    d = EvictionDuel(100, rules=1)
    d.record(["v"], 1, virtual=True)  # picked, not evicted: still resident
    d.record(["e"], 1)  # evicted
    d.on_touch(["v", "e"], {"v", "e"})  # e is resident again (stored since): stale, not counted
    assert d.stats()["hits"]["rule1"] == 1
    d.record(["w"], 1, virtual=True)
    d.on_touch(["w"], set())  # the inner policy evicted w since: no difference, not counted
    assert d.stats()["hits"]["rule1"] == 1


def test_duel_ghosts_expire_after_a_tier_of_evictions_and_memory_is_bounded():
    d = EvictionDuel(10, rules=1)
    for i in range(100):
        d.record([("i", i)], 0)
        d.record([("r", i)], 1, virtual=True)
    assert len(d.snapshot()["ghost"]) <= 2 * 10 + 2
    d.on_touch([("i", 0), ("r", 0)], set())  # long expired
    assert d.stats()["hits"] == {"inner": 0, "rule1": 0}
    d.on_touch([("i", 99)], set())
    assert d.stats()["hits"]["inner"] == 1


def test_duel_turns_a_rule_off_while_its_victims_are_hit_more_and_on_again():
    d = EvictionDuel(10_000, rules=1)
    # the inner policy's victims: 20 % hit again; the rule's: 15 % (> half of 20 %): off
    for i in range(DUEL_MIN * 2):
        d.record([("i", i)], 0)
        d.record([("r", i)], 1)
        if i % 5 == 0:
            d.on_touch([("i", i)], set())
        if i % 20 < 3:
            d.on_touch([("r", i)], set())
    assert not d.allows(1)
    # the rule's victims go dead (still recorded, virtually, while it is off): on again
    for i in range(DUEL_MIN * 2, DUEL_MIN * 8):
        d.record([("i", i)], 0)
        d.record([("r", i)], 1, virtual=True)
        if i % 5 == 0:
            d.on_touch([("i", i)], set())
    assert d.allows(1)
    hits, ev = d.stats()["hits"], d.stats()["evicted"]
    assert hits["rule1"] * ev["inner"] <= DUEL_RATIO * hits["inner"] * ev["rule1"]


def test_guard_is_validated_and_off_means_the_previous_wrapper():
    with pytest.raises(ValueError, match="guard"):
        PrefixLRUPolicy(4, guard=1)
    with pytest.raises(ValueError, match="guard"):
        prefix_aware(LRUPolicy, guard="yes")
    assert not PrefixLRUPolicy(4, guard=False).guard and PrefixLRUPolicy(4).guard


def test_a_held_back_leaf_rule_only_records_its_picks():
    p = PrefixLRUPolicy(16)
    chain(p, list("abc"))
    chain(p, list("de"))
    p.touch(list("abc"))  # LRU: e d c b a; leaves c, e
    p._leaf_est.demoting = True  # leaves measured dead ...
    p._duel.allowed[2] = False  # ... but the safeguard holds the rule back
    assert not p.demoting
    assert keys_of(p.evict(2, ())) == ["e", "d"]  # the inner LRU's choice
    snap = p.snapshot()
    # c was picked by the rule: recorded as a virtual victim, out of the leaf queue, resident
    assert snap["leaf_queue"] == ([], frozenset()) and "c" in snap["resident"]
    ghosts = dict(snap["duel"]["ghost"])
    assert set(ghosts) == {"c", "d", "e"} and ghosts["c"] & 3 == 2
