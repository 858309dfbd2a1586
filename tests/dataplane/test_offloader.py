"""KVOffloader: bytes round-trip through the manager's slots; pins and pending stores never leak."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from kvtier import BlockStateError, OffloadingManager  # noqa: E402
from kvtier.dataplane import HostBlockPool, KVOffloader, OffloadResult, TransferEngine  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BLOCK = [2, 4, 2, 8]


def make(num_slots=8, num_dev=16, layers=3, device="cpu", policy="lru", seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = [torch.randn(num_dev, *BLOCK, generator=g).to(device) for _ in range(layers)]
    return KVOffloader.create(kv, num_slots, policy), kv


def block(kv, b):
    return torch.stack([t[b] for t in kv]).cpu()


def fill_blocks(kv, blocks, seed):
    """Give device blocks new random contents; returns {block: contents}."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for b in blocks:
        for t in kv:
            t[b] = torch.randn(t.shape[1:], generator=g).to(t.device)
        out[b] = block(kv, b)
    return out


def assert_clean(off, used):
    s = off.manager.stats()
    assert (s.pending, s.pinned, s.used, s.free) == (0, 0, used, off.manager.num_blocks - used)
    assert off.in_flight == 0 and off.engine.in_flight == 0


@pytest.mark.parametrize("device", DEVICES)
def test_round_trip_with_evictions_never_serves_stale_bytes(device):
    off, kv = make(num_slots=5, device=device)
    data = fill_blocks(kv, range(16), seed=1)
    # store 5 blocks (odd count) of request A
    job = off.offload(["a0", "a1", "a2", "a3", "a4"], [9, 2, 14, 0, 7])
    assert off.wait(10) == [OffloadResult(job, "store", True, ["a0", "a1", "a2", "a3", "a4"])]
    slot_of = {}
    for k in ["a0", "a1", "a2", "a3", "a4"]:  # one at a time: a4 ends most recently used
        slot_of[k] = off.manager.prepare_load([k])[0]
        off.manager.complete_load([k])
        off.manager.touch([k])  # the use orders them; a load and its release move nothing
    # touch a1, a3: LRU order is now a0, a2, a4, a3, a1
    off.manager.touch(["a1", "a3"])
    # store 2 new keys from other device contents: evicts a0 and a2, reuses their slots
    new = fill_blocks(kv, [3, 11], seed=2)
    job = off.offload(["b0", "b1"], [3, 11])
    assert job is not None
    res = off.wait(10)
    assert [r.ok for r in res] == [True]
    assert "a0" not in off.manager and "a2" not in off.manager
    assert off.manager.stats().evictions == 2
    assert off.lookup(["a0"]) == 0
    with pytest.raises(BlockStateError):
        off.restore(["a0"], [1])
    # overwrite the device, load everything stored back into fresh device blocks
    for t in kv:
        t.zero_()
    keys = ["b1", "a1", "a3", "b0", "a4"]
    dst = [15, 1, 4, 13, 6]
    job = off.restore(keys, dst)
    assert off.wait(10) == [OffloadResult(job, "load", True, keys)]
    expect = {"a1": data[2], "a3": data[0], "a4": data[7], "b0": new[3], "b1": new[11]}
    for k, d in zip(keys, dst):
        assert torch.equal(block(kv, d), expect[k]), k
    # the evicted keys' slots now hold the new keys' bytes
    assert {off.manager.prepare_load([k])[0] for k in ["b0", "b1"]} == {slot_of["a0"], slot_of["a2"]}
    off.manager.complete_load(["b0", "b1"])
    assert all(off.manager.ref_count(k) == 0 for k in keys)
    assert_clean(off, used=5)
    off.close()


def test_restore_prefix_stops_at_first_miss_and_at_block_budget():
    off, kv = make()
    data = fill_blocks(kv, [0, 1, 2], seed=3)
    off.offload(["h0", "h1", "h2"], [0, 1, 2])
    off.wait(10)
    n, job = off.restore_prefix(["h0", "h1", "zz", "h2"], [10, 11, 12, 13])
    assert n == 2
    off.wait(10)
    assert torch.equal(block(kv, 10), data[0]) and torch.equal(block(kv, 11), data[1])
    n, job = off.restore_prefix(["h0", "h1", "h2"], [5])
    assert n == 1 and job is not None
    off.wait(10)
    n, job = off.restore_prefix(["nope"], [5])
    assert (n, job) == (0, None)
    assert_clean(off, used=3)
    off.close()


def test_block_ids_may_be_numpy_arrays_or_tensors():
    np = pytest.importorskip("numpy")
    off, kv = make()
    data = fill_blocks(kv, [0, 1, 2], seed=4)
    off.offload(["h0", "h1"], np.array([0, 1], dtype=np.int64))  # was refused: not a Sequence
    off.offload(["h2"], torch.tensor([2]))
    off.wait(10)
    n, _ = off.restore_prefix(["h0", "h1", "h2"], torch.tensor([10, 11, 12]))
    assert n == 3
    off.wait(10)
    n, _ = off.restore_prefix(["h2"], np.array([13], dtype=np.uint32))
    assert n == 1
    off.wait(10)
    assert [torch.equal(block(kv, b), data[s]) for b, s in ((10, 0), (11, 1), (12, 2), (13, 2))] \
        == [True] * 4
    before = off.manager.snapshot()
    for bad, what in ((np.array([1.0]), "1-D integer array"), (np.array([[1]]), "1-D integer"),
                      (torch.tensor([1.0]), "1-D integer tensor"), ("ab", "sequence of ints")):
        with pytest.raises(TypeError, match=what):
            off.restore_prefix(["h0"], bad)
    assert off.manager.snapshot() == before  # refused before the lookup counted anything
    assert_clean(off, used=3)
    off.close()


@pytest.mark.parametrize("bad, error", [([10, 10], ValueError), ([10, 99], ValueError),
                                         ([10, 1.5], TypeError), ([10, -1], ValueError)])
def test_restore_prefix_checks_block_ids_before_the_lookup_counts(bad, error):
    """A repeated, out-of-range or non-int block id is refused before the lookup (found by
    a newcomer session: the lookup counted its hits first, then restore raised)."""
    off, _kv = make()
    off.offload(["h0", "h1"], [0, 1])
    off.wait(10)
    before = off.manager.stats()
    with pytest.raises(error, match="block_ids"):
        off.restore_prefix(["h0", "h1"], bad)
    assert off.manager.stats() == before
    off.close()


def test_already_stored_keys_are_not_copied_again():
    off, kv = make()
    off.offload(["x", "y"], [0, 1])
    off.wait(10)
    assert off.offload(["x", "y"], [2, 3]) is None
    job = off.offload(["x", "z", "z"], [4, 5, 6])
    assert off.wait(10) == [OffloadResult(job, "store", True, ["z"])]
    assert off.manager.stats().stores == 3
    off.close()


def test_pinned_block_cannot_be_evicted_while_its_load_runs():
    off, kv = make(num_slots=3)
    data = fill_blocks(kv, [0, 1, 2], seed=4)
    off.offload(["p", "q", "r"], [0, 1, 2])
    off.wait(10)
    gate = threading.Event()
    off.engine._before_copy = lambda *a: gate.wait(10)
    load = off.restore(["p"], [8])  # held in flight by the gate
    assert off.manager.ref_count("p") == 1
    # the tier is full: storing 3 new blocks needs 3 evictions but only q, r are evictable
    assert off.offload(["n0", "n1", "n2"], [3, 4, 5]) is None
    assert off.refused_blocks == 3
    # only the new blocks count, each once: "p" is stored, "n0" named twice (found by
    # newcomer10: every key of the call was counted, 5 here)
    assert off.offload(["p", "n0", "n0", "n1", "n2"], [0, 3, 3, 4, 5]) is None
    assert off.refused_blocks == 3 + 3
    assert "p" in off.manager and off.manager.ref_count("p") == 1
    # 2 new blocks fit by evicting q and r, never p
    store = off.offload(["n0", "n1"], [3, 4])
    assert "p" in off.manager and "q" not in off.manager and "r" not in off.manager
    gate.set()
    res = off.wait(10)
    assert sorted((r.job_id, r.kind, r.ok) for r in res) == [(load, "load", True), (store, "store", True)]
    assert torch.equal(block(kv, 8), data[0])  # p's bytes, not a new key's
    assert off.manager.ref_count("p") == 0
    assert_clean(off, used=3)
    off.close()


def test_failed_store_mid_batch_frees_its_slots():
    off, kv = make(num_slots=6)
    fill_blocks(kv, range(16), seed=5)
    off.offload(["k0"], [0])
    off.wait(10)

    def fail(job_id, kind, t):
        if kind == "store" and t == 2:
            raise RuntimeError("disk on fire")

    off.engine._before_copy = fail
    job = off.offload(["k1", "k2", "k3"], [1, 2, 3])
    assert off.manager.stats().pending == 3
    res = off.wait(10)
    assert res == [OffloadResult(job, "store", False, ["k1", "k2", "k3"])]
    assert [off.manager.ref_count(k) for k in ["k0", "k1", "k2", "k3"]] == [0, None, None, None]
    s = off.manager.stats()
    assert (s.failed_stores, s.used, s.free) == (3, 1, 5)
    assert isinstance(off.engine.take_errors()[job], RuntimeError)
    # the freed slots are reused by new keys with the new keys' bytes
    off.engine._before_copy = None
    new = fill_blocks(kv, [7, 8, 9, 10, 11], seed=6)
    off.offload(["m7", "m8", "m9", "m10", "m11"], [7, 8, 9, 10, 11])
    assert [r.ok for r in off.wait(10)] == [True]
    for t in kv:
        t.zero_()
    off.restore(["m7", "m8", "m9", "m10", "m11"], [11, 12, 13, 14, 15])
    off.wait(10)
    for b, d in zip([7, 8, 9, 10, 11], [11, 12, 13, 14, 15]):
        assert torch.equal(block(kv, d), new[b])
    assert_clean(off, used=6)
    off.close()


def test_failed_load_releases_its_pins():
    off, kv = make()
    off.offload(["a", "b"], [0, 1])
    off.wait(10)
    off.engine._before_copy = lambda job_id, kind, t: (_ for _ in ()).throw(OSError("dma"))
    job = off.restore(["a", "b", "a"], [4, 5, 6])
    assert off.manager.ref_count("a") == 2 and off.manager.ref_count("b") == 1
    assert off.wait(10) == [OffloadResult(job, "load", False, ["a", "b", "a"])]
    assert off.manager.ref_count("a") == 0 and off.manager.ref_count("b") == 0
    assert_clean(off, used=2)
    off.close()


def test_reset_with_jobs_in_flight_releases_everything():
    off, kv = make(num_slots=6)
    data = fill_blocks(kv, range(16), seed=7)
    off.offload(["r0", "r1"], [0, 1])
    off.wait(10)
    gate = threading.Event()
    off.engine._before_copy = lambda *a: gate.wait(10)
    load = off.restore(["r0", "r1"], [10, 11])
    store = off.offload(["s0", "s1", "s2"], [2, 3, 4])
    s = off.manager.stats()
    assert (s.pinned, s.pending) == (2, 3)
    # cannot finish in time: nothing reset, everything still accounted for
    with pytest.raises(TimeoutError, match="not reset"):
        off.reset_cache(timeout=0.05)
    assert off.manager.stats().used == 5 and off.in_flight == 2
    threading.Timer(0.1, gate.set).start()
    off.reset_cache(timeout=10)
    assert_clean(off, used=0)
    assert off.manager.stats().free == 6 and len(off.manager) == 0
    res = off.poll()
    assert sorted((r.job_id, r.kind, r.ok) for r in res) == [(load, "load", True), (store, "store", False)]
    assert torch.equal(block(kv, 10), data[0]) and torch.equal(block(kv, 11), data[1])
    assert off.poll() == []
    # the tier works normally afterwards; the old jobs touch nothing
    off.engine._before_copy = None
    off.offload(["r0", "s0"], [5, 6])
    assert [r.ok for r in off.wait(10)] == [True]
    for t in kv:
        t.zero_()
    off.restore(["s0", "r0"], [0, 1])
    off.wait(10)
    assert torch.equal(block(kv, 0), data[6]) and torch.equal(block(kv, 1), data[5])
    assert_clean(off, used=2)
    off.close()


def test_bad_input_changes_nothing():
    off, kv = make()
    off.offload(["a"], [0])
    off.wait(10)
    snap = off.manager.snapshot()
    with pytest.raises(ValueError, match="2 keys but 1 block_ids"):
        off.offload(["b", "c"], [1])
    with pytest.raises(ValueError, match="engine block id 16 is out of range 0..15"):
        off.offload(["b"], [16])
    with pytest.raises(TypeError, match="not hashable"):
        off.offload([["b"]], [1])
    with pytest.raises(ValueError, match="repeat a block"):
        off.restore(["a", "a"], [3, 3])
    with pytest.raises(BlockStateError, match="'zz'"):
        off.restore(["a", "zz"], [3, 4])
    with pytest.raises(TypeError, match="keys must be a sequence"):
        off.offload("ab", [1, 2])
    assert off.manager.snapshot() == snap
    assert off.in_flight == 0
    off.close()


def test_submit_failure_rolls_back_pending_store_and_pins():
    off, kv = make()
    off.offload(["a"], [0])
    off.wait(10)
    off.engine.close()
    with pytest.raises(ValueError, match="closed"):
        off.offload(["b", "c"], [1, 2])
    with pytest.raises(ValueError, match="closed"):
        off.restore(["a"], [3])
    assert off.manager.ref_count("a") == 0
    assert "b" not in off.manager and "c" not in off.manager
    assert_clean(off, used=1)


def test_closed_offloader_changes_nothing_even_in_a_full_tier():
    off, _ = make(num_slots=2)
    off.offload(["a", "b"], [0, 1])
    off.close()
    snap, stats = off.manager.snapshot(), off.manager.stats()
    with pytest.raises(ValueError, match="closed"):
        off.offload(["q"], [2])  # would evict "a" if the manager were asked
    with pytest.raises(ValueError, match="closed"):
        off.restore(["a"], [3])
    with pytest.raises(ValueError, match="closed"):
        off.restore_prefix(["a", "b"], [3, 4])
    assert off.manager.snapshot() == snap and off.manager.stats() == stats
    assert "a" in off.manager and "b" in off.manager


def test_constructor_checks():
    pool = HostBlockPool(4, [1, *BLOCK], torch.float32)
    eng = TransferEngine([torch.zeros(3, *BLOCK)], pool)
    with pytest.raises(ValueError, match=r"manager.num_blocks \(5\) != pool.num_blocks \(4\)"):
        KVOffloader(OffloadingManager(5), eng)
    with pytest.raises(TypeError, match="manager must be an OffloadingManager"):
        KVOffloader(object(), eng)
    eng.close()
