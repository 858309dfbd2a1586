"""The README's note on keys (issue #12 fault 7): 1, 1.0 and True are one key."""

from kvtier import LookupResult, OffloadingManager


def test_equal_numbers_and_bools_are_one_block():
    m = OffloadingManager(4, "lru")
    out = m.prepare_store([1])
    m.complete_store(out.keys_to_store)
    assert m.lookup(1.0) is LookupResult.HIT and m.lookup(True) is LookupResult.HIT
    assert m.prepare_store([1.0, True]).keys_to_store == []  # already stored
    assert len(m) == 1
