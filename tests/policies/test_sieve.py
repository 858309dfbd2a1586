"""SIEVE: exact eviction orders on hand-checked sequences (queue drawn tail -> head)."""

from __future__ import annotations

from kvtier import OffloadingManager
from kvtier.policies.sieve import SievePolicy


def fill(policy, keys):
    """Insert ``keys`` in order and make each evictable: queue (tail -> head) = keys."""
    for i, key in enumerate(keys):
        policy.insert([key])
        policy.mark_evictable([key])


def keys_of(victims):
    return victims


def test_hand_clears_visited_bits_and_stays_where_it_evicted():
    p = SievePolicy(8)
    fill(p, "abcd")
    p.touch(["a", "c"])
    # hand at a (visited: cleared, passed), b unvisited: victim; hand now at c
    assert keys_of(p.evict(1, ())) == ["b"]
    assert p.examined == 2
    p.insert(["e"])
    p.mark_evictable(["e"])  # enters at the head: queue a c d e, hand at c
    # c visited: cleared; d is the victim; hand at e
    assert keys_of(p.evict(1, ())) == ["d"]
    # e unvisited: victim; the hand wraps to the tail: a (bit cleared earlier) is next
    assert keys_of(p.evict(2, ())) == ["e", "a"]
    assert keys_of(p.evict(1, ())) == ["c"]
    assert p.count_eligible() == 0 and not p.snapshot()["held"]


def test_all_visited_takes_one_lap_then_evicts_where_the_hand_started():
    p = SievePolicy(8)
    fill(p, "abcd")
    p.touch(list("abcd"))
    before = p.examined
    assert keys_of(p.evict(3, ())) == ["a", "b", "c"]
    # one full lap clearing 4 bits, then 3 victims: each entry examined at most twice
    assert p.examined - before == 7


def test_protected_is_passed_without_clearing_and_not_evicted():
    p = SievePolicy(8)
    fill(p, "abc")
    p.touch(["b"])
    assert keys_of(p.evict(1, {"a"})) == ["c"]  # a protected, b visited (cleared)
    assert p.snapshot()["visited_bits"] == set()
    assert keys_of(p.evict(1, ["a"])) == ["b"]


def test_pinned_block_keeps_its_place_and_its_touch_and_is_met_there_again():
    p = SievePolicy(8)
    fill(p, "abc")
    p.mark_non_evictable(["a"])
    p.touch(["a"])  # touch while pinned sets the bit
    assert keys_of(p.evict(1, ())) == ["b"]
    p.mark_evictable(["a"])  # back at its place, bit still set: the hand meets c, wraps, then a
    assert keys_of(p.evict(2, ())) == ["c", "a"]


def test_a_block_set_aside_in_an_earlier_lap_is_behind_the_hand_once_it_passed_it():
    p = SievePolicy(8)
    fill(p, "abc")
    p.mark_non_evictable(["a"])
    assert keys_of(p.evict(2, ())) == ["b", "c"]  # a held: passed; the hand wraps
    fill(p, "def")  # queue a d e f, the hand at the tail
    assert keys_of(p.evict(1, ())) == ["d"]  # a still held: passed again; hand at e
    assert p.snapshot()["hand"] == 1  # a is behind it
    p.mark_evictable(["a"])
    # the hand goes on from e (it used to go back to a, numbered in the earlier lap), and
    # meets a after the wrap
    assert keys_of(p.evict(1, ())) == ["e"]
    assert keys_of(p.evict(2, ())) == ["f", "a"]


def test_evict_is_atomic_when_protected_blocks_leave_too_few():
    p = SievePolicy(8)
    fill(p, "abcd")
    p.touch(["a", "b"])
    p.insert(["x"])  # pending: not a candidate
    snap, visited = p.snapshot(), p.examined
    assert p.evict(3, ["c", "d", "x"]) is None
    assert p.snapshot() == snap
    assert p.examined == visited
    assert p.evict(5, ()) is None
    assert p.snapshot() == snap


def test_remove_of_the_hands_block_moves_the_hand_on():
    p = SievePolicy(8)
    fill(p, "abcd")
    p.touch(["a"])
    assert keys_of(p.evict(1, ())) == ["b"]  # hand at c
    p.mark_non_evictable(["c"])
    p.remove(["c"])
    snap = p.snapshot()
    assert "c" not in snap["held"] and "c" not in snap["queue"]
    assert keys_of(p.evict(1, ())) == ["d"]


def test_through_the_manager():
    m = OffloadingManager(3, policy="sieve")
    m.complete_store(m.prepare_store(["a", "b", "c"]).keys_to_store)  # queue c b a
    m.touch(["c"])
    out = m.prepare_store(["d"])
    assert out.evicted_keys == ["b"]
    assert isinstance(m.policy, SievePolicy)
