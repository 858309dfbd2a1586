"""Nothing returned or recorded changes later (issue #11, section 4).

Events hold tuples of their own; ``PrepareStoreOutput``'s lists, ``prepare_load``'s slots,
``take_events()``'s list and ``snapshot()`` are fresh objects no internal state refers to. Each
test mutates every container it is given and checks the manager's state and events.
"""

from __future__ import annotations

import pytest

from kvtier import OffloadingEvent, OffloadingManager, available_policies


def scramble(value) -> None:
    """Mutate every mutable container reachable from ``value`` (depth first), in place."""
    if isinstance(value, dict):
        for item in list(value.values()):
            scramble(item)
        value.clear()
        value["scrambled"] = True
    elif isinstance(value, list):
        for item in value:
            scramble(item)
        value.clear()
        value.append("scrambled")
    elif isinstance(value, set):
        value.clear()
        value.add("scrambled")
    elif isinstance(value, tuple):
        for item in value:
            scramble(item)


def test_clearing_the_evicted_keys_of_an_output_leaves_the_event_intact():
    m = OffloadingManager(2, "lru", enable_events=True)
    m.complete_store(m.prepare_store([1, 2]).keys_to_store)
    out = m.prepare_store([3])
    out.evicted_keys.clear()
    assert m.take_events() == [OffloadingEvent((1, 2), False), OffloadingEvent((2,), True)]


@pytest.mark.parametrize("policy", available_policies())
def test_mutating_every_returned_container_changes_nothing(policy):
    m = OffloadingManager(4, policy, enable_events=True)
    out = m.prepare_store(["a", "b", "c"])
    m.complete_store(out.keys_to_store)
    scramble(out)  # after use: the tier keeps its own copies
    m.touch(["a"])
    for keys in (["d", "e"], ["f"]):  # a batch eviction and the one-key path
        before = m.snapshot()
        out = m.prepare_store(keys)
        after = m.snapshot()
        assert out.evicted_keys and out.keys_to_store == keys
        scramble(out)
        assert m.snapshot() == after != before
        m.complete_store(keys)

    slots = m.prepare_load(["f"])
    snap = m.snapshot()
    scramble(slots)
    assert m.snapshot() == snap
    m.complete_load(["f"])

    events = m.take_events()
    expected = list(events)
    assert all(type(e.keys) is tuple for e in events)
    scramble(events)
    assert events != expected and m.take_events() == []

    kept = m.snapshot()
    mutated = m.snapshot()
    assert mutated is not kept
    scramble(mutated)
    assert m.snapshot() == kept
    policy_snap = m.policy.snapshot()
    scramble(m.policy.snapshot())
    assert m.policy.snapshot() == policy_snap
    stats = m.stats()
    with pytest.raises(AttributeError):
        stats.hits = 5  # frozen
