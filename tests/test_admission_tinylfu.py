"""TinyLFU admission (kvtier.admission_tinylfu): sketch, doorkeeper, aging, victim rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import OffloadingManager
from kvtier.admission_adaptive import make_admission
from kvtier.admission_tinylfu import SAMPLE_FACTOR, TinyLFUAdmission
from kvtier.policies import available_policies
from kvtier.replay import replay
from kvtier.trace import Request

from test_admission_adaptive import once_traffic, run, scan_traffic


def test_doorkeeper_then_sketch_counts_and_never_underestimates():
    a = TinyLFUAdmission(1000)
    assert a.estimate(7) == 0
    a.record([7])
    assert a.estimate(7) == 1 and 7 in a._door
    assert all(not any(row) for row in a._rows)  # a first lookup leaves the counters alone
    for _ in range(5):
        a.record([7, 8])
    assert a.estimate(7) == 6 and a.estimate(8) == 5
    # count-min: each of many keys is estimated at least at its true count
    keys = list(range(100, 400))
    for rep in range(3):
        a.record(keys)
    assert all(a.estimate(k) >= 3 for k in keys)


def test_counters_saturate_at_15():
    a = TinyLFUAdmission(64)
    for _ in range(40):
        a.record([1])
    assert a.estimate(1) == 15 + 1  # counters 15, plus the doorkeeper


def test_aging_halves_counters_and_empties_the_doorkeeper():
    a = TinyLFUAdmission(10, sample_factor=SAMPLE_FACTOR)
    assert a.sample == 100
    for _ in range(9):
        a.record([1])  # 9 lookups: doorkeeper + 8 counted
    assert a.estimate(1) == 9
    a.record(list(range(1000, 1091)))  # the 100th lookup ends the sample
    assert a.resets == 1
    assert a.estimate(1) == 4  # 8 halved, doorkeeper emptied
    assert a.state_size() == 0


def test_free_slots_admit_everything_then_victims_decide():
    m = OffloadingManager(32, "lru", admission="tinylfu")
    run(m, once_traffic(0, 4))  # 32 blocks: the tier fills, nothing evicted
    assert m.stats().stores == 32 and m.stats().skipped_stores == 0
    # hot keys seen over and over, the scan never again: once the tier evicts scan blocks
    # (estimate 1) the victims' mean is about 1 and a first-seen block (1) is refused
    requests = scan_traffic(10_000, 400, hot=8, scan=4)
    hits = run(m, requests)
    assert hits >= 400 - 2 * 8 - 40  # the hot keys stay once the victim mean settles
    assert m.stats().skipped_stores > 300 * 4
    assert m.admission.info()["victim_freq"] < 1.5


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=10), min_size=1,
                max_size=80),
       st.sampled_from(["lru", "arc", "sieve", "prefix-lru"]))
def test_prefix_closed_and_counted(requests, policy):
    m = OffloadingManager(8, policy, admission="tinylfu")
    offered = 0
    for keys in requests:
        n = m.lookup_prefix(keys)
        m.touch(keys)
        new = list(dict.fromkeys(k for k in keys[n:] if k not in m))
        before = m.stats()
        out = m.prepare_store(keys[n:])
        if out is None:
            assert m.stats() == before
            continue
        offered += len(new)
        assert out.keys_to_store == new[: len(out.keys_to_store)]  # a leading run
        m.complete_store(out.keys_to_store)
    s = m.stats()
    assert s.stores + s.skipped_stores == offered


def test_state_is_bounded_whatever_the_trace_length():
    a = TinyLFUAdmission(16)
    longest = 10
    for start in range(0, 100_000, longest):
        a.record(list(range(start, start + longest)))
        assert a.state_size() <= a.sample + longest
    assert len(a._rows) == 4 and all(len(r) == a.width == 64 for r in a._rows)  # 4 * 16
    assert a.resets >= 100_000 // (a.sample + longest)


def test_deterministic_for_a_trace():
    trace = [Request(keys, None, None, float(i)) for i, keys in
             enumerate(scan_traffic(0, 300) + once_traffic(5_000, 300))]
    a = replay(trace, "arc", 40, admission="tinylfu")
    b = replay(trace, "arc", 40, admission="tinylfu")
    assert (a.hit_blocks, a.stored_blocks, a.refused_blocks) == (
        b.hit_blocks, b.stored_blocks, b.refused_blocks)
    assert a.refused_blocks > 0 and a.admission == "tinylfu"


@pytest.mark.parametrize("policy", available_policies())
def test_composes_with_every_registered_policy(policy):
    requests = scan_traffic(0, 400)
    m = OffloadingManager(64, policy, admission="tinylfu")
    hits = run(m, requests)
    s = m.stats()
    assert s.used <= 64
    assert s.stores + s.skipped_stores == 400 * 9 - hits  # every missed block was offered
    assert s.skipped_stores > 0


def test_bad_arguments_and_unhashable_keys_change_nothing():
    with pytest.raises(ValueError, match="num_blocks"):
        TinyLFUAdmission(0)
    with pytest.raises(ValueError, match="sample_factor"):
        TinyLFUAdmission(8, sample_factor=True)
    assert isinstance(make_admission("tinylfu", 8), TinyLFUAdmission)
    m = OffloadingManager(8, admission="tinylfu")
    run(m, [[1, 2, 3], [1, 2, 3]])
    before = m.snapshot()
    with pytest.raises(TypeError, match="not hashable"):
        m.lookup_prefix([1, [2], 3])
    assert m.snapshot() == before
    m.reset_cache()
    assert m.snapshot() == OffloadingManager(8, admission="tinylfu").snapshot()


def test_sketch_width_is_capped_for_huge_tiers():
    from kvtier.admission_tinylfu import MAX_WIDTH
    from kvtier.manager import MAX_BLOCKS

    a = TinyLFUAdmission(4_194_304)  # the size at which the cap is reached
    assert a.width == MAX_WIDTH == 4 * 4_194_304
    huge = TinyLFUAdmission(MAX_BLOCKS)  # was 2**33 counters per row: 32 GiB up front
    assert huge.width == MAX_WIDTH
    assert sum(len(r) for r in huge._rows) == 4 * MAX_WIDTH  # 64 MiB
    huge.record([1, 2, 3])
    huge.record([1, 2, 3])
    assert huge.estimate(1) >= 1 and huge._shift == 64 - MAX_WIDTH.bit_length() + 1
    a = TinyLFUAdmission(4_194_305)
    assert a.width == MAX_WIDTH


def test_failed_stores_give_their_slots_back_to_the_free_count():
    """complete_store(success=False) frees the blocks' slots: TinyLFU must count them free
    again, or it refuses blocks a tier with free slots would store without evicting."""
    m = OffloadingManager(16, "lru", admission="tinylfu")
    out = m.prepare_store(list(range(16)))
    assert out is not None and len(out.keys_to_store) == 16
    m.complete_store(list(range(8)), success=False)  # 8 slots free again
    m.complete_store(list(range(8, 16)))
    assert m.stats().free == 8
    # 8 first-seen keys fit the free slots: stored, nothing evicted, nothing refused
    out = m.prepare_store(list(range(100, 108)))
    assert out is not None and len(out.keys_to_store) == 8 and out.evicted_keys == []
    assert m.stats().skipped_stores == 0
    assert m.admission._admitted == 16


def test_reset_cache_gives_every_slot_back():
    m = OffloadingManager(8, "lru", admission="tinylfu")
    m.complete_store(m.prepare_store(list(range(8))).keys_to_store)
    m.reset_cache()
    out = m.prepare_store(list(range(100, 108)))
    assert out is not None and len(out.keys_to_store) == 8
    assert m.stats().skipped_stores == 0


def test_failed_store_after_evictions_gives_its_slots_back():
    """The free-slot count is of slots, not of blocks ever admitted: a tier that has
    evicted is full (an admitted block takes its victim's slot), and a failed store after
    that frees slots that first-seen keys fill without a victim. Before, the count grew
    with every admitted block (20 here), so releasing 2 left it above the tier's 16 and
    the 2 free slots were refused to first-seen keys."""
    m = OffloadingManager(16, "lru", admission="tinylfu")
    m.complete_store(m.prepare_store(list(range(16))).keys_to_store)
    for key in (50, 51, 52, 53):  # looked up often: admitted over the victims, evicting
        for _ in range(5):
            m.lookup(key)
    out = m.prepare_store([50, 51, 52, 53])
    assert out is not None and len(out.keys_to_store) == 4 and len(out.evicted_keys) == 4
    m.complete_store([50, 51])
    m.complete_store([52, 53], success=False)  # 2 slots free again
    assert m.stats().free == 2
    out = m.prepare_store([100, 101])  # first-seen keys: they fit the free slots
    assert out is not None and out.keys_to_store == [100, 101] and out.evicted_keys == []
    assert m.stats().skipped_stores == 0
    assert m.admission._admitted == 16
