"""Tier composition: tiered lookup, promotion, demotion (write-back / write-through), per-tier
events and stats, on the real data plane (KVOffloader + DiskTier) and in the simulation."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from kvtier import OffloadingManager
from kvtier.tiers.disk import DiskTier
from kvtier.tiers.stack import TierEvent, TierStack
from kvtier.tiersim import SimTier, parse_tiers, replay_tiers
from kvtier.trace import Request

from redis_servers import redis_server  # noqa: F401  (fixture)

torch = pytest.importorskip("torch")

from kvtier.dataplane import KVOffloader  # noqa: E402
from kvtier.dataplane.tiered import TieredOffloader  # noqa: E402

BLOCK = [2, 4, 8]  # per layer; 3 layers of float32: 3 * 64 * 4 = 768 bytes per block


def make(tmp_path, host_slots=4, disk_slots=16, demotion="write-back", num_dev=16):
    g = torch.Generator().manual_seed(0)
    kv = [torch.randn(num_dev, *BLOCK, generator=g) for _ in range(3)]
    off = KVOffloader.create(kv, host_slots, "lru", enable_events=True)
    disk = DiskTier(tmp_path / "disk", disk_slots, off.pool.block_nbytes, enable_events=True)
    return TieredOffloader(off, [disk], demotion=demotion), kv, disk


def block(kv, b):
    return torch.stack([t[b] for t in kv]).clone()


def as_bytes(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _two_host_slots():
    """A 2-slot host of 8-byte blocks (numpy) and its read_slot / write_slot."""
    host = np.zeros((2, 8), dtype=np.uint8)

    def read_slot(slot):
        return host[slot].tobytes()

    def write_slot(slot, data):
        host[slot] = np.frombuffer(data, dtype=np.uint8)

    return host, read_slot, write_slot


def test_a_closed_stack_stops_seeing_the_host_evictions(tmp_path):
    """Found by newcomer12: TierStack.close left its wrapper on the host policy's _evict,
    so a new stack on the same host manager (its lower tier swapped) failed every eviction
    with "disk tier <the old one> is closed", raised from inside prepare_store."""
    host, read_slot, write_slot = _two_host_slots()
    m = OffloadingManager(2, "lru")
    evict_before = m.policy._evict
    old = TierStack(m, [DiskTier(tmp_path / "old", 8, 8)], 8, read_slot, write_slot)
    old.close()
    assert "_evict" not in m.policy.__dict__  # the class's method again
    new = TierStack(m, [DiskTier(tmp_path / "new", 8, 8)], 8, read_slot, write_slot)

    def store(keys, *stacks):
        out = m.prepare_store(keys)
        for key, slot in zip(out.keys_to_store, out.block_ids):
            host[slot] = key
        m.complete_store(out.keys_to_store)
        for stack in stacks:
            stack.flush_demotions()
        return out.evicted_keys

    assert store([1, 2], new) == []
    assert store([3], new) == [2]  # LRU: keys[0] ends most recent
    assert new.flush(10)
    assert new.lower[0].read([2]) == [bytes([2]) * 8]  # demoted by the new stack only
    assert old.demoted == 0 and new.demoted == 1
    # closed in the other order: the inner stack's wrapper goes inert, the outer one is
    # taken off, and the policy evicts as before
    a = TierStack(m, [DiskTier(tmp_path / "a", 8, 8)], 8, read_slot, write_slot)
    new.close()
    assert store([4], a) == [1] and a.demoted == 1 and new.demoted == 1
    a.close()
    assert store([5], a) == [3] and a.demoted == 1
    assert "_evict" not in m.policy.__dict__ and m.policy._evict == evict_before


def test_a_lower_tier_closed_under_an_open_stack_does_not_break_the_host(tmp_path):
    """Found by newcomer12: with the disk tier closed directly (the stack still open), the
    stack's eviction hook asked the disk whether it held each victim, which raised "disk
    tier ... is closed" from inside prepare_store after the policy had let the victim go:
    the host then kept block 2 that its policy no longer knew (used 2, evictable 1, never
    evicted again). Now the eviction completes and flush_demotions reports the closed
    tier."""
    host, read_slot, write_slot = _two_host_slots()
    m = OffloadingManager(2, "lru")
    disk = DiskTier(tmp_path / "d", 8, 8)
    stack = TierStack(m, [disk], 8, read_slot, write_slot)
    m.complete_store(m.prepare_store([1, 2]).keys_to_store)
    disk.close()
    out = m.prepare_store([3])
    assert out.evicted_keys == [2]
    m.complete_store([3])
    st = m.stats()
    assert (st.used, st.evictable) == (2, 2) and 2 not in m
    with pytest.raises(RuntimeError, match="not demoted to .disk.*is closed"):  # fix13
        stack.flush_demotions()
    assert m.prepare_store([4]).evicted_keys == [1]  # the policy still knows every block


def test_write_back_copies_victims_before_reuse_and_promotes_them_back(tmp_path):
    tiered, kv, disk = make(tmp_path)
    data = {b: block(kv, b) for b in range(16)}
    tiered.offload(["a0", "a1", "a2", "a3"], [0, 1, 2, 3])
    tiered.wait(10)
    assert len(disk) == 0  # write-back: nothing below until evicted
    # LRU: a request's head ends most recent, so the tail a3, a2 are evicted; b0, b1 get
    # their host slots
    tiered.offload(["b0", "b1"], [4, 5])
    tiered.wait(10)
    assert tiered.flush(10)
    assert tiered.stack.demoted == 2
    # the disk holds a3/a2's bytes, not the b blocks that reused their host slots
    assert disk.read(["a3", "a2"]) == [as_bytes(data[3]), as_bytes(data[2])]
    for t in kv:
        t.zero_()
    n, job, found = tiered.restore_prefix(["a3", "a2", "a0"], torch.tensor([10, 11, 12]))  # ids as a tensor
    assert (n, found.runs) == (3, [("disk", 2), ("host", 1)])
    assert job is not None
    tiered.wait(10)
    for k, d, src in (("a3", 10, 3), ("a2", 11, 2), ("a0", 12, 0)):
        assert torch.equal(block(kv, d), data[src]), k
    assert tiered.stack.promoted == {"disk": 2}
    # promotion went through prepare_store: a3, a2 are host blocks again (2 more evictions)
    assert "a3" in tiered.offloader.manager and "a2" in tiered.offloader.manager
    assert tiered.offloader.manager.stats().evictions == 4
    tiered.flush(10)
    assert tiered.stack.demoted == 4 and len(disk) == 4
    tiered.close()


@pytest.mark.parametrize("bad, error", [((1, 2), TypeError), (1.5, TypeError),
                                         ("k" * 300, ValueError)])
def test_offload_refuses_a_key_no_lower_tier_can_store_before_anything_changes(
        tmp_path, bad, error):
    """A key the disk cannot store (a tuple, a float, a 300-byte str) is refused before the
    host store, naming it. Before (found by a newcomer), the host took it, and the error
    came later, from the write-back of another offload: that call raised instead of
    returning its job id while its copy ran, and the victim never reached the disk."""
    tiered, kv, disk = make(tmp_path, host_slots=2)
    m = tiered.offloader.manager
    before = m.snapshot()
    with pytest.raises(error, match="block key"):
        tiered.offload(["a", bad], [0, 1])
    assert m.snapshot() == before and tiered.offloader.in_flight == 0
    # every key of the stack is storable below, so demotions never fail
    tiered.offload(["a", "b"], [0, 1])
    tiered.wait(10)
    job = tiered.offload(["c"], [2])  # evicts b: written to the disk
    assert job is not None
    tiered.wait(10)
    assert tiered.flush(10) and disk.lookup_prefix(["b"]) == 1
    with pytest.raises(TypeError, match="keys must be a sequence"):
        tiered.offload("ab", [0, 1])
    tiered.close()


@pytest.mark.parametrize("bad, error", [([10, 10, 12], ValueError), ([10, 99, 12], ValueError),
                                         ([10, 1.5, 12], TypeError)])
def test_restore_prefix_refuses_bad_block_ids_before_promoting(tmp_path, bad, error):
    """Found by a newcomer session: restore_prefix with a repeated / out-of-range block id
    promoted a3, a2 from the disk (evicting a1, b1 from the host and demoting them), and only
    then did the offloader's restore refuse the ids."""
    tiered, _kv, disk = make(tmp_path)
    tiered.offload(["a0", "a1", "a2", "a3"], [0, 1, 2, 3])
    tiered.wait(10)
    tiered.offload(["b0", "b1"], [4, 5])
    tiered.wait(10)
    assert tiered.flush(10)
    host = tiered.offloader.manager
    before = (host.stats(), disk.stats().lookups, dict(tiered.stack.promoted),
              tiered.stack.demoted)
    with pytest.raises(error, match="block_ids"):
        tiered.restore_prefix(["a3", "a2", "a0"], bad)
    assert tiered.flush(10)
    assert (host.stats(), disk.stats().lookups, dict(tiered.stack.promoted),
            tiered.stack.demoted) == before
    assert "a3" not in host and "a1" in host
    tiered.close()
    with pytest.raises(ValueError, match="closed"):
        tiered.restore_prefix(["a3"], [1])


def test_offload_refuses_a_closed_lower_tier_before_anything_changes(tmp_path):
    """A lower tier closed by its owner: the host store is refused up front, naming the
    tier. Before, the host took the blocks and the write-back of their victims raised from
    inside ``offload`` after the copy had started, so the caller lost the job id."""
    tiered, kv, disk = make(tmp_path, host_slots=2)
    tiered.offload(["a", "b"], [0, 1])
    tiered.wait(10)
    disk.close()
    m = tiered.offloader.manager
    before = m.snapshot()
    with pytest.raises(ValueError, match="closed"):
        tiered.offload(["c"], [2])  # would evict b into the closed disk
    assert m.snapshot() == before and tiered.offloader.in_flight == 0
    tiered.close()  # closing the stack again is fine
    tiered.close()


def test_restore_prefix_refuses_a_closed_or_refusing_lower_tier_before_the_lookup(tmp_path):
    """Found by a newcomer session: restore_prefix asked the host first and counted its
    lookup (and miss), then the lower tier raised: a closed disk (ValueError) or a key
    Redis cannot encode (a tuple: TypeError). The call raised with the host's counters
    changed; now it checks the lower tiers and keys first, as offload does."""
    tiered, _kv, disk = make(tmp_path, host_slots=2)
    tiered.offload(["a"], [0])
    tiered.wait(10)
    host = tiered.offloader.manager
    disk.close()
    before = host.snapshot()
    with pytest.raises(ValueError, match="closed"):
        tiered.restore_prefix(["a", "b"], [4, 5])
    assert host.snapshot() == before
    tiered.close()

    redis_tier = pytest.importorskip("kvtier.tiers.redis")
    off = KVOffloader.create([torch.zeros(4, *BLOCK)], 2, "lru")
    # no server: the key fails before any I/O
    redis = redis_tier.RedisTier.from_url(
        "redis://127.0.0.1:1/0", block_bytes=off.pool.block_nbytes, fingerprint="fp")
    tiered = TieredOffloader(off, [redis])
    before = off.manager.snapshot()
    with pytest.raises(TypeError, match=r"block key \(1, 2\)"):
        tiered.restore_prefix([(1, 2)], [0])
    assert off.manager.snapshot() == before
    tiered.close()


def test_write_through_into_a_closed_tier_loses_no_job_result(tmp_path):
    """Found by a newcomer session: under write-through, poll() applies the finished jobs
    to the host, then writes the completed stores down; with the disk closed by its owner
    meanwhile, that write raised and the results (already applied) were lost: the caller
    never learnt that its store job had finished, so never freed its device blocks. The
    error is raised once; the results come with the next poll (or wait), and close still
    stops the copy thread."""
    tiered, _kv, disk = make(tmp_path, demotion="write-through")
    job = tiered.offload(["a", "b"], [0, 1])
    assert tiered.offloader.engine.wait(10)  # copied, not yet polled
    disk.close()
    # (a RuntimeError naming the tier and its error since session 14: TierStack.stored
    # tries every tier, then reports each refusal)
    with pytest.raises(RuntimeError, match=r"not demoted to 'disk' \(ValueError: .*closed"):
        tiered.poll()
    results = tiered.poll()
    assert _outcomes(results) == [(job, "store", True)]
    assert tiered.poll() == []
    with pytest.raises(ValueError, match="closed"):  # offload refuses a closed tier up front
        tiered.offload(["c"], [2])
    tiered.close()
    assert tiered.offloader.engine.closed


def test_write_through_writes_every_completed_store(tmp_path):
    tiered, kv, disk = make(tmp_path, demotion="write-through")
    data = {b: block(kv, b) for b in range(16)}
    tiered.offload(["a0", "a1", "a2"], [0, 1, 2])
    tiered.wait(10)
    tiered.flush(10)
    assert disk.lookup_prefix(["a0", "a1", "a2"]) == 3
    assert disk.read(["a2"]) == [as_bytes(data[2])]
    tiered.offload(["b0", "b1", "b2"], [3, 4, 5])  # evicts 2: nothing copied at eviction
    assert tiered.stack._victims == []
    tiered.wait(10)
    tiered.flush(10)
    assert tiered.stack.demoted == 6 and len(disk) == 6
    for t in kv:
        t.zero_()
    n, _, found = tiered.restore_prefix(["a2", "b2"], [7, 8])  # a2, a1 were evicted
    tiered.wait(10)
    assert found.runs == [("disk", 1), ("host", 1)] and n == 2
    assert torch.equal(block(kv, 7), data[2]) and torch.equal(block(kv, 8), data[5])
    tiered.close()


def test_events_and_stats_per_tier(tmp_path):
    tiered, kv, disk = make(tmp_path, host_slots=2, disk_slots=2)
    tiered.offload(["a", "b"], [0, 1])
    tiered.wait(10)
    tiered.offload(["c"], [2])  # host evicts b (LRU: a was named first, so is more recent)
    tiered.wait(10)
    tiered.flush(10)
    events = tiered.take_events()
    assert TierEvent("host", ("a", "b"), False) in events
    assert TierEvent("host", ("b",), True) in events
    assert TierEvent("host", ("c",), False) in events
    assert TierEvent("disk", ("b",), False) in events
    tiered.offload(["d", "e"], [3, 4])  # host evicts a, c -> disk (2 slots) evicts b
    tiered.wait(10)
    tiered.flush(10)
    events = tiered.take_events()
    disk_removed = [k for e in events if e.tier == "disk" and e.removed for k in e.keys]
    disk_stored = [k for e in events if e.tier == "disk" and not e.removed for k in e.keys]
    assert disk_removed == ["b"] and sorted(disk_stored) == ["a", "c"]
    stats = tiered.stats()
    assert list(stats) == ["host", "disk"]
    h, d = stats["host"], stats["disk"]
    assert (h.writes_completed, h.evictions, h.used_blocks, h.capacity_blocks) == (5, 3, 2, 2)
    assert (d.writes, d.writes_completed, d.evictions, d.used_blocks) == (3, 3, 1, 2)
    assert d.bytes_written == 3 * disk.block_bytes
    tiered.close()


def test_corrupt_block_below_ends_the_prefix(tmp_path):
    tiered, kv, disk = make(tmp_path, host_slots=2)
    tiered.offload(["a", "b"], [0, 1])
    tiered.wait(10)
    tiered.offload(["c", "d"], [2, 3])  # a, b go to disk
    tiered.wait(10)
    tiered.flush(10)
    (logical,) = disk.manager.prepare_load(["b"])
    disk.manager.complete_load(["b"])
    with open(tmp_path / "disk" / "blocks.dat", "r+b") as f:
        f.seek(disk._phys[logical] * disk.block_bytes + 5)
        f.write(b"\xff\x00\xff")
    n, _, found = tiered.restore_prefix(["a", "b"], [8, 9])
    tiered.wait(10)
    assert found.hits == 2 and n == 1  # b failed verification: only a is restored
    assert tiered.stats()["disk"].read_errors == 1
    tiered.close()


def _host_stack(host_slots, lower, demotion="write-back"):
    host = OffloadingManager(host_slots, "lru", enable_events=True)
    slots: dict[int, bytes] = {}
    stack = TierStack(host, lower, 8, lambda s: slots[s], slots.__setitem__, demotion=demotion)
    return host, stack, slots


def _store(host, stack, slots, keys):
    out = host.prepare_store(keys)
    for k, s in zip(out.keys_to_store, out.block_ids):
        slots[s] = str(k).encode().ljust(8, b".")
    host.complete_store(out.keys_to_store)
    stack.stored(out.keys_to_store)
    stack.flush_demotions()


def test_a_host_slot_that_cannot_be_read_does_not_desync_the_host(tmp_path):
    """Found by a newcomer session: under write-back the stack copies each victim's bytes
    inside the policy's eviction; a read_slot that raised there (a pool already freed, say)
    left the policy without the victims and the manager with them: prepare_store raised
    the read's error, and the next eviction 'LRUPolicy.evict(2) returned 1 victims'. The
    eviction now completes; the block is dropped (not demoted), and flush_demotions, called
    after every host prepare_store, raises naming it."""
    disk = SimTier("disk", 4, block_bytes=8)
    host, stack, slots = _host_stack(2, [disk])
    _store(host, stack, slots, [1, 2])
    real = stack._read_slot

    def unreadable(slot):
        raise OSError("pool gone")

    stack._read_slot = unreadable
    out = host.prepare_store([3])  # evicts 2 (1 was named first: more recent); unreadable
    assert out is not None and out.evicted_keys == [2]
    with pytest.raises(RuntimeError, match=r"write-back: block 2 was evicted from host but "
                                           r"its slot could not be read \(OSError: pool gone\)"):
        stack.flush_demotions()
    assert stack.flush_demotions() == 0  # reported once
    stack._read_slot = real
    host.complete_store([3])
    out = host.prepare_store([4, 5])  # the policy and the manager agree
    assert out is not None and sorted(out.evicted_keys) == [1, 3]
    assert stack.flush_demotions() == 2 and 2 not in disk.manager and 1 in disk.manager


def test_a_write_back_error_after_the_store_still_gives_the_job_id(tmp_path):
    """Noticed in session 9: when the write-back after a successful host store raised
    (here a victim's slot that cannot be read), ``offload`` raised without the store's job
    id, while its copy ran and poll() later returned a job the caller never heard of."""
    tiered, kv, disk = make(tmp_path, host_slots=2)
    tiered.offload(["a0", "a1"], [0, 1])
    tiered.wait(10)

    def unreadable(slot):
        raise OSError("pool gone")

    tiered.stack._read_slot = unreadable
    with pytest.raises(RuntimeError, match="write-back: block 'a1'") as caught:
        tiered.offload(["b0"], [2])
    job = caught.value.job_id
    assert isinstance(job, int)
    done = tiered.wait(10)
    assert [(r.job_id, r.keys) for r in done] == [(job, ["b0"])]
    assert "b0" in tiered.offloader.manager and "a1" not in disk
    tiered.close()


def test_lookup_runs_interleave_tiers_and_stop_at_a_pending_host_block():
    disk = SimTier("disk", 8, block_bytes=8)
    far = SimTier("far", 8, block_bytes=8)
    host, stack, slots = _host_stack(4, [disk, far])
    _store(host, stack, slots, [0, 1, 4])
    disk.write([2], [b"2" * 8])
    far.write([3, 2], [b"3" * 8, b"2" * 8])
    found = stack.lookup([0, 1, 2, 3, 4, 5])
    assert (found.hits, found.runs) == (5, [("host", 2), ("disk", 1), ("far", 1), ("host", 1)])
    assert found.by_tier() == {"host": 3, "disk": 1, "far": 1}
    host.prepare_store([7])  # pending in the host
    far.write([7, 8], [b"7" * 8, b"8" * 8])
    assert stack.lookup([0, 7, 8]).runs == [("host", 1)]


def test_promotion_refused_when_the_host_cannot_make_room():
    disk = SimTier("disk", 8, block_bytes=8)
    host, stack, slots = _host_stack(2, [disk])
    _store(host, stack, slots, ["x", "y"])
    disk.write(["a"], [b"a" * 8])
    host.prepare_load(["x", "y"])  # both host blocks pinned
    found = stack.lookup(["a"])
    assert found.runs == [("disk", 1)]
    assert stack.promote(["a"], found) == 0 and stack.promote_failures == 1
    host.complete_load(["x", "y"])
    assert stack.promote(["a"], stack.lookup(["a"])) == 1
    assert stack.demoted == 0  # the victim's bytes wait for flush_demotions
    assert stack.flush_demotions() == 1 and stack.demoted == 1
    assert disk.lookup_prefix(["y"]) == 1  # LRU victim: y (x was named first)


@pytest.mark.parametrize("demotion", ["write-through", "write-back"])
def test_a_block_promoted_from_the_bottom_tier_reaches_the_tiers_above_it(demotion):
    """Write-through keeps the hierarchy inclusive: every host block is in every lower tier.
    A block promoted from the bottom tier (Redis, say) was entered into the host without a
    write to the tiers between (the disk), so once the host evicted it, only the bottom tier
    had it. Under write-through the promotion now writes it to the lower tiers that lack it;
    under write-back it goes down when evicted (unchanged)."""
    disk = SimTier("disk", 8, block_bytes=8)
    far = SimTier("far", 8, block_bytes=8)
    host, stack, slots = _host_stack(2, [disk, far], demotion)
    far.write([9], [b"9" * 8])
    far_writes = far.stats().writes
    found = stack.lookup([9])
    assert found.runs == [("far", 1)]
    assert stack.promote([9], found) == 1 and stack.promoted == {"disk": 0, "far": 1}
    stack.flush_demotions()  # (callers flush after every promote)
    if demotion == "write-through":
        assert 9 in disk.manager and stack.demoted == 1
        assert far.stats().writes == far_writes  # the source is not written again
    else:
        assert 9 not in disk.manager and stack.demoted == 0
    _store(host, stack, slots, [1, 2])  # evicts 9 from the host
    assert 9 not in host and 9 in disk.manager and 9 in far.manager


@pytest.mark.parametrize("host_slots, restored", [(4, 4), (3, 3), (2, 2)])
def test_restore_prefix_whose_head_is_only_on_the_disk(tmp_path, host_slots, restored):
    """Disk holds 10, 11 and the host 12, 13: the prefix [10, 11, 12, 13] is restored from its
    head, as much of it as the host can hold at once. It used to restore nothing (0, None)
    when the host could not hold all four (found by a newcomer session)."""
    tiered, kv, disk = make(tmp_path, host_slots=host_slots)
    data = {b: block(kv, b) for b in range(16)}
    disk.write([10, 11], [as_bytes(data[0]), as_bytes(data[1])])
    assert disk.flush(10)
    tiered.offload([12, 13], [2, 3])
    tiered.wait(10)
    for t in kv:
        t[4:8] = 0
    n, job, found = tiered.restore_prefix([10, 11, 12, 13], [4, 5, 6, 7])
    assert found.runs == [("disk", 2), ("host", 2)]
    assert n == restored and job is not None
    tiered.wait(10)
    for dst, src in zip(range(4, 4 + n), (0, 1, 2, 3)):
        assert torch.equal(block(kv, dst), data[src]), dst
    assert all(torch.count_nonzero(block(kv, d)) == 0 for d in range(4 + n, 8))
    assert tiered.stack.promoted == {"disk": 2}
    assert tiered.stack.promote_failures == (restored < 4)
    # write-back: the host blocks the promotion evicted went down with their bytes
    tiered.flush(10)
    gone = [k for k in (12, 13) if k not in tiered.offloader.manager]
    assert len(gone) == 4 - restored
    assert disk.read(gone) == [as_bytes(data[k - 10]) for k in gone]
    tiered.close()


def test_bad_stack_arguments():
    with pytest.raises(ValueError, match="demotion must be one of"):
        _host_stack(2, [], demotion="write-around")
    with pytest.raises(ValueError, match="used twice"):
        _host_stack(2, [SimTier("disk", 2, block_bytes=8), SimTier("disk", 2, block_bytes=8)])
    with pytest.raises(ValueError, match="stores blocks of 64 bytes"):
        _host_stack(2, [SimTier("disk", 2)])
    # newcomer finding: one tier where a list belongs (TieredOffloader(off, disk), as
    # docs/tiers.md spells [disk]) raised a bare "'SimTier' object is not iterable", None
    # "'NoneType' object is not iterable"
    for wrong, name in ((SimTier("disk", 2, block_bytes=8), "SimTier"), (None, "NoneType")):
        with pytest.raises(TypeError, match=rf"lower must be a list of tiers \(e\.g\. "
                                            rf"\[disk\]\), got {name}"):
            _host_stack(2, wrong)
    # found by newcomer10: block_bytes was not checked without lower tiers: "8" was taken,
    # and host_stats() then reported bytes_read = loads * "8", a str
    for bad in ("8", 0, -8, 8.0):
        with pytest.raises(ValueError, match=rf"block_bytes must be a positive int \(bytes\), "
                                             rf"got {bad!r}"):
            TierStack(OffloadingManager(2), [], bad, bytes, print)
    assert TierStack(OffloadingManager(2), [], np.int64(8), bytes, print).block_bytes == 8


# -- simulation (kvtier replay --tiers) ------------------------------------------------------
TINY = [[1, 2], [3], [1, 2], [3, 4], [1, 2, 5]]
# Worked by hand (host 2 blocks, disk 4, LRU), the same in both demotion modes:
#   [1,2] miss, host {1,2} | [3] miss, host evicts 2 | [1,2]: 1 host, 2 disk (promoted; host
#   evicts 3) | [3,4]: 3 disk | [1,2,5]: 1,2 disk, and 5 is not stored: the host's 2 slots
#   hold the request's prefix, pinned while it is read (a store failure, as in kvtier replay
#   -c 2). Host 1 hit, disk 4, of 10 block refs, 1 store failure.
# Write-back demotes the host victims the disk does not hold yet: 2 | 3 | 1 | 4 = 4 (the
# victims 2 in [3,4] and 3 in [1,2,5] were promoted from the disk, which still has them);
# write-through writes each stored block once: 1,2 | 3 | 4 = 4. (Until session 17 the
# simulation released the prefix before the store: 5 evicted 2 and was stored, and
# write-through wrote it too, 5 blocks, the 5th evicting one on the disk.)


@pytest.mark.parametrize("demotion, demoted, disk_writes, disk_evictions",
                         [("write-back", 4, 4, 0), ("write-through", 4, 4, 0)])
def test_tiny_trace_by_hand(demotion, demoted, disk_writes, disk_evictions):
    reqs = [Request(keys, None, None, None) for keys in TINY]
    r = replay_tiers(reqs, parse_tiers("host:2,disk:4"), "lru", demotion=demotion)
    assert [t.hit_blocks for t in r.tiers] == [1, 4]
    assert r.block_refs == 10 and r.block_hit_ratio == 0.5 and r.store_failures == 1
    assert r.tier_hit_ratio("host") == 0.1 and r.tier_hit_ratio("disk") == 0.4
    assert r.demoted == demoted
    disk = r.tiers[1].stats
    assert (disk.writes, disk.evictions) == (disk_writes, disk_evictions)
    assert r.tiers[1].promoted == 4


def test_cli_replay_tiers_on_a_tiny_trace(tmp_path):
    from typer.testing import CliRunner

    from kvtier.cli import app

    trace = tmp_path / "tiny.txt"
    trace.write_text("\n".join(" ".join(map(str, r)) for r in TINY) + "\n")
    out = tmp_path / "out.json"
    res = CliRunner().invoke(app, ["replay", str(trace), "--tiers", "host:2,disk:4", "-p",
                                   "lru", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "disk" in res.output and "40.00" in res.output and "50.00" in res.output
    payload = json.loads(out.read_text())
    (result,) = payload["results"]
    assert [(t["name"], t["hit_blocks"]) for t in result["tiers"]] == [("host", 1), ("disk", 4)]
    assert result["block_hit_ratio"] == 0.5
    runs = []
    for extra in ([], ["--stream"]):  # disk:40% of the 5 distinct blocks = 2 blocks
        res = CliRunner().invoke(app, ["replay", str(trace), "--tiers", "host:2,disk:40%",
                                       "-p", "lru,arc", "--json", str(out), *extra])
        assert res.exit_code == 0, res.output
        runs.append(json.loads(out.read_text()))
    assert runs[0]["results"] == [dict(r, seconds=runs[0]["results"][i]["seconds"])
                                  for i, r in enumerate(runs[1]["results"])]
    assert runs[0]["results"][0]["tiers"][1]["capacity"] == 2
    bad = CliRunner().invoke(app, ["replay", str(trace), "--tiers", "disk:4"])
    assert bad.exit_code == 1 and "first tier must be host" in bad.output
    bad = CliRunner().invoke(app, ["replay", str(trace), "--tiers", "host:2", "-c", "4"])
    assert bad.exit_code == 1 and "--capacity" in bad.output


def test_cli_replay_tiers_says_when_host_stores_failed(tmp_path):
    """Found by a newcomer session (17): kvtier replay shows its store failures (a column),
    the --tiers table did not: on a host too small for a request's prefix and new blocks
    together the hits fell with no word (the count was only in the JSON)."""
    from typer.testing import CliRunner

    from kvtier.cli import app

    trace = tmp_path / "tiny.txt"
    trace.write_text("\n".join(" ".join(map(str, r)) for r in TINY) + "\n")
    res = CliRunner().invoke(app, ["replay", str(trace), "--tiers", "host:2,disk:4", "-p",
                                   "lru,arc"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stderr.split())
    for policy in ("lru", "arc"):
        assert (f"warning: {policy} run: 1 of 5 requests could not store its new blocks in "
                "the host tier (host:2, 2 blocks: too small for a request's loaded "
                "prefix") in text
    res = CliRunner().invoke(app, ["replay", str(trace), "--tiers", "host:3,disk:4"])
    assert res.exit_code == 0 and "could not store" not in res.stderr


def test_replay_tiers_refuses_a_bad_request_as_replay_does():
    """Found by a newcomer session (17): replay_tiers() took a negative input_length (a token
    hit ratio of 102 %: -5,000 hit tokens of -4,900), a str one failed half-way with a bare
    "unsupported operand type(s) for +=", and a bare key list raised "AttributeError: 'list'
    object has no attribute 'keys'"; replay() refuses each by name before the request runs."""
    ok = Request([1], 100, None, None)
    with pytest.raises(ValueError, match=r"request 1: input_length must be >= 0 \(tokens\), "
                                         "got -5000"):
        replay_tiers([ok, Request([1], -5000, None, None)], parse_tiers("host:4"), "lru")
    with pytest.raises(TypeError, match=r"request 1: input_length must be an int \(tokens\) "
                                        "or None, got str '5'"):
        replay_tiers([ok, Request([1], "5", None, None)], parse_tiers("host:4"), "lru")
    with pytest.raises(TypeError, match=r"request 1 \(\[1, 2\]\) has no .keys: "
                                        r"replay_tiers\(\) takes Request objects"):
        replay_tiers([ok, [1, 2]], parse_tiers("host:4"), "lru")


def test_host_alone_equals_kvtier_replay(trace_slice):
    from kvtier.replay import replay

    for policy in ("lru", "arc", "s3fifo"):
        r = replay(trace_slice, policy, 500)
        t = replay_tiers(trace_slice, parse_tiers("host:500"), policy)
        assert (t.hit_blocks, t.hit_tokens) == (r.hit_blocks, r.hit_tokens)


def test_host_alone_equals_kvtier_replay_when_the_store_needs_the_loaded_prefix_slots():
    """Found by a newcomer session (17): the simulation released a request's loaded prefix
    (complete_load) before storing the rest, so that store could evict the prefix, while
    kvtier replay keeps it pinned until the request completes (W = 0). With a host too small
    for a request's prefix and new blocks together the two differed: [1] then [1, 0] on one
    block is a store failure in the replay and was a store in the simulation; on the
    embedded sample at 200 blocks 498 hits and 4 store failures against 499 and 5."""
    from kvtier.replay import replay
    from kvtier.trace import embedded_sample_path, read_trace

    tiny = [Request(keys, None, None, None) for keys in ([1], [1, 0])]
    r = replay(tiny, "lru", 1)
    t = replay_tiers(tiny, parse_tiers("host:1"), "lru")
    assert (t.hit_blocks, t.store_failures) == (r.hit_blocks, r.store_failures) == (1, 1)
    sample = list(read_trace(embedded_sample_path()))
    for policy in ("lru", "arc"):
        r = replay(sample, policy, 200)
        t = replay_tiers(sample, parse_tiers("host:200"), policy)
        assert (t.hit_blocks, t.hit_tokens, t.store_failures) == \
            (r.hit_blocks, r.hit_tokens, r.store_failures)
        assert (r.hit_blocks, r.store_failures) == (499, 5)


def test_a_disk_tier_only_adds_hits(trace_slice):
    alone = replay_tiers(trace_slice, parse_tiers("host:300"), "lru")
    for demotion in ("write-back", "write-through"):
        both = replay_tiers(trace_slice, parse_tiers("host:300,disk:3000"), "lru",
                            demotion=demotion)
        assert both.hit_blocks > alone.hit_blocks
        assert both.tiers[1].hit_blocks == both.tiers[1].promoted > 0


def test_parse_tiers_errors():
    assert [t.kind for t in parse_tiers("host:10, disk:5%, redis://h:1/0")] == \
        ["host", "disk", "redis"]
    for spec, msg in (("", "must name the tiers"), ("host:1,host:2", "named twice"),
                      ("host:1,tape:4", "expected host:CAP"), ("disk:4", "first tier"),
                      ("host:1,,disk:2", "empty item")):
        with pytest.raises(ValueError, match=msg):
            parse_tiers(spec)


def test_parse_tiers_keeps_a_redis_url_with_a_comma_whole():
    """Found by a newcomer session: --tiers was split at every comma, so a Redis password
    (or URL query) with a comma was cut in two, and the error echoed the password's tail:
    "--tiers item 'ret@127.0.0.1:6397/0': expected host:CAP, ...". A piece that follows a
    Redis URL and is not a tier item belongs to the URL."""
    tiers = parse_tiers("host:10,redis://:sec,ret@127.0.0.1:6397/0,disk:5")
    assert [(t.kind, t.url) for t in tiers] == [
        ("host", None), ("redis", "redis://:sec,ret@127.0.0.1:6397/0"), ("disk", None)]
    assert parse_tiers("host:1, redis://h:1/0?a=1,2")[1].url == "redis://h:1/0?a=1,2"
    for spec in ("host:1,redis://:sec,ret@h:1/0,host:2",
                 "host:1,redis://:sec,ret@h:1/0,redis://:sec,ret@h:2/0"):
        with pytest.raises(ValueError) as err:
            parse_tiers(spec)
        assert "sec" not in str(err.value) and "ret@" not in str(err.value), str(err.value)


def test_tiny_trace_with_a_real_redis_tier_below(tmp_path):
    """host:2 over Redis (unbounded) serves what host:2 over a never-full disk serves."""
    import shutil
    import socket
    import subprocess
    import time

    pytest.importorskip("kvtier.tiers.redis")
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        reqs = [Request(keys, None, None, None) for keys in TINY]
        r = replay_tiers(reqs, parse_tiers(f"host:2,redis://127.0.0.1:{port}/0"), "lru")
        assert [(t.name, t.hit_blocks) for t in r.tiers] == [("host", 1), ("redis", 4)]
    finally:
        proc.kill()
        proc.wait(10)


def _replay_cli(*args):
    from typer.testing import CliRunner

    from kvtier.cli import app

    return CliRunner().invoke(app, ["replay", "-p", "lru", "--limit", "150", *args])


def test_tiers_replay_with_an_unreachable_redis_fails_fast():
    """It used to print 0 Redis hits and exit 0 (found by a newcomer session)."""
    pytest.importorskip("kvtier.tiers.redis")
    import time

    from redis_servers import free_port

    t0 = time.monotonic()
    result = _replay_cli("--tiers", f"host:50,redis://127.0.0.1:{free_port()}/0")
    assert time.monotonic() - t0 < 5
    assert result.exit_code == 1
    assert "not reachable" in result.output and "Connection refused" in result.output
    assert "lru     redis" not in result.output  # no table of a run that did not happen


def test_tiers_replay_never_shows_a_redis_password(tmp_path):
    """The table's title, the --json file and --tiers errors showed a Redis URL's password
    (found by a newcomer); now each shows ``***`` as RedisTier's own messages do."""
    pytest.importorskip("kvtier.tiers.redis")
    from redis_servers import RedisServer, require_redis

    require_redis()
    server = RedisServer(tmp_path / "redis", password="s3cret-pw").start()
    try:
        out = tmp_path / "r.json"
        result = _replay_cli("--tiers", f"host:50,{server.url}", "--json", out)
        assert result.exit_code == 0, result.output
        assert "s3cret-pw" not in result.output and "redis://:***@127.0.0.1" in result.output
        text = out.read_text()
        assert "s3cret-pw" not in text
        assert json.loads(text)["tiers"][1]["url"] == f"redis://:***@127.0.0.1:{server.port}/0"
        for spec in (f"host:50,{server.url},redis://127.0.0.1:1/0", f"{server.url},host:50"):
            result = _replay_cli("--tiers", spec)
            assert result.exit_code == 1 and "s3cret-pw" not in result.output
            assert ":***@" in result.output
    finally:
        server.stop()


def test_tiers_replay_deletes_its_redis_keys_and_sets_a_ttl(redis_server):
    pytest.importorskip("kvtier.tiers.redis")
    from kvtier.tiersim import SIM_REDIS_TTL_S, _redis_tier

    tier = _redis_tier(redis_server.url, 64)
    try:
        assert tier.ttl_s == SIM_REDIS_TTL_S and tier.namespace.startswith("kvtier-tiersim-")
    finally:
        tier.close()
    tier = _redis_tier(redis_server.url + "?ttl_s=60&namespace=mine", 64)
    try:
        assert tier.ttl_s == 60 and tier.namespace.startswith("mine-")
    finally:
        tier.close()
    result = _replay_cli("--tiers", f"host:50,{redis_server.url}", "--json", "-")
    assert result.exit_code == 0, result.output
    served = json.loads(result.output[result.output.index("{"):])["results"][0]["tiers"][1]
    assert served["name"] == "redis" and served["hit_blocks"] > 0 and served["failures"] == 0
    assert redis_server.cli("DBSIZE").strip() == "0"  # the run's keys are gone


def test_tiers_replay_fails_when_redis_fails_during_the_run(redis_server):
    """A server that answers PING but refuses writes (out of memory, noeviction): the table
    is shown, then the command fails, naming the lost writes."""
    pytest.importorskip("kvtier.tiers.redis")
    redis_server.cli("CONFIG", "SET", "maxmemory-policy", "noeviction")
    redis_server.cli("CONFIG", "SET", "maxmemory", "1")
    result = _replay_cli("--tiers", f"host:50,{redis_server.url}")
    assert result.exit_code == 1
    assert "lru     redis" in result.output  # the figures are shown
    assert "failed during the run" in result.output and "block writes lost" in result.output


@pytest.mark.parametrize("policy", __import__("kvtier").available_policies())
def test_write_back_demotes_exactly_the_evicted_blocks_under_every_policy(tmp_path, policy):
    g = torch.Generator().manual_seed(1)
    kv = [torch.randn(24, *BLOCK, generator=g) for _ in range(2)]
    off = KVOffloader.create(kv, 4, policy, enable_events=True)
    disk = DiskTier(tmp_path / "disk", 32, off.pool.block_nbytes)
    tiered = TieredOffloader(off, [disk])
    data = {b: as_bytes(block(kv, b)) for b in range(24)}
    for i in range(0, 24, 3):
        tiered.offload([f"k{b}" for b in range(i, i + 3)], list(range(i, i + 3)))
        tiered.wait(10)
    tiered.flush(10)
    evicted = [k for e in tiered.take_events() if e.tier == "host" and e.removed for k in e.keys]
    assert len(evicted) == 20 == tiered.stack.demoted == len(disk)
    assert disk.read(evicted) == [data[int(k[1:])] for k in evicted]
    tiered.close()


@pytest.mark.parametrize("extra, message", [
    (["-p", "belady,lru"], "belady"),
    (["--admission", "adaptive"], "--admission"),
    (["--cost"], "--cost"),
])
def test_tiers_replay_refuses_options_it_does_not_simulate(extra, message):
    """--tiers used to ignore these silently (belady rows equal to lru's; found by a newcomer
    session): every option the simulation does not model is refused."""
    from typer.testing import CliRunner

    from kvtier.cli import app

    result = CliRunner().invoke(app, ["replay", "--tiers", "host:2%,disk:20%", *extra])
    assert result.exit_code == 1
    assert message in result.output


def test_a_redis_item_without_redis_py_says_how_to_install_it(monkeypatch):
    """Found by a newcomer session: in a fresh `pip install -e .` (no redis extra),
    `kvtier replay --tiers host:2%,disk:20%,redis://...` (docs/tiers.md's example) said only
    "not available: No module named 'redis'"."""
    import sys

    from kvtier.tiersim import _redis_tier

    monkeypatch.setitem(sys.modules, "kvtier.tiers.redis", None)  # import raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'kvtier\[redis\]'"):
        _redis_tier("redis://127.0.0.1:1/0", 64)


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo"])
def test_sim_tier_keeps_the_disk_tiers_bookkeeping(tmp_path, policy):
    """SimTier (``--tiers``) says it keeps DiskTier's bookkeeping: the same writes leave the
    same blocks in both, including writes that name blocks already present (found by a
    newcomer session: both evicted a call's own present keys to store its new ones; the
    disk tier protects them now, and the simulation must too)."""
    import random

    rng = random.Random(7)
    sim = SimTier("disk", 6, policy=policy, block_bytes=8)
    with DiskTier(tmp_path, 6, 8, policy=policy) as disk:
        for _ in range(120):
            keys = [rng.randrange(14) for _ in range(rng.randrange(1, 9))]
            blocks = [bytes(8)] * len(keys)
            assert sim.write(keys, blocks) == disk.write(keys, blocks)
            assert disk.flush(10)
            assert [k for k in range(14) if k in sim] == [k for k in range(14) if k in disk]
            st_sim, st_disk = sim.stats(), disk.stats()
            assert (st_sim.writes_skipped, st_sim.evictions) == (
                st_disk.writes_skipped, st_disk.evictions)



def test_flush_timeout_bounds_the_whole_call():
    """Found by a newcomer session: TierStack.flush(timeout) (and TieredOffloader.flush)
    gave each lower tier the whole timeout in turn, so with two tiers whose writes hang a
    flush(0.3) returned after 0.6 s. The timeout now bounds the call: each tier gets what
    is left of it."""
    import time

    class Hung(SimTier):
        waited: list

        def flush(self, timeout=None):
            self.waited.append(timeout)
            time.sleep(timeout)
            return False

    tiers = [Hung("disk", 4, block_bytes=8), Hung("far", 4, block_bytes=8)]
    for t in tiers:
        t.waited = []
    _, stack, _ = _host_stack(2, tiers)
    t0 = time.monotonic()
    assert stack.flush(0.3) is False
    assert time.monotonic() - t0 < 0.5
    assert tiers[0].waited[0] == pytest.approx(0.3, abs=0.05)
    assert tiers[1].waited[0] < 0.05  # what was left


def test_a_promotion_whose_slot_write_fails_leaves_no_pending_host_block(tmp_path):
    """Found by a newcomer session: when write_slot raised during a promotion (here a lower
    tier handing back a block of the wrong size, which the pool's slot refuses), the host's
    prepare_store had already made the promoted blocks pending and nothing completed them:
    their slots leaked and every later lookup answered HIT_PENDING for them. Now the
    promotion's store is dropped (complete_store(success=False)) before the error goes up."""
    g = torch.Generator().manual_seed(0)
    kv = [torch.randn(8, *BLOCK, generator=g) for _ in range(3)]
    off = KVOffloader.create(kv, 4, "lru")

    class Liar(SimTier):
        def read(self, keys):
            return [None if b is None else b[:-1] for b in super().read(keys)]

    liar = Liar("disk", 8, block_bytes=off.pool.block_nbytes)
    liar.write(["x0", "x1"], [bytes(off.pool.block_nbytes)] * 2)
    tiered = TieredOffloader(off, [liar])
    with pytest.raises(ValueError):
        tiered.restore_prefix(["x0", "x1"], [0, 1])
    st = off.manager.stats()
    assert (st.pending, st.pinned, st.used) == (0, 0, 0)
    assert off.manager.lookup_prefix(["x0"]) == 0
    tiered.close()


def test_docs_tiered_offloader_example_runs_as_written(tmp_path):
    """docs/tiers.md's TieredOffloader example, with small tensors for its names."""
    import re

    from conftest import REPO_ROOT

    text = (REPO_ROOT / "docs" / "tiers.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    block = block.replace('"/var/cache/kvtier"', repr(str(tmp_path / "disk")))
    kv = [torch.randn(16, 2, 16, 2, 8) for _ in range(2)]
    ns = {"kv_caches": kv, "block_hashes": ["a", "b", "c"], "gpu_block_ids": [0, 1, 2],
          "new_hashes": ["a", "b", "x"], "free_ids": [5, 6, 7]}
    exec(compile(block, "docs/tiers.md", "exec"), ns)  # noqa: S102 - the doc's own code
    assert ns["n"] == 2 and ns["found"].runs == [("host", 2)]
    assert torch.equal(kv[0][5], kv[0][0]) and torch.equal(kv[1][6], kv[1][1])


def _host_disk_redis_stack(tmp_path, url, demotion="write-back"):
    """A 2-slot host (bytes per slot in a dict) over a disk tier and a Redis tier."""
    from kvtier.tiers.redis import RedisTier

    size = 64
    host = OffloadingManager(2, "lru")
    slots: dict[int, bytes] = {}
    disk = DiskTier(tmp_path / "disk", 8, size)
    redis = RedisTier.from_url(url, block_bytes=size, fingerprint="fp",
                               namespace=f"close-{tmp_path.name}")
    stack = TierStack(host, [disk, redis], size, slots.__getitem__, slots.__setitem__,
                      demotion=demotion)
    return stack, host, slots, disk, redis


def test_close_with_a_closed_disk_still_demotes_to_redis_and_names_what_was_lost(
        tmp_path, redis_server):
    """Found by an earlier session: close() wrote the pending demotions tier by tier, the
    closed disk raised first, and the Redis tier's share was dropped with it, silently.
    Now every tier that can take the blocks gets them, every tier is closed, and close
    raises afterwards naming the tier that could not take them."""
    pytest.importorskip("kvtier.tiers.redis")
    stack, host, slots, disk, redis = _host_disk_redis_stack(tmp_path, redis_server.url)
    for key in ("a", "b", "c"):  # c evicts a (LRU); its bytes wait for flush_demotions
        out = host.prepare_store([key])
        slots[out.block_ids[0]] = key.encode() * 64
        host.complete_store([key])
    assert [k for k, _ in stack._victims] == ["a"]
    disk.close()  # its owner closed it
    with pytest.raises(RuntimeError, match=r"1 block.*not.*disk.*closed") as err:
        stack.close()
    assert "redis" not in str(err.value).split("closed")[0]  # Redis is not named as failing
    assert stack.demoted == 1  # written to Redis
    stack.close()  # idempotent: nothing left to report
    # the Redis tier got a's bytes before it was closed: read them with a fresh client
    from kvtier.tiers.redis import RedisTier

    again = RedisTier.from_url(redis_server.url, block_bytes=64, fingerprint="fp",
                               namespace=f"close-{tmp_path.name}")
    try:
        assert again.read(["a"]) == [b"a" * 64]
    finally:
        again.close()


def test_close_under_write_through_still_closes_redis_when_the_disk_refuses(
        tmp_path, redis_server):
    """Write-through: a block promoted from Redis waits for the disk below the host; with
    the disk closed, close reports it (not Redis, which it came from) and closes Redis."""
    pytest.importorskip("kvtier.tiers.redis")
    stack, host, slots, disk, redis = _host_disk_redis_stack(
        tmp_path, redis_server.url, demotion="write-through")
    redis.write(["x"], [b"x" * 64])
    assert redis.flush(10)
    found = stack.lookup(["x"])
    assert found.runs == [("redis", 1)]
    assert stack.promote(["x"], found) == 1 and slots[host.slot_of("x")] == b"x" * 64
    disk.close()
    with pytest.raises(RuntimeError, match=r"1 block was not demoted to 'disk'") as err:
        stack.close()
    assert "'redis'" not in str(err.value)
    with pytest.raises(RuntimeError, match="closed"):  # closed all the same
        redis.read(["x"])
    stack.close()


def test_an_eviction_with_a_closed_lower_tier_keeps_the_host_and_its_policy_in_step(tmp_path):
    """Found in session 13: under write-back the eviction asks each lower tier whether it
    holds the victim already (``in``); a disk closed by its owner raised there, inside the
    policy's eviction, after the policy had let the victim go: prepare_store raised and the
    host kept the block its policy no longer knew (never evictable again). The eviction now
    completes; the victim is copied, and flush_demotions names the closed tier."""
    host = OffloadingManager(2, "lru")
    slots: dict[int, bytes] = {}
    disk = DiskTier(tmp_path / "disk", 8, 64)
    stack = TierStack(host, [disk], 64, slots.__getitem__, slots.__setitem__)
    for key in ("a", "b"):
        out = host.prepare_store([key])
        slots[out.block_ids[0]] = key.encode() * 64
        host.complete_store([key])
    disk.close()
    out = host.prepare_store(["c"])
    assert out is not None and out.evicted_keys == ["a"]
    assert sorted(host.snapshot()["slot_of"]) == ["b", "c"]
    assert host.policy.snapshot()["order"] == ["b", "c"]  # the policy agrees (LRU first)
    with pytest.raises(RuntimeError, match=r"1 block was not demoted to 'disk' \(ValueError: "
                                           r"disk tier .* is closed\)"):
        stack.flush_demotions()
    assert stack.flush_demotions() == 0  # reported once
    stack.close()


def test_flush_demotions_writes_every_tier_that_can_take_them(tmp_path, redis_server):
    """flush_demotions wrote the victims tier by tier and a tier that raised (a disk its
    owner closed) kept the tiers after it from getting them: Redis lost them, silently
    under the disk's error. Now every other tier gets them, then it raises naming the
    tier that did not."""
    pytest.importorskip("kvtier.tiers.redis")
    stack, host, slots, disk, redis = _host_disk_redis_stack(tmp_path, redis_server.url)
    for key in ("a", "b", "c"):
        out = host.prepare_store([key])
        slots[out.block_ids[0]] = key.encode() * 64
        host.complete_store([key])
    disk.close()
    with pytest.raises(RuntimeError, match=r"1 block was not demoted to 'disk'") as err:
        stack.flush_demotions()
    assert "'redis'" not in str(err.value)
    assert stack.demoted == 1
    assert redis.flush(10) and redis.read(["a"]) == [b"a" * 64]
    stack.close()


def test_write_through_tries_every_tier_before_raising():
    """Session 14, item 2: TierStack.stored stopped at the first tier whose write raised,
    so the tiers below it never got the block. Every tier is written now, then one
    RuntimeError names each refusal (as TierStack.close and flush_demotions do)."""
    upper, lower = SimTier("upper", 4, block_bytes=8), SimTier("lower", 4, block_bytes=8)
    host, stack, slots = _host_stack(2, [upper, lower], demotion="write-through")

    def refuse(keys, blocks):
        raise OSError("upper is full of errors")

    upper.write = refuse
    out = host.prepare_store([1])
    slots[out.block_ids[0]] = b"1" * 8
    host.complete_store(out.keys_to_store)
    with pytest.raises(RuntimeError, match=r"TierStack.stored: 1 block was not demoted to "
                                           r"'upper' \(OSError: upper is full of errors\)"
                       ) as err:
        stack.stored(out.keys_to_store)
    assert isinstance(err.value.__cause__, OSError)
    assert lower.lookup_prefix([1]) == 1  # (a SimTier keeps no bytes)
    assert stack.demoted == 1  # taken by one tier at least


def test_close_keeps_the_results_when_a_lower_tier_fails_to_close(tmp_path):
    """Session 14, item 2: TieredOffloader.close lost wait's results (jobs applied to the
    host already) when the stack's close raised: the caller never saw its store job end,
    so never freed its device blocks. The error carries them, and poll returns them."""
    tiered, _kv, disk = make(tmp_path, demotion="write-through")
    job = tiered.offload(["a", "b"], [0, 1])
    real_close = disk.close

    def failing_close():
        real_close()
        raise OSError("disk unmounted")

    disk.close = failing_close
    with pytest.raises(RuntimeError, match=r"'disk' failed to close \(OSError: disk "
                                           r"unmounted\)") as err:
        tiered.close(10)
    assert _outcomes(err.value.results) == [(job, "store", True)]
    assert tiered.offloader.engine.closed
    assert _outcomes(tiered.poll()) == [(job, "store", True)]
    assert tiered.poll() == []


def test_close_keeps_the_results_of_jobs_that_end_after_wait_timed_out(tmp_path):
    """Session 15: when close's wait(timeout) timed out, a job that finished during the
    offloader's close (its own wait) was applied to the host and its result dropped: close
    returned [], no poll returned it, and under write-through its blocks never went down.
    close returns it with wait's (write-through applied), as it returns wait's."""
    tiered, kv, _disk = make(tmp_path, demotion="write-through")
    job = _job_ending_in_the_offloaders_close(tiered)
    results = tiered.close(0.05)
    assert _outcomes(results) == [(job, "store", True)]
    assert tiered.offloader.engine.closed
    assert tiered.poll() == []
    assert tiered.stack.demoted == 2  # written through before the disk closed
    reopened = DiskTier(tmp_path / "disk", 16, tiered.offloader.pool.block_nbytes)
    assert reopened.read(["b"]) == [as_bytes(block(kv, 1))]
    reopened.close()


def test_close_keeps_a_late_job_whose_write_through_fails(tmp_path):
    """As above, with the disk closed by its owner: the late job's write-through raises;
    the error carries the job's result and the next poll returns it, as for wait's."""
    tiered, _kv, disk = make(tmp_path, demotion="write-through")
    job = _job_ending_in_the_offloaders_close(tiered)
    disk.close()
    with pytest.raises(RuntimeError, match=r"not demoted to 'disk'") as err:
        tiered.close(0.05)
    assert _outcomes(err.value.results) == [(job, "store", True)]
    assert tiered.offloader.engine.closed
    assert _outcomes(tiered.poll()) == [(job, "store", True)]
    assert tiered.poll() == []


def _outcomes(results):
    """``(job_id, kind, ok)`` of each of ``results`` (TieredOffloader job results)."""
    return [(r.job_id, r.kind, r.ok) for r in results]


def _job_ending_in_the_offloaders_close(tiered):
    """A store job held in flight until ``tiered.offloader.close`` is called (after the
    tiered close's wait timed out); returns its job id."""
    gate = threading.Event()
    tiered.offloader.engine._before_copy = lambda *a: gate.wait(10)
    job = tiered.offload(["a", "b"], [0, 1])
    real_close = tiered.offloader.close

    def close_after_the_copy(timeout=None):
        gate.set()
        return real_close(timeout)

    tiered.offloader.close = close_after_the_copy
    return job


def test_a_victim_demoted_again_while_its_first_demotion_fails_reaches_the_disk(
        tmp_path, monkeypatch):
    """Session 17: under write-back the host evicted block 1, the disk's write of it was
    still running; block 1 came back into the host and was evicted again, and the stack's
    second write of it was skipped by the disk as "being written". That first write then
    failed (EIO): block 1 was in neither tier. The disk now writes the newer block when the
    write in flight fails."""
    from kvtier.tiers import disk as disk_mod

    gate = threading.Event()
    real = disk_mod._pwrite_all
    failed = []

    def flaky(fd, data, offset):  # the first data write of block 1 waits, then fails
        if bytes(data) == b"1......." and not failed:
            failed.append(offset)
            gate.wait(10)
            raise OSError(5, "Input/output error")
        real(fd, data, offset)

    monkeypatch.setattr(disk_mod, "_pwrite_all", flaky)
    with DiskTier(tmp_path / "disk", 4, 8, workers=2) as disk:
        host, stack, slots = _host_stack(1, [disk])
        _store(host, stack, slots, [1])
        _store(host, stack, slots, [2])  # evicts 1: its disk write hangs, then fails
        _store(host, stack, slots, [1])  # recomputed; evicts 2
        _store(host, stack, slots, [3])  # evicts 1 again: written while the first runs
        gate.set()
        assert stack.flush(10) and failed
        assert disk.stats().writes_failed == 1
        found = stack.lookup([1])
        assert found.runs == [("disk", 1)]
        assert stack.promote([1], found) == 1
        assert slots[host.slot_of(1)] == b"1......."


def test_demoted_counts_the_blocks_a_lower_tier_took(tmp_path, monkeypatch):
    """Session 17: TierStack.demoted counted every block handed to a lower tier whose write
    did not raise, also those the tier then skipped (a disk whose slots are all pending,
    a Redis tier with its breaker open): demoted 1, disk writes 0. It now counts from what
    each tier's write returns: blocks at least one lower tier took."""
    from kvtier.tiers import disk as disk_mod

    gate = threading.Event()
    real = disk_mod._pwrite_all
    monkeypatch.setattr(disk_mod, "_pwrite_all",
                        lambda fd, data, offset: (gate.wait(10), real(fd, data, offset)))
    with DiskTier(tmp_path / "disk", 1, 8, workers=1) as disk:
        host, stack, slots = _host_stack(1, [disk])
        assert disk.write(["x"], [b"x" * 8]) == 1  # the disk's one slot, pending until gate
        _store(host, stack, slots, [1])
        _store(host, stack, slots, [2])  # evicts 1: the disk has no slot to give
        assert disk.stats().writes_skipped == 1 and disk.stats().writes == 1
        assert stack.demoted == 0
        gate.set()
        assert disk.flush(10)
        _store(host, stack, slots, [3])  # evicts 2: the disk evicts x for it
        assert stack.demoted == 1 and disk.flush(10) and disk.lookup_prefix([2]) == 1
    # two lower tiers: a block counts once when either took it
    sim = SimTier("sim", 4, block_bytes=8)
    full = SimTier("full", 1, block_bytes=8)
    full.write(["y"], [b"y" * 8])
    full.manager.prepare_load(["y"])  # pinned: "full" has no room
    host, stack, slots = _host_stack(1, [full, sim])
    _store(host, stack, slots, [1])
    _store(host, stack, slots, [2])
    assert stack.demoted == 1 and full.stats().writes == 1 and sim.lookup_prefix([1]) == 1


@pytest.mark.parametrize("results, taken", [
    ([([1, 2, 3], 3)], 3),
    ([([1, 2, 3], 1)], 1),  # one lower tier: what it took
    ([([1, 2, 3], 0), ([1, 2, 3], 2)], 2),
    ([([1, 2, 3], 3), ([1, 2, 3], 1)], 3),
    ([([1, 2], 2), ([3, 4], 1)], 3),  # write-through: each tier its own keys
    ([([1, 2], 2), ([2, 3], 1)], 2),  # took 2 or 3: the least the counts allow
    ([([1, 2, 3], 2), ([1, 2, 3], 2)], 2),  # took 2 or 3
    ([([1, 1, 2], 2)], 2),  # a repeated key is one block
    ([([1, 2], None)], 2),  # a tier outside kvtier that returns no count: all, as before
    ([], 0),
])
def test_taken_counts_from_the_tiers_write_returns(results, taken):
    assert TierStack._taken(results) == taken
