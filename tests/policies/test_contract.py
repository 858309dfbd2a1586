"""The CachePolicy contract, checked on every registered policy (built-in and plugins).

Driven through the manager, which is how policies are used. Exact eviction orders are tested
per policy in ``test_<policy>.py``; here: what every policy must guarantee.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier import LookupResult, OffloadingManager, available_policies
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.prefix import prefix_aware
from kvtier.policies.s3fifo import S3FIFOPolicy

from example_policy import FIFOPolicy  # tests/policies/example_policy.py

# the prefix wrappers demote dead leaves only on traffic that has them; these variants always
# do, so the contract is checked on that eviction path too (passed as classes, not registered)
ALWAYS_DEMOTING = [
    prefix_aware(inner, f"prefix-{inner.name}-always", leaf_mode="always")
    for inner in (LRUPolicy, ARCPolicy, S3FIFOPolicy)
]
# plus the ~40-line example policy of docs/manager.md, taken from the document
POLICIES = available_policies() + ALWAYS_DEMOTING + [FIFOPolicy]


def test_the_docs_example_policy_is_short_and_evicts_first_in_first_out():
    lines = FIFOPolicy.__doc__ and len(
        [line for line in open(FIFOPolicy.__init__.__code__.co_filename).read()
         .split("## How to write a policy")[1].split("```python")[1].split("```")[0]
         .splitlines() if line.strip()]
    )
    assert lines <= 45
    m = OffloadingManager(3, FIFOPolicy)
    m.complete_store(m.prepare_store(["a", "b", "c"]).keys_to_store)  # a ends newest
    m.touch(["c"])  # ignored
    assert m.prepare_store(["d"]).evicted_keys == ["c"]
    m.prepare_load(["b"])
    m.complete_load(["b"])  # a pin and its release move nothing
    assert m.prepare_store(["e", "f"]).evicted_keys == ["b", "a"]


def _name(policy) -> str:
    return policy if isinstance(policy, str) else policy.name


def full(policy: str, n: int) -> OffloadingManager:
    m = OffloadingManager(n, policy)
    keys = list(range(n))
    m.prepare_store(keys)
    m.complete_store(keys)
    return m


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
@pytest.mark.parametrize("pinned_share", [0.0, 0.9, 0.99])
def test_eviction_visits_victims_and_protected_keys_only(policy, pinned_share):
    n = 4000
    m = full(policy, n)
    pinned = int(n * pinned_share)
    if pinned:
        m.prepare_load(list(range(pinned)))
    protected = list(range(pinned, pinned + 5))  # named in the call: must be skipped
    m.policy.examined = 0
    out = m.prepare_store(protected + list(range(n, n + 20)))
    assert out is not None and len(out.evicted_keys) == 20
    assert not set(out.evicted_keys) & set(protected)
    assert all(k >= pinned for k in out.evicted_keys)
    assert m.policy.examined <= 20 + len(protected)


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
@pytest.mark.parametrize("pinned_share", [0.5, 0.99])
def test_pinned_blocks_in_the_way_are_paid_once_not_at_every_eviction(policy, pinned_share):
    # issue #11 section 1: held blocks keep their place, so an eviction walk meets them; each
    # is set aside once (not met again while it stays pinned): over R rounds the entries
    # examined are at most R * (victims + protected) + pinned, not R * pinned
    n = 4000
    m = full(policy, n)
    m.touch(list(range(n)))  # one use each: every policy's order, reversed
    pinned = list(range(n - int(n * pinned_share), n))  # the oldest blocks, in every policy
    m.prepare_load(pinned)
    pinned_set = set(pinned)
    m.policy.examined = 0
    rounds = 3
    for r in range(rounds):
        protected = [k for k in range(n) if k not in pinned_set and m.ref_count(k) == 0][:5]
        out = m.prepare_store(protected + [f"new{r}.{i}" for i in range(10)])
        assert out is not None and len(out.evicted_keys) == 10
        assert not set(out.evicted_keys) & (pinned_set | set(protected))
        m.complete_store(out.keys_to_store)
    # S3-FIFO's promotions and SIEVE's visited bits add one entry per touch at most
    assert m.policy.examined <= rounds * (10 + 5) + len(pinned) + n, m.policy.examined
    m.policy.examined = 0
    m.prepare_store([f"late{i}" for i in range(10)])
    assert m.policy.examined <= 10 + 5 + 30, m.policy.examined


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_pins_and_out_of_order_completions_move_nothing(policy):
    # issue #11 section 1, on every policy: the same stores and touches, with and without pins
    # taken and released and stores completed one key at a time in another order, leave the
    # same state (the snapshot says how the policy will behave from here on)
    def build(with_transfers: bool) -> OffloadingManager:
        m = OffloadingManager(64, policy)
        for r in range(6):
            keys = [f"r{r}.{i}" for i in range(5)]
            out = m.prepare_store(keys)
            if with_transfers:
                for key in reversed(out.keys_to_store):
                    m.complete_store([key])
            else:
                m.complete_store(out.keys_to_store)
            m.touch([f"r{r // 2}.0", f"r{r // 2}.1"])
            if with_transfers:
                m.prepare_load([f"r{r // 2}.1"])
                m.prepare_load([f"r{r // 2}.0", f"r{r // 2}.1"])
                m.complete_load([f"r{r // 2}.1"])
                m.complete_load([f"r{r // 2}.1", f"r{r // 2}.0"])
        return m

    plain, moved = build(False), build(True)
    assert moved.policy.snapshot() == plain.policy.snapshot()
    order = [plain.prepare_store([f"x{i}"]).evicted_keys for i in range(40)]
    assert [moved.prepare_store([f"x{i}"]).evicted_keys for i in range(40)] == order


RELEASE_ORDERS = {
    "one call, head first": lambda keys: [keys],
    "one call, tail first": lambda keys: [keys[::-1]],
    "one key at a time, head first": lambda keys: [[k] for k in keys],
    "one key at a time, tail first": lambda keys: [[k] for k in reversed(keys)],
    "mixed": lambda keys: [[keys[1]], [keys[3], keys[0]], [keys[2]]],
}


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_blocks_set_aside_come_back_at_their_place_whatever_the_release_order(policy):
    # issue #11 section 1 (the gap a newcomer found in LFU and SIEVE): evictions meet a pinned
    # request and set its blocks aside; however its pins are released, the policy ends in the
    # same state, evicts in the same order afterwards, and never drops a head before its tail
    def run(release) -> tuple[dict, list]:
        m = OffloadingManager(12, policy)
        requests = [[f"{r}{i}" for i in range(4)] for r in "abc"]
        for keys in requests:
            m.complete_store(m.prepare_store(keys).keys_to_store)
        m.touch(requests[1])
        m.prepare_load(requests[0])  # the oldest request in every policy: evictions meet it
        for i in range(3):
            out = m.prepare_store([f"y{i}"])
            m.complete_store(out.keys_to_store)
            assert not set(out.evicted_keys) & set(requests[0])
        for keys in release(requests[0]):
            m.complete_load(keys)
        _check_prefixes(m, requests)
        snap, order = m.policy.snapshot(), []
        for i in range(12):
            out = m.prepare_store([f"z{i}"])
            if out is None:
                break
            order.append(out.evicted_keys)
            _check_prefixes(m, requests)
        return snap, order

    runs = {name: run(release) for name, release in RELEASE_ORDERS.items()}
    reference = runs.pop("one call, head first")
    for name, result in runs.items():
        assert result == reference, name


def test_lfu_and_sieve_bring_set_aside_blocks_back_tail_first():
    # the newcomer's inputs: before the fix LFU (released tail first) and SIEVE (released head
    # first, or one complete_load) evicted a, b, c head first
    for policy, releases in (("lfu", [["c"], ["b"], ["a"]]), ("sieve", [["a"], ["b"], ["c"]]),
                             ("sieve", [["a", "b", "c"]])):
        m = OffloadingManager(4, policy)
        m.complete_store(m.prepare_store(["a", "b", "c"]).keys_to_store)
        m.complete_store(m.prepare_store(["x"]).keys_to_store)
        m.prepare_load(["a", "b", "c"])
        assert m.prepare_store(["y"]).evicted_keys == ["x"]
        m.complete_store(["y"])
        for keys in releases:
            m.complete_load(keys)
        victims = [m.prepare_store([f"z{i}"]).evicted_keys for i in range(3)]
        assert victims == [["c"], ["b"], ["a"]], (policy, releases)
        assert m.lookup_prefix(["a", "b", "c"]) == 0


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_refused_eviction_changes_nothing(policy):
    m = full(policy, 10)
    m.touch([1, 3, 5])
    m.prepare_load(list(range(7)))  # 3 evictable: 7, 8, 9
    before = m.snapshot()
    assert m.policy.evict(3, protected={8}) is None
    assert m.snapshot() == before
    assert m.prepare_store([8, 10, 11, 12]) is None
    assert m.snapshot() == before


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
@pytest.mark.parametrize("n", [2.5, 0, -1, True])
def test_evict_refuses_a_count_that_is_not_a_positive_int(policy, n):
    m = full(policy, 10)
    before = m.snapshot()
    with pytest.raises((TypeError, ValueError), match=r"\bn\b"):  # names the argument
        m.policy.evict(n)
    assert m.snapshot() == before


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_evict_with_protected_none_protects_nothing(policy):
    """Found by newcomer10: ``evict(n, None)`` worked on ARC (nothing protected) and raised
    "'NoneType' object is not iterable" on every other policy."""
    a, b = full(policy, 10), full(policy, 10)
    assert a.policy.evict(2, None) == b.policy.evict(2, ())
    assert a.policy.snapshot() == b.policy.snapshot()
    assert a.policy.evict(20, None) is None


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_evict_takes_a_numpy_integer_count(policy):
    np = pytest.importorskip("numpy")
    m = full(policy, 10)
    assert len(m.policy.evict(np.int64(2))) == 2


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_pending_and_pinned_blocks_are_not_candidates(policy):
    m = OffloadingManager(6, policy)
    m.prepare_store([0, 1])  # pending
    m.prepare_store([2, 3])
    m.complete_store([2, 3])
    m.prepare_load([2])  # pinned
    m.prepare_store([4, 5])
    m.complete_store([4, 5])
    victims = m.policy.evict(2, protected=())
    assert victims is not None
    assert len(victims) == 2 and set(victims) <= {3, 4, 5}
    assert m.policy.evict(4, protected=()) is None


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_evict_returns_n_distinct_keys_and_their_slots_are_reused(policy):
    m = full(policy, 8)
    slot_of = m.snapshot()["slot_of"]
    m.touch([1, 2])
    out = m.prepare_store([10, 11, 12])
    assert len(out.evicted_keys) == 3 == len(set(out.evicted_keys))
    assert sorted(out.block_ids) == sorted(slot_of[k] for k in out.evicted_keys)
    assert m.policy.count_eligible() == 5
    survivors = [k for k in range(8) if k not in out.evicted_keys]
    # 10 is pending: not eligible anyway
    assert m.policy.count_eligible({survivors[0], survivors[1], 10}) == 3


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_clear_forgets_everything(policy):
    m = full(policy, 8)
    m.touch([1, 2])
    m.reset_cache()
    assert m.policy.count_eligible() == 0 and m.policy.examined == 0
    fresh = OffloadingManager(8, policy)
    assert m.snapshot() == fresh.snapshot()


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
def test_policy_rejects_bad_capacity(policy):
    from kvtier import get_policy

    cls = get_policy(policy) if isinstance(policy, str) else policy
    with pytest.raises(ValueError, match="capacity"):
        cls(0)


def test_registry_lists_builtins_and_accepts_plugins(monkeypatch):
    from kvtier import CachePolicy, get_policy, register_policy
    from kvtier.policies import registry
    from kvtier.policies.lru import LRUPolicy

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # leave no trace

    assert {"lru", "arc"} <= set(POLICIES)

    class MyPolicy(LRUPolicy):
        name = "my-lru"

    register_policy("my-lru-test", MyPolicy)
    assert get_policy("my-lru-test") is MyPolicy
    assert isinstance(OffloadingManager(4, "my-lru-test").policy, CachePolicy)
    with pytest.raises(ValueError, match="already registered"):
        register_policy("lru", MyPolicy)
    with pytest.raises(TypeError, match="not a CachePolicy"):
        register_policy("bad", dict)  # type: ignore[arg-type]


def test_entry_point_plugins_are_found_by_name(monkeypatch):
    from importlib.metadata import EntryPoint

    from kvtier.policies import registry
    from kvtier.policies.lru import LRUPolicy

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    plugin = EntryPoint("ext-lru", "kvtier.policies.lru:LRUPolicy", registry.ENTRY_POINT_GROUP)
    seen_groups = []

    def fake_entry_points(*, group):
        seen_groups.append(group)
        return [plugin]

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    assert registry.get_policy("ext-lru") is LRUPolicy
    assert "ext-lru" in registry.available_policies()
    assert seen_groups == ["kvtier.policies"]
    assert isinstance(OffloadingManager(4, "ext-lru").policy, LRUPolicy)


def _check_prefixes(m: OffloadingManager, requests) -> None:
    for keys in requests:
        cached = [key in m for key in keys]
        assert cached == sorted(cached, reverse=True), f"{keys}: tail kept, head gone {cached}"


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
@pytest.mark.parametrize("capacity,length", [(10, 10), (10, 3), (16, 5), (40, 7), (100, 30)])
def test_a_request_loses_its_tail_before_its_head_from_the_first_fill(policy, capacity, length):
    # issue #11 section 3: requests stored head first, one call each (the first ones fill the
    # tier), then one-key stores; after every call each request's cached blocks are a prefix
    m = OffloadingManager(capacity, policy)
    requests = [[f"r{r}.{i}" for i in range(length)] for r in range(capacity // length + 3)]
    for keys in requests:
        out = m.prepare_store(keys)
        assert out is not None
        m.complete_store(out.keys_to_store)
        _check_prefixes(m, requests)
    for i in range(capacity + 1):  # pending one-key stores until nothing is evictable
        if m.prepare_store([f"x{i}"]) is None:
            break
        _check_prefixes(m, requests)
    assert m.stats().evictable == 0


def test_s3fifo_first_fill_evicts_the_tail_first():
    # issue #11 section 3's small input: before the fix the first victim was 1 (S held the
    # head) and the lookup found nothing
    m = OffloadingManager(10, "s3fifo")
    keys = list(range(1, 11))
    m.complete_store(m.prepare_store(keys).keys_to_store)
    assert m.prepare_store([11]).evicted_keys == [10]
    assert m.prepare_store([12]).evicted_keys == [9]
    assert m.lookup_prefix(keys) == 8


def test_logical_order_refuses_non_members_and_duplicates():
    # newcomer finding: hold() of a non-member used to corrupt len(); append() of a member
    # set aside made a duplicate
    from kvtier.policies import LogicalOrder

    order = LogicalOrder()
    for key in range(3):
        order.append(key)
    with pytest.raises(KeyError, match="99"):
        order.hold([0, 99])
    assert len(order) == 3 and not order.held
    order.hold([0])
    assert order.take(1, ()) == ([1], 2)  # 0 held: set aside, in place
    with pytest.raises(ValueError, match="member already"):
        order.append(0)
    assert order.snapshot() == ([0, 2], frozenset({0}))


# random sequences of stores, touches, loads and evictions; the pins of a batch of loads are
# released either in one call or one key at a time tail first: nothing else may differ
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(1, 4), st.booleans()),  # n keys, complete?
        st.tuples(st.just("touch"), st.lists(st.integers(0, 30), max_size=4)),
        st.tuples(st.just("load"), st.integers(0, 30), st.integers(2, 6)),  # a run of keys
        st.tuples(st.just("release"), st.just(0)),
    ),
    max_size=60,
)


def _store_new(m: OffloadingManager, stored: list[str], count: int, log: list):
    """Offer ``count`` new keys (named after ``stored``'s length), log the victims."""
    keys = [f"k{len(stored) + i}" for i in range(count)]
    stored += keys
    out = m.prepare_store(keys)
    log.append(None if out is None else out.evicted_keys)
    return out


def _end_state(m: OffloadingManager, log: list) -> tuple[dict, list]:
    """The policy's snapshot, then the victims of 12 more one-key stores."""
    snap = m.policy.snapshot()
    for i in range(12):
        out = m.prepare_store([f"z{i}"])
        log.append(None if out is None else out.evicted_keys)
    return snap, log


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_release_order_never_matters_on_random_sequences(policy, ops):
    def run(tail_first: bool) -> tuple[dict, list]:
        m = OffloadingManager(8, policy)
        stored: list[str] = []
        pinned: list[str] = []
        pending: list[str] = []
        log = []
        for op in ops:
            if op[0] == "store":
                out = _store_new(m, stored, op[1], log)
                if out is not None:
                    (m.complete_store if op[2] else pending.extend)(out.keys_to_store)
            elif op[0] == "touch":
                m.touch([stored[i] for i in op[1] if i < len(stored)])
            elif op[0] == "load":
                ready = [k for k in stored if m.lookup(k) == LookupResult.HIT]
                start = op[1] % max(len(ready), 1)
                keys = ready[start:start + op[2]]
                if keys:
                    m.prepare_load(keys)
                    pinned += keys
            elif pinned:  # release every pin taken so far
                for keys in ([k] for k in reversed(pinned)) if tail_first else [pinned]:
                    m.complete_load(keys)
                pinned = []
        if pending:
            m.complete_store(pending)
        for keys in ([k] for k in reversed(pinned)) if tail_first else [pinned] if pinned else []:
            m.complete_load(keys)
        return _end_state(m, log)

    assert run(True) == run(False)


def test_arc_counts_a_ghost_key_named_twice_in_one_touch_once():
    targets = []
    for touched in ([0, 1, 0, 1], [0, 1]):
        m = OffloadingManager(4, "arc")
        for i in range(8):  # 0-3 evicted to B1
            m.complete_store(m.prepare_store([i]).keys_to_store)
        m.touch(touched)
        targets.append(m.policy.snapshot())
    assert targets[0] == targets[1]


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_a_key_named_twice_in_one_touch_is_one_use(policy, ops):
    """CachePolicy.touch's contract: a key named several times in one call is one use of
    it, at its first (most recent) position: the same state and the same victims as the call
    with the repeats dropped (vLLM 0.33's LRU and ARC move a resident key once per call too)."""
    def run(dedup: bool) -> tuple[dict, list]:
        m = OffloadingManager(8, policy)
        stored: list[str] = []
        log = []
        for op in ops:
            if op[0] == "store":
                out = _store_new(m, stored, op[1], log)
                if out is not None and op[2]:
                    m.complete_store(out.keys_to_store)
            elif op[0] == "touch":
                keys = [stored[i] for i in op[1] if i < len(stored)]
                keys = keys + keys[::-1]  # every key named again
                m.touch(list(dict.fromkeys(keys)) if dedup else keys)
        return _end_state(m, log)

    assert run(False) == run(True)


_REPEAT_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(1, 4), st.booleans()),  # n keys, complete?
        # any repeats in any order; indices past the stored keys name keys never stored
        st.tuples(st.just("touch"), st.lists(st.integers(0, 40), max_size=8)),
        st.tuples(st.just("complete"), st.just(0)),
    ),
    max_size=50,
)


@pytest.mark.parametrize("policy", POLICIES, ids=_name)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_REPEAT_OPS)
def test_a_touch_with_any_repeats_is_the_touch_of_its_first_occurrences(policy, ops):
    """CachePolicy.touch's contract on any pattern of repeats (not only [a, b, b, a]):
    resident, pending, evicted (ghost) and never-stored keys named several times in one call,
    in any order, leave the state and victims of the call with each key at its first
    position."""
    def run(dedup: bool) -> tuple[dict, list]:
        m = OffloadingManager(6, policy)
        n_stored = 0
        pending: list[str] = []
        log = []
        for op in ops:
            if op[0] == "store":
                keys = [f"k{n_stored + i}" for i in range(op[1])]
                n_stored += op[1]
                out = m.prepare_store(keys)
                log.append(None if out is None else out.evicted_keys)
                if out is not None:
                    if op[2]:
                        m.complete_store(out.keys_to_store)
                    else:
                        pending += out.keys_to_store
            elif op[0] == "touch":
                keys = [f"k{i}" for i in op[1]]
                m.touch(list(dict.fromkeys(keys)) if dedup else keys)
            elif pending:
                m.complete_store(pending)
                pending = []
        snap = m.policy.snapshot()
        for i in range(10):
            out = m.prepare_store([f"z{i}"])
            log.append(None if out is None else out.evicted_keys)
        return snap, log

    assert run(False) == run(True)
