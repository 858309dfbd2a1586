"""The README's note on keys (issue #12 fault 7): 1, 1.0 and True are one key."""

import numpy as np
import pytest

from kvtier import LookupResult, OffloadingManager
from kvtier.policies import available_policies


def test_equal_numbers_and_bools_are_one_block():
    m = OffloadingManager(4, "lru")
    out = m.prepare_store([1])
    m.complete_store(out.keys_to_store)
    assert m.lookup(1.0) is LookupResult.HIT and m.lookup(True) is LookupResult.HIT
    assert m.prepare_store([1.0, True]).keys_to_store == []  # already stored
    assert len(m) == 1


@pytest.mark.parametrize("policy", [p for p in available_policies() if p != "belady"])
def test_numpy_int_and_tuple_keys_in_one_tier_leave_state_unchanged_on_error(policy):
    """Found by a newcomer's fuzz: np.int64 keys next to tuple keys. The eviction's protected
    keys were a list, compared with ``==``: a victim np.int64(1) == (1, 2) gives an array
    whose truth value raised ValueError after the policy had dropped np.int64(1) (a later
    eviction then raised PolicyError). Protected keys are now a set (compared by hash)."""
    m = OffloadingManager(2, policy)
    for key in [np.int64(1), (1, 2)]:
        m.complete_store(m.prepare_store([key]).keys_to_store)
    out = m.prepare_store([(1, 2), 5])  # (1, 2) is stored: protected; np.int64(1) goes
    assert out is not None
    assert (out.keys_to_store, out.evicted_keys) == ([5], [1])
    m.complete_store([5])
    assert 1 not in m and (1, 2) in m and 5 in m
    out = m.prepare_store([np.int64(7)])  # the policy and the manager agree: one more victim
    assert out is not None and len(out.evicted_keys) == 1


# two keys whose == raises: numpy's answer to a tuple is an array (its truth value raises
# ValueError), np.True_ == 2**70 raises OverflowError
RAISING_PAIRS = [((1, 2), np.float64(2.0)), (2**70, np.True_)]


@pytest.mark.parametrize("first, second", RAISING_PAIRS)
@pytest.mark.parametrize("policy", [p for p in available_policies() if p != "belady"])
def test_a_numpy_scalar_key_after_a_tuple_key_in_one_store(policy, first, second):
    """Found by a newcomer's fuzz: the prefix-aware policies compared a key's recorded
    parent with the call's previous key by ``==``; np.float64(2.0) == (1, 2) is an array,
    whose truth value raised ValueError inside prepare_store after the manager had taken
    the slots (policy and manager out of step). Keys are compared as dict keys."""
    m = OffloadingManager(4, policy)
    m.complete_store(m.prepare_store([first]).keys_to_store)
    out = m.prepare_store([first, second])
    assert out is not None and out.keys_to_store == [second]
    m.complete_store(out.keys_to_store)
    m.touch([np.int64(5), first, second])
    assert m.lookup_prefix([first, second]) == 2
    assert len(m.prepare_store([3, 4, 5]).evicted_keys) == 1  # policy and manager agree


@pytest.mark.parametrize("first, second", RAISING_PAIRS)
@pytest.mark.parametrize("policy", [p for p in available_policies() if p != "belady"])
def test_a_store_after_a_touch_of_other_keys_with_a_tuple_and_a_numpy_scalar(policy, first,
                                                                              second):
    """Found by a newcomer's fuzz: ARC's insert compared the store's keys with the last
    touch's ghost-free key list by ``==`` (the request-mode shortcut); np.float64(2.0) ==
    (1, 2) is an array, and its truth value raised ValueError after the manager had taken
    the slots: 9 pending blocks the policy never heard of."""
    m = OffloadingManager(20, policy)
    m.touch([first, *range(100, 108)])  # none resident: ARC remembers the list
    out = m.prepare_store([second, *range(200, 208)])
    assert out is not None and len(out.keys_to_store) == 9
    m.complete_store(out.keys_to_store)
    assert m.lookup_prefix([second, 200]) == 2
    out = m.prepare_store(list(range(300, 320)))  # evicts 9: policy and manager agree
    assert out is not None and len(out.evicted_keys) == 9


@pytest.mark.parametrize("keys", [bytearray(b"\x01\x02"), memoryview(b"\x01\x02")])
@pytest.mark.parametrize("method", ["lookup_prefix", "prepare_store", "prepare_load",
                                    "complete_store", "complete_load", "touch"])
def test_a_bytes_like_key_list_is_refused_not_split_into_ints(keys, method):
    """Found by a newcomer session: a bytearray or memoryview passed as the key list (a
    forgotten list around one bytes-like key) was iterated into its byte values, so
    ``prepare_store(bytearray(b"\\x01\\x02"))`` stored blocks 1 and 2. Refused like str and
    bytes already were, naming the method; nothing changes."""
    m = OffloadingManager(4, "lru")
    m.complete_store(m.prepare_store([1]).keys_to_store)
    before = m.snapshot()
    with pytest.raises(TypeError, match=rf"{method}: keys must be a list of block keys, not a "
                                         rf"single {type(keys).__name__}"):
        getattr(m, method)(keys)
    assert m.snapshot() == before


@pytest.mark.parametrize("method", ["lookup_prefix", "prepare_store", "prepare_load",
                                    "complete_store", "complete_load", "touch", "missing"])
def test_a_dict_as_the_key_list_is_refused(method):
    """Found by a newcomer session (on ``RedisTier.write({6: 1}, ...)``): a dict passed as
    the key list was iterated into its keys, its values dropped without a word, so
    ``prepare_store({6: 1})`` stored block 6. Refused like a lone str / bytearray, naming the
    method and the type; nothing changes."""
    m = OffloadingManager(4, "lru")
    m.complete_store(m.prepare_store([1]).keys_to_store)
    before = m.snapshot()
    with pytest.raises(TypeError, match=rf"{method}: keys must be a list of block keys, not a "
                                         r"dict \{6: 1\}"):
        getattr(m, method)({6: 1})
    assert m.snapshot() == before


@pytest.mark.parametrize("make", [set, frozenset])
@pytest.mark.parametrize("method", ["lookup_prefix", "prepare_load", "touch", "prepare_store",
                                    "missing"])
def test_a_set_as_the_key_list_is_refused(make, method):
    """Session 14, item 3: a key list's order is its meaning (first key most recently used,
    prefixes head first); a set's order is arbitrary, and it was taken as a list."""
    m = OffloadingManager(4, "lru")
    m.complete_store(m.prepare_store([1, 2]).keys_to_store)
    before = m.snapshot()
    with pytest.raises(TypeError, match=rf"{method}: keys must be a list of block keys in "
                                        rf"order .*not a {make.__name__}, whose order is "
                                        r"arbitrary"):
        getattr(m, method)(make([1, 2]))
    assert m.snapshot() == before
    # an ordered view is still taken (dict keys keep their insertion order)
    assert m.missing({2: None, 3: None}.keys()) == [3]


@pytest.mark.parametrize("make", [set, frozenset])
def test_a_set_is_taken_where_the_order_does_not_matter(make):
    """Releasing pins and completing stores do not depend on the key order, and vLLM's
    offloading connector passes each job's keys as a set to complete_load and
    complete_store: those two take sets (checks.key_collection)."""
    m = OffloadingManager(4, "lru")
    out = m.prepare_store([1, 2, 3])
    m.complete_store(make(out.keys_to_store))
    assert m.stats().completed_stores == 3
    m.prepare_load([1, 2])
    m.complete_load(make([1, 2]))
    assert m.stats().pinned == 0 and m.stats().evictable == 3
