"""LRU: least recently used first, the reverse rule, re-entry at the MRU end, O(k) eviction."""

from __future__ import annotations

from kvtier import OffloadingManager


def store(m: OffloadingManager, keys):
    out = m.prepare_store(keys)
    assert out is not None
    m.complete_store(out.keys_to_store)
    return out


def test_lru_touch_first_key_ends_most_recent():
    m = OffloadingManager(3, "lru")
    store(m, ["a", "b", "c"])
    m.touch(["a", "b", "c"])
    # a is most recent, c least recent
    assert m.prepare_store(["d"]).evicted_keys == ["c"]
    assert m.prepare_store(["e"]).evicted_keys == ["b"]


def test_complete_store_and_complete_load_apply_keys_in_reverse():
    m = OffloadingManager(3, "lru")
    store(m, ["h", "m", "t"])  # head-first: h ends most recent
    assert m.policy.snapshot()["order"] == ["t", "m", "h"]
    m.prepare_load(["h", "m", "t"])
    m.complete_load(["h", "m", "t"])
    assert m.policy.snapshot()["order"] == ["t", "m", "h"]


def test_a_pin_and_its_release_do_not_move_a_block():
    # issue #11 section 1: logical recency
    m = OffloadingManager(3, "lru")
    store(m, ["a", "b", "c"])  # order c, b, a
    m.prepare_load(["c"])
    assert m.policy.snapshot()["order"] == ["c", "b", "a"]
    m.complete_load(["c"])
    assert m.policy.snapshot()["order"] == ["c", "b", "a"]
    assert m.prepare_store(["d"]).evicted_keys == ["c"]


def test_issue_small_input_a_released_pin_keeps_the_prefix_head_last():
    # issue #11 section 1's small input (LRU, 3 blocks)
    m = OffloadingManager(3, "lru")
    store(m, [1, 2])
    store(m, [3])
    m.touch([1, 2])
    m.prepare_load([2])
    m.complete_load([2])
    assert m.prepare_store([4]).evicted_keys == [3]
    m.complete_store([4])
    assert m.prepare_store([5]).evicted_keys == [2]  # was 1 before logical recency
    assert m.lookup_prefix([1, 2]) == 1


def test_stores_completing_out_of_order_keep_the_stored_order():
    m = OffloadingManager(4, "lru")
    assert m.prepare_store(["h", "m", "t"]).keys_to_store == ["h", "m", "t"]  # h most recent
    m.complete_store(["t"])
    m.complete_store(["h"])
    m.complete_store(["m"])
    assert m.policy.snapshot()["order"] == ["t", "m", "h"]


def test_a_pinned_block_met_by_eviction_comes_back_at_its_place():
    m = OffloadingManager(4, "lru")
    store(m, ["a", "b", "c", "d"])  # order d, c, b, a
    m.prepare_load(["d", "c"])
    assert m.prepare_store(["x"]).evicted_keys == ["b"]  # d, c set aside, in place
    m.complete_store(["x"])
    m.complete_load(["c"])  # released in the other order than they were met
    m.complete_load(["d"])
    assert m.policy.snapshot()["order"] == ["d", "c", "a", "x"]
    assert m.prepare_store(["y", "z"]).evicted_keys == ["d", "c"]


def test_lru_eviction_visits_only_victims_whatever_is_pinned():
    n = 10_000
    m = OffloadingManager(n, "lru")
    store(m, list(range(n)))
    m.prepare_load(list(range(n - 100)))  # 99% pinned
    m.policy.examined = 0
    out = m.prepare_store(list(range(n, n + 50)))
    assert out.evicted_keys == list(range(n - 1, n - 51, -1))
    assert m.policy.examined == 50
