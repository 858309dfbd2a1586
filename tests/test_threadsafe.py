"""Issue #12 fault 2: one manager shared by many threads through ThreadSafeManager.

Eight threads run the engine's protocol (lookup_prefix + prepare_load under the lock, touch,
prepare_store, complete_store, complete_load) on overlapping keys with a 1 us switch
interval, so threads switch inside the manager's methods. A checker thread takes snapshots
under the lock meanwhile. Invariants: no two keys share a slot, no slot is both free and used,
the counts agree with the key sets, and at the end nothing is pinned or pending.
"""

from __future__ import annotations

import random
import sys
import threading

import pytest

from kvtier import BlockStateError, OffloadingManager, RequestStateError
from kvtier.threadsafe import ThreadSafeManager

THREADS = 8
STEPS = 400


def check_invariants(snap: dict, num_blocks: int) -> None:
    slot_of = snap["slot_of"]
    slots = list(slot_of.values())
    assert len(set(slots)) == len(slots), "two keys share a slot"
    assert all(0 <= s < num_blocks for s in slots)
    assert not set(snap["free"]) & set(slots), "a used slot is also free"
    assert len(set(snap["free"])) == len(snap["free"])
    assert snap["pending_keys"] <= set(slot_of)
    evictable, pending, pinned = snap["counts"]
    assert pending == len(snap["pending_keys"])
    assert evictable + pending + pinned == len(slot_of)
    assert len(slot_of) + len(snap["free"]) == snap["next_fresh"]


def worker(m: ThreadSafeManager, seed: int, errors: list) -> None:
    rng = random.Random(seed)
    try:
        for _ in range(STEPS):
            # requests share prefixes: a few roots, chains of up to 6 blocks
            root = rng.randrange(6)
            keys = [(root, i) for i in range(rng.randrange(1, 7))]
            with m.lock:  # the lookup and the pins it leads to see one state
                hits = m.lookup_prefix(keys)
                loaded = keys[:hits]
                if loaded:
                    m.prepare_load(loaded)
            m.touch(keys)
            out = m.prepare_store(keys[hits:]) if hits < len(keys) else None
            if out is not None and out.keys_to_store:
                assert len(set(out.block_ids)) == len(out.block_ids)
                m.complete_store(out.keys_to_store, success=rng.random() > 0.1)
            if loaded:
                m.complete_load(loaded)
            if rng.random() < 0.05:
                m.stats()
                len(m)
                (root, 0) in m
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def _run_workers(worker, m, errors: list) -> None:
    """``worker(m, seed, errors)`` on THREADS threads (seeds 0..THREADS-1), with a 1 us switch
    interval so that they interleave often; returns when all have ended."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(m, seed, errors))
                   for seed in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "prefix-lru"])
def test_many_threads_keep_the_manager_consistent(policy):
    m = ThreadSafeManager(OffloadingManager(16, policy))
    errors: list = []
    stop = threading.Event()

    def checker():
        while not stop.is_set():
            with m.lock:
                snap = m.snapshot()
            try:
                check_invariants(snap, 16)
            except AssertionError as exc:
                errors.append(exc)
                return

    check = threading.Thread(target=checker)
    check.start()
    try:
        _run_workers(worker, m, errors)
    finally:
        stop.set()
        check.join()
    assert not errors, errors[:3]
    snap = m.snapshot()
    check_invariants(snap, 16)
    s = m.stats()
    assert s.pinned == 0 and s.pending == 0 and s.evictable == s.used == len(m)
    assert s.free == 16 - s.used
    assert s.hits + s.misses + s.pending_hits == s.lookups > 0


def test_the_wrapper_forwards_the_public_api_and_hides_private_state():
    m = ThreadSafeManager(OffloadingManager(4, "lru"))
    out = m.prepare_store(["a", "b"])
    assert m.num_blocks == 4 and m.ref_count("a") == -1
    m.complete_store(out.keys_to_store)
    assert "a" in m and len(m) == 2 and m.lookup_prefix(["a", "b", "c"]) == 2
    assert m.prepare_store.__doc__ == OffloadingManager.prepare_store.__doc__
    assert m.manager.stats() == m.stats()
    with pytest.raises(AttributeError, match="private attribute '_slot_of'"):
        m._slot_of  # noqa: B018
    with pytest.raises(AttributeError):
        m.no_such_method  # noqa: B018
    with pytest.raises(BlockStateError):  # the manager's own errors pass through
        m.complete_load(["a"])
    with pytest.raises(TypeError, match="context manager"):
        ThreadSafeManager(OffloadingManager(4), lock=object())
    # newcomer finding: a plain Lock deadlocked at the first call inside `with m.lock:`
    with pytest.raises(TypeError, match="not re-entrant"):
        ThreadSafeManager(OffloadingManager(4), lock=threading.Lock())
    # and a semaphore likewise (session 9 newcomer note): `with m.lock: m.lookup(...)`
    # blocked forever on a Semaphore(1)
    for semaphore in (threading.Semaphore(1), threading.BoundedSemaphore(1)):
        with pytest.raises(TypeError, match="Semaphore, which is not re-entrant"):
            ThreadSafeManager(OffloadingManager(4), lock=semaphore)
    assert ThreadSafeManager(OffloadingManager(4), lock=threading.RLock()).prepare_store(["a"])


def test_a_lock_that_is_not_re_entrant_under_another_type_is_refused():
    """Found by a newcomer session: ``threading.Condition(threading.Lock())`` (and a
    multiprocessing Lock) passed the type checks, and ``with m.lock: m.lookup("a")`` then
    blocked forever. The constructor now tries the lock: taken once, it must be taken again
    by the same thread."""
    import multiprocessing

    for lock in (threading.Condition(threading.Lock()), multiprocessing.Lock()):
        with pytest.raises(TypeError, match="not re-entrant"):
            ThreadSafeManager(OffloadingManager(4), lock=lock)
        assert lock.acquire(False)  # the probe left it free
        lock.release()
    for lock in (threading.Condition(), threading.Condition(threading.RLock()),
                 multiprocessing.RLock()):
        m = ThreadSafeManager(OffloadingManager(4), lock=lock)
        with m.lock:
            assert m.prepare_store(["a"]) is not None
        assert lock.acquire(False)  # the probe released what it took
        lock.release()


def test_setting_a_public_attribute_sets_it_on_the_manager():
    # newcomer finding: `m.enable_events = True` on the wrapper created a wrapper attribute;
    # the manager kept recording no events, and m.enable_events read back True (silently
    # wrong). Writes of public names go to the manager, under the lock.
    m = ThreadSafeManager(OffloadingManager(4, "lru"))
    m.enable_events = True
    assert m.manager.enable_events is True and "enable_events" not in vars(m)
    out = m.prepare_store(["a"])
    m.complete_store(out.keys_to_store)
    assert [e.keys for e in m.take_events()] == [("a",)]
    with pytest.raises(AttributeError, match="private attribute '_pins'"):
        m._pins = {}
    assert m.manager._pins == {}
    # the lock the cached methods took stays the one `with m.lock:` takes: no replacing it
    lock = m.lock
    with pytest.raises(AttributeError, match="'lock' is set once"):
        m.lock = threading.RLock()
    with pytest.raises(AttributeError, match="'manager' is set once"):
        m.manager = OffloadingManager(4)
    assert m.lock is lock and not hasattr(m.manager, "lock")


def test_every_call_holds_the_lock():
    """A method blocks while another thread holds the lock."""
    m = ThreadSafeManager(OffloadingManager(4, "lru"))
    done = threading.Event()
    with m.lock:
        t = threading.Thread(target=lambda: (m.prepare_store(["x"]), done.set()))
        t.start()
        assert not done.wait(0.2)  # waiting for the lock
        assert len(m.manager) == 0
    assert done.wait(10)
    t.join()
    assert "x" in m


def test_wrapper_refuses_what_is_not_a_manager():
    with pytest.raises(TypeError, match="wraps an OffloadingManager"):
        ThreadSafeManager(None)  # type: ignore[arg-type]


def test_a_thread_safe_manager_is_not_wrapped_again():
    """Found by a newcomer session: ThreadSafeManager(ThreadSafeManager(m)) was accepted: two
    locks, taken outer-then-inner by callers of the outer wrapper and inner-then-outer by a
    thread holding the inner lock and calling the outer one (a lock-order deadlock), for no
    gain. Refused, naming the rule; the inner wrapper is unchanged and still works."""
    inner = ThreadSafeManager(OffloadingManager(4, "lru"))
    with pytest.raises(TypeError, match=r"manager is already a ThreadSafeManager"):
        ThreadSafeManager(inner)
    with pytest.raises(TypeError, match=r"manager is already a ThreadSafeManager"):
        ThreadSafeManager(inner, threading.RLock())
    inner.complete_store(inner.prepare_store([1]).keys_to_store)
    assert inner.lookup_prefix([1]) == 1
    ThreadSafeManager(inner.manager)  # the manager itself may be wrapped with another lock


def test_metrics_collector_takes_the_thread_safe_wrapper():
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from kvtier.metrics import TierCollector

    m = ThreadSafeManager(OffloadingManager(4, "lru"))
    out = m.prepare_store([1, 2])
    m.complete_store(out.keys_to_store)
    registry = CollectorRegistry()
    registry.register(TierCollector({"host": m}))
    text = generate_latest(registry).decode()
    assert 'tier="host"' in text


def test_lock_and_manager_cannot_be_deleted_and_set_again():
    """Found by a newcomer session: ``del m.lock`` then ``m.lock = threading.RLock()`` got
    round the set-once rule. The forwarded methods kept the first lock, so a thread inside
    ``with m.lock:`` no longer held off another thread's ``m.prepare_store``: a compound
    step silently stopped being atomic. Deleting ``lock`` or ``manager`` is refused; other
    public deletions go to the manager, as assignments do."""
    m = ThreadSafeManager(OffloadingManager(4, "lru"))
    m.prepare_store(["a"])  # a forwarded method, cached with the first lock
    lock = m.lock
    for name in ("lock", "manager"):
        with pytest.raises(AttributeError, match=rf"'{name}' is set once, by the constructor, "
                                                 "and cannot be deleted"):
            delattr(m, name)
    with pytest.raises(AttributeError, match="'lock' is set once"):
        m.lock = threading.RLock()
    assert m.lock is lock
    with pytest.raises(AttributeError, match="private attribute '_pins'"):
        del m._pins
    assert m.manager._pins == {}
    # the manager's own attributes: deleted there (a property without deleter refuses)
    with pytest.raises(AttributeError):
        del m.enable_events
    assert m.manager.enable_events is False
    # so `with m.lock:` still excludes the other threads' calls
    done = threading.Event()
    with m.lock:
        t = threading.Thread(target=lambda: (m.prepare_store(["x"]), done.set()))
        t.start()
        assert not done.wait(0.2)
    assert done.wait(10)
    t.join()


def test_admission_settings_are_read_only_through_the_wrapper_and_on_the_manager():
    """Found by a newcomer session: the wrapper forwards assignments to the manager (as
    documented), and ``store_threshold``, ``max_tracker_size`` and ``admission_mode`` were
    plain attributes there: ``m.store_threshold = 2`` was taken, changed nothing until the
    next ``reset_cache()``, which then ran a lookup tracker beside the adaptive admission
    (a combination the constructor refuses), and ``"2"`` made ``reset_cache()`` raise a bare
    "'>=' not supported between instances of 'str' and 'int'". They are read-only now, as
    ``num_blocks``."""
    for wrap in (False, True):
        plain = OffloadingManager(8, "lru", admission="adaptive", max_tracker_size=100)
        m = ThreadSafeManager(plain) if wrap else plain
        for name, value in (("store_threshold", 2), ("store_threshold", "2"),
                            ("max_tracker_size", 5), ("admission_mode", "all")):
            with pytest.raises(AttributeError, match=rf"^{name} is fixed at construction "
                                                     r"\(admission='adaptive', "
                                                     r"store_threshold=1, "
                                                     r"max_tracker_size=100\)"):
                setattr(m, name, value)
        assert (m.store_threshold, m.max_tracker_size, m.admission_mode) == (1, 100, "adaptive")
        m.reset_cache()
        assert plain._tracker is None and plain.admission is not None
    m = OffloadingManager(8, "lru", store_threshold=3)
    assert m.store_threshold == 3 and m._tracker is not None


# -- random operation mixes, replayed serially ----------------------------------------------

_RECORDED = ("lookup", "lookup_prefix", "prepare_load", "complete_load", "touch",
             "prepare_store", "complete_store", "on_new_request", "on_request_finished",
             "reset_cache", "take_events", "stats", "slot_of", "missing", "ref_count")


class _Recording(OffloadingManager):
    """Logs each public call (arguments, result or error) in the order the calls ran, and
    checks the state after each; the log is appended to inside the call, so under the
    wrapper's lock its order is the serial order."""

    log: list | None = None
    lock: object = None


def _recorded(name):
    import copy

    base = getattr(OffloadingManager, name)

    def call(self, *args, **kwargs):
        if self.log is None:
            return base(self, *args, **kwargs)
        assert self.lock._is_owned(), f"{name} ran without the wrapper's lock"
        logged = copy.deepcopy((args, kwargs))
        before = OffloadingManager.snapshot(self)
        try:
            result = base(self, *args, **kwargs)
        except Exception as exc:
            # bad calls raise and leave the manager unchanged (README, "Using the manager")
            assert OffloadingManager.snapshot(self) == before, f"{name}{logged} changed state"
            self.log.append((name, logged, ("error", type(exc).__name__, str(exc))))
            raise
        self.log.append((name, logged, ("ok", copy.deepcopy(result))))
        snap = OffloadingManager.snapshot(self)
        check_invariants(snap, self.num_blocks)
        assert all(r >= -1 for r in snap["ref"]), "a negative ref count"
        if name == "prepare_store" and result is not None:
            held = {k for k, s in before["slot_of"].items() if before["ref"][s]}
            assert not held & set(result.evicted_keys), "evicted a pinned or pending block"
        return result

    call.__name__ = name
    return call


for _name in _RECORDED:
    setattr(_Recording, _name, _recorded(_name))


def mixed_worker(m: ThreadSafeManager, seed: int, errors: list) -> None:
    """Every public operation at random, request mode included, and a rare reset_cache (after
    which this thread's own pins and stores may be gone: BlockStateError, taken as such)."""
    rng = random.Random(seed)
    pins: list = []
    stores: list = []
    ctx = None
    try:
        for step in range(STEPS // 2):
            keys = [rng.randrange(5) * 100 + i for i in range(rng.randrange(1, 6))]
            op = rng.random()
            try:
                if op < 0.1:
                    m.lookup(keys[-1], ctx)
                elif op < 0.3:
                    with m.lock:
                        n = m.lookup_prefix(keys, ctx)
                        if n:
                            pins.append(keys[:n])
                            m.prepare_load(keys[:n], ctx)
                elif op < 0.4 and pins:
                    m.complete_load(pins.pop(rng.randrange(len(pins))), ctx)
                elif op < 0.45:
                    m.touch([*keys, 999], ctx)
                elif op < 0.6:
                    out = m.prepare_store(keys, ctx)
                    if out is not None and out.keys_to_store:
                        stores.append(out.keys_to_store)
                elif op < 0.7 and stores:
                    m.complete_store(stores.pop(rng.randrange(len(stores))), ctx,
                                     success=rng.random() > 0.2)
                elif op < 0.76:
                    if ctx is None:
                        ctx = (seed, step)
                        m.on_new_request(ctx)
                    else:
                        ctx, finished = None, ctx
                        m.on_request_finished(finished)
                elif op < 0.765:
                    m.reset_cache()
                elif op < 0.8:
                    m.take_events()
                elif op < 0.9:
                    m.stats()
                else:
                    m.slot_of(keys[0]), m.ref_count(keys[0]), m.missing(keys)
            except (BlockStateError, RequestStateError):
                pass  # a reset_cache of another thread dropped what this one held
            assert not m.lock._is_owned(), "the lock stayed held after a call"
        for keys in stores:
            m.complete_store(keys)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.parametrize("policy,kwargs", [
    ("lru", {}), ("arc", {"admission": "adaptive"}),
    ("s3fifo", {"store_threshold": 2, "max_open_requests": 2}),
    ("prefix-lru", {"admission": "tinylfu"}),
])
def test_random_operation_mixes_equal_their_serial_replay(policy, kwargs):
    """Eight threads call every public method at random through the wrapper (1 us switch
    interval); each call runs under the lock, leaves the invariants holding and, when it
    raises, the state unchanged; replaying the calls in the order they ran on a plain
    manager gives the same result for each (stats and events included) and the same final
    state."""
    import copy

    inner = _Recording(12, policy, enable_events=True, **kwargs)
    m = ThreadSafeManager(inner)
    inner.lock, inner.log = m.lock, []
    errors: list = []
    _run_workers(mixed_worker, m, errors)
    assert not errors, errors[:3]
    log, inner.log = inner.log, None
    assert {name for name, _, _ in log} == set(_RECORDED)
    replay = OffloadingManager(12, policy, enable_events=True, **kwargs)
    for i, (name, logged, expected) in enumerate(log):
        args, kw = copy.deepcopy(logged)
        try:
            got = ("ok", getattr(replay, name)(*args, **kw))
        except Exception as exc:  # noqa: BLE001 - compared with the logged outcome
            got = ("error", type(exc).__name__, str(exc))
        assert got == expected, (i, name, args, kw)
    assert replay.snapshot() == inner.snapshot()
    assert m.lock.acquire(False)  # released after every call, the raising ones included
    m.lock.release()
