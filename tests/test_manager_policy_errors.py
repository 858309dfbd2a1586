"""The manager checks what a policy's ``evict`` returns (issue #12, fault 4).

Each buggy policy below breaks one rule; ``prepare_store`` must raise a ``PolicyError`` naming
the policy, and the manager's own state (slots, ref counts, counters, events) must be exactly
as before the call.
"""

from __future__ import annotations

import pytest

from kvtier import OffloadingManager, PolicyError
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.lru import LRUPolicy


def buggy(name: str, pick):
    """An LRU whose ``_evict`` returns ``pick(self, n, protected, honest_victims)``."""

    def _evict(self, n, protected):
        return pick(self, n, protected, LRUPolicy._evict(self, n, protected))

    return type(f"Buggy{name.title()}", (LRUPolicy,), {"name": f"buggy-{name}",
                                                        "_evict": _evict})


BUGS = {
    "short": lambda self, n, prot, v: v[:-1],  # fewer than n victims
    "long": lambda self, n, prot, v: v + ["k0"],  # more than n
    "repeated": lambda self, n, prot, v: v[:-1] + v[:1] if n > 1 else v + v,
    "unknown": lambda self, n, prot, v: v[:-1] + ["never-stored"],
    "pending": lambda self, n, prot, v: v[:-1] + ["p0"],
    "pinned": lambda self, n, prot, v: v[:-1] + ["k1"],
    "protected": lambda self, n, prot, v: v[:-1] + ["k2"],
    "unhashable": lambda self, n, prot, v: v[:-1] + [["k3"]],
    "tuple": lambda self, n, prot, v: tuple(v),
}


def setup(cls) -> OffloadingManager:
    m = OffloadingManager(8, cls, enable_events=True)
    keys = [f"k{i}" for i in range(6)]
    m.complete_store(m.prepare_store(keys).keys_to_store)
    m.prepare_store(["p0", "p1"])  # pending, tier now full
    m.prepare_load(["k1"])  # pinned
    m.take_events()
    return m


@pytest.mark.parametrize("bug", sorted(BUGS))
@pytest.mark.parametrize("n_new", [1, 2])
def test_a_broken_evict_raises_naming_the_policy_and_the_manager_is_unchanged(bug, n_new):
    cls = buggy(bug, BUGS[bug])
    m = setup(cls)
    before = {k: v for k, v in m.snapshot().items() if k != "policy"}
    stats = m.stats()
    # "k2" is named in the call (protected) only for the protected bug, so the other calls
    # stay on the one-key path when n_new == 1
    keys = (["k2"] if bug == "protected" else []) + [f"new{i}" for i in range(n_new)]
    with pytest.raises(PolicyError, match=rf"policy 'buggy-{bug}': Buggy\w+\.evict\({n_new}\)") as err:
        m.prepare_store(keys)
    assert err.value.policy == f"buggy-{bug}"
    assert {k: v for k, v in m.snapshot().items() if k != "policy"} == before
    assert m.stats() == stats
    assert m.take_events() == []


def test_the_check_costs_nothing_when_the_policy_is_right():
    m = setup(LRUPolicy)
    out = m.prepare_store(["k2", "new0", "new1"])
    assert out.evicted_keys == ["k5", "k4"]  # k2 protected, k1 pinned, p0/p1 pending
    assert m.stats().evictions == 2


def buggy_arc(name: str, pick, declares: bool):
    """An ARC subclass (it shares the manager's held state) whose ``_evict`` returns
    ``pick(...)``; ``declares``: its own class sets ``checks_shared_victims`` (outside
    kvtier: the manager does not trust it either)."""

    def _evict(self, n, protected):
        return pick(self, n, protected, ARCPolicy._evict(self, n, protected))

    body = {"name": f"buggy-{name}", "_evict": _evict}
    if declares:
        body["checks_shared_victims"] = True
    return type(f"Buggy{name.title()}", (ARCPolicy,), body)


@pytest.mark.parametrize("bug", ["pending", "pinned"])
@pytest.mark.parametrize("declares", [False, True])
@pytest.mark.parametrize("n_new", [1, 2])
def test_a_custom_sharing_policy_is_still_checked(bug, declares, n_new):
    # the manager skips the pending / pin checks only for a policy class shipped in kvtier
    # that declares it makes them (ARC, CachePolicy.checks_shared_victims): a user's
    # subclass that changes the victim choice is checked, declared or not
    m = setup(buggy_arc(bug, BUGS[bug], declares))
    assert m.policy._shared and not m._req_log.trusted
    before = {k: v for k, v in m.snapshot().items() if k != "policy"}
    stats = m.stats()
    with pytest.raises(PolicyError, match="pending" if bug == "pending" else "pinned"):
        m.prepare_store([f"new{i}" for i in range(n_new)])
    assert {k: v for k, v in m.snapshot().items() if k != "policy"} == before
    assert m.stats() == stats
    assert m.take_events() == []


def test_arc_is_trusted_and_its_answers_are_right():
    # ARC (shipped, declared, sharing): the manager skips the two checks; ARC skips the
    # pinned and pending blocks itself
    m = setup(ARCPolicy)
    assert m._req_log.trusted
    out = m.prepare_store(["k2", "new0", "new1"])
    assert out.evicted_keys == ["k5", "k4"]  # k1 pinned, p0 / p1 pending, k2 protected


@pytest.mark.parametrize("bug", ["unhashable", "unknown", "repeated"])
@pytest.mark.parametrize("policy", [LRUPolicy, ARCPolicy])
def test_a_broken_evict_with_nothing_held_leaves_the_manager_unchanged(bug, policy):
    # nothing pending, pinned or protected: no check stops the answer before the victims'
    # slots are popped, so the slots popped before the bad key must be put back (an
    # unhashable victim after a good one lost the good one's block and slot)
    def pick(self, n, protected, victims):
        return victims[:-1] + {"unhashable": [["k9"]], "unknown": ["never-stored"],
                               "repeated": victims[:1]}[bug]

    cls = type(f"Buggy{bug.title()}", (policy,),
               {"name": f"buggy-{bug}",
                "_evict": lambda self, n, prot: pick(self, n, prot, policy._evict(self, n, prot))})
    m = OffloadingManager(4, cls)
    m.complete_store(m.prepare_store(["k0", "k1", "k2", "k3"]).keys_to_store)
    before = {k: v for k, v in m.snapshot().items() if k != "policy"}
    stats = m.stats()
    with pytest.raises(PolicyError, match=r"evict\(3\)"):
        m.prepare_store(["new0", "new1", "new2"])
    assert {k: v for k, v in m.snapshot().items() if k != "policy"} == before
    assert m.stats() == stats
