"""LFU with dynamic aging: exact eviction orders on hand-checked sequences."""

from __future__ import annotations

from kvtier import OffloadingManager
from kvtier.policies.lfu import WINDOW, LFUPolicy


def add(policy, key, slot=0):
    policy.insert([key])
    policy.mark_evictable([key])


def keys_of(victims):
    return victims


def test_lowest_count_first_ties_by_recency_and_floor_rises():
    p = LFUPolicy(8)
    for key in "abc":
        add(p, key)  # K = floor + 1 = 1
    p.touch(["c"])  # c: 2
    p.touch(["b", "a"])  # applied a then b: bucket 2 = c, a, b (b most recent)
    assert p.snapshot()["buckets"] == [(2, ["c", "a", "b"])]
    assert keys_of(p.evict(1, ())) == ["c"]
    assert p.floor == 2
    add(p, "d")  # enters at floor + 1 = 3
    assert p.priority("d") == 3
    assert keys_of(p.evict(2, ())) == ["a", "b"]
    assert keys_of(p.evict(1, ())) == ["d"]
    assert p.floor == 3


def test_old_popularity_fades():
    p = LFUPolicy(8)
    add(p, "a")
    for _ in range(3):
        p.touch(["a"])  # K = 4
    for i in range(1, 4):
        add(p, f"x{i}")  # K = floor + 1 = i
        assert keys_of(p.evict(1, ())) == [f"x{i}"]
        assert p.floor == i
    add(p, "x4")  # K = 4, like a; a is older in the bucket
    assert keys_of(p.evict(1, ())) == ["a"]


def test_protected_skipped_and_floor_stays_below_it():
    p = LFUPolicy(8)
    for key in "abc":
        add(p, key)
    p.touch(["c"])
    before = p.examined
    assert keys_of(p.evict(2, {"a"})) == ["b", "c"]
    assert p.examined - before == 3  # a skipped, b, c
    assert p.floor == 1  # a (K = 1) is still evictable
    assert keys_of(p.evict(1, ())) == ["a"]


def test_pinned_block_keeps_counting_and_is_aged_on_reentry():
    p = LFUPolicy(8)
    add(p, "a")
    add(p, "b")
    p.mark_non_evictable(["a"])
    p.touch(["a"])  # counted while pinned: K = 2
    assert p.priority("a") == 2
    for i in range(5):
        add(p, i)
        for _ in range(5):
            p.touch([i])
    for _ in range(8):
        p.touch(["b"])  # b: 9
    p.mark_non_evictable(["b"])
    assert keys_of(p.evict(5, ())) == [0, 1, 2, 3, 4]  # K = 6 each, floor 6
    p.mark_evictable(["a"])  # K 2 < floor: re-enters at the floor
    assert p.priority("a") == 6
    p.mark_evictable(["b"])
    assert keys_of(p.evict(2, ())) == ["a", "b"]


def test_count_saturates_within_the_window():
    p = LFUPolicy(8)
    add(p, "a")
    for _ in range((3 * WINDOW)):
        p.touch(["a"])
    assert p.priority("a") == WINDOW - 1
    add(p, "b")
    assert keys_of(p.evict(2, ())) == ["b", "a"]


def test_evict_is_atomic():
    p = LFUPolicy(8)
    for key in "abc":
        add(p, key)
    p.insert(["x"])
    snap = p.snapshot()
    assert p.evict(2, ["a", "b"]) is None
    assert p.evict(4, ()) is None
    assert p.snapshot() == snap


def test_through_the_manager():
    m = OffloadingManager(3, policy="lfu")
    m.complete_store(m.prepare_store(["a", "b", "c"]).keys_to_store)
    m.touch(["a", "b"])  # a, b: K = 2 (bucket 2 = b, a); c: K = 1
    assert m.prepare_store(["d"]).evicted_keys == ["c"]  # floor 1
    m.complete_store(["d"])  # d: K = floor + 1 = 2, most recent in bucket 2
    assert m.prepare_store(["e"]).evicted_keys == ["b"]
