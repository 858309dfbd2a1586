"""TransferEngine: bit-exact batched copies between paged KV tensors and the host pool."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvtier.dataplane import HostBlockPool, TransferEngine, TransferResult  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BLOCK = [2, 4, 2, 8]  # [2 (K/V), block_tokens, kv_heads, head_dim]


def random_bits(shape, device, seed):
    """float16 tensor with uniformly random bit patterns (NaNs, infs, -0.0 included)."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)
    return bits.view(torch.float16).to(device)


def bits(t):
    return t.cpu().view(torch.int16)


def make(device, layers, num_dev, num_slots, *, single=False, staging_bytes=32 * 2**20, seed=0):
    pool = HostBlockPool(num_slots, [layers, *BLOCK], torch.float16)
    if single:
        kv = random_bits((num_dev, layers, *BLOCK), device, seed)
        kv_list = [kv]
    else:
        kv_list = [random_bits((num_dev, *BLOCK), device, seed + i) for i in range(layers)]
    eng = TransferEngine(kv_list[0] if single else kv_list, pool, staging_bytes=staging_bytes)
    return pool, kv_list, eng


def dev_block(kv_list, single, b):
    """Block b of the engine in the pool's layout [layers, *BLOCK]."""
    if single:
        return kv_list[0][b]
    return torch.stack([t[b] for t in kv_list])


def finish(eng):
    assert eng.wait(10)
    return eng.poll()


# (src device blocks, dst slots) patterns hitting each code path
PATTERNS = {
    "both_ranges": (list(range(3, 10)), list(range(5, 12))),
    "src_range": (list(range(0, 7)), [12, 3, 9, 0, 6, 1, 10]),
    "dst_range": ([13, 2, 7, 0, 11, 5, 9], list(range(4, 11))),
    "scattered": ([13, 2, 7, 0, 11, 5, 9], [12, 3, 9, 0, 6, 1, 10]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("single", [False, True], ids=["per_layer", "one_tensor"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("staging_bytes", [32 * 2**20, 300], ids=["big_stage", "tiny_stage"])
def test_store_then_load_round_trip_bit_exact(device, single, pattern, staging_bytes):
    layers = 3
    pool, kv, eng = make(device, layers, 16, 13, single=single, staging_bytes=staging_bytes)
    src, slots = PATTERNS[pattern]
    original = {b: dev_block(kv, single, b).clone() for b in range(16)}

    eng.submit_store("s", src, slots)
    assert finish(eng) == [TransferResult("s", True)]
    for b, s in zip(src, slots):
        assert torch.equal(bits(pool.tensor[s]), bits(original[b]))
    untouched = set(range(13)) - set(slots)
    for s in untouched:
        assert int(pool.tensor[s].view(torch.int16).count_nonzero()) == 0

    # overwrite the device copies, then load back into other device blocks
    for t in kv:
        t.fill_(0.0)
    dst = [15, 1, 8, 4, 14, 6, 12] if pattern != "both_ranges" else list(range(8, 15))
    eng.submit_load(7, slots, dst)
    assert finish(eng) == [TransferResult(7, True)]
    for b, d in zip(src, dst):
        assert torch.equal(bits(dev_block(kv, single, d)), bits(original[b]))
    for d in set(range(16)) - set(dst):
        assert int(bits(dev_block(kv, single, d)).count_nonzero()) == 0
    eng.close()


@pytest.mark.parametrize("device", DEVICES)
def test_load_with_repeated_source_slot(device):
    pool, kv, eng = make(device, 2, 6, 4)
    eng.submit_store(0, [5, 1], [2, 0])
    finish(eng)
    eng.submit_load(1, [2, 2, 0], [0, 3, 4])
    assert finish(eng) == [TransferResult(1, True)]
    assert torch.equal(bits(dev_block(kv, False, 0)), bits(dev_block(kv, False, 5)))
    assert torch.equal(bits(dev_block(kv, False, 3)), bits(dev_block(kv, False, 5)))
    assert torch.equal(bits(dev_block(kv, False, 4)), bits(dev_block(kv, False, 1)))
    eng.close()


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_job_sequences_match_a_reference(data):
    """Random stores/loads (odd counts, any slot order) against a dict of expected bytes."""
    num_dev, num_slots, layers = 9, 11, 2
    seed = data.draw(st.integers(0, 10**6))
    staging = data.draw(st.sampled_from([64, 1000, 2**20]))
    single = data.draw(st.booleans())
    pool, kv, eng = make("cpu", layers, num_dev, num_slots, single=single,
                         staging_bytes=staging, seed=seed)
    dev_ref = {b: bits(dev_block(kv, single, b)).clone() for b in range(num_dev)}
    pool_ref = {s: torch.zeros_like(dev_ref[0]) for s in range(num_slots)}
    for step in range(data.draw(st.integers(1, 6))):
        n = data.draw(st.integers(0, 7))
        if data.draw(st.booleans()):
            src = data.draw(st.lists(st.integers(0, num_dev - 1), min_size=n, max_size=n))
            dst = data.draw(st.permutations(range(num_slots)))[:n]
            eng.submit_store(step, src, dst)
            for b, s in zip(src, dst):
                pool_ref[s] = dev_ref[b].clone()
        else:
            src = data.draw(st.lists(st.integers(0, num_slots - 1), min_size=n, max_size=n))
            dst = data.draw(st.permutations(range(num_dev)))[:n]
            eng.submit_load(step, src, dst)
            for s, b in zip(src, dst):
                dev_ref[b] = pool_ref[s].clone()
    assert eng.wait(10)
    assert all(r.ok for r in eng.poll())
    for b in range(num_dev):
        assert torch.equal(bits(dev_block(kv, single, b)), dev_ref[b])
    for s in range(num_slots):
        assert torch.equal(bits(pool.tensor[s]), pool_ref[s])
    eng.close()


@pytest.mark.parametrize("device", DEVICES)
def test_failed_copy_mid_batch_reports_not_raises(device):
    pool, kv, eng = make(device, 3, 8, 8)
    boom = RuntimeError("injected copy failure")

    def fail_on_second_tensor(job_id, kind, t):
        if job_id == "bad" and t == 1:
            raise boom

    eng._before_copy = fail_on_second_tensor
    eng.submit_store("good1", [0, 1], [0, 1])
    eng.submit_store("bad", [2, 3, 4], [2, 3, 4])
    eng.submit_store("good2", [5], [5])
    assert eng.wait(10)
    results = eng.poll()  # never raises
    assert sorted(results, key=str) == sorted(
        [TransferResult("good1", True), TransferResult("bad", False), TransferResult("good2", True)],
        key=str,
    )
    assert eng.take_errors() == {"bad": boom}
    assert eng.take_errors() == {}
    # mid-batch: layer 0 of the bad job was written, layers 1.. were not
    for b in (2, 3, 4):
        assert torch.equal(bits(pool.tensor[b, 0]), bits(kv[0][b]))
        assert int(bits(pool.tensor[b, 1:]).count_nonzero()) == 0
    assert torch.equal(bits(pool.tensor[5]), bits(dev_block(kv, False, 5)))
    assert eng.in_flight == 0
    # the id is free again once polled
    eng._before_copy = None
    eng.submit_store("bad", [2], [2])
    assert finish(eng) == [TransferResult("bad", True)]
    eng.close()


def test_jobs_are_asynchronous_and_fifo():
    pool, kv, eng = make("cpu", 2, 8, 8)
    gate = threading.Event()
    eng._before_copy = lambda job_id, kind, t: gate.wait(10)
    eng.submit_store(0, [1, 2], [0, 1])
    eng.submit_load(1, [0, 1], [6, 7])  # reads what job 0 writes
    assert eng.poll() == []
    assert eng.in_flight == 2
    assert not eng.wait(0.05)
    gate.set()
    assert eng.wait(10)
    assert eng.poll() == [TransferResult(0, True), TransferResult(1, True)]
    assert torch.equal(bits(dev_block(kv, False, 6)), bits(dev_block(kv, False, 1)))
    assert torch.equal(bits(dev_block(kv, False, 7)), bits(dev_block(kv, False, 2)))
    eng.close()


def test_wait_and_close_take_an_infinite_timeout_and_refuse_a_bad_one():
    """Found by a newcomer session: wait(float("inf")) with a job in flight raised
    OverflowError ('timestamp out of range for platform time_t', from the Condition wait);
    so did close(inf) and KVOffloader.wait(inf) above it. NaN spun on non-blocking waits."""
    pool, kv, eng = make("cpu", 2, 8, 8)
    gate = threading.Event()
    eng._before_copy = lambda job_id, kind, t: gate.wait(10)
    eng.submit_store(0, [1, 2], [0, 1])
    for bad in (float("nan"), "5", True):
        with pytest.raises(ValueError, match="wait: timeout must be None or a number"):
            eng.wait(bad)
        with pytest.raises(ValueError, match="close: timeout must be None or a number"):
            eng.close(bad)
    assert not eng.closed
    threading.Timer(0.05, gate.set).start()
    assert eng.wait(float("inf")) is True
    assert eng.poll() == [TransferResult(0, True)]
    eng.submit_store(1, [3], [2])
    eng.close(float("inf"))
    assert eng.closed


def test_empty_job_finishes_ok():
    pool, kv, eng = make("cpu", 1, 4, 4)
    eng.submit_store("e", [], [])
    assert finish(eng) == [TransferResult("e", True)]
    eng.close()


@pytest.mark.parametrize(
    "kind, job_id, src, dst, exc, match",
    [
        ("store", 0, [1, 2], [3], ValueError, "2 sources but 1 destinations"),
        ("store", 0, [8], [0], ValueError, "src_block_ids: engine block id 8 is out of range 0..7"),
        ("store", 0, [0], [5], ValueError, "dst_slots: pool slot 5 is out of range 0..4"),
        ("store", 0, [-1], [0], ValueError, "out of range"),
        ("store", 0, [0, 1], [2, 2], ValueError, "dst_slots names 2 twice"),
        ("load", 0, [0, 1], [3, 3], ValueError, "dst_block_ids names 3 twice"),
        ("load", 0, [0], [1.0], TypeError, "1.0 is not an int block id"),
        ("load", 0, [True], [1], TypeError, "bool"),
        ("load", 0, "ab", [1], TypeError, "sequence of ints"),
        ("load", [0], [0], [1], ValueError, "not hashable"),
        ("store", "busy", [0], [0], ValueError, "'busy' is already in use"),
        # a newcomer pass: job ids True and 1 were the same id
        ("store", True, [0], [0], ValueError, "job_id True is a bool: True and 1"),
        ("load", np.bool_(False), [0], [1], ValueError, "job_id .*False_? is a bool"),
    ],
)
def test_bad_submissions_raise_and_queue_nothing(kind, job_id, src, dst, exc, match):
    pool, kv, eng = make("cpu", 2, 8, 5)
    gate = threading.Event()
    eng._before_copy = lambda *a: gate.wait(10)
    eng.submit_store("busy", [0], [4])
    before = pool.tensor.clone()
    submit = eng.submit_store if kind == "store" else eng.submit_load
    with pytest.raises(exc, match=match):
        submit(job_id, src, dst)
    assert eng.in_flight == 1
    gate.set()
    assert finish(eng) == [TransferResult("busy", True)]
    assert torch.equal(bits(pool.tensor[:4]), bits(before[:4]))
    eng.close()


def test_index_tensors_accepted():
    pool, kv, eng = make("cpu", 2, 8, 5)
    eng.submit_store(0, torch.tensor([3, 1]), torch.tensor([4, 0]))
    assert finish(eng) == [TransferResult(0, True)]
    assert torch.equal(bits(pool.tensor[4]), bits(dev_block(kv, False, 3)))
    eng.close()


def test_constructor_validation():
    pool = HostBlockPool(4, [3, *BLOCK], torch.float16)
    ok = [torch.zeros(5, *BLOCK, dtype=torch.float16) for _ in range(3)]
    with pytest.raises(ValueError, match="dtype torch.float32, but the pool's dtype is torch.float16"):
        TransferEngine([t.float() for t in ok], pool)
    with pytest.raises(ValueError, match="do not match the pool's block_shape"):
        TransferEngine(ok[:2], pool)
    with pytest.raises(ValueError, match="same number of blocks"):
        TransferEngine([ok[0], ok[1], torch.zeros(6, *BLOCK, dtype=torch.float16)], pool)
    with pytest.raises(ValueError, match="at least one tensor"):
        TransferEngine([], pool)
    with pytest.raises(TypeError, match="kv_caches\\[1\\] must be a torch.Tensor"):
        TransferEngine([ok[0], "x", ok[2]], pool)
    with pytest.raises(TypeError, match="pool must be a HostBlockPool"):
        TransferEngine(ok, pool.tensor)
    with pytest.raises(ValueError, match="staging_bytes must be a positive int, got 0"):
        TransferEngine(ok, pool, staging_bytes=0)


def test_a_kv_cache_without_blocks_is_named_for_what_it_lacks():
    """Found by newcomer10: a 0-d KV tensor raised IndexError ("tuple index out of range",
    from the message naming the block count), and one with 0 blocks said "every tensor
    needs the same number of blocks (0)", which it had."""
    pool = HostBlockPool(4, [2], torch.float32)
    with pytest.raises(ValueError, match=r"kv_caches\[0\] has shape \(\): a KV cache tensor "
                                         r"needs a block dimension \(dimension 0\)"):
        TransferEngine(torch.tensor(5.0), pool)
    with pytest.raises(ValueError, match=r"kv_caches\[1\] has shape \(\): a KV cache tensor "
                                         r"needs a block dimension"):
        TransferEngine([torch.zeros(4, 2), torch.tensor(1.0)], pool)
    with pytest.raises(ValueError, match=r"kv_caches\[0\] has shape \(0, 2\): no device "
                                         r"blocks \(dimension 0 must be >= 1\)"):
        TransferEngine(torch.zeros(0, 2), pool)


def test_closed_engine_refuses_jobs():
    pool, kv, eng = make("cpu", 1, 4, 4)
    with eng:
        eng.submit_store(0, [0], [0])
    assert finish(eng) == [TransferResult(0, True)]
    with pytest.raises(ValueError, match="closed"):
        eng.submit_store(1, [0], [0])
    eng.close()  # idempotent


def test_per_layer_copies_are_batched_not_per_block(monkeypatch):
    """A 200-block scattered job issues O(layers) index ops, not O(blocks x layers)."""
    pool, kv, eng = make("cpu", 3, 256, 256)
    calls = {"n": 0}
    real_select, real_put = torch.index_select, torch.Tensor.index_put_

    def counting_select(*a, **k):
        calls["n"] += 1
        return real_select(*a, **k)

    def counting_put(self, *a, **k):
        calls["n"] += 1
        return real_put(self, *a, **k)

    monkeypatch.setattr(torch, "index_select", counting_select)
    monkeypatch.setattr(torch.Tensor, "index_put_", counting_put)
    rng = random.Random(0)
    src = rng.sample(range(256), 200)
    dst = rng.sample(range(256), 200)
    eng.submit_store(0, src, dst)
    assert finish(eng) == [TransferResult(0, True)]
    assert calls["n"] == 2 * 3  # one gather + one scatter per layer (staging holds the job)
    monkeypatch.undo()
    for b, s in zip(src, dst):
        assert torch.equal(bits(pool.tensor[s]), bits(dev_block(kv, False, b)))
    eng.close()
