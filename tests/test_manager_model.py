"""Property-based test: random operation sequences against an obviously-correct model.

Runs on every registered policy. The model keeps, per stored key, its ref count
(-1 pending, 0 evictable, >0 pinned) and, for LRU, a use stamp set only by a use (a store or
a touch: logical recency, pins and completions never move a block), so LRU's victims are
predicted exactly; for every other policy the contract is checked: atomic failure, only evictable and
unprotected victims, exactly the shortfall evicted, and all counts consistent. A second test
adds the admission modes and request mode, whose choices the model cannot predict, and checks
the rules that hold whatever they decide (a None store and a refused call change nothing).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier import BlockStateError, LookupResult, OffloadingManager, available_policies
from kvtier.policies import ARCPolicy, LFUPolicy, LRUPolicy, S3FIFOPolicy, SievePolicy
from kvtier.policies.prefix import prefix_aware

sys.path.insert(0, str(Path(__file__).parent / "policies"))
from example_policy import FIFOPolicy  # noqa: E402  the docs/manager.md example

# None and a tuple are valid block keys too (a policy must not use None as a marker)
KEYS = st.sampled_from([0, 1, 2, 3, None, ("t", 1)])
KEY_LISTS = st.lists(KEYS, min_size=0, max_size=5)
DISTINCT = st.lists(KEYS, min_size=1, max_size=3, unique=True)
# "store" and "touch" are listed several times: they build the ready blocks and the recency
# order whose eviction choices are checked; rarer ops still appear in most sequences.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), DISTINCT),
        st.tuples(st.just("store"), DISTINCT),
        st.tuples(st.just("touch"), DISTINCT),
        st.tuples(st.just("touch"), DISTINCT),
        st.tuples(st.just("lookup"), KEYS),
        st.tuples(st.just("lookup_prefix"), KEY_LISTS),
        st.tuples(st.just("touch"), KEY_LISTS),
        st.tuples(st.just("prepare_load"), KEY_LISTS),
        st.tuples(st.just("complete_load"), KEY_LISTS),
        st.tuples(st.just("prepare_store"), KEY_LISTS),
        st.tuples(st.just("store"), KEY_LISTS),
        st.tuples(st.just("complete_store"), KEY_LISTS, st.booleans()),
        st.tuples(st.just("reset_cache")),
        # complete what is in flight, so the cache does not clog with pinned/pending blocks
        st.tuples(st.just("finish_stores"), st.booleans(), st.randoms(use_true_random=False)),
        st.tuples(st.just("finish_loads"), st.randoms(use_true_random=False)),
        st.tuples(st.just("load_ready"), st.randoms(use_true_random=False)),
    ),
    min_size=15,
    max_size=80,
)


class Model:
    """The obviously-correct reference: a dict of ref counts and an LRU use stamp per key."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ref: dict[int, int] = {}
        self.stamp: dict[int, int] = {}
        self.clock = itertools.count()

    def use(self, keys) -> None:
        for key in reversed(keys):
            self.stamp[key] = next(self.clock)

    def lookup(self, key) -> LookupResult:
        if key not in self.ref:
            return LookupResult.MISS
        return LookupResult.HIT_PENDING if self.ref[key] < 0 else LookupResult.HIT

    def lru_victims(self, n, protected):
        order = sorted(
            (k for k, r in self.ref.items() if r == 0 and k not in protected),
            key=self.stamp.__getitem__,
        )
        return order[:n] if len(order) >= n else None


def check_invariants(m: OffloadingManager, model: Model) -> None:
    snap = m.snapshot()
    assert set(snap["slot_of"]) == set(model.ref)
    slots = list(snap["slot_of"].values())
    assert len(set(slots)) == len(slots)
    assert all(0 <= s < m.num_blocks for s in slots)
    for key, slot in snap["slot_of"].items():
        assert snap["ref"][slot] == model.ref[key]
    # the policy's evictable keys are exactly the model's ref-count-0 keys
    evictable = {k for k, r in model.ref.items() if r == 0}
    assert m.policy.count_eligible() == len(evictable)
    assert m.policy.count_eligible(evictable) == 0
    s = m.stats()
    assert s.used == len(model.ref)
    assert s.pending == sum(1 for r in model.ref.values() if r < 0)
    assert s.pinned == sum(1 for r in model.ref.values() if r > 0)
    assert s.evictable == sum(1 for r in model.ref.values() if r == 0)
    assert s.free == m.num_blocks - s.used


def run(policy: str, capacity: int, ops) -> None:
    m = OffloadingManager(capacity, policy)
    model = Model(capacity)
    exact_lru = policy == "lru"
    for op in ops:
        name = op[0]
        if name == "finish_stores":
            pending = sorted((k for k, r in model.ref.items() if r < 0), key=repr)
            op[2].shuffle(pending)
            op = ("complete_store", pending, op[1])
            name = op[0]
        elif name == "load_ready":
            ready = sorted((k for k, r in model.ref.items() if r >= 0), key=repr)
            op[1].shuffle(ready)
            op = ("prepare_load", ready[:3])
            name = op[0]
        elif name == "finish_loads":
            pinned = sorted((k for k, r in model.ref.items() if r > 0), key=repr)
            op[1].shuffle(pinned)
            op = ("complete_load", pinned)
            name = op[0]
        if name == "lookup":
            assert m.lookup(op[1]) is model.lookup(op[1])
        elif name == "lookup_prefix":
            expected = 0
            for key in op[1]:
                if model.lookup(key) is not LookupResult.HIT:
                    break
                expected += 1
            assert m.lookup_prefix(op[1]) == expected
        elif name == "touch":
            m.touch(op[1])
            model.use([k for k in op[1] if k in model.ref])  # pinned and pending ones too
        elif name == "prepare_load":
            keys = op[1]
            ok = all(model.ref.get(k, -1) >= 0 for k in keys)
            before = m.snapshot()
            if ok:
                slots = m.prepare_load(keys)
                assert slots == [m.snapshot()["slot_of"][k] for k in keys]
                for k in keys:
                    model.ref[k] += 1
            else:
                with pytest.raises(BlockStateError):
                    m.prepare_load(keys)
                assert m.snapshot() == before
        elif name == "complete_load":
            keys = op[1]
            need: dict[int, int] = {}
            for k in keys:
                need[k] = need.get(k, 0) + 1
            ok = all(model.ref.get(k, 0) >= c for k, c in need.items())
            before = m.snapshot()
            if ok:
                m.complete_load(keys)
                for k in keys:  # a release moves nothing
                    model.ref[k] -= 1
            else:
                with pytest.raises(BlockStateError):
                    m.complete_load(keys)
                assert m.snapshot() == before
        elif name in ("prepare_store", "store"):
            keys = op[1]
            new = list(dict.fromkeys(k for k in keys if k not in model.ref))
            shortfall = len(new) - (capacity - len(model.ref))
            eligible = [k for k, r in model.ref.items() if r == 0 and k not in keys]
            before = m.snapshot()
            out = m.prepare_store(keys)
            if shortfall > len(eligible):
                assert out is None
                assert m.snapshot() == before
                continue
            if out is None:  # only a policy-level refusal could explain it: not allowed
                raise AssertionError("prepare_store refused although enough eligible blocks")
            assert out.keys_to_store == new
            assert len(out.evicted_keys) == max(0, shortfall)
            assert len(set(out.evicted_keys)) == len(out.evicted_keys)
            for k in out.evicted_keys:
                assert model.ref.get(k) == 0 and k not in keys
            if exact_lru:
                assert out.evicted_keys == model.lru_victims(max(0, shortfall), set(keys))
            for k in out.evicted_keys:
                del model.ref[k]
            for k in new:
                model.ref[k] = -1
            model.use(new)  # stored: a use, the call's first new key most recent
            if name == "store":  # prepare_store immediately followed by complete_store
                m.complete_store(out.keys_to_store)
                for k in new:
                    model.ref[k] = 0
        elif name == "complete_store":
            keys, success = op[1], op[2]
            m.complete_store(keys, success=success)
            # each pending key once; a completed store moves nothing
            done = [k for k in dict.fromkeys(keys) if model.ref.get(k) == -1]
            for k in done:
                if success:
                    model.ref[k] = 0
                else:
                    del model.ref[k]
        elif name == "reset_cache":
            m.reset_cache()
            model.ref.clear()
        check_invariants(m, model)


@pytest.mark.parametrize(
    "policy", available_policies() + [FIFOPolicy], ids=lambda p: getattr(p, "name", p)
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(min_value=1, max_value=4), ops=OPS)
def test_random_operations_match_reference_model(policy, capacity, ops):
    run(policy, capacity, ops)


# the prefix wrappers' dead-leaf path needs hundreds of stores before it may switch on; these
# variants demote from the start, so random sequences exercise it too
@pytest.mark.parametrize(
    "policy",
    [prefix_aware(inner, f"prefix-{inner.name}-always", leaf_mode="always")
     for inner in (LRUPolicy, ARCPolicy, S3FIFOPolicy, SievePolicy, LFUPolicy)],
    ids=lambda cls: cls.name,
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(min_value=1, max_value=4), ops=OPS)
def test_random_operations_match_reference_model_always_demoting(policy, capacity, ops):
    run(policy, capacity, ops)


# Admission and request mode on top: the model cannot predict what admission stores, so this
# checks the rules that hold whatever it decides. A store that returns None and a call that
# raises change nothing (request mode: a failed store still records its offer, as vLLM);
# what a store returns is consistent with the state before it.
ADMISSION_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), KEY_LISTS, st.sampled_from([None, "r"])),
        st.tuples(st.just("store"), KEY_LISTS, st.sampled_from([None, "r"])),
        st.tuples(st.just("lookup_prefix"), KEY_LISTS),
        st.tuples(st.just("prepare_load"), KEY_LISTS),
        st.tuples(st.just("complete_load"), KEY_LISTS),
        st.tuples(st.just("complete_store"), KEY_LISTS, st.booleans()),
        st.tuples(st.just("touch"), KEY_LISTS),
        st.tuples(st.just("request"),),
    ),
    min_size=10,
    max_size=60,
)


@pytest.mark.parametrize("admission", [{"store_threshold": 2}, {"admission": "adaptive"},
                                       {"admission": "tinylfu"}], ids=str)
@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "prefix-lru"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(min_value=1, max_value=3), ops=ADMISSION_OPS)
def test_admission_and_request_mode_keep_the_atomic_rules(policy, admission, capacity, ops):
    m = OffloadingManager(capacity, policy, **admission)
    for op in ops:
        before = m.snapshot()
        name = op[0]
        if name == "store":
            keys, ctx = op[1], op[2]
            out = m.prepare_store(keys, ctx)
            after = m.snapshot()
            if out is None:
                if ctx in [r[0] for r in before["requests"]]:
                    before.pop("requests")
                    after.pop("requests")
                assert after == before
                continue
            assert len(set(out.keys_to_store)) == len(out.keys_to_store)
            for k in out.keys_to_store:
                assert k in keys and k not in before["slot_of"]
            for k in out.evicted_keys:
                assert k not in keys and k in before["slot_of"]
                assert k not in before["pending_keys"] and m.ref_count(k) is None
            m.complete_store(out.keys_to_store, success=True)
        elif name == "request":
            open_ = [r[0] for r in before["requests"]]
            if "r" in open_:
                m.on_request_finished("r")
            else:
                m.on_new_request("r")
        elif name in ("prepare_load", "complete_load"):
            try:
                getattr(m, name)(op[1])
            except BlockStateError:
                assert m.snapshot() == before
        elif name == "complete_store":
            m.complete_store(op[1], success=op[2])
        else:
            getattr(m, name)(op[1])
        s = m.stats()
        assert s.used == len(m.snapshot()["slot_of"]) <= capacity
        assert m.policy.count_eligible() == s.evictable
