"""Request mode: a request finished while its loads and stores are still in flight (what
docs/manager.md, "Finishing with transfers in flight", says)."""

from __future__ import annotations

import pytest

from kvtier import BlockStateError, OffloadingManager, available_policies

POLICIES = [p for p in available_policies() if p != "belady"]


@pytest.mark.parametrize("policy", POLICIES)
def test_finish_with_a_load_and_a_store_in_flight(policy):
    m = OffloadingManager(6, policy)
    m.prepare_store(["x", "y"])
    m.complete_store(["x", "y"])
    m.on_new_request("r")
    m.prepare_load(["x"], "r")  # load in flight
    assert m.prepare_store(["a", "b"], "r") is not None  # store in flight
    m.on_request_finished("r")
    st = m.stats()
    assert (st.requests_open, st.requests_finished) == (0, 1)
    # the finish changed no pin and no pending store
    assert (m.ref_count("x"), m.ref_count("a"), m.ref_count("b")) == (1, -1, -1)
    assert st.evictable == 1  # only y
    # while they are in flight an eviction never takes them
    out = m.prepare_store(["c", "d", "e"])
    assert out is not None and out.evicted_keys == ["y"]
    assert m.prepare_store(["f"]) is None  # all others pinned or pending
    # the completions work as usual, with the finished context or none
    m.complete_load(["x"], "r")
    m.complete_store(["a"], "r")
    m.complete_store(["b"])
    assert (m.ref_count("x"), m.ref_count("a"), m.ref_count("b")) == (0, 0, 0)
    with pytest.raises(BlockStateError, match="not pinned"):
        m.complete_load(["x"], "r")  # one complete_load per prepare_load, finish or not


@pytest.mark.parametrize("policy", POLICIES)
def test_a_finished_context_is_not_recorded_and_a_failed_store_drops_its_blocks(policy):
    m = OffloadingManager(4, policy)
    m.on_new_request(1)
    m.prepare_store(["a", "b"], 1)
    m.on_request_finished(1)  # the use counted a and b while pending
    m.complete_store(["a", "b"], success=False)
    assert m.ref_count("a") is None and m.ref_count("b") is None
    assert len(m) == 0 and m.stats().evictable == 0
    # calls under the finished context are explicit mode: nothing is recorded, and a
    # second finish still raises
    m.prepare_store(["c"], 1)
    m.complete_store(["c"], 1)
    assert m.stats().requests_open == 0
    with pytest.raises(ValueError, match="not open"):
        m.on_request_finished(1)


def test_lru_applies_the_use_at_finish_to_keys_in_flight():
    """LRU: the finished request's keys (x loaded, a b stored, all in flight at the finish)
    move to the most recent end, x first, so y is the oldest and a request's tail (b)
    goes before its head."""
    m = OffloadingManager(4, "lru")
    m.prepare_store(["x", "y"])
    m.complete_store(["x", "y"])
    m.on_new_request("r")
    m.prepare_load(["x"], "r")
    m.prepare_store(["a", "b"], "r")
    m.on_request_finished("r")
    m.complete_load(["x"])
    m.complete_store(["a", "b"])
    assert m.prepare_store(["c", "d"]).evicted_keys == ["y", "b"]
