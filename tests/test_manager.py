"""OffloadingManager: evictable count, stores, loads, errors, events, admission, stats."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from kvtier import (
    BlockStateError,
    CachePolicy,
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    available_policies,
)
from kvtier.manager import MAX_BLOCKS

ALL_POLICIES = available_policies()


def store(m: OffloadingManager, keys):
    out = m.prepare_store(keys)
    assert out is not None
    m.complete_store(out.keys_to_store)
    return out


class CountingPolicy:
    """Wraps a policy class and counts evict() calls."""

    @staticmethod
    def make(base: type[CachePolicy]) -> type[CachePolicy]:
        class Counting(base):  # type: ignore[misc, valid-type]
            evict_calls = 0

            def evict(self, n, protected):
                type(self).evict_calls += 1
                return super().evict(n, protected)

        return Counting


# -- scenario 3: the evictable count ------------------------------------------------------
def test_evictable_count_through_loads_and_fast_fail_without_asking_policy():
    policy = CountingPolicy.make(OffloadingManager(1).policy.__class__)
    m = OffloadingManager(3, policy)
    store(m, [1, 2, 3])
    assert m.stats().evictable == 3
    m.prepare_load([1])
    m.prepare_load([1])
    assert m.stats().evictable == 2
    m.complete_load([1])
    assert m.stats().evictable == 2
    m.complete_load([1])
    assert m.stats().evictable == 3
    m.prepare_load([1, 2, 3])
    assert m.stats().evictable == 0
    before = m.snapshot()
    assert m.prepare_store([4]) is None
    assert policy.evict_calls == 0
    assert m.snapshot() == before


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_evictable_count_exact_through_failed_stores_evictions_and_reset(policy):
    m = OffloadingManager(4, policy)
    out = m.prepare_store([1, 2, 3])
    m.complete_store([1], success=True)
    m.complete_store([2, 3], success=False)
    s = m.stats()
    assert (s.evictable, s.pending, s.used, s.free, s.failed_stores) == (1, 0, 1, 3, 2)
    store(m, [4, 5, 6])
    out = m.prepare_store([7, 8])
    assert len(out.evicted_keys) == 2
    s = m.stats()
    assert (s.evictable, s.pending, s.used, s.evictions) == (2, 2, 4, 2)
    m.reset_cache()
    s = m.stats()
    assert (s.evictable, s.pending, s.used, s.free, s.evictions) == (0, 0, 0, 4, 0)
    store(m, [1, 2, 3, 4])
    assert m.stats().evictable == 4


# -- scenario 4: stores, pending, bad keys ----------------------------------------------
@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_failed_store_frees_its_slots(policy):
    m = OffloadingManager(2, policy)
    out = m.prepare_store(["a", "b"])
    assert out.block_ids == [0, 1]
    m.complete_store(["a", "b"], success=False)
    assert len(m) == 0 and m.lookup("a") is LookupResult.MISS
    out = m.prepare_store(["c", "d"])
    assert sorted(out.block_ids) == [0, 1] and out.evicted_keys == []


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_key_stored_twice_is_not_stored_again_nor_evicted(policy):
    m = OffloadingManager(2, policy)
    store(m, ["a", "b"])
    out = m.prepare_store(["a", "c"])
    assert out.keys_to_store == ["c"]
    assert out.evicted_keys == ["b"]
    assert m.lookup("a") is LookupResult.HIT


def test_duplicates_in_one_call_are_stored_once():
    m = OffloadingManager(4)
    out = m.prepare_store(["a", "b", "a", "b", "c"])
    assert out.keys_to_store == ["a", "b", "c"]
    assert out.block_ids == [0, 1, 2]


def test_no_new_keys_gives_empty_output():
    m = OffloadingManager(2)
    store(m, ["a"])
    out = m.prepare_store(["a"])
    assert out is not None and out.keys_to_store == [] and out.block_ids == []


def test_fresh_slots_first_then_free_list():
    m = OffloadingManager(4)
    store(m, ["a", "b"])
    m.prepare_store(["c"])
    m.complete_store(["c"], success=False)  # slot 2 freed
    out = m.prepare_store(["d", "e"])
    assert out.block_ids == [3, 2]


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_pending_blocks_answer_hit_pending_and_are_never_evicted(policy):
    m = OffloadingManager(3, policy)
    m.prepare_store(["p1", "p2"])
    store(m, ["r"])
    assert m.lookup("p1") is LookupResult.HIT_PENDING
    assert m.lookup_prefix(["r", "p1"]) == 1
    assert m.prepare_store(["x", "y"]) is None
    out = m.prepare_store(["x"])
    assert out.evicted_keys == ["r"]
    assert m.prepare_store(["z"]) is None


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_pinned_blocks_never_evicted(policy):
    m = OffloadingManager(2, policy)
    store(m, ["a", "b"])
    m.prepare_load(["a", "b"])
    assert m.prepare_store(["c"]) is None
    m.complete_load(["b"])
    assert m.prepare_store(["c"]).evicted_keys == ["b"]


def test_prepare_load_unknown_or_pending_key_raises_and_changes_nothing():
    m = OffloadingManager(4)
    store(m, ["a"])
    m.prepare_store(["p"])
    before = m.snapshot()
    with pytest.raises(BlockStateError, match="'zz'.*not stored"):
        m.prepare_load(["a", "zz"])
    with pytest.raises(BlockStateError, match="'p'.*in flight"):
        m.prepare_load(["a", "p"])
    assert m.snapshot() == before
    assert m.ref_count("a") == 0


def test_complete_load_unpinned_or_unknown_raises_and_changes_nothing():
    m = OffloadingManager(4)
    store(m, ["a", "b"])
    m.prepare_load(["a"])
    before = m.snapshot()
    with pytest.raises(BlockStateError, match="'b'.*not pinned"):
        m.complete_load(["a", "b"])
    with pytest.raises(BlockStateError, match="'q'.*not stored"):
        m.complete_load(["a", "q"])
    with pytest.raises(BlockStateError, match="'a'.*released 2 times"):
        m.complete_load(["a", "a"])
    assert m.snapshot() == before


def test_same_key_loaded_many_times_concurrently():
    m = OffloadingManager(2)
    store(m, ["a"])
    assert m.prepare_load(["a", "a"]) == [0, 0]
    m.prepare_load(["a"])
    assert m.ref_count("a") == 3
    m.complete_load(["a", "a"])
    m.complete_load(["a"])
    assert m.ref_count("a") == 0
    assert m.stats().evictable == 1


def test_lookup_prefix_checks_the_keys_it_examines():
    # keys after the first miss are not examined (no hash per key); with admission every key
    # is counted, so every key is hashed first
    m = OffloadingManager(4)
    assert m.lookup_prefix(["miss", [1]]) == 0
    assert m.stats().misses == 1
    m = OffloadingManager(4, store_threshold=2)
    with pytest.raises(TypeError, match=r"lookup_prefix: block key \[1\] is not hashable"):
        m.lookup_prefix(["miss", [1]])
    assert m.stats().misses == 0


@pytest.mark.parametrize("keys", [[{1}], [2, {1}, 3], [2, 3, {1}]])
def test_complete_store_of_a_mutable_set_key_raises_and_changes_nothing(keys):
    # a set's membership test takes a mutable set for the equal frozenset; the pending set
    # must not, or the frozenset's block leaves the pending set and then the call fails
    m = OffloadingManager(4, "arc")
    m.prepare_store([frozenset({1}), 2, 3])
    before = m.snapshot()
    with pytest.raises(TypeError, match=r"complete_store: block key \{1\} is not hashable"):
        m.complete_store(keys)
    assert m.snapshot() == before
    assert m.ref_count(frozenset({1})) == -1


def test_release_of_blocks_with_different_pin_counts_frees_only_the_last_pins():
    m = OffloadingManager(4)
    store(m, ["a", "b", "c"])
    m.prepare_load(["a", "b", "c"])
    m.prepare_load(["b"])  # b now holds two pins
    m.complete_load(["a", "b", "c"])
    assert [m.ref_count(k) for k in "abc"] == [0, 1, 0]
    assert (m.stats().evictable, m.stats().pinned) == (2, 1)
    # released in reverse, so a is the most recent; b is still pinned: c is the victim
    assert m.prepare_store(["x", "y"]).evicted_keys == ["c"]


@pytest.mark.parametrize(
    "call",
    ["prepare_store", "prepare_load", "complete_load", "complete_store", "touch", "lookup_prefix"],
)
def test_unhashable_key_raises_type_error_naming_it_and_changes_nothing(call):
    m = OffloadingManager(4, "arc")
    store(m, ["a"])
    m.prepare_load(["a"])
    before = m.snapshot()
    with pytest.raises(TypeError, match=r"\['bad'\].*not hashable"):
        getattr(m, call)(["a", ["bad"]])
    assert m.snapshot() == before


def test_complete_load_of_an_unhashable_key_after_pinned_ones_releases_nothing():
    # complete_load pops the pins before it checks the keys (round 9): the counts popped
    # before an unhashable key are put back (with other blocks still pinned, dict.pop hashes
    # the key and raises; an empty dict answers the default)
    m = OffloadingManager(4, "arc")
    store(m, ["a", "b", "c"])
    m.prepare_load(["a", "b", "c"])
    before = m.snapshot()
    with pytest.raises(TypeError, match=r"\['bad'\].*not hashable"):
        m.complete_load(["a", "b", ["bad"], "c"])
    assert m.snapshot() == before
    assert [m.ref_count(k) for k in "abc"] == [1, 1, 1]


def test_complete_store_ignores_keys_that_are_not_pending():
    m = OffloadingManager(2)
    store(m, ["a"])
    m.complete_store(["a", "nope"])
    m.complete_store(["a"], success=False)
    assert m.lookup("a") is LookupResult.HIT


def test_missing_lists_the_keys_not_stored_in_order_and_counts_nothing():
    m = OffloadingManager(4)
    store(m, ["a"])  # ready
    m.prepare_store(["b"])  # pending: stored too
    before = m.snapshot()
    assert m.missing(["x", "a", "b", "y", "x"]) == ["x", "y", "x"]
    assert m.missing(("a", "b")) == []
    assert m.missing(k for k in ["z", "a"]) == ["z"]
    assert m.snapshot() == before  # no lookup counted, no admission, nothing moved
    with pytest.raises(TypeError, match=r"missing: block key \['c'\] is not hashable"):
        m.missing(["a", ["c"]])
    with pytest.raises(TypeError, match="missing: keys must be a list"):
        m.missing("ab")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4", np.float64(4.0), np.bool_(True),
                                 np.int64(0)])
def test_constructor_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="num_blocks"):
        OffloadingManager(bad)


@pytest.mark.parametrize("policy", ["lru", "arc", "prefix-arc"])
def test_numpy_integer_sizes_are_taken_as_plain_ints(policy):
    """A capacity computed with numpy (e.g. ``bytes // block_bytes`` of numpy ints) is an
    integer: it is taken, and stored as a plain ``int`` (was refused before)."""
    m = OffloadingManager(np.int64(4), policy, store_threshold=np.int32(1),
                          max_open_requests=np.uint16(8))
    assert m.num_blocks == 4 and type(m.num_blocks) is int
    assert type(m.policy.capacity) is int
    out = m.prepare_store(list(range(4)))
    assert out is not None and sorted(out.block_ids) == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", ["no", "false", 0, None])
def test_enable_events_must_be_a_bool(bad):
    """Found by newcomer10: enable_events="no" (a flag from a config file) turned events on,
    and a caller that never takes them grows the event list by one per store for ever."""
    with pytest.raises(ValueError, match=rf"^enable_events must be a bool, got {bad!r}$"):
        OffloadingManager(4, enable_events=bad)
    assert OffloadingManager(4, enable_events=np.bool_(True)).enable_events is True


@pytest.mark.parametrize("bad", ["no", "false", 0, None])
def test_setting_enable_events_checks_it_as_the_constructor_does(bad):
    """Found by an earlier session: the constructor refused enable_events="no", but
    ``m.enable_events = "no"`` was taken as is (events on, and the attribute read back
    "no"). The attribute is checked the same way; a refused value changes nothing."""
    m = OffloadingManager(4)
    with pytest.raises(ValueError, match=rf"^enable_events must be a bool, got {bad!r}$"):
        m.enable_events = bad
    assert m.enable_events is False
    m.complete_store(m.prepare_store(["a"]).keys_to_store)
    assert m.take_events() == []
    m.enable_events = np.bool_(True)  # numpy's bool, as the constructor takes it
    assert m.enable_events is True
    m.complete_store(m.prepare_store(["b"]).keys_to_store)
    assert [e.keys for e in m.take_events()] == [("b",)]


def test_constructor_rejects_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy 'nope'.*lru"):
        OffloadingManager(4, "nope")
    with pytest.raises(TypeError, match="policy"):
        OffloadingManager(4, object)


# -- events, admission, stats --------------------------------------------------------------
def test_events_one_per_evicting_store_and_per_completing_store():
    m = OffloadingManager(2, enable_events=True)
    m.prepare_store(["a", "b"])
    assert m.take_events() == []
    m.complete_store(["a", "b"])
    assert m.take_events() == [OffloadingEvent(("a", "b"), False)]
    m.prepare_store(["c"])
    m.complete_store(["c", "zz"])
    assert m.take_events() == [
        OffloadingEvent(("b",), True),
        OffloadingEvent(("c",), False),
    ]
    m.complete_store(["c"])  # nothing became ready
    assert m.take_events() == []


def test_events_disabled_records_nothing():
    m = OffloadingManager(1)
    store(m, ["a"])
    store(m, ["b"])
    assert m.take_events() == []


def test_store_threshold_admits_keys_looked_up_often_enough():
    m = OffloadingManager(4, store_threshold=2)
    m.lookup("a")
    out = m.prepare_store(["a"])
    assert out.keys_to_store == [] and m.stats().skipped_stores == 1
    m.lookup_prefix(["a", "b"])  # counts both keys
    out = m.prepare_store(["a", "b", "c"])
    assert out.keys_to_store == ["a"]
    assert m.stats().skipped_stores == 3


def test_store_threshold_tracker_is_bounded_lru():
    m = OffloadingManager(4, store_threshold=2, max_tracker_size=2)
    for key in ["a", "a", "b", "c"]:  # "a" falls out when "c" arrives
        m.lookup(key)
    m.lookup("a")
    assert m.prepare_store(["a"]).keys_to_store == []
    assert len(m.snapshot()["tracker"]) == 2


def test_store_threshold_tracker_smaller_than_a_request_keeps_the_head():
    """Found by a newcomer session: with max_tracker_size below a request's length, each
    lookup_prefix counted the keys head first and the trim then dropped the request's own
    head, so only the tail reached the threshold and was stored, where no prefix lookup
    reaches it. A call longer than the tracker is counted tail first: the head is kept."""
    keys = list(range(8))
    m = OffloadingManager(16, store_threshold=2, max_tracker_size=4)
    m.lookup_prefix(keys)
    m.lookup_prefix(keys)
    assert [key for key, _ in m.snapshot()["tracker"]] == [3, 2, 1, 0]
    assert m.prepare_store(keys).keys_to_store == [0, 1, 2, 3]


def test_stats_counters():
    m = OffloadingManager(2)
    store(m, ["a"])
    m.prepare_store(["p"])
    m.lookup("a")
    m.lookup("p")
    m.lookup("x")
    m.prepare_load(["a"])
    s = m.stats()
    assert (s.lookups, s.hits, s.pending_hits, s.misses) == (3, 1, 1, 1)
    assert (s.stores, s.completed_stores, s.loads) == (2, 1, 1)
    assert (s.used, s.pending, s.pinned, s.evictable, s.free) == (2, 1, 1, 0, 0)
    assert s.hit_ratio == pytest.approx(1 / 3)


def test_lookup_prefix_stops_at_first_miss_or_pending():
    m = OffloadingManager(8)
    store(m, [1, 2, 3])
    m.prepare_store([4])
    assert m.lookup_prefix([1, 2, 3, 4, 5]) == 3
    assert m.lookup_prefix([1, 9, 2]) == 1
    assert m.lookup_prefix([]) == 0
    s = m.stats()
    assert (s.hits, s.pending_hits, s.misses) == (4, 1, 1)


def test_req_context_accepted_everywhere():
    m = OffloadingManager(2)
    ctx = object()
    out = m.prepare_store(["a"], req_context=ctx)
    m.complete_store(out.keys_to_store, ctx, True)  # vLLM's positional order
    assert m.lookup("a", req_context=ctx) is LookupResult.HIT
    assert m.lookup_prefix(["a"], req_context=ctx) == 1
    m.touch(["a"], req_context=ctx)
    m.prepare_load(["a"], req_context=ctx)
    m.complete_load(["a"], req_context=ctx)


# -- input shapes ----------------------------------------------------------------------------
def test_any_iterable_of_keys_is_accepted():
    m = OffloadingManager(4)
    out = m.prepare_store(k for k in ["a", "b"])
    assert out.keys_to_store == ["a", "b"]
    m.complete_store(iter(["a", "b"]))
    assert m.lookup_prefix(k for k in ["a", "b", "c"]) == 2
    assert m.prepare_load(k for k in ["a"]) == [0]
    assert m.ref_count("a") == 1
    m.touch(k for k in ["b", "a"])
    m.complete_load(iter(["a"]))
    assert m.ref_count("a") == 0
    with pytest.raises(BlockStateError, match="'zz'.*not stored"):
        m.prepare_load(iter(["zz"]))


@pytest.mark.parametrize(
    "call", ["prepare_store", "prepare_load", "complete_load", "complete_store", "touch",
             "lookup_prefix"],
)
def test_a_bare_string_is_refused_not_split_into_characters(call):
    m = OffloadingManager(4)
    store(m, ["h0"])
    before = m.snapshot()
    with pytest.raises(TypeError, match=f"{call}: keys must be a list.*'h0'"):
        getattr(m, call)("h0")
    assert m.snapshot() == before


def test_none_and_tuples_are_ordinary_keys_for_every_policy():
    for policy in ALL_POLICIES:
        m = OffloadingManager(3, policy)
        store(m, [None, ("t", 1)])
        m.prepare_store(["x", None])
        m.complete_store(["x", None], success=False)
        s = m.stats()
        assert (s.used, s.pending, s.evictable) == (2, 0, 2), policy
        assert m.lookup(None) is LookupResult.HIT


def test_lookup_of_unhashable_key_names_it():
    m = OffloadingManager(2)
    with pytest.raises(TypeError, match=r"lookup: block key \['x'\] is not hashable"):
        m.lookup(["x"])


def test_read_only_queries_name_an_unhashable_key():
    m = OffloadingManager(2)
    m.prepare_store(["a"])
    before = m.snapshot()
    for call, name in ((m.slot_of, "slot_of"), (m.ref_count, "ref_count"),
                       (m.__contains__, "__contains__")):
        with pytest.raises(TypeError, match=rf"{name}.*block key \['x'\] is not hashable"):
            call(["x"])
    with pytest.raises(TypeError, match=r"block key \{'k': 1\} is not hashable"):
        {"k": 1} in m  # noqa: B015 (the membership test is the call under test)
    assert m.snapshot() == before


def test_lookup_prefix_with_admission_counts_nothing_on_bad_key():
    m = OffloadingManager(4, store_threshold=2)
    before = m.snapshot()
    with pytest.raises(TypeError, match="not hashable"):
        m.lookup_prefix(["a", ["x"]])
    assert m.snapshot() == before


def test_num_blocks_above_the_slot_id_range_is_refused():
    from kvtier.manager import MAX_BLOCKS

    with pytest.raises(ValueError, match="at most"):
        OffloadingManager(MAX_BLOCKS + 1)


def test_complete_store_names_a_key_twice_first_occurrence_counts_as_in_touch():
    for policy in ("lru", "arc"):
        m = OffloadingManager(3, policy)
        m.prepare_store(["a", "b", "c"])
        m.complete_store(["a", "b", "c", "a"])  # "a" ends most recent, as touch would leave it
        assert m.prepare_store(["d"]).evicted_keys == ["c"]


def test_complete_store_success_must_be_a_bool():
    m = OffloadingManager(3)
    m.prepare_store(["a", "b"])
    snap = m.snapshot()
    with pytest.raises(TypeError, match="success must be a bool, got 'no'"):
        m.complete_store(["a", "b"], success="no")
    with pytest.raises(TypeError, match="success must be a bool"):
        m.complete_store(["a"], success=1)
    assert m.snapshot() == snap


def test_complete_store_takes_vllms_positional_order_and_refuses_a_bool_context():
    m = OffloadingManager(4)
    m.prepare_store(["a", "b", "c"])
    snap = m.snapshot()
    # the old kvtier order, complete_store(keys, success): a bool where req_context goes
    for flag in (False, True):
        with pytest.raises(TypeError, match=f"req_context is {flag}.*pass success={flag}"):
            m.complete_store(["a", "b"], flag)
        with pytest.raises(TypeError, match="pass success="):
            m.complete_store(["a"], flag)  # the one-key fast path checks it too
    assert m.snapshot() == snap
    ctx = {"request": 7}
    m.complete_store(["a"], ctx, False)  # vLLM's order: (keys, req_context, success)
    assert m.ref_count("a") is None  # dropped, not stored
    m.complete_store(["b"], ctx)
    assert m.ref_count("b") == 0
    m.complete_store(["c"], None, success=True)
    assert m.ref_count("c") == 0


def test_lookup_with_admission_names_an_unhashable_key():
    m = OffloadingManager(3, store_threshold=2)
    snap = m.snapshot()
    with pytest.raises(TypeError, match=r"lookup: block key \[1\] is not hashable"):
        m.lookup([1])
    assert m.snapshot() == snap


def test_huge_tier_allocates_nothing_per_slot():
    tracemalloc.start()
    m = OffloadingManager(MAX_BLOCKS)
    allocated, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert allocated < 1 << 20  # nothing proportional to num_blocks (2^31 - 1) up front
    keys = list(range(200_000))
    m.prepare_store(keys[:150_000])
    for key in keys[150_000:]:
        m.prepare_store([key])
    m.complete_store(keys)
    assert m.prepare_load([keys[-1], keys[170_000], keys[-1]]) == [199_999, 170_000, 199_999]
    assert m.ref_count(keys[-1]) == 2 and m.ref_count(keys[170_000]) == 1
    assert m.stats().pinned == 2 and m.stats().evictable == 200_000 - 2


def test_complete_store_refuses_a_numpy_bool_context_and_names_a_pending_block_on_release():
    """Found by a newcomer session: numpy.bool_(False) in the req_context position stored the
    block; complete_load of a pending block reported 'ref count -1'."""
    np = pytest.importorskip("numpy")
    m = OffloadingManager(4, "lru")
    m.prepare_store([1])
    before = m.snapshot()
    with pytest.raises(TypeError, match="by keyword"):
        m.complete_store([1], np.bool_(False))
    assert m.snapshot() == before
    with pytest.raises(BlockStateError, match="still in flight"):
        m.complete_load([1])
    assert m.snapshot() == before


# a store that cannot get its slots: (setup, the failing call) for each None-returning path
def _one_key_all_pinned(m):
    store(m, ["a"])
    m.prepare_load(["a"])
    return ["d"], None


def _shortfall_over_evictable(m):
    store(m, ["a"])
    m.prepare_load(["a"])
    return ["c", "d"], None


def _only_a_protected_block_evictable(m):
    store(m, ["a"])
    return ["a", "d"], None


def _request_mode_only_a_protected_block(m):
    store(m, ["a"])
    m.on_new_request("r")
    return ["a", "d"], "r"


@pytest.mark.parametrize("admission", ["adaptive", "tinylfu"])
@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "prefix-lru"])
@pytest.mark.parametrize("setup", [_one_key_all_pinned, _shortfall_over_evictable,
                                   _only_a_protected_block_evictable,
                                   _request_mode_only_a_protected_block])
def test_a_store_that_returns_none_leaves_the_admission_unchanged(admission, policy, setup):
    # prepare_store's None changes nothing (docs/manager.md, "Atomic stores"), the
    # admission's state included: its record of the stores in flight (adaptive) and of the
    # blocks admitted (TinyLFU) counted a store that never happened
    m = OffloadingManager(1, policy, admission=admission)
    keys, ctx = setup(m)
    for _ in range(3):
        m.lookup_prefix(keys)  # seen before: admitted by every rule
    before = m.snapshot()
    assert m.prepare_store(keys, ctx) is None
    after = m.snapshot()
    if ctx is not None:  # a failed store still records the request's keys (as vLLM)
        before.pop("requests")
        after.pop("requests")
    assert after == before


def test_num_blocks_is_read_only():
    """num_blocks sizes the slots, the policy and the admission at construction: setting it
    afterwards broke the invariants (free slots counted from the new size, slot ids beyond
    the allocator's range). It is read-only, named in the error; nothing changes."""
    m = OffloadingManager(4, "lru")
    m.complete_store(m.prepare_store([1, 2, 3, 4]).keys_to_store)
    before = m.snapshot()
    with pytest.raises(AttributeError, match=r"num_blocks is fixed at construction"):
        m.num_blocks = 8
    assert m.num_blocks == 4 and m.stats().num_blocks == 4 and m.stats().free == 0
    assert m.snapshot() == before
    out = m.prepare_store([5])
    assert out is not None and out.evicted_keys == [4]  # LRU: the call's tail
    assert "num_blocks" not in vars(m)  # a class property, no instance attribute of its own
