"""A policy hook or ``evict`` that raises leaves the manager exactly as it was (session 14,
items 1a-1c of the defects earlier sessions noticed): the request-mode record of a failed
``prepare_store`` offer, the admission's answer for it, the pins of a ``prepare_load``
whose ``mark_non_evictable`` raised, and the oldest open request when the
``max_open_requests`` cap cannot finish it."""

from __future__ import annotations

import copy

import pytest

from kvtier import OffloadingManager, PolicyError, RequestStateError
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.types import OffloadingEvent


def without_policy(m: OffloadingManager) -> dict:
    """The manager's snapshot less the policy's part (a broken policy's own state may
    change: the PolicyError says so)."""
    return {k: v for k, v in m.snapshot().items() if k != "policy"}


class ShortLRU(LRUPolicy):
    """An LRU whose eviction returns one victim too few: a PolicyError in prepare_store."""

    name = "short-lru"

    def _evict(self, n, protected):
        return LRUPolicy._evict(self, n, protected)[:-1]


def _full_tier_with_request(offer_kind: str) -> OffloadingManager:
    """A full 4-block tier of ShortLRU, request "r" open with one load recorded; for
    ``"merged"`` the request also stored a block (so a later offer is recorded in
    ``keys``, not lazily)."""
    m = OffloadingManager(4 if offer_kind != "merged" else 5, ShortLRU)
    m.complete_store(m.prepare_store([1, 2, 3, 4]).keys_to_store)
    m.on_new_request("r")
    m.prepare_load([1], "r")
    m.complete_load([1], "r")
    if offer_kind == "merged":  # the request stores 9 itself (fills the tier), then loads 2
        m.complete_store(m.prepare_store([9], "r").keys_to_store)
        m.prepare_load([2], "r")
        m.complete_load([2], "r")
    return m


@pytest.mark.parametrize(("offer_kind", "offer"), [
    ("usual", [5, 6]),          # new keys only: recorded at insert (lazy)
    ("ready", [1, 5, 6]),       # a ready key with the new ones (recorded in keys)
    ("merged", [5, 6]),         # after the request's store and a load (merged record)
    ("merged", [2, 5, 6]),
])
def test_a_policy_error_in_request_mode_leaves_the_record_as_it_was(offer_kind, offer):
    # the record was written before the eviction: the failed offer stayed in it
    m = _full_tier_with_request(offer_kind)
    before = without_policy(m)
    stats = m.stats()
    with pytest.raises(PolicyError, match=r"short-lru.*evict\(2\) returned 1 victims"):
        m.prepare_store(offer, "r")
    assert without_policy(m) == before
    assert m.stats() == stats
    # and the request goes on as if the call had not been made: a store that fits records
    m.policy.__class__ = LRUPolicy  # repaired
    m.prepare_store(offer, "r")
    assert set(m.snapshot()["requests"][0][1]) >= set(offer)


def test_a_failed_store_without_room_still_records_its_offer():
    # vLLM's order (recorded before any early return) is kept where no PolicyError comes:
    # not enough evictable blocks, the offer names a ready key (not the lazy record)
    # (a guard of the deferral, which must not drop this record; it passed before too)
    m = OffloadingManager(3, "lru")
    m.complete_store(m.prepare_store([1, 2, 3]).keys_to_store)
    m.prepare_load([3])  # pinned outside the request
    m.on_new_request("r")
    m.prepare_load([1, 2], "r")  # all pinned: nothing evictable
    assert m.prepare_store([1, 5], "r") is None
    assert m.snapshot()["requests"][0][1] == (1, 2, 5)


@pytest.mark.parametrize("admission", ["adaptive", "tinylfu"])
@pytest.mark.parametrize("n_new", [1, 2])
def test_a_policy_error_takes_back_the_admissions_answer(admission, n_new):
    # the admission had counted the call's admitted keys: a PolicyError left them counted
    m = OffloadingManager(4, ShortLRU, admission=admission)
    keys = [1, 2, 3, 4]
    while len(m) < 4:  # looked up until the admission lets them all in
        for key in keys:
            m.lookup(key)
        out = m.prepare_store(keys)
        m.complete_store(out.keys_to_store)
    new = [5, 6][:n_new]
    for _ in range(3):
        for key in new:
            m.lookup(key)
    before = without_policy(m)
    with pytest.raises(PolicyError, match=rf"evict\({n_new}\)"):
        m.prepare_store(new)
    assert without_policy(m) == before


class PinHookRaises(LRUPolicy):
    """An LRU that does not share the manager's held state and whose pin hook raises."""

    name = "pin-hook-raises"
    fail = True

    def mark_non_evictable(self, keys):
        if self.fail:
            raise RuntimeError(f"mark_non_evictable({list(keys)}) failed")
        super().mark_non_evictable(keys)


@pytest.mark.parametrize("keys", [
    [1],            # the one-key path
    [1, 2],         # every key pinned by this call
    [3, 1],         # 3 already pinned: its count + 1, 1 newly pinned
    [1, 2, 1],      # a key named twice: one pin per occurrence
])
@pytest.mark.parametrize("req", [False, True])
def test_a_raising_pin_hook_leaves_prepare_load_without_effect(keys, req):
    # the pins (and the evictable count) were updated before the hook raised
    m = OffloadingManager(4, PinHookRaises)
    assert m._on_pin is not None
    m.complete_store(m.prepare_store([1, 2, 3, 4]).keys_to_store)
    m.policy.fail = False
    m.prepare_load([3])
    m.policy.fail = True
    ctx = None
    if req:
        m.on_new_request("r")
        ctx = "r"
    before = m.snapshot()
    stats = m.stats()
    with pytest.raises(RuntimeError, match="mark_non_evictable"):
        m.prepare_load(keys, ctx)
    assert m.snapshot() == before
    assert m.stats() == stats
    m.policy.fail = False
    assert m.prepare_load(keys, ctx) == [m.slot_of(k) for k in keys]  # nothing was left over
    assert m.stats().evictable == 4 - len(set(keys) | {3})


class FinishRaises(LRUPolicy):
    name = "finish-raises"
    fail = True

    def on_request_finished(self, keys, inserted, reused):
        if self.fail:
            raise RuntimeError("on_request_finished failed")
        super().on_request_finished(keys, inserted, reused)


def test_the_cap_finishes_the_oldest_request_before_dropping_it():
    # it was dropped first: when its finish raised, it was lost (a later finish of it
    # raised RequestStateError) and its use never applied
    m = OffloadingManager(4, FinishRaises, max_open_requests=2)
    m.complete_store(m.prepare_store([1, 2]).keys_to_store)
    m.on_new_request("old")
    m.prepare_load([1], "old")
    m.complete_load([1], "old")
    m.on_new_request("mid")
    before = m.snapshot()
    stats = m.stats()
    with pytest.raises(RuntimeError, match="on_request_finished failed"):
        m.on_new_request("new")
    assert m.snapshot() == before
    assert m.stats() == stats
    assert [ctx for ctx, *_ in m.snapshot()["requests"]] == ["old", "mid"]
    m.policy.fail = False
    m.on_new_request("new")  # the cap finishes "old" early now
    s = m.stats()
    assert (s.requests_open, s.requests_finished, s.requests_finished_early) == (2, 1, 1)
    m.on_request_finished("old")  # its late finish: ignored and counted
    assert m.stats().late_finishes == 1


def test_a_raising_finish_closes_the_request_uncounted():
    # documented: on_request_finished does not put the request back (that would cost every
    # finish a dict operation more); it is not counted as finished
    m = OffloadingManager(4, FinishRaises)
    m.complete_store(m.prepare_store([1]).keys_to_store)
    m.on_new_request("r")
    m.prepare_load([1], "r")
    with pytest.raises(RuntimeError, match="on_request_finished failed"):
        m.on_request_finished("r")
    assert m.stats().requests_finished == 0
    with pytest.raises(RequestStateError):
        m.on_request_finished("r")


class RaisingEq:
    """A key hash-equal to every other RaisingEq, whose ``==`` with another one raises."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, RaisingEq):
            raise ValueError(f"cannot compare RaisingEq({self.n})")
        return NotImplemented

    def __repr__(self) -> str:
        return f"RaisingEq({self.n})"


_A, _B = RaisingEq(1), RaisingEq(2)
_OPS = {
    "prepare_store one key": lambda m, c: m.prepare_store([_B], c),
    "prepare_store": lambda m, c: m.prepare_store([3, _B], c),
    "prepare_store evicting": lambda m, c: m.prepare_store([5, 6, _B], c),
    "lookup": lambda m, c: m.lookup(_B, c),
    "lookup_prefix": lambda m, c: m.lookup_prefix([1, _B], c),
    "touch": lambda m, c: m.touch([1, _B], c),
    "prepare_load": lambda m, c: m.prepare_load([1, _B], c),
    "prepare_load one key": lambda m, c: m.prepare_load([_B], c),
    "complete_load": lambda m, c: m.complete_load([_B], c),
    "missing": lambda m, c: m.missing([_B]),
}


@pytest.mark.parametrize("op", sorted(_OPS))
@pytest.mark.parametrize("policy", ["lru", "arc", "lfu", "s3fifo", "sieve"])
@pytest.mark.parametrize("req", [False, True])
def test_a_key_whose_eq_raises_propagates_its_error_and_changes_nothing(op, policy, req):
    # item 4: documented (docs/manager.md, "The rules"), not wrapped: the key's own error
    # comes out and the manager is as before; S3-FIFO's and SIEVE's touch mark the keys
    # before the raising one (the policy's state, documented)
    ctx = "r" if req else None
    m = OffloadingManager(4, policy)
    if req:
        m.on_new_request(ctx)
    m.complete_store(m.prepare_store([_A, 1, 2], ctx).keys_to_store)
    m.prepare_store([4], ctx)
    partial_touch = op == "touch" and policy in ("s3fifo", "sieve")
    before = without_policy(m) if partial_touch else m.snapshot()
    stats = m.stats()
    with pytest.raises(ValueError, match=r"cannot compare RaisingEq\(\d\)"):
        _OPS[op](m, ctx)
    assert m.stats() == stats
    assert (without_policy(m) if partial_touch else m.snapshot()) == before


# -- any exception out of a policy hook during prepare_store (session 15) -----------------
# Before: only a PolicyError took the admission's answer back; a raising _evict, insert,
# on_store, count_eligible or request mode's ghost-learning touch / on_store_miss left the
# admission's answer counted, and a raising insert / on_store left the new blocks pending
# with their slots taken (a caller that got the exception never completes them).


class _Raises:
    """A policy whose hook named by ``fail`` raises RuntimeError at its entry (before it
    changes anything of its own); ``victims``: what its last ``_evict`` returned; ``raised``:
    whether the hook named by ``fail`` was called."""

    fail = None
    raised = False
    victims = ()

    def _check(self, hook):
        if self.fail == hook:
            self.raised = True
            raise RuntimeError(f"{hook} failed")

    def _evict(self, n, protected):
        self._check("_evict")
        self.victims = super()._evict(n, protected)
        return self.victims

    def count_eligible(self, protected=()):
        self._check("count_eligible")
        return super().count_eligible(protected)

    def insert(self, keys):
        self._check("insert")
        super().insert(keys)

    def on_store(self, keys):
        self._check("on_store")
        super().on_store(keys)

    def touch(self, keys):
        self._check("touch")
        super().touch(keys)

    def mark_evictable(self, keys):
        self._check("mark_evictable")
        super().mark_evictable(keys)

    def remove(self, keys):
        self._check("remove")
        super().remove(keys)


class _MissRaises:
    """A ghost-learning hook of its own (the manager calls it instead of touch)."""

    def on_store_miss(self, keys):
        self._check("on_store_miss")
        super().on_store_miss(keys)


class HookRaises(_Raises, LRUPolicy):
    name = "hook-raises"


class MissHookRaises(_MissRaises, _Raises, LRUPolicy):
    name = "miss-hook-raises"


class ArcHookRaises(_MissRaises, _Raises, ARCPolicy):
    """ARC: its own on_store_miss, and it shares the manager's held state."""

    name = "arc-hook-raises"


def _filled(cls, admission: str, num_blocks: int, req: bool) -> OffloadingManager:
    """Blocks 1-4 stored and ready, 5-7 looked up often enough for any admission; request
    mode: "r" open, with a load of 1 recorded."""
    m = OffloadingManager(num_blocks, cls, admission=admission, enable_events=True)
    keys = [1, 2, 3, 4]
    while len(m) < 4:  # looked up until the admission lets them all in
        for key in keys:
            m.lookup(key)
        out = m.prepare_store(m.missing(keys))
        m.complete_store(out.keys_to_store)
    for _ in range(3):
        for key in (5, 6, 7):
            m.lookup(key)
    if req:
        m.on_new_request("r")
        m.prepare_load([1], "r")
        m.complete_load([1], "r")
    m.take_events()
    return m


_BEFORE_THE_STORE = ["_evict", "count_eligible", "touch", "on_store_miss"]
_AFTER_THE_STORE = ["insert", "on_store"]
_OFFERS = {
    "one key": [5],                # explicit mode, no TinyLFU: the one-key path
    "two keys": [5, 6],
    "a stored key first": [2, 5],  # 2 protected: count_eligible is asked
}


def _cases():
    for hook in _BEFORE_THE_STORE + _AFTER_THE_STORE:
        for offer in _OFFERS:
            for req in (False, True):
                if hook in ("touch", "on_store_miss") and not req:
                    continue  # ghost learning: request mode only
                for num_blocks in (4, 6):  # a full tier (the offer evicts) or room for it
                    if hook in ("_evict", "count_eligible") and num_blocks == 6:
                        continue  # not asked
                    yield hook, offer, req, num_blocks


@pytest.mark.parametrize(("hook", "offer", "req", "num_blocks"), list(_cases()))
@pytest.mark.parametrize("admission", ["all", "adaptive", "tinylfu"])
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_raising_hook_leaves_prepare_store_without_effect(
        policy, hook, offer, req, num_blocks, admission):
    cls = {"lru": MissHookRaises if hook == "on_store_miss" else HookRaises,
           "arc": ArcHookRaises}[policy]
    m = _filled(cls, admission, num_blocks, req)
    ctx = "r" if req else None
    before = m.snapshot()
    admission_before = copy.deepcopy(m.admission)
    m.policy.fail = hook
    try:
        out = m.prepare_store(_OFFERS[offer], ctx)
    except RuntimeError as error:
        assert str(error) == f"{hook} failed"  # propagated unchanged
    else:  # a hook the call does not reach (count_eligible: only for a protected key in
        # request mode, or through CachePolicy.evict; touch: not for ARC's ghost learning)
        assert not m.policy.raised, out
        return
    victims = list(m.policy.victims) if hook in _AFTER_THE_STORE else []
    expected = {k: v for k, v in before.items() if k != "policy"}
    if victims:  # evicted before the hook raised: they stay evicted, reported as such
        expected["free"] = before["free"] + [before["slot_of"][k] for k in victims]
        expected["slot_of"] = {k: s for k, s in before["slot_of"].items() if k not in victims}
        evictable, pending, pinned = before["counts"]
        expected["counts"] = (evictable - len(victims), pending, pinned)
        counters = list(before["counters"])
        counters[7] += len(victims)  # evictions
        expected["counters"] = tuple(counters)
        expected["events"] = before["events"] + [OffloadingEvent(tuple(victims), True)]
        if admission == "tinylfu":  # learns the victims' frequency, their slots free
            admission_before.evicted(victims)
            admission_before.released(victims)
    if admission_before is not None:  # its answer taken back
        expected["admission"] = admission_before.snapshot()
    assert without_policy(m) == expected
    # nothing left pending, no slot taken: a retry stores the blocks (the hooks raised at
    # their entry, so the policy agrees with the manager)
    m.policy.fail = None
    out = m.prepare_store(_OFFERS[offer], ctx)
    assert out is not None and out.keys_to_store
    m.complete_store(out.keys_to_store)
    s = m.stats()
    assert s.pending == 0 and s.used + s.free == num_blocks
    # the policy's evictable blocks are the manager's
    ready = {key for key in m.snapshot()["slot_of"] if m.ref_count(key) == 0}
    assert set(m.policy.evict(len(ready))) == ready


@pytest.mark.parametrize(("admission", "offer"), [
    (admission, offer)
    for admission in ("all", "adaptive", "tinylfu")
    for offer in ([1], [1, 2], [8], [8, 9], [1, 8])
    if admission != "all" or 8 not in offer  # (admitted: the test above)
])
@pytest.mark.parametrize("req", [False, True])
def test_a_raising_on_store_of_a_call_that_stores_nothing_changes_nothing(
        admission, offer, req):
    # every key stored already, or every new key refused by the admission (8 and 9 never
    # looked up: TinyLFU's estimate and second sight refuse them); the skipped count and
    # TinyLFU's count of refused blocks were kept
    m = _filled(HookRaises, admission, 4, req)
    if admission == "adaptive":
        m.admission.selective = True  # second sight (its own duel would take long to)
    ctx = "r" if req else None
    before = m.snapshot()
    m.policy.fail = "on_store"
    with pytest.raises(RuntimeError, match="on_store failed"):
        m.prepare_store(offer, ctx)
    assert without_policy(m) == {k: v for k, v in before.items() if k != "policy"}


class InsertRaisingLRU(LRUPolicy):
    """An LRU whose ``insert`` raises (before changing anything) while ``boom`` is set."""

    name = "insert-raising-lru"
    boom = False

    def insert(self, keys):
        if self.boom:
            raise RuntimeError("insert")
        super().insert(keys)


def test_tinylfu_counts_the_slots_an_evicting_store_that_raised_left_free():
    """Found by a review pass (session 15): when ``insert`` raised in a store that evicted,
    the victims stay evicted and their slots free, but TinyLFU still counted them held
    (``undo_admit`` takes back only what its answer added, nothing in a full tier): it
    filtered the next new block by the victims' frequency as if the tier were full, and
    refused it though a slot was free. The victims' slots are now counted free, as a
    failed ``complete_store``'s are (``released``)."""
    m = OffloadingManager(2, InsertRaisingLRU, admission="tinylfu")
    m.complete_store(m.prepare_store([1, 2]).keys_to_store)
    for _ in range(3):  # 3's estimate above the victims' mean: admitted into the full tier
        m.lookup_prefix([3])
    m.policy.boom = True
    with pytest.raises(RuntimeError, match="insert"):
        m.prepare_store([3])
    m.policy.boom = False
    assert m.stats().used == 1 and m.stats().evictions == 1  # the eviction stands
    out = m.prepare_store([4])  # never looked up: admitted only into a free slot
    assert out.keys_to_store == [4] and out.evicted_keys == []
    assert m.stats().skipped_stores == 0


@pytest.mark.parametrize("req", [False, True])
def test_a_store_that_raised_during_the_fill_is_not_counted_in_the_fills_share(req):
    """Noticed in session 15, fixed in session 17: during the fill the adaptive admission
    counts each admitted store call's new blocks, and those at its sampled depths, to size
    its shadows at the fill's end (``_end_fill``); a store that raised stored nothing but
    stayed counted. ``undo_admit`` now takes the counts back (``snapshot()["fill"]``)."""
    m = OffloadingManager(100_000, InsertRaisingLRU, admission="adaptive")
    adm = m.admission
    assert adm.stride > 1 and adm._filling
    ctx = "r" if req else None
    if req:
        m.on_new_request(ctx)
    keys = list(range(10))
    assert m.lookup_prefix(keys) == 0
    before = m.snapshot()
    assert before["admission"]["fill"] == (0, 0)
    m.policy.boom = True
    with pytest.raises(RuntimeError, match="insert"):
        m.prepare_store(keys, ctx)
    assert m.snapshot() == before
    m.policy.boom = False
    m.complete_store(m.prepare_store(keys, ctx).keys_to_store)
    s = adm.stride  # depths 0-9: the sampled ones are the multiples of the stride
    assert adm.snapshot()["fill"] == (10, len(range(0, 10, s)))


# -- mark_evictable / remove raising in complete_store and complete_load (session 17) -----
# Before: the blocks were taken out of the pending set (or their pins released) before the
# hook ran, so a raising hook left a block neither pending nor counted evictable (a failed
# store's block read as ready, its slot still taken), or a loaded block unpinned but not
# counted evictable (docs/manager.md, "Other hooks", before session 17).


@pytest.mark.parametrize("keys", [[5], [5, 6], [6, 5, 6], [5, 9]])
@pytest.mark.parametrize(("hook", "success"), [("mark_evictable", True), ("remove", False)])
@pytest.mark.parametrize("req", [False, True])
def test_a_raising_completion_hook_leaves_complete_store_without_effect(
        keys, hook, success, req):
    m = _filled(HookRaises, "all", 8, req)
    ctx = "r" if req else None
    m.prepare_store([5, 6], ctx)  # pending
    before = m.snapshot()
    m.policy.fail = hook
    with pytest.raises(RuntimeError, match=f"{hook} failed"):
        m.complete_store(keys, ctx, success=success)
    assert m.policy.raised
    assert without_policy(m) == {k: v for k, v in before.items() if k != "policy"}
    assert all(m.ref_count(key) == -1 for key in (5, 6))  # still pending
    m.policy.fail = None  # the caller tries again: the blocks complete as usual
    m.complete_store(keys, ctx, success=success)
    s = m.stats()
    named = {5, 6} & set(keys)
    assert s.used == 4 + 2 - (0 if success else len(named))
    assert s.pending == 2 - len(named)
    assert s.used + s.free == 8
    ready = {key for key in m.snapshot()["slot_of"] if m.ref_count(key) == 0}
    assert set(m.policy.evict(len(ready))) == ready


@pytest.mark.parametrize("release", [[1], [1, 2], [2, 1, 2], [3, 2], [1, 1, 2]])
def test_a_raising_mark_evictable_leaves_complete_load_without_effect(release):
    # 1 pinned once, 2 twice, 3 once: a release that frees a block calls mark_evictable
    m = _filled(HookRaises, "all", 8, False)
    m.prepare_load([1, 2, 3])
    m.prepare_load([2])
    if release == [1, 1, 2]:
        m.prepare_load([1])  # 1 pinned twice, released twice: freed
    before = m.snapshot()
    m.policy.fail = "mark_evictable"
    with pytest.raises(RuntimeError, match="mark_evictable failed"):
        m.complete_load(release)
    assert m.policy.raised
    assert m.snapshot() == before  # (the hook raised before changing the policy)
    m.policy.fail = None
    m.complete_load(release)
    assert m.stats().pinned == len({1, 2, 3} - set(release)) + (
        1 if release.count(2) == 1 else 0)
