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


def test_unpinned_block_reenters_at_mru_end():
    m = OffloadingManager(3, "lru")
    store(m, ["a", "b", "c"])  # order c, b, a
    m.prepare_load(["c"])
    m.complete_load(["c"])
    assert m.policy.snapshot()["order"] == ["b", "a", "c"]


def test_lru_eviction_visits_only_victims_whatever_is_pinned():
    n = 10_000
    m = OffloadingManager(n, "lru")
    store(m, list(range(n)))
    m.prepare_load(list(range(n - 100)))  # 99% pinned
    m.policy.examined = 0
    out = m.prepare_store(list(range(n, n + 50)))
    assert out.evicted_keys == list(range(n - 1, n - 51, -1))
    assert m.policy.examined == 50
