"""Request mode of the manager (issue #11 section 2, vLLM 0.33's request-scoped accounting):
on_new_request / on_request_finished, the records, the caps, the policy's one call."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier import OffloadingManager, RequestStateError, available_policies
from kvtier.policies.lru import LRUPolicy


class RecordingLRU(LRUPolicy):
    """LRU that records the touches and request finishes it is given."""

    name = "recording-lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.calls: list[tuple] = []

    def touch(self, keys):
        self.calls.append(("touch", tuple(keys)))
        super().touch(keys)

    def on_request_finished(self, keys, inserted, reused):
        self.calls.append(("finished", tuple(keys), frozenset(inserted), frozenset(reused)))
        super().on_request_finished(keys, inserted, reused)


def stored(m: OffloadingManager, keys, ctx=None):
    out = m.prepare_store(keys, ctx)
    assert out is not None
    m.complete_store(out.keys_to_store)
    return out


def one_key_stores(m: OffloadingManager, keys) -> list:
    evicted = []
    for key in keys:
        evicted += stored(m, [key]).evicted_keys
    return evicted


# -- the issue's small input ------------------------------------------------------------------
def _issue_setup() -> OffloadingManager:
    m = OffloadingManager(4, "lru")
    stored(m, [1, 2, 3])
    stored(m, [4])
    return m


def test_issue_small_input_request_mode():
    m = _issue_setup()
    m.on_new_request("r")
    m.prepare_load([1], "r")
    m.prepare_load([2, 3], "r")
    m.complete_load([1], "r")
    m.complete_load([2, 3], "r")
    m.on_request_finished("r")
    assert one_key_stores(m, [5, 6, 7]) == [4, 3, 2]
    assert m.lookup_prefix([1, 2, 3]) == 1
    s = m.stats()
    assert (s.requests_open, s.requests_finished, s.requests_finished_early) == (0, 1, 0)


def test_issue_small_input_explicit_mode_loads_move_nothing():
    m = _issue_setup()
    m.prepare_load([1])
    m.prepare_load([2, 3])
    m.complete_load([1])
    m.complete_load([2, 3])
    # nothing moved: the order is still 3, 2, 1, 4 (least recent first); the head 1 is the
    # last of 1, 2, 3 to go
    assert one_key_stores(m, [5, 6, 7]) == [3, 2, 1]


def test_explicit_mode_context_never_opened_is_ignored():
    m = OffloadingManager(4, RecordingLRU)
    stored(m, [1, 2])
    m.on_new_request("other")  # request mode is on, but "r" is not open
    m.prepare_load([1, 2], "r")
    m.complete_load([1, 2], "r")
    m.prepare_load([1], ["unhashable"])  # an unhashable context cannot be open: ignored
    m.complete_load([1])
    m.on_request_finished("other")
    assert not [c for c in m.policy.calls if c[0] == "finished"]


# -- what is recorded --------------------------------------------------------------------------
def test_record_keys_inserted_reused_in_first_occurrence_order():
    m = OffloadingManager(8, RecordingLRU)
    stored(m, ["a", "b"])
    m.on_new_request("r")
    m.prepare_load(["b", "a"], "r")  # reused, loaded tail first
    out = m.prepare_store(["a", "b", "c", "d", "c"], "r")  # a, b ready; c, d new
    m.complete_store(out.keys_to_store)
    m.complete_load(["b", "a"])
    m.prepare_load(["d", "c"], "r")  # re-reading its own blocks: not reused
    m.complete_load(["d", "c"])
    m.policy.calls.clear()
    m.on_request_finished("r")
    assert m.policy.calls[0] == (
        "finished", ("b", "a", "c", "d"), frozenset({"c", "d"}), frozenset({"a", "b"})
    )
    assert m.policy.calls[1] == ("touch", ("b", "a", "c", "d"))  # the default: one use
    assert m.policy.snapshot()["order"][-4:] == ["d", "c", "a", "b"]  # keys[0] most recent


@pytest.mark.parametrize("other_pending", [True, False])
def test_a_key_offered_while_another_requests_store_is_in_flight_keeps_its_place(
        other_pending):
    """Found in session 16, fixed in session 17: request C offers 0-4 while request A's
    store of 0 is in flight, so 0 is not recorded then (vLLM's order); C later loads 0-2
    (as after a preemption) and stores 5. 0 was recorded at that load, behind C's tail, and
    the head ended second least recent (the next six stores evicted 5, 0, 4, 3, 2, 1). Its
    place is now held: the same order as when nothing was in flight."""
    m = OffloadingManager(6, "lru")
    if other_pending:
        m.on_new_request("A")
        assert m.prepare_store([0], "A").keys_to_store == [0]
    m.on_new_request("C")
    out = m.prepare_store([0, 1, 2, 3, 4], "C")
    assert out.keys_to_store == ([1, 2, 3, 4] if other_pending else [0, 1, 2, 3, 4])
    if other_pending:
        assert m.snapshot()["requests"][1][1] == (1, 2, 3, 4)  # the held place: not recorded
        m.complete_store([0])
        m.on_request_finished("A")
    m.complete_store(out.keys_to_store)
    m.prepare_load([0, 1, 2], "C")
    m.complete_load([0, 1, 2])
    m.complete_store(m.prepare_store([5], "C").keys_to_store)
    assert m.snapshot()["requests"][0][1] == (0, 1, 2, 3, 4, 5)
    m.on_request_finished("C")
    victims = []
    for key in range(10, 16):
        out = m.prepare_store([key])
        victims += out.evicted_keys
        m.complete_store(out.keys_to_store)
    assert victims == [5, 4, 3, 2, 1, 0]


def test_a_held_place_never_recorded_is_dropped_at_finish():
    # C offers 0 (pending for A) and 1, never loads or stores 0: its use is 1 alone; a
    # request that only held places makes no policy call
    m = OffloadingManager(6, RecordingLRU)
    m.on_new_request("A")
    m.prepare_store([0, 7], "A")
    m.on_new_request("C")
    m.complete_store(m.prepare_store([0, 1], "C").keys_to_store)
    m.on_new_request("D")
    assert m.prepare_store([7], "D").keys_to_store == []
    m.policy.calls.clear()
    m.on_request_finished("D")
    assert m.policy.calls == []
    m.on_request_finished("C")
    assert m.policy.calls == [("finished", (1,), frozenset({1}), frozenset()),
                              ("touch", (1,))]


def test_record_of_stores_then_a_failed_store_then_a_load_keeps_first_occurrence_order():
    # a store's new keys are recorded in the request's inserted dict only (the usual
    # request: loads, then stores); a failed store after it, a load after it and a new key
    # already recorded each merge the two, the order and the sets are the same
    m = OffloadingManager(5, RecordingLRU)
    stored(m, ["a"])
    m.prepare_store(["x"])  # another store in flight
    m.on_new_request("r")
    m.prepare_load(["a"], "r")
    out = m.prepare_store(["b", "c"], "r")  # simple layout: keys {a}, inserted {b, c}
    assert m.snapshot()["requests"] == [("r", ("a", "b", "c"), {"b", "c"}, {"a"})]
    assert m._requests["r"].inserted is not m._requests["r"].keys
    # one free block, a pinned, x, b and c pending: no room (the keys fit the request's cap)
    assert m.prepare_store(["d", "e"], "r") is None
    assert m.snapshot()["requests"] == [("r", ("a", "b", "c", "d", "e"), {"b", "c"}, {"a"})]
    m.complete_store(out.keys_to_store)
    m.complete_load(["a"])
    m.prepare_load(["c", "b"], "r")  # its own blocks: not reused
    m.complete_load(["c", "b"])
    m.policy.calls.clear()
    m.on_request_finished("r")
    assert m.policy.calls[0] == (
        "finished", ("a", "b", "c", "d", "e"), frozenset({"b", "c"}), frozenset({"a"})
    )
    # a store-only request: keys are the inserted ones, in order
    m.on_new_request("s")
    stored(m, ["f", "g"], "s")
    m.policy.calls.clear()
    m.on_request_finished("s")
    assert m.policy.calls[0] == ("finished", ("f", "g"), frozenset({"f", "g"}), frozenset())


def test_pending_keys_in_prepare_store_are_not_recorded():
    m = OffloadingManager(8, RecordingLRU)
    pending = m.prepare_store(["p"]).keys_to_store  # another request's store in flight
    m.on_new_request("r")
    m.prepare_store(["p", "n"], "r")
    m.policy.calls.clear()
    m.on_request_finished("r")
    assert m.policy.calls[0] == ("finished", ("n",), frozenset({"n"}), frozenset())
    assert pending == ["p"]


def test_store_miss_touch_once_per_request_before_insert():
    m = OffloadingManager(2, RecordingLRU)
    m.on_new_request("r")
    stored(m, ["a", "b"], "r")
    assert m.policy.calls == [("touch", ("a", "b"))]
    stored(m, ["c"])  # explicit store evicts b (least recent)
    assert "b" not in m
    m.policy.calls.clear()
    stored(m, ["b"], "r")  # stored again by the same request: no second ghost touch
    assert m.policy.calls == []
    m.on_new_request("s")
    m.on_request_finished("r")
    stored(m, ["a"], "s")  # another request: its first store of "a"
    assert ("touch", ("a",)) in m.policy.calls


def test_failed_store_records_ready_keys_but_not_inserted_and_learns_nothing():
    m = OffloadingManager(2, "arc")
    stored(m, ["x"])
    m.prepare_load(["x"])  # pinned by someone else
    stored(m, ["y"])
    m.prepare_load(["y"])
    m.on_new_request("r")
    before = m.policy.snapshot()
    assert m.prepare_store(["y", "z"], "r") is None  # no evictable block for z
    assert m.policy.snapshot() == before  # no ghost learning, nothing inserted
    assert m.snapshot()["requests"] == [("r", ("y", "z"), set(), {"y"})]  # keys, inserted, reused


def test_failed_store_with_protected_keys_learns_nothing():
    # the count of eligible blocks fails only because of the protected key
    m = OffloadingManager(2, "arc")
    stored(m, ["a"])
    stored(m, ["b"])
    stored(m, ["c"])  # evicts a into B1
    m.prepare_load(["c"])  # pinned: only b is evictable
    m.on_new_request("r")
    policy_before = m.policy.snapshot()
    # a needs a slot; b, the only evictable block, is named in the call (protected): the
    # store fails, and ARC's target and B1 are unchanged (no ghost learning)
    assert m.prepare_store(["b", "a"], "r") is None
    assert "a" not in m
    assert m.policy.snapshot() == policy_before


def test_per_request_key_cap_keeps_the_head():
    m = OffloadingManager(3, RecordingLRU)
    m.on_new_request("r")
    stored(m, [1, 2], "r")
    stored(m, [3, 4], "r")  # 4 is not recorded: at most num_blocks = 3 keys
    m.policy.calls.clear()
    m.on_request_finished("r")
    assert m.policy.calls[0][1:] == ((1, 2, 3), frozenset({1, 2, 3}), frozenset())


# -- ARC ---------------------------------------------------------------------------------------
def test_arc_inserted_key_stays_in_t1_reused_key_goes_to_t2():
    m = OffloadingManager(8, "arc")
    stored(m, ["old"])
    m.on_new_request("r")
    m.prepare_load(["old"], "r")
    m.complete_load(["old"])
    stored(m, ["new1", "new2"], "r")
    m.prepare_load(["new1"], "r")  # its own block: not a reuse
    m.complete_load(["new1"])
    m.on_request_finished("r")
    snap = m.policy.snapshot()
    assert snap["t2_all"] == {"old"}
    assert snap["t1_all"] == {"new1", "new2"}
    assert snap["t1"] == ["new2", "new1"]  # refreshed in place, head most recent
    assert snap["t2"] == ["old"]


def test_arc_request_finish_orders_head_most_recent_in_t2():
    m = OffloadingManager(8, "arc")
    stored(m, ["a", "b", "c"])
    m.on_new_request("r")
    m.prepare_load(["a", "b", "c"], "r")
    m.complete_load(["c"])
    m.complete_load(["a"])
    m.complete_load(["b"])
    m.on_request_finished("r")
    assert m.policy.snapshot()["t2"] == ["c", "b", "a"]


def test_arc_ghost_hit_at_store_time_adapts_target_once_per_request():
    m = OffloadingManager(2, "arc")
    stored(m, ["a"])
    stored(m, ["b"])
    stored(m, ["c"])  # a -> B1
    assert m.policy.snapshot()["b1"] == ["a"]
    assert m.policy.target == 0.0
    m.on_new_request("r")
    stored(m, ["a"], "r")  # B1 hit: target grows by 1 before the insert
    assert m.policy.target == 1.0
    m.on_request_finished("r")


def test_arc_on_request_finished_ignores_absent_and_unclassified_keys():
    m = OffloadingManager(4, "arc")
    stored(m, ["a"])
    before = m.policy.snapshot()
    m.policy.on_request_finished(("zz", "a"), frozenset({"zz"}), frozenset())
    m.policy.on_request_finished(("a",), frozenset(), frozenset())
    assert m.policy.snapshot() == before


# -- bad input and caps ------------------------------------------------------------------------
def test_bad_finish_and_open_raise_and_change_nothing():
    m = OffloadingManager(4, "lru")
    stored(m, [1])
    m.on_new_request("r")
    m.prepare_load([1], "r")
    snap = m.snapshot()
    with pytest.raises(RequestStateError, match="'unknown'.*not open"):
        m.on_request_finished("unknown")
    with pytest.raises(RequestStateError, match="'r'.*already open"):
        m.on_new_request("r")
    with pytest.raises(TypeError, match=r"\['x'\].*not hashable"):
        m.on_new_request(["x"])
    with pytest.raises(TypeError, match=r"\['x'\].*not hashable"):
        m.on_request_finished(["x"])
    assert m.snapshot() == snap
    m.on_request_finished("r")
    snap = m.snapshot()
    with pytest.raises(RequestStateError, match="already finished"):
        m.on_request_finished("r")
    assert m.snapshot() == snap
    assert isinstance(RequestStateError("r", "x"), ValueError)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_max_open_requests_validated(bad):
    with pytest.raises((ValueError, TypeError), match="max_open_requests"):
        OffloadingManager(4, max_open_requests=bad)


def test_cap_finishes_oldest_early_and_ignores_its_late_finish():
    m = OffloadingManager(8, RecordingLRU, max_open_requests=2)
    stored(m, ["a", "b"])
    m.on_new_request("r1")
    m.prepare_load(["a"], "r1")
    m.complete_load(["a"])
    m.on_new_request("r2")
    m.policy.calls.clear()
    m.on_new_request("r3")  # r1 is finished early: its use applied now
    assert m.policy.calls[0] == ("finished", ("a",), frozenset(), frozenset({"a"}))
    m.on_request_finished("r1")  # late: ignored
    s = m.stats()
    assert (s.requests_open, s.requests_finished, s.requests_finished_early, s.late_finishes) == (
        2, 1, 1, 1)
    with pytest.raises(RequestStateError):
        m.on_request_finished("r1")  # the late finish was consumed
    # the FIFO of contexts finished early is bounded by max_open_requests
    for i in range(10):
        m.on_new_request(f"x{i}")
    assert len(m.snapshot()["finished_early"]) == 2
    assert m.stats().requests_open == 2


def test_reopening_a_context_finished_early_starts_a_new_request():
    m = OffloadingManager(8, "lru", max_open_requests=1)
    m.on_new_request("r")
    m.on_new_request("s")  # r finished early
    m.on_new_request("r")  # s finished early; r is open again (a new request)
    m.on_request_finished("r")
    assert m.stats().late_finishes == 0
    m.on_request_finished("s")  # s's late finish
    assert m.stats().late_finishes == 1


def test_reset_cache_forgets_open_requests():
    m = OffloadingManager(4, "lru")
    m.on_new_request("r")
    stored(m, [1], "r")
    m.reset_cache()
    assert m.stats().requests_open == 0
    with pytest.raises(RequestStateError):
        m.on_request_finished("r")


@pytest.mark.parametrize("policy", available_policies())
def test_every_policy_accepts_request_mode(policy):
    m = OffloadingManager(4, policy)
    m.on_new_request("r")
    stored(m, [1, 2], "r")
    m.prepare_load([1, 2], "r")
    m.complete_load([1, 2])
    m.on_request_finished("r")
    m.on_new_request("s")
    m.prepare_load([1], "s")
    m.complete_load([1])
    stored(m, [3, 4, 5], "s")
    m.on_request_finished("s")
    assert m.lookup_prefix([1]) == 1  # the reused head survives the one eviction
    assert len(m) == 4


# -- property test: the records against a reference model --------------------------------------
CTXS = ("r0", "r1", "r2")
# contexts on loads and stores: mostly r0, so one request often loads, stores, re-stores
CALL_CTXS = (None, "r0", "r0", "r0", "r1", "r2")
KEYS = list(range(6))
CAPACITY = 4
MAX_OPEN = 2

op = st.one_of(
    st.tuples(st.just("open"), st.sampled_from(CTXS)),
    st.tuples(st.just("open"), st.just("r0")),
    st.tuples(st.just("finish"), st.sampled_from(CTXS)),
    st.tuples(st.just("store"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
              st.sampled_from(CALL_CTXS), st.booleans()),
    st.tuples(st.just("load"), st.integers(0, 15), st.integers(1, 3),
              st.sampled_from(CALL_CTXS)),
    st.tuples(st.just("release"), st.integers(0, 15)),
    st.tuples(st.just("complete"),),
)


class _Model:
    """The records of open requests, as docs/manager.md ("Request mode") states them."""

    def __init__(self) -> None:
        self.open: OrderedDict = OrderedDict()
        self.early: OrderedDict = OrderedDict()
        self.calls: list[tuple] = []
        self.finished = self.finished_early = self.late = 0

    def _finish(self, rec) -> None:
        self.finished += 1
        keys = tuple(k for k, held in rec["keys"].items() if not held)  # held places dropped
        if keys:
            self.calls.append(("finished", keys, frozenset(rec["ins"] - rec["reu"]),
                               frozenset(rec["reu"])))
            self.calls.append(("touch", keys))

    def open_request(self, ctx) -> bool:
        if ctx in self.open:
            return False
        self.early.pop(ctx, None)
        if len(self.open) >= MAX_OPEN:
            oldest, rec = self.open.popitem(last=False)
            self._finish(rec)
            self.finished_early += 1
            self.early[oldest] = None
            if len(self.early) > MAX_OPEN:
                self.early.popitem(last=False)
        self.open[ctx] = {"keys": {}, "ins": set(), "reu": set(), "missed": set()}
        return True

    def finish(self, ctx) -> bool:
        if ctx in self.open:
            self._finish(self.open.pop(ctx))
            return True
        if ctx in self.early:
            del self.early[ctx]
            self.late += 1
            return True
        return False

    @staticmethod
    def add(rec, keys, held=()) -> None:
        """Record ``keys`` in order (a key recorded already keeps its place, a held one is
        recorded there); a key of ``held`` (pending, offered) only holds a place."""
        for key in keys:
            if key in rec["keys"]:
                if key not in held:
                    rec["keys"][key] = False
            elif len(rec["keys"]) < CAPACITY:
                rec["keys"][key] = key in held

    def load(self, ctx, keys) -> None:
        rec = self.open.get(ctx)
        if rec is None:
            return
        self.add(rec, keys)
        rec["reu"].update(k for k in keys if k in rec["keys"] and k not in rec["ins"])

    def store_offer(self, ctx, keys, new, ready, held) -> None:
        rec = self.open.get(ctx)
        if rec is None:
            return
        offered = set(new) | set(ready) | set(held)
        self.add(rec, [k for k in keys if k in offered], set(held))
        rec["reu"].update(k for k in ready if k in rec["keys"] and k not in rec["ins"])

    def store_done(self, ctx, new) -> None:
        rec = self.open.get(ctx)
        if rec is None:
            return
        misses = [k for k in new if k not in rec["missed"]]
        if misses:
            self.calls.append(("touch", tuple(misses)))
            rec["missed"].update(k for k in misses if k in rec["keys"])
        rec["ins"].update(k for k in new if k in rec["keys"])


def _drive_against_model(ops, after_finish=None) -> None:
    """Run ``ops`` on a manager and on the reference model: the same policy calls, in the
    same order, and the same request counters. ``after_finish(m, calls_before)`` runs after
    each finish op."""
    m = OffloadingManager(CAPACITY, RecordingLRU, max_open_requests=MAX_OPEN)
    model = _Model()
    pending: list = []
    pins: list = []
    for o in ops:
        kind = o[0]
        calls_before = len(m.policy.calls)
        if kind == "open":
            if model.open_request(o[1]):
                m.on_new_request(o[1])
            else:
                with pytest.raises(RequestStateError):
                    m.on_new_request(o[1])
        elif kind == "finish":
            if model.finish(o[1]):
                m.on_request_finished(o[1])
            else:
                with pytest.raises(RequestStateError):
                    m.on_request_finished(o[1])
            if after_finish is not None:
                after_finish(m, calls_before)
        elif kind == "store":
            _, keys, ctx, complete = o
            new = list(dict.fromkeys(k for k in keys if k not in m))
            ready = [k for k in keys if k in m and m.ref_count(k) >= 0]
            held = [k for k in keys if k in m and m.ref_count(k) == -1]  # pending
            model.store_offer(ctx, keys, new, ready, held)
            out = m.prepare_store(keys, ctx)
            if out is not None:
                assert out.keys_to_store == new
                if new:
                    model.store_done(ctx, new)
                if complete:
                    m.complete_store(out.keys_to_store)
                else:
                    pending += out.keys_to_store
        elif kind == "load":
            _, start, count, ctx = o
            ready = [k for k in KEYS if k in m and m.ref_count(k) >= 0]
            if not ready:
                continue
            keys = [ready[(start + i) % len(ready)] for i in range(count)]
            m.prepare_load(keys, ctx)
            model.load(ctx, keys)
            pins += keys
        elif kind == "release":
            if pins:
                key = pins.pop(o[1] % len(pins))
                m.complete_load([key])
        elif kind in ("complete", "fail"):
            if pending:
                m.complete_store(pending, success=kind == "complete")
                pending = []
        elif kind == "reset":
            m.reset_cache()  # nothing in flight is let finish: pins and pending dropped
            pending, pins = [], []
            model.open.clear()
            model.early.clear()
            model.finished = model.finished_early = model.late = 0
        elif kind == "touch":
            m.touch(o[1], o[2])  # passed on as is (an empty call too); never recorded
            model.calls.append(("touch", tuple(o[1])))
        else:  # lookup
            m.lookup_prefix(o[1], o[2])
    assert m.policy.calls == model.calls
    s = m.stats()
    assert (s.requests_open, s.requests_finished, s.requests_finished_early,
            s.late_finishes) == (len(model.open), model.finished, model.finished_early,
                                 model.late)
    assert [r[0] for r in m.snapshot()["requests"]] == list(model.open)


def _finished_keys_at_mru_end(m: OffloadingManager, calls_before: int) -> None:
    # the default use leaves the finished request's resident keys (pinned and pending ones
    # too: logical recency) at the MRU end, keys[0] most recent
    if len(m.policy.calls) > calls_before:
        keys = m.policy.calls[-1][1]
        order = m.policy.snapshot()["order"]
        resident = [k for k in reversed(keys) if k in m]
        assert order[len(order) - len(resident):] == resident


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=15, max_size=60))
def test_request_records_match_reference_model(ops):
    _drive_against_model(ops, _finished_keys_at_mru_end)


def test_key_reused_then_stored_again_is_reused_not_inserted_only():
    m = OffloadingManager(2, RecordingLRU)
    stored(m, ["a"])
    m.on_new_request("r")
    m.prepare_load(["a"], "r")
    m.complete_load(["a"])
    stored(m, ["b"])
    stored(m, ["c"])  # evicts a
    assert "a" not in m
    stored(m, ["a"], "r")  # the request stores it again: inserted and reused
    m.policy.calls.clear()
    m.on_request_finished("r")
    assert m.policy.calls[0] == ("finished", ("a",), frozenset(), frozenset({"a"}))


def test_prefix_wrapper_passes_request_finish_to_inner_arc():
    m = OffloadingManager(8, "prefix-arc")
    stored(m, ["old"])
    m.on_new_request("r")
    m.prepare_load(["old"], "r")
    m.complete_load(["old"])
    stored(m, ["old", "n1", "n2"], "r")
    m.on_request_finished("r")
    inner = m.policy.inner.snapshot()
    assert inner["t2_all"] == {"old"} and inner["t1_all"] == {"n1", "n2"}
    # the wrapper learned the request's links: n1's parent is old, n2's is n1
    assert m.policy._parent["n2"] == "n1" and m.policy._parent["n1"] == "old"


def test_none_cannot_open_a_request_and_unhashable_finish_names_the_context():
    # newcomer findings: None means "no request" to prepare_load / prepare_store, so it cannot
    # be a request's context; an unhashable context is named also when no request is open
    m = OffloadingManager(4, "lru", max_open_requests=1)
    before = m.snapshot()
    with pytest.raises(TypeError, match="None"):
        m.on_new_request(None)
    with pytest.raises(TypeError, match=r"\['x'\] is not hashable"):
        m.on_request_finished(["x"])
    assert m.snapshot() == before and m.stats().requests_open == 0


op_with_failures = st.one_of(
    op,
    st.tuples(st.just("fail"),),  # every pending store fails: complete_store(success=False)
    st.tuples(st.just("reset"),),
    st.tuples(st.just("touch"), st.lists(st.sampled_from(KEYS), max_size=3),
              st.sampled_from(CALL_CTXS)),
    st.tuples(st.just("lookup"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=3),
              st.sampled_from(CALL_CTXS)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_with_failures, min_size=15, max_size=60))
def test_request_records_with_failed_stores_and_resets_match_reference_model(ops):
    """The reference model through failed stores (a request's failed new keys stay in its
    record, inserted: it stored them, and a later store of them by the same request is no
    new ghost-learning use), touches and lookups (not recorded) and reset_cache (forgets the
    open requests and the counters): the same policy calls, in the same order."""
    _drive_against_model(ops)


def test_reused_keys_stay_exact_when_a_request_records_more_after_its_first_load():
    # a request's first load records its reused keys as a view of its keys (round 9): a later
    # load, a failed store, a store naming a ready key or a store after a store each make
    # them a set of their own first; the policy gets exactly the reused keys every time
    def finished(m, ctx):
        m.policy.calls.clear()
        m.on_request_finished(ctx)
        return m.policy.calls[0]

    m = OffloadingManager(8, RecordingLRU)
    stored(m, ["a", "b", "c"])
    m.on_new_request("r")  # two loads, then a store of new keys
    m.prepare_load(["a", "b"], "r")
    m.prepare_load(["c"], "r")
    stored(m, ["d"], "r")
    m.complete_load(["a", "b"])
    m.complete_load(["c"])
    assert finished(m, "r") == (
        "finished", ("a", "b", "c", "d"), frozenset("d"), frozenset("abc"))
    m.prepare_store(["x", "y", "z"])  # pending: 4 blocks taken, a, b, c, d evictable
    m.on_new_request("s")  # a load, then a failed store: its new keys seen, not reused
    m.prepare_load(["a"], "s")
    m.prepare_load(["b"])  # pinned outside the request: only c, d evictable
    assert m.prepare_store(["e", "f", "g", "h"], "s") is None
    assert m.snapshot()["requests"] == [("s", ("a", "e", "f", "g", "h"), set(), {"a"})]
    m.complete_load(["a"])
    m.complete_load(["b"])
    assert finished(m, "s") == ("finished", ("a", "e", "f", "g", "h"), frozenset(),
                                frozenset("a"))
    m.on_new_request("t")  # a load, then a store naming a ready key and a new one
    m.prepare_load(["c"], "t")
    stored(m, ["d", "e"], "t")
    m.complete_load(["c"])
    assert finished(m, "t") == ("finished", ("c", "d", "e"), frozenset("e"), frozenset("cd"))
    m.on_new_request("u")  # a load, a store, then a load of its own block and of another
    m.prepare_load(["a"], "u")
    stored(m, ["f"], "u")
    m.prepare_load(["f", "c"], "u")
    m.complete_load(["a"])
    m.complete_load(["f", "c"])
    assert finished(m, "u") == ("finished", ("a", "f", "c"), frozenset("f"), frozenset("ac"))
