"""ARC: scenarios 1 and 2 of the core issue (eviction rule, fallback, one walk per list)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier import OffloadingManager
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.base import CachePolicy


def store(m: OffloadingManager, keys):
    out = m.prepare_store(keys)
    assert out is not None
    m.complete_store(out.keys_to_store)
    return out


@pytest.fixture
def arc_state() -> OffloadingManager:
    """ARC, 4 blocks: T1 = [3, 4], T2 = [6, 5] (LRU first), B1 = [2, 1], target 3."""
    m = OffloadingManager(4, "arc")
    for key in (1, 2, 3, 4):
        store(m, [key])
    assert store(m, [5]).evicted_keys == [1]
    assert store(m, [6]).evicted_keys == [2]
    m.touch([5, 6])
    for _ in range(3):
        m.touch([1])
    snap = m.policy.snapshot()
    assert snap["t1"] == [3, 4]
    assert snap["t2"] == [6, 5]
    assert snap["b1"] == [2, 1]
    assert snap["target"] == 3.0
    return m


def test_setup_matches_paper_state(arc_state):
    assert arc_state.policy.t1_size == 2
    assert arc_state.policy.t2_size == 2


def test_three_victims_prefer_t2_then_fall_back_to_t1(arc_state):
    assert arc_state.prepare_store([7, 8, 9]).evicted_keys == [6, 5, 3]


def test_four_victims(arc_state):
    assert arc_state.prepare_store([7, 8, 9, 10]).evicted_keys == [6, 5, 3, 4]


def test_pinned_t2_falls_back_to_t1(arc_state):
    arc_state.prepare_load([5, 6])
    assert arc_state.prepare_store([7, 8]).evicted_keys == [3, 4]


def test_keys_named_in_call_are_protected(arc_state):
    out = arc_state.prepare_store([5, 6, 7, 8])
    assert out.keys_to_store == [7, 8]
    assert out.evicted_keys == [3, 4]


def test_protected_t1_key_skipped(arc_state):
    arc_state.prepare_load([5, 6])
    out = arc_state.prepare_store([3, 7])
    assert out.keys_to_store == [7]
    assert out.evicted_keys == [4]


def test_infeasible_store_changes_nothing(arc_state):
    arc_state.prepare_load([5, 6])
    before = arc_state.snapshot()
    stats_before = arc_state.stats()
    assert arc_state.prepare_store([3, 7, 8]) is None
    assert arc_state.snapshot() == before
    assert arc_state.stats() == stats_before


def test_victims_enter_ghost_lists_at_mru_and_ghosts_are_bounded(arc_state):
    arc_state.prepare_store([7, 8, 9])
    snap = arc_state.policy.snapshot()
    assert snap["b2"] == [6, 5]
    assert snap["b1"] == [2, 1, 3]
    # ghost lists never exceed the capacity (4 blocks)
    for key in range(100, 120):
        out = arc_state.prepare_store([key])
        arc_state.complete_store(out.keys_to_store)
    snap = arc_state.policy.snapshot()
    assert len(snap["b1"]) <= 4 and len(snap["b2"]) <= 4


def test_reinserted_ghost_key_goes_to_t2(arc_state):
    out = arc_state.prepare_store([1])  # 1 is in B1
    arc_state.complete_store(out.keys_to_store)
    snap = arc_state.policy.snapshot()
    assert 1 in snap["t2_all"] and 1 not in snap["b1"]


def test_b2_hit_lowers_target(arc_state):
    arc_state.prepare_store([7, 8, 9])  # B2 = [6, 5], B1 = [2, 1, 3]
    arc_state.touch([6])
    # |B1| = 3, |B2| = 2: target drops by max(1, 3/2) = 1.5
    assert arc_state.policy.target == pytest.approx(1.5)
    assert arc_state.policy.snapshot()["b2"] == [5, 6]


def test_a_ghost_key_named_twice_adapts_the_target_at_its_first_position():
    """CachePolicy.touch: a key named twice in one call is one use at its first (most
    recent) position. ARC applies a call tail first, so [a, b, a] is b's B2 hit, then a's B1
    hit, as [a, b]; the target's clamps at 0 and the capacity make the order matter (it
    adapted at a's repeat, the call's tail: +1, then -1 clamped at 0)."""
    snaps = []
    for touched in (["a", "b", "a"], ["a", "b"]):
        m = OffloadingManager(2, "arc")
        store(m, ["a"])
        store(m, ["b"])
        m.touch(["b"])  # T1 = [a], T2 = [b]
        assert store(m, ["c"]).evicted_keys == ["a"]  # target 0: T1's LRU -> B1
        m.touch(["c"])
        assert store(m, ["d"]).evicted_keys == ["b"]  # T1 empty: T2's LRU -> B2
        snap = m.policy.snapshot()
        assert (snap["b1"], snap["b2"], snap["target"]) == (["a"], ["b"], 0.0)
        m.touch(touched)
        snaps.append(m.policy.snapshot())
    # b: 0 - max(1, |B1|/|B2|) clamped at 0; a: 0 + max(1, |B2|/|B1|) = 1
    assert snaps[0]["target"] == snaps[1]["target"] == 1.0
    assert snaps[0] == snaps[1]


def test_pending_block_touched_stays_in_t1():
    m = OffloadingManager(4, "arc")
    m.prepare_store([1])
    m.touch([1])
    assert 1 in m.policy.snapshot()["t1_all"]
    m.complete_store([1])
    m.touch([1])
    assert 1 in m.policy.snapshot()["t2_all"]


def test_pinned_t1_block_touched_moves_to_t2_at_once_and_unpin_moves_nothing():
    # logical recency (issue #11 section 1): a use moves a block, a pin's release does not
    m = OffloadingManager(4, "arc")
    store(m, [1, 2])
    store(m, [3])
    m.touch([2])
    m.prepare_load([1])
    m.touch([1])
    snap = m.policy.snapshot()
    assert 1 in snap["t2_all"] and snap["t2"] == [2, 1]
    m.touch([2])
    m.complete_load([1])
    assert m.policy.snapshot()["t2"] == [1, 2]


def test_target_zero_one_eligible_t1_block_then_t2_each_list_walked_once():
    """Scenario 2: target 0; T1 holds one eligible block, the rest pinned or protected."""
    m = OffloadingManager(10, "arc")
    store(m, [1, 2, 3, 4, 5])  # T1
    store(m, [6, 7, 8, 9, 10])
    m.touch([6, 7, 8, 9, 10])  # -> T2 (T2 order LRU first: 10, 9, 8, 7, 6)
    assert m.policy.target == 0
    m.prepare_load([1, 2])  # pinned in T1
    # T1 evictable order: 3, 4, 5; protect 3 and 5 by naming them in the call
    m.policy.examined = 0
    out = m.prepare_store([3, 5, 11, 12, 13])
    assert out.evicted_keys == [4, 10, 9]
    # T1 walked once: 5 (skipped), 4 (victim), 3 (skipped), 2 and 1 (pinned: set aside, in
    # place) -> exhausted; T2: 10, 9.
    assert m.policy.examined == 7
    m.complete_store([11, 12, 13])
    m.policy.examined = 0
    assert m.prepare_store([14]).evicted_keys == [5]  # the pinned blocks are not met again
    assert m.policy.examined == 1


def test_each_list_walked_once_in_a_large_batch():
    n = 2000
    m = OffloadingManager(n, "arc")
    store(m, list(range(n)))
    m.touch(list(range(n // 2)))  # half in T2
    m.prepare_load(list(range(n // 2, n - 10)))  # T1 nearly all pinned
    m.policy.examined = 0
    out = m.prepare_store(list(range(n, n + 500)))
    assert len(out.evicted_keys) == 500
    # 10 eligible T1 blocks + 490 from T2: one visit per victim, plus one per pinned T1 block
    # met (set aside in place, not met again)
    assert m.policy.examined == 500 + (n // 2 - 10)
    m.complete_store(out.keys_to_store)
    m.policy.examined = 0
    out = m.prepare_store(list(range(n + 500, n + 600)))
    assert len(out.evicted_keys) == 100 and m.policy.examined == 100


def test_pending_blocks_stay_in_t1_after_reset_cache():
    # reset_cache clears ARC's own pending set; a touched pending block must still stay in T1
    m = OffloadingManager(4, "arc")
    m.prepare_store(["a"])
    m.reset_cache()
    m.prepare_store(["k"])  # pending
    m.touch(["k"])
    assert (m.policy.t1_size, m.policy.t2_size) == (1, 0)
    m.complete_store(["k"])
    m.touch(["k"])  # ready now: seen again, so T2
    assert (m.policy.t1_size, m.policy.t2_size) == (0, 1)


def test_standalone_arc_keeps_its_own_pending_set():
    arc = ARCPolicy(4)
    arc.insert(["k"])  # pending until mark_evictable
    arc.touch(["k"])
    assert (arc.t1_size, arc.t2_size) == (1, 0)
    arc.mark_evictable(["k"])
    arc.touch(["k"])
    assert (arc.t1_size, arc.t2_size) == (0, 1)


def test_a_ghost_free_touch_is_forgotten_by_a_one_key_insert():
    # touch() of >= 8 keys none resident nor in a ghost list remembers them so the insert
    # that follows skips its ghost tests; a one-key insert in between must end that: here
    # one of the keys is stored alone, evicted to B1, and the same keys stored again: it is
    # a B1 hit (to T2), not a new T1 block left in B1 too
    m = OffloadingManager(10, "arc")
    store(m, list(range(10)))
    keys = list(range(100, 108))
    m.touch(keys)
    store(m, [keys[0]])  # one key: evicts block 0 to B1
    for k in range(200, 210):  # keys[0] goes to B1 on the way
        store(m, [k])
    arc = m.policy
    assert keys[0] in arc._b1 and not arc._t1.has(keys[0]) and not arc._t2.has(keys[0])
    store(m, keys)
    assert keys[0] not in arc._b1
    assert keys[0] in arc._t2.live


class OwnHeldARC(ARCPolicy):
    """ARC that keeps its own held state under the manager (as inside vLLM's manager)."""

    def share_held_state(self, pending, pins) -> bool:
        return False


@pytest.mark.parametrize("batch", [False, True])
def test_a_block_pinned_then_evicted_is_pending_again_when_stored_again(batch):
    # pending is "held and not pinned since stored": an eviction (one-victim branch or the
    # multi-victim phases) must forget the pin, or the stored-again block would count as
    # pinned and a touch would move it to T2 before it is readable (ARC's own held state;
    # shared with the manager, pending is the manager's set: see the test below)
    m = OffloadingManager(2, OwnHeldARC)
    store(m, [1, 2])
    m.prepare_load([1])
    m.complete_load([1])
    assert 1 in m.policy._pinned
    if batch:
        assert store(m, [3, 4]).evicted_keys == [2, 1]
    else:
        assert store(m, [3]).evicted_keys == [2]
        assert store(m, [4]).evicted_keys == [1]
    assert 1 not in m.policy._pinned
    store(m, [5, 6])  # 1 leaves B1 (bounded to 2 keys): a new block when stored again
    assert 1 not in m.policy._b1 and not m.policy._pinned
    m.prepare_store([1])
    m.touch([1])  # pending: refreshed within T1
    snap = m.policy.snapshot()
    assert 1 in snap["t1_all"] and snap["pending"] == {1}


def test_a_failed_store_leaves_no_pin_behind():
    arc = ARCPolicy(4)
    arc.insert(["k"])
    arc.mark_evictable(["k"])
    arc.mark_non_evictable(["k"])  # pinned
    arc.mark_evictable(["k"])
    arc.mark_non_evictable(["k"])
    arc.remove(["k"])  # (not the manager's use of remove: the policy's state rule alone)
    assert not arc._pinned and arc.t1_size == 0
    arc.insert(["k"])  # stored again: pending
    arc.touch(["k"])
    assert arc.snapshot()["pending"] == {"k"} and (arc.t1_size, arc.t2_size) == (1, 0)


def _general_evict(arc: ARCPolicy, n: int) -> list:
    """The three phases alone (a protected key nobody has sends _evict past its fast path)."""
    return arc._evict(n, frozenset({"not a key"}))


@pytest.mark.parametrize("ghost_full", [False, True])
def test_several_victims_from_one_list_match_the_three_phases(ghost_full):
    # _evict's fast path (several victims from one list's old end, ghost list trimmed in the
    # same loop when full) leaves the same state as the general three phases
    def build() -> ARCPolicy:
        arc = ARCPolicy(8)
        keys = list(range(8))
        arc.insert(keys)
        arc.mark_evictable(keys)
        if ghost_full:  # B1 full: 8 victims, then 8 new keys
            assert arc.evict(8) == list(reversed(range(8)))
            keys = list(range(10, 18))
            arc.insert(keys)
            arc.mark_evictable(keys)
        return arc

    fast, general = build(), build()
    assert fast.evict(3) == _general_evict(general, 3)
    assert fast.snapshot() == general.snapshot()
    assert fast.examined == general.examined
    assert len(fast._b1) == (8 if ghost_full else 3)


def test_several_victims_with_a_held_block_among_the_oldest_match_the_three_phases():
    def build() -> ARCPolicy:
        arc = ARCPolicy(8)
        arc.insert(list(range(8)))
        arc.mark_evictable([k for k in range(8) if k != 6])  # 6 (second oldest) pending
        return arc

    fast, general = build(), build()
    assert fast.evict(3) == _general_evict(general, 3) == [7, 5, 4]
    assert fast.snapshot() == general.snapshot()


def test_mark_evictable_puts_a_block_set_aside_back_where_it_was():
    arc = ARCPolicy(8)
    arc.insert(list(range(8)))
    arc.mark_evictable([k for k in range(8) if k != 7])  # 7 (the oldest) pending
    assert arc.evict(2) == [6, 5]  # 7 met and set aside
    assert 7 in arc._t1.aside
    arc.mark_evictable([3, 7])  # completes: 7 is the oldest again
    assert arc.evict(1) == [7]


@pytest.mark.parametrize("covered", [True, False])
def test_request_finished_promotes_reused_and_refreshes_inserted(covered):
    arc = ARCPolicy(8)
    arc.insert([1, 2, 3, 4])
    arc.mark_evictable([1, 2, 3, 4])
    arc.touch([4])  # 4 to T2
    keys = (1, 2, 3, 4) if covered else (1, 2, 3, 4, 9)  # 9: neither inserted nor reused
    arc.on_request_finished(keys, {2, 3}, {1, 4})
    snap = arc.snapshot()
    assert snap["t1"] == [3, 2]  # 2 and 3 refreshed, 2 most recent
    assert snap["t2"] == [4, 1]  # 4 refreshed, then 1 promoted (keys[0] most recent)


# -- held state shared with the manager (CachePolicy.share_held_state) ------------------------
def _touch_or_request(m: OffloadingManager, rng, op: float, touch_below: float,
                      next_key: int, next_req: int, requests: list[int]) -> int:
    """The random drivers' last draws (op above their loads): a touch of known and unknown
    keys below ``touch_below``, else a new request below 0.93, else a request finished.
    Returns the next request id."""
    if op < touch_below:
        m.touch([rng.randrange(max(next_key, 1)) for _ in range(rng.randrange(1, 10))])
    elif op < 0.93:
        m.on_new_request(next_req)
        requests.append(next_req)
        next_req += 1
    elif requests:
        m.on_request_finished(requests.pop(rng.randrange(len(requests))))
    return next_req


def _drive(m: OffloadingManager, rng, steps: int) -> list:
    """A random mix of explicit and request-mode calls, stores and loads left in flight (so
    walks set blocks aside and requeue them); returns every answer."""
    answers: list = []
    pending: list[list] = []
    pinned: list[list] = []
    requests: list[int] = []
    next_key, next_req = 0, 0
    for _ in range(steps):
        op = rng.random()
        ctx = rng.choice(requests) if requests and rng.random() < 0.7 else None
        if op < 0.35:  # a store: new keys, some known ones, some ghosts
            keys = [rng.randrange(max(next_key, 1)) for _ in range(rng.randrange(3))]
            fresh = rng.randrange(1, 6)
            keys += list(range(next_key, next_key + fresh))
            next_key += fresh
            out = m.prepare_store(keys, ctx)
            answers.append(None if out is None else tuple(map(list, out)))
            if out is not None and out.keys_to_store:
                pending.append(list(out.keys_to_store))
        elif op < 0.5 and pending:
            keys = pending.pop(rng.randrange(len(pending)))
            m.complete_store(keys, success=rng.random() < 0.9)
        elif op < 0.65:  # a load of ready keys
            ready = [k for k in rng.sample(range(max(next_key, 1)), min(next_key, 6))
                     if m.ref_count(k) is not None and m.ref_count(k) >= 0]
            if ready:
                answers.append(m.prepare_load(ready, ctx))
                pinned.append(ready)
        elif op < 0.78 and pinned:
            m.complete_load(pinned.pop(rng.randrange(len(pinned))))
        else:
            next_req = _touch_or_request(m, rng, op, 0.86, next_key, next_req, requests)
        answers.append(m.lookup(rng.randrange(max(next_key, 1))))
    return answers


class TouchARC(OwnHeldARC):
    """ARC with its own held state whose ghost learning is the plain touch."""

    on_store_miss = CachePolicy.on_store_miss  # not overridden: the manager calls touch


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("capacity", [8, 40])
def test_shared_held_state_behaves_as_arcs_own(seed, capacity):
    # ARC reading the manager's pending set and pin counts (no per-key set work at insert,
    # completion and pin), and its on_store_miss, make exactly the moves and choices of ARC
    # with its own held sets, and of ARC learning ghost hits by touch
    import random

    shared = OffloadingManager(capacity, "arc")
    others = [OffloadingManager(capacity, OwnHeldARC), OffloadingManager(capacity, TouchARC)]
    assert shared.policy._shared and not others[0].policy._shared
    assert others[1]._req_log.store_miss == others[1].policy.touch
    rngs = [random.Random(seed) for _ in range(3)]
    for round_ in range(3):  # reset_cache between rounds: shared again with the new sets
        answers = _drive(shared, rngs[0], 300)
        for m, rng in zip(others, rngs[1:]):
            assert _drive(m, rng, 300) == answers
            assert m.snapshot() == shared.snapshot()
            assert m.policy.examined == shared.policy.examined
        if round_ < 2:
            for m in [shared, *others]:
                m.reset_cache()
            assert shared.policy._held is shared._pending_keys
            assert shared.policy._pins is shared._pins


def test_shared_walks_set_blocks_aside_and_put_them_back():
    # the runs above meet blocks set aside (held among the oldest) and put back on release
    import random

    parked = 0
    for seed in range(12):
        m = OffloadingManager(8, "arc")
        _drive(m, random.Random(seed), 300)
        parked += m.policy._t1.parked + m.policy._t2.parked
    assert parked > 0


def test_share_held_state_is_refused_with_blocks_and_dropped_by_clear():
    arc = ARCPolicy(4)
    arc.insert(["a"])
    assert arc.share_held_state(set(), {}) is False  # its held blocks would be lost
    arc.clear()
    pending, pins = {"x"}, {"y": 1}
    assert arc.share_held_state(pending, pins) is True
    arc.clear()  # the manager's collections are not cleared, and no longer read
    assert pending == {"x"} and pins == {"y": 1}
    assert arc._held is not pending and arc._pins is not pins and not arc._shared


def test_the_manager_does_not_tell_a_sharing_policy_of_pins():
    m = OffloadingManager(4, "arc")
    store(m, [1, 2])
    calls = []
    m.policy.mark_non_evictable = calls.append  # never called when shared
    m.prepare_load([1])
    m.prepare_load([1, 2])
    assert calls == []
    assert m.policy.count_eligible() == 0  # both pinned: read from the manager's pins
    m.complete_load([1])
    m.complete_load([1, 2])
    assert m.policy.count_eligible() == 2


# -- victims the manager trusts (CachePolicy.checks_shared_victims) ---------------------------
def _check_victims(m: OffloadingManager, seen: list) -> None:
    """Check every answer of ``m``'s ARC against the manager's state before the manager uses
    it (an instance attribute: the manager's trust is decided by the policy's class, so it
    still skips its own pending / pin checks); ``seen`` gets (victims, pending, pinned) per
    call, the held blocks present at the time."""
    policy = m.policy
    evict = type(policy)._evict.__get__(policy)

    def checked(n, protected):
        victims = evict(n, protected)
        assert type(victims) is list and len(victims) == n == len(set(victims))
        for key in victims:
            assert key in m._slot_of, key  # resident (the manager has not popped it yet)
            assert key not in m._pending_keys, f"pending victim {key!r}"
            assert key not in m._pins, f"pinned victim {key!r}"
            assert key not in protected, f"protected victim {key!r}"
        seen.append((n, len(m._pending_keys), len(m._pins)))
        return victims

    policy._evict = checked


def _drive_held(m: OffloadingManager, rng, steps: int) -> None:
    """Random explicit and request-mode calls that keep many blocks pinned (loads released
    late, blocks pinned by several loads) and many stores in flight (completed late, some
    failed), stores naming ghosts and resident keys (protected), touches, requests."""
    pending: list[list] = []
    pinned: list[list] = []
    requests: list[int] = []
    next_key, next_req = 0, 0
    for _ in range(steps):
        op = rng.random()
        ctx = rng.choice(requests) if requests and rng.random() < 0.6 else None
        if op < 0.4:  # a store: new keys, and known ones (resident: protected; ghosts)
            keys = [rng.randrange(max(next_key, 1)) for _ in range(rng.randrange(4))]
            fresh = rng.randrange(1, 10)
            keys += list(range(next_key, next_key + fresh))
            next_key += fresh
            rng.shuffle(keys)
            out = m.prepare_store(keys, ctx)
            if out is not None and out.keys_to_store:
                pending.append(list(out.keys_to_store))
        elif op < 0.5 and pending:  # stores complete late: many in flight
            keys = pending.pop(rng.randrange(len(pending)))
            m.complete_store(keys, success=rng.random() < 0.85)
        elif op < 0.7:  # loads of ready keys, some pinned twice
            stored = sorted(m._slot_of)
            ready = [k for k in rng.sample(stored, min(len(stored), rng.randrange(1, 6)))
                     if m.ref_count(k) >= 0]
            if ready:
                m.prepare_load(ready, ctx)
                pinned.append(ready)
        elif op < 0.77 and pinned:  # pins released late: many pinned
            m.complete_load(pinned.pop(rng.randrange(len(pinned))))
        else:
            next_req = _touch_or_request(m, rng, op, 0.85, next_key, next_req, requests)
        if op > 0.999:  # rarely: everything dropped, the held state shared anew
            m.reset_cache()
            pending.clear()
            pinned.clear()
            requests.clear()


def test_the_manager_trusts_arcs_victims_only():
    # the pending / pin checks are skipped for ARC sharing the manager's held state alone: a
    # subclass (it may change the victim choice), ARC keeping its own held sets, and every
    # other policy are checked in full (tests/test_manager_policy_errors.py)
    assert ARCPolicy.checks_shared_victims and not CachePolicy.checks_shared_victims
    m = OffloadingManager(8, "arc")
    assert m._req_log.trusted
    m.reset_cache()
    assert m._req_log.trusted
    for policy in (OwnHeldARC, TouchARC, "lru", "prefix-arc", "s3fifo", "sieve", "lfu"):
        assert not OffloadingManager(8, policy)._req_log.trusted, policy

    class SubARC(ARCPolicy):  # shares, declares nothing itself: checked
        pass

    sub = OffloadingManager(8, SubARC)
    assert sub.policy._shared and not sub._req_log.trusted


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), capacity=st.sampled_from([4, 8, 16, 40]),
       steps=st.integers(20, 300))
def test_arc_never_returns_a_pending_or_pinned_victim(seed, capacity, steps):
    # the property the manager's trust rests on: every answer of ARC's _evict (the one-victim
    # loop, the several-victims fast path, the three phases, blocks set aside and put back)
    # names resident blocks that are neither pending nor pinned (nor protected)
    import random

    m = OffloadingManager(capacity, "arc")
    assert m._req_log.trusted
    _check_victims(m, [])
    _drive_held(m, random.Random(seed), steps)


def test_the_property_runs_meet_many_held_blocks():
    # the runs above evict while many blocks are pinned and pending, and set held blocks
    # aside (so the checked answers are not only the easy ones)
    import random

    seen: list = []
    parked = 0
    for seed in range(20):
        m = OffloadingManager(16, "arc")
        _check_victims(m, seen)
        _drive_held(m, random.Random(seed), 300)
        parked += m.policy._t1.parked + m.policy._t2.parked
    several = [s for s in seen if s[0] > 1]
    assert len(seen) > 250 and len(several) > 200 and parked > 300
    # (299 evict calls, 121 of them with 2 or more blocks pending and 2 or more pinned)
    assert sum(1 for _, pending, pins in seen if pending >= 2 and pins >= 2) > 100
