"""S3-FIFO: exact eviction orders on hand-checked sequences.

Capacity 10 gives S = 1 block, M = 9 blocks, G = 9 keys. Queues are drawn oldest first.
"""

from __future__ import annotations

from kvtier import OffloadingManager
from kvtier.policies.s3fifo import S3FIFOPolicy


def add(policy, key, slot=0):
    policy.insert([key])
    policy.mark_evictable([key])


def keys_of(victims):
    return victims


def state(policy):
    snap = policy.snapshot()
    return snap["small"], snap["main"], snap["ghost"]


def test_promotion_reinsertion_ghost_and_protected():
    p = S3FIFOPolicy(10)
    assert (p.small_capacity, p.main_capacity, p.ghost_capacity) == (1, 9, 9)
    add(p, "a")
    add(p, "b")  # S full before any eviction: enters M (libCacheSim's warm-up rule)
    add(p, "c")
    assert state(p) == (["a"], ["b", "c"], [])
    p.touch(["a", "b"])
    p.touch(["a"])  # freq a = 2, b = 1 (a key named twice in one call would be one use)
    # M is within its share and S is not empty: evict from S. a (freq 2) moves to M with
    # freq 0; S is now empty, so M: b (freq 1) is reinserted with 0, c is the victim
    assert keys_of(p.evict(1, ())) == ["c"]
    assert state(p) == ([], ["a", "b"], [])  # evicted from M: no ghost entry
    add(p, "d")
    add(p, "e")  # after the first eviction new blocks always enter S
    assert keys_of(p.evict(1, ())) == ["d"]  # d leaves S unused: its key enters G
    assert state(p) == (["e"], ["a", "b"], ["d"])
    add(p, "d")  # ghost hit: straight into M
    assert state(p) == (["e"], ["a", "b", "d"], [])
    # e from S (-> G); then S empty: M's a is protected, passed and kept at the head; b next
    assert keys_of(p.evict(2, {"a"})) == ["e", "b"]
    assert state(p) == ([], ["a", "d"], ["e"])


def test_frequency_is_capped_at_three():
    p = S3FIFOPolicy(10)
    add(p, "s")
    add(p, "a")
    add(p, "b")  # M: a b
    for _ in range(10):
        p.touch(["a"])
    p.mark_non_evictable(["s"])
    # a has 3 laps of credit: reinserted with 2, b evicted
    assert keys_of(p.evict(1, ())) == ["b"]
    assert p.snapshot()["freq"]["a"] == 2
    add(p, "c")  # enters S (an eviction happened) and is pinned: S has no candidate
    p.mark_non_evictable(["c"])
    before = p.examined
    # M is only a: reinserted twice (2 -> 1 -> 0), then evicted: 3 examinations
    assert keys_of(p.evict(1, ())) == ["a"]
    assert p.examined - before == 3


def test_evict_is_atomic_and_skips_pinned_and_pending():
    p = S3FIFOPolicy(10)
    for key in "abc":
        add(p, key)
    p.touch(["b", "c"])
    p.touch(["b"])
    p.insert(["x"])  # pending
    p.mark_non_evictable(["a"])  # pinned
    snap, visited = p.snapshot(), p.examined
    assert p.evict(2, ["b"]) is None
    assert p.evict(3, ()) is None
    assert p.snapshot() == snap and p.examined == visited
    # S has no evictable block (a pinned): M b(2) c(1) -> b(1) c(0) -> b(0) c evicted -> b
    assert keys_of(p.evict(2, ())) == ["c", "b"]


def test_a_protected_block_passed_over_stays_in_front_of_a_held_block_behind_it():
    p = S3FIFOPolicy(10)
    for key in "smpqx":  # S = [s]; M = [m, p, q, x] (S was full during the first fill)
        add(p, key)
    p.mark_non_evictable(["s", "p"])  # S's only block and M's second are held
    # from M (S has no candidate): m protected (passed over), p held (set aside), q
    assert keys_of(p.evict(1, {"m"})) == ["q"]
    assert state(p)[1] == ["m", "p", "x"]  # was p, m, x: the held block went first
    p.mark_evictable(["p"])
    assert keys_of(p.evict(1, ())) == ["m"]  # the oldest (was p)
    assert keys_of(p.evict(1, ())) == ["p"]


def test_ghost_is_bounded():
    p = S3FIFOPolicy(10)
    for i in range(100):
        add(p, i)
        if p.small_size + p.main_size > 10:
            p.evict(1, ())
    p.on_store([])
    assert len(p.snapshot()["ghost"]) <= p.ghost_capacity
    assert p.small_size + p.main_size == 10


def test_touch_of_a_pinned_block_counts_and_it_reenters_its_queue_tail():
    m = OffloadingManager(10, policy="s3fifo")
    m.complete_store(m.prepare_store(["a", "b", "c"]).keys_to_store)
    # c is in S (a call takes S's room tail first), a and b in M (S was full during the
    # first fill); M's order, oldest first: b, a (the call's head ends newest)
    assert state(m.policy) == (["c"], ["b", "a"], [])
    m.prepare_load(["c"])
    m.touch(["c"])
    m.touch(["c"])
    m.complete_load(["c"])
    assert state(m.policy) == (["c"], ["b", "a"], [])
    assert m.policy.snapshot()["freq"]["c"] == 2
