"""DiskTier: round trip, recovery after restart and kill -9, corruption, crash consistency."""

from __future__ import annotations

import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import kvtier
from kvtier.tiers import disk as disk_mod
from kvtier.tiers.disk import RECORD_BYTES, DiskTier, DiskTierError, decode_key
from kvtier.tiers.base import encode_key

sys.path.insert(0, str(Path(__file__).parent))
from disk_writer import expected_block  # noqa: E402

WRITER = Path(__file__).parent / "disk_writer.py"
BB = 4096


def blk(key, nbytes=BB) -> bytes:
    return expected_block(hash(key) & 0xFFFF_FFFF, nbytes)


def test_round_trip_key_types_and_buffer_types(tmp_path):
    keys = [7, -3, 2**80, "h0", b"\x00raw", "ключ"]
    datas = [blk(k) for k in keys]
    bufs = [datas[0], bytearray(datas[1]), memoryview(datas[2]), datas[3],
            memoryview(bytearray(datas[4])), datas[5]]
    with DiskTier(tmp_path, 16, BB, workers=3) as t:
        assert t.write(keys, bufs) == len(keys)
        bufs[1][:] = bytes(BB)  # the caller reuses its buffer: the tier copied it
        assert t.flush(10)
        assert t.lookup_prefix(keys + ["absent"]) == len(keys)
        assert t.read(keys) == datas
        st = t.stats()
        assert (st.writes, st.writes_completed, st.read_hits, st.read_errors) == (6, 6, 6, 0)
        assert st.bytes_written == st.bytes_read == 6 * BB
        assert st.used_blocks == 6 and st.capacity_blocks == 16
        assert st.lookups == 7 and st.lookup_hits == 6
        assert st.write_latency.total >= 1 and st.read_latency.total == 6
        # present keys are skipped, not rewritten
        assert t.write([7], [datas[0]]) == 0
        assert t.stats().writes_skipped == 1
    for k in keys:
        assert decode_key(encode_key(k)) == k


def test_a_str_key_with_a_lone_surrogate_is_named(tmp_path):
    """Found by a newcomer session: a str key holding a lone surrogate ("\\ud800", what
    os.fsdecode makes of undecodable bytes) raised a bare UnicodeEncodeError ("'utf-8' codec
    can't encode character") from write, read and check_keys, naming neither the key nor the
    rule; it is the TypeError of any key without a stable encoding now."""
    with pytest.raises(TypeError, match=r"block key 'a\\ud800' has no stable byte encoding "
                                        r"\(a str with a lone surrogate is not UTF-8\)"):
        encode_key("a\ud800")
    with DiskTier(tmp_path, 4, BB) as t:
        for call in (lambda: t.write(["ok", "\ud800"], [blk(1), blk(2)]),
                     lambda: t.read(["\ud800"]), lambda: t.check_keys(["\ud800"])):
            with pytest.raises(TypeError, match="no stable byte encoding"):
                call()
        assert len(t) == 0 and t.stats().reads == 0


def test_bad_input_raises_and_changes_nothing(tmp_path):
    with DiskTier(tmp_path, 4, BB) as t:
        with pytest.raises(ValueError, match="block for key 2 is 10 bytes"):
            t.write([1, 2], [blk(1), b"x" * 10])
        with pytest.raises(TypeError, match="no stable byte encoding"):
            t.write([1, (1, 2)], [blk(1), blk(2)])
        with pytest.raises(ValueError, match="at most 216"):
            t.write(["k" * 300], [blk(1)])
        with pytest.raises(ValueError, match="2 keys but 1 block$"):  # was "1 blocks"
            t.write([1, 2], [blk(1)])
        with pytest.raises(ValueError, match=r"1 key but 2 blocks$"):
            t.write([1], [blk(1), blk(2)])
        with pytest.raises(ValueError, match=r"block for key 1 is 1 byte; this tier's blocks"):
            t.write([1], [b"x"])
        assert t.flush(5) and len(t) == 0 and t.stats().writes == 0
    with pytest.raises(ValueError, match="fsync must be one of none, batch"):
        DiskTier(tmp_path / "x", 4, BB, fsync="always")
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        DiskTier(tmp_path / "y", 0, BB)
    # the name is the tier's label in metrics, events and --tiers: empty, not a str, or only
    # spaces (taken until session 16) is refused
    for bad in ("", 5, " ", "\t"):
        said = f"name must be a non-empty str, got {bad!r}"
        with pytest.raises(ValueError, match=re.escape(said)):
            DiskTier(tmp_path / "n", 4, BB, name=bad)
    assert not (tmp_path / "n").exists()
    # found by a newcomer session: a slot file past the largest file offset raised a bare
    # OverflowError ("Python int too large to convert to C long") from ftruncate
    with pytest.raises(ValueError,
                       match=r"num_blocks x block_bytes = 4 x 4611686018427387904 bytes"):
        DiskTier(tmp_path / "z", 4, 2**62)
    assert not (tmp_path / "z").exists()
    t.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        t.lookup_prefix([1])
    # found by a newcomer pass: `in` and len() answered after close() while every other
    # call raised; all of them raise the same error now
    calls = {"lookup_prefix": lambda: t.lookup_prefix([1]), "read": lambda: t.read([1]),
             "write": lambda: t.write([1], [blk(1)]), "check_keys": lambda: t.check_keys([1]),
             "in": lambda: 1 in t, "len": lambda: len(t)}
    for call in calls.values():
        with pytest.raises(ValueError, match=r"^disk tier .* is closed$"):
            call()


def test_read_of_an_unhashable_key_names_it_and_counts_nothing(tmp_path):
    """read([1, [2]]) raised a bare "unhashable type: 'list'" after counting the call's
    reads (found by a newcomer): now the key is named and the counters are as before."""
    with DiskTier(tmp_path, 4, BB) as t:
        t.write([1], [blk(1)])
        assert t.flush(5)
        before = t.stats()
        for bad in ([1, [2]], [{}]):
            with pytest.raises(TypeError, match=r"DiskTier.read: block key .* is not hashable"):
                t.read(bad)
        after = t.stats()
        assert (after.reads, after.read_hits) == (before.reads, before.read_hits) == (0, 0)
        assert t.read([1]) == [blk(1)] and t.stats().reads == 1


def test_a_non_contiguous_block_is_written_as_its_bytes(tmp_path):
    """Found by a newcomer's fuzz: a block that is a non-contiguous view (every other byte
    of a buffer, a strided numpy array) passed the size check, then the copy raised
    "memoryview: casts are restricted to C-contiguous views" after prepare_store: its slot
    stayed pending for good (the tier lost a slot per such call). Its bytes, in order, are
    written as for any buffer."""
    np = pytest.importorskip("numpy")
    strided = memoryview(bytearray(blk(1, 2 * BB)))[::2]
    array = np.frombuffer(blk(2, 2 * BB), dtype=np.uint32)[::2]  # 4-byte items, every other
    with DiskTier(tmp_path, 2, BB) as t:
        assert t.write([1, 2], [strided, array]) == 2
        assert t.flush(5)
        assert t.read([1, 2]) == [strided.tobytes(), array.tobytes()]
        s = t.stats()
        assert (s.writes_completed, t.manager.stats().pending) == (2, 0)


@pytest.mark.parametrize("alias", [True, "numpy"])
def test_read_of_a_key_without_an_encoding_names_it_and_counts_nothing(tmp_path, alias):
    """Found by a newcomer's fuzz: read([np.int64(1)]) or read([True]) where block 1 is
    stored (equal keys to the manager) pinned and read the block, then its checksum check
    raised "no stable byte encoding" half-way: reads and loads counted, nothing returned.
    read now checks every key's encoding first, as write does."""
    if alias == "numpy":
        alias = pytest.importorskip("numpy").int64(1)
    with DiskTier(tmp_path, 4, BB) as t:
        t.write([1, 2], [blk(1), blk(2)])
        assert t.flush(5)
        before = (t.stats(), t.manager.snapshot())
        for keys in ([alias], [2, alias], [2, 1.5]):
            with pytest.raises(TypeError, match=r"block key .* has no stable byte encoding"):
                t.read(keys)
            after = (t.stats(), t.manager.snapshot())
            assert (after[0].reads, after[0].read_hits, after[1]) == (
                before[0].reads, before[0].read_hits, before[1])
        assert t.read([1, 2]) == [blk(1), blk(2)]


@pytest.mark.parametrize("blocks, match", [
    (None, r"DiskTier.write: blocks must be an iterable of blocks, got None"),
    (5, r"DiskTier.write: blocks must be an iterable of blocks, got 5"),
    (b"x" * BB, r"DiskTier.write: blocks must be a list of blocks, not a single bytes "
                r"object of 4096 bytes \(wrap it in a list\)"),
])
def test_write_names_blocks_that_are_not_a_list_of_blocks(tmp_path, blocks, match):
    """Found by newcomer10: write([1], None) raised "'NoneType' object is not iterable", and
    write([1], one_block) "1 keys but 4096 blocks" (the block's bytes taken as blocks)."""
    with DiskTier(tmp_path, 4, BB) as t:
        with pytest.raises(TypeError, match=match):
            t.write([1], blocks)
        assert t.stats().writes == 0 and len(t) == 0


def hold_writes(monkeypatch) -> threading.Event:
    """Make the tier's block writes wait (at most 10 s) until the returned event is set."""
    gate = threading.Event()
    real = disk_mod._pwrite_all

    def slow(fd, data, offset):
        gate.wait(10)
        real(fd, data, offset)

    monkeypatch.setattr(disk_mod, "_pwrite_all", slow)
    return gate


def test_write_is_readable_only_when_done(tmp_path, monkeypatch):
    gate = hold_writes(monkeypatch)
    with DiskTier(tmp_path, 8, BB, workers=2) as t:
        assert t.write([1, 2, 3], [blk(1), blk(2), blk(3)]) == 3
        assert t.lookup_prefix([1, 2, 3]) == 0
        assert t.read([1, 2, 3]) == [None, None, None]
        assert not t.flush(0.05)
        gate.set()
        assert t.flush(10)
        assert t.lookup_prefix([1, 2, 3]) == 3


def test_failed_write_is_counted_and_not_stored(tmp_path, monkeypatch):
    def broken(fd, data, offset):
        raise OSError(28, "No space left on device")

    with DiskTier(tmp_path, 8, BB) as t:
        monkeypatch.setattr(disk_mod, "_pwrite_all", broken)
        assert t.write([1, 2], [blk(1), blk(2)]) == 2
        assert t.flush(10)
        st = t.stats()
        assert st.writes_failed == 2 and st.writes_completed == 0 and len(t) == 0
        monkeypatch.undo()
        t.write([1], [blk(1)])
        t.flush(10)
        assert t.read([1]) == [blk(1)]


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo"])
def test_eviction_by_policy_keeps_capacity(tmp_path, policy):
    with DiskTier(tmp_path, 4, BB, policy=policy, enable_events=True) as t:
        for k in range(10):
            t.write([k], [blk(k)])
            t.flush(10)
        assert len(t) == 4
        st = t.stats()
        assert st.evictions == 6 and st.used_blocks == 4
        present = [k for k in range(10) if k in t]
        assert t.read(present) == [blk(k) for k in present]
        events = t.take_events()
        stored = [k for e in events if not e.removed for k in e.keys]
        removed = [k for e in events if e.removed for k in e.keys]
        assert stored == list(range(10)) and len(removed) == 6
        assert set(removed) | set(present) == set(range(10))
    if policy == "lru":
        assert present == [6, 7, 8, 9]


def test_more_blocks_than_capacity_keeps_the_head(tmp_path):
    with DiskTier(tmp_path, 4, BB) as t:
        assert t.write(list(range(6)), [blk(k) for k in range(6)]) == 4
        t.flush(10)
        assert t.lookup_prefix(list(range(6))) == 4
        assert t.stats().writes_skipped == 2


def test_a_write_never_evicts_its_own_present_keys(tmp_path):
    """Found by a newcomer session: a full 2-slot LRU tier holding 2 (least recent) and 1;
    write([2, 3]) skipped 2 as present but then evicted it to make room for 3 (only the new
    keys were named in the manager's prepare_store, so the present ones were not protected):
    lookup_prefix([2, 3]) fell from 1 to 0 -- the call lost its own head to store its tail.
    Now the call's present keys are protected, as in the manager; the victim is 1."""
    with DiskTier(tmp_path, 2, BB, policy="lru") as t:
        t.write([1, 2], [blk(1), blk(2)])  # keys[0] ends most recent: 2 is the LRU victim
        assert t.flush(10)
        assert t.write([2, 3], [blk(2), blk(3)]) == 1
        assert t.flush(10)
        assert 2 in t and 3 in t and 1 not in t
        assert t.lookup_prefix([2, 3]) == 2
        assert t.read([2, 3]) == [blk(2), blk(3)]
        st = t.stats()
        assert (st.evictions, st.writes_skipped) == (1, 1)
        # room counts only what can be evicted outside the call: present keys 3 and 2
        # fill the tier, so nothing new fits and the present ones stay
        assert t.write([3, 2, 4], [blk(3), blk(2), blk(4)]) == 0
        assert t.flush(10)
        assert 2 in t and 3 in t and 4 not in t
        assert t.stats().writes_skipped == 4


def test_write_latency_is_one_observation_per_write_call(tmp_path):
    """Found by a newcomer session: the write histogram observed each worker batch's time
    since the call began, so a call split over 4 workers counted its wall time about 4 times
    (16 x 2 MiB blocks: write_latency.sum_s 335 ms for a 109 ms write + flush), and
    kvtier:kv_offload_tiering_write_time (vLLM's write_time: time spent writing) and the
    throughput derived from it were off by the worker count. Now one observation per write
    call: from the call until its last batch is done."""
    import time

    with DiskTier(tmp_path, 16, BB, workers=4) as t:
        t0 = time.perf_counter()
        t.write(list(range(8)), [blk(k) for k in range(8)])  # 4 batches of 2
        assert t.flush(10)
        wall = time.perf_counter() - t0
        hist = t.stats().write_latency
        assert hist.total == 1 and 0 < hist.sum_s <= wall
        for k in (100, 101):
            t.write([k], [blk(k)])
            assert t.flush(10)
        assert t.stats().write_latency.total == 3


def test_a_key_repeated_in_one_write_keeps_its_first_block(tmp_path):
    # the same rule as the Redis tier (test_redis.py): first occurrence written, repeats skipped
    with DiskTier(tmp_path, 4, BB) as t:
        assert t.write([7, 8, 7, 7], [blk(1), blk(2), blk(3), blk(3)]) == 2
        assert t.flush(10)
        assert t.read([7, 8]) == [blk(1), blk(2)]
        assert (t.stats().writes, t.stats().writes_skipped) == (2, 2)


def test_restart_recovers_blocks_in_write_order(tmp_path):
    with DiskTier(tmp_path, 6, BB, policy="lru") as t:
        for k in range(8):  # 0 and 1 are evicted, their slots rewritten by 6 and 7
            t.write([k], [blk(k)])
            t.flush(10)
    with DiskTier(tmp_path, 6, BB, policy="lru") as t:
        assert len(t) == 6
        assert t.lookup_prefix(list(range(2, 8))) == 6 and 0 not in t and 1 not in t
        # LRU order is write order: the next write evicts 2, the oldest
        t.write([100], [blk(100)])
        t.flush(10)
        assert 2 not in t and 3 in t and 100 in t
        assert t.read(list(range(3, 8))) == [blk(k) for k in range(3, 8)]
    with DiskTier(tmp_path, 6, BB) as t:
        assert t.read([100, 3]) == [blk(100), blk(3)]


def test_layout_mismatch_and_second_opener_are_refused(tmp_path):
    t = DiskTier(tmp_path, 4, BB)
    with pytest.raises(DiskTierError, match="already open"):
        DiskTier(tmp_path, 4, BB)
    t.close()
    with pytest.raises(DiskTierError, match="block_bytes is 4096 there, 8192 asked"):
        DiskTier(tmp_path, 4, 8192)
    with pytest.raises(DiskTierError, match="num_blocks is 4 there, 5 asked") as info:
        DiskTier(tmp_path, 5, BB)
    assert info.value.differences == {"num_blocks": (4, 5)}  # for adapters naming options
    DiskTier(tmp_path, 4, BB).close()  # the refusals left the lock free


@pytest.mark.parametrize("meta", ["[1, 2]", '"kvtier-disk"', "null"])
def test_a_meta_json_that_is_not_an_object_is_named(tmp_path, meta):
    """Found by a newcomer session: valid JSON that is not an object raised
    "AttributeError: 'list' object has no attribute 'get'"."""
    DiskTier(tmp_path, 4, BB).close()
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(DiskTierError, match="meta.json"):
        DiskTier(tmp_path, 4, BB)


def test_an_empty_path_is_refused(tmp_path, monkeypatch):
    """Found by a newcomer session: DiskTier("", ...) made its files in the current
    directory (Path("") is "."), e.g. from an unset setting."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="path"):
        DiskTier("", 4, BB)
    assert list(tmp_path.iterdir()) == []


def _file_slot(t: DiskTier, key) -> int:
    (logical,) = t.manager.prepare_load([key])
    t.manager.complete_load([key])
    return t._phys[logical]


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def test_corrupt_data_is_a_miss_and_a_counted_error(tmp_path):
    keys = list(range(5))
    with DiskTier(tmp_path, 8, BB) as t:
        t.write(keys, [blk(k) for k in keys])
        t.flush(10)
        slot2 = _file_slot(t, 2)
        slot4 = _file_slot(t, 4)
    _flip(tmp_path / "blocks.dat", slot2 * BB + 1234)  # data of block 2
    _flip(tmp_path / "index.dat", slot4 * RECORD_BYTES + 40)  # the record of block 4
    with DiskTier(tmp_path, 8, BB) as t:
        assert 4 not in t  # a torn record is an empty slot
        assert t.lookup_prefix(keys) == 4  # block 2's record is valid; its data is not read
        got = t.read(keys)
        assert got == [blk(0), blk(1), None, blk(3), None]
        st = t.stats()
        assert st.read_errors == 1 and st.read_hits == 3
        assert t.lookup_prefix(keys) == 2  # known bad: a miss from now on
        assert t.read([2]) == [None] and t.stats().read_errors == 1  # not counted twice
        slot3 = _file_slot(t, 3)
        _flip(tmp_path / "blocks.dat", slot3 * BB)  # corruption while the tier is open
        assert t.read([3]) == [None] and t.stats().read_errors == 2
    with DiskTier(tmp_path, 8, BB) as t:
        assert 2 not in t and 3 not in t  # the bad records were dropped on disk too
        t.write([2], [blk(2)])  # and the blocks can be stored again
        t.flush(10)
        assert t.read([2]) == [blk(2)]


def test_bad_block_rewritten_in_place_while_open(tmp_path):
    with DiskTier(tmp_path, 4, BB) as t:
        t.write([1, 2], [blk(1), blk(2)])
        t.flush(10)
        _flip(tmp_path / "blocks.dat", _file_slot(t, 1) * BB + 7)
        assert t.read([1, 2]) == [None, blk(2)]
        assert t.lookup_prefix([1, 2]) == 0
        assert t.write([1], [blk(1)]) == 1
        t.flush(10)
        assert t.lookup_prefix([1, 2]) == 2 and t.read([1]) == [blk(1)]
        assert len(t) == 2


def test_fsync_batch_syncs_data_before_the_record(tmp_path, monkeypatch):
    calls = []
    real_sync, real_pwrite = os.fdatasync, os.pwrite
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(("sync", fd)), real_sync(fd)))
    monkeypatch.setattr(os, "pwrite", lambda fd, d, o: (calls.append(("write", fd)),
                                                       real_pwrite(fd, d, o))[1])
    with DiskTier(tmp_path, 2, BB, fsync="batch", workers=1) as t:
        calls.clear()
        t.write([1, 2], [blk(1), blk(2)])
        t.flush(10)
        data_fd, index_fd = t._data_fd, t._index_fd
        assert t.read([1, 2]) == [blk(1), blk(2)]
        fresh, calls[:] = list(calls), []
        t.write([3, 4], [blk(3), blk(4)])  # evicts 1 and 2: their slots held records
        t.flush(10)
        assert t.read([3, 4]) == [blk(3), blk(4)]
        evicting = list(calls)
    # slots that never held a record (session 17: all records zeroed before the data, which
    # came block by block before; the same order per block)
    assert fresh == [
        ("write", index_fd), ("write", index_fd),  # invalidate blocks 1 and 2's slots
        ("write", data_fd), ("write", data_fd),  # data
        ("sync", data_fd),
        ("write", index_fd), ("write", index_fd),  # the two records
        ("sync", index_fd),
    ]
    # slots of evicted blocks: the zeroed records are synced before the data overwrites
    # the old blocks (session 17), else a power loss could keep an old record over new data
    assert evicting == [
        ("write", index_fd), ("write", index_fd), ("sync", index_fd),
        ("write", data_fd), ("write", data_fd), ("sync", data_fd),
        ("write", index_fd), ("write", index_fd), ("sync", index_fd),
    ]


def _writer(path, num_blocks, bb, first, *extra):
    env = dict(os.environ)
    src = str(Path(kvtier.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(path), str(num_blocks), str(bb), str(first), *extra],
        stdout=subprocess.PIPE, text=True, env=env,
    )


def _check_all_intact(path, num_blocks, bb) -> int:
    """Open the tier: every block present must read back intact (no errors). Returns how many."""
    with DiskTier(path, num_blocks, bb) as t:
        keys = list(t.manager._slot_of)
        got = t.read(keys)
        st = t.stats()
        assert st.read_errors == 0, f"{st.read_errors} torn blocks offered after restart"
        assert got == [expected_block(k, bb) for k in keys]
        return len(keys)


def test_kill_9_mid_write_torn_block_is_a_miss(tmp_path):
    bb = 64 * 1024
    proc = _writer(tmp_path, 32, bb, 0, "--torn", "10")
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("torn"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert lines[-1] == "torn 10"
    done = max(int(x.split()[1]) for x in lines if x.startswith("done"))
    assert done < 10
    with DiskTier(tmp_path, 32, bb) as t:
        assert t.lookup_prefix(list(range(done + 1))) == done + 1  # flushed blocks survived
        assert 10 not in t
        assert t.read([10]) == [None]
        assert t.read(list(range(done + 1))) == [expected_block(k, bb) for k in range(done + 1)]
        assert t.stats().read_errors == 0
    # the torn slot's data really is half written: its bytes are not block 10's
    data = (tmp_path / "blocks.dat").read_bytes()
    assert expected_block(10, bb)[: bb // 2] in data
    assert expected_block(10, bb) not in data


def test_crash_consistency_random_kill_9(tmp_path):
    """A long write loop killed -9 at random points 24 times, reopened after each kill."""
    rng = random.Random(1234)
    num_blocks, bb = 48, 32 * 1024
    first = 0
    seen_done = 0
    for _ in range(24):
        proc = _writer(tmp_path, num_blocks, bb, first)
        # wait for the writer to be running, then kill it after a random delay
        line = proc.stdout.readline()
        assert line.startswith("done"), line
        threading.Event().wait(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        out = proc.stdout.read()
        proc.wait(10)
        done = [int(x.split()[1]) for x in [line, *out.splitlines()] if x.startswith("done")]
        last = max(done)
        n = _check_all_intact(tmp_path, num_blocks, bb)
        assert n > 0
        with DiskTier(tmp_path, num_blocks, bb) as t:
            assert last in t  # the last flushed block survived the kill
        seen_done += len(done)
        first = last + 100  # new keys each run; old slots get reused
    assert seen_done >= 24


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_operations_against_a_model(tmp_path, seed):
    """Random writes / reads / lookups / restarts on an LRU disk tier, checked against a
    model: an LRU dict of what must be readable (every write flushed at once)."""
    from collections import OrderedDict

    rng = random.Random(seed)
    cap, bb = 6, 512
    model: OrderedDict = OrderedDict()  # key -> bytes, least recent first
    t = DiskTier(tmp_path, cap, bb, workers=2)
    try:
        for _ in range(250):
            op = rng.random()
            if op < 0.45:
                keys = rng.sample(range(20), rng.randint(1, 4))
                t.write(keys, [blk(k, bb) for k in keys])
                assert t.flush(10)
                new = [k for k in keys if k not in model]
                # the shortfall, LRU first, never a key the call names (present ones kept)
                victims = [k for k in model if k not in keys]
                for k in victims[:max(0, len(model) + len(new) - cap)]:
                    del model[k]
                # the manager completes a batch in reverse: keys[0] ends most recent
                for k in reversed(new):
                    model[k] = blk(k, bb)
            elif op < 0.8:
                keys = rng.sample(range(20), rng.randint(1, 5))
                got = t.read(keys)
                assert got == [model.get(k) for k in keys]
                for k in reversed([k for k in keys if k in model]):
                    model.move_to_end(k)
            elif op < 0.95:
                keys = rng.sample(range(20), rng.randint(1, 5))
                expect = 0
                for k in keys:
                    if k not in model:
                        break
                    expect += 1
                assert t.lookup_prefix(keys) == expect
            else:  # restart: the order becomes the write order, so the model is rebuilt
                t.close()
                t = DiskTier(tmp_path, cap, bb, workers=2)
                assert set(t.manager._slot_of) == set(model)
                order = list(t.manager.policy.snapshot()["order"])
                model = OrderedDict((k, model[k]) for k in order)
            assert len(t) == len(model) <= cap
        assert t.stats().read_errors == 0
    finally:
        t.close()


def test_a_lone_str_is_not_a_key_list(tmp_path):
    """Found by a newcomer session: write("g", [...]) stored key 'g'; "ab" would be two keys."""
    with DiskTier(tmp_path, 8, 64) as t:
        for call in (lambda: t.write("ab", [b"z" * 64, b"y" * 64]), lambda: t.read("ab"),
                     lambda: t.lookup_prefix("ab")):
            with pytest.raises(TypeError, match="wrap it in a list"):
                call()
        assert t.stats().writes == 0


def test_stats_from_a_scrape_thread_never_runs_the_manager_beside_the_engine(tmp_path):
    """TierCollector calls stats() on the scraping thread (docs/metrics.md: tiers' stats()
    are thread-safe). Found by a newcomer session: stats() collected finished writes into
    the tier's manager (complete_store) while the engine thread was inside write()'s
    prepare_store; with ARC a scrape loop beside a write loop raised
    "PolicyError: ARCPolicy.evict(5) returned 4 victims" within seconds. The engine's call
    now waits for the scrape's collection (and the other way round)."""
    t = DiskTier(tmp_path / "d", 8, 8, workers=1)
    m = t.manager
    in_complete = threading.Event()
    overlaps: list[str] = []
    real_complete, real_prepare = m.complete_store, m.prepare_store

    def complete_store(keys, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            in_complete.set()
            threading.Event().wait(0.3)  # the engine thread calls write meanwhile
            try:
                return real_complete(keys, *args, **kwargs)
            finally:
                in_complete.clear()
        return real_complete(keys, *args, **kwargs)

    def prepare_store(keys, *args, **kwargs):
        if in_complete.is_set():
            overlaps.append(f"prepare_store({keys}) during the scrape's complete_store")
        return real_prepare(keys, *args, **kwargs)

    m.complete_store, m.prepare_store = complete_store, prepare_store
    t.write([1], [b"a" * 8])

    def scrape():
        for _ in range(10_000):  # until the write above has finished and is collected
            t.stats()
            if m.stats().completed_stores:
                return

    scraper = threading.Thread(target=scrape)
    scraper.start()
    assert in_complete.wait(10)
    t.write([2], [b"b" * 8])
    scraper.join(10)
    assert overlaps == []
    assert t.flush(10) and t.read([1, 2]) == [b"a" * 8, b"b" * 8]
    t.close()


def test_numpy_sizes_are_taken_as_the_manager_takes_them(tmp_path):
    """Found by a newcomer session: OffloadingManager(np.int64(4)) works, DiskTier refused
    the same np.int64 ("num_blocks must be a positive int, got np.int64(4)")."""
    np = pytest.importorskip("numpy")
    with DiskTier(tmp_path, np.int64(4), np.int32(BB), workers=np.int64(2)) as t:
        assert (type(t.num_blocks), type(t.block_bytes)) == (int, int)
        assert t.write([1], [blk(1)]) == 1 and t.flush(5) and t.read([1]) == [blk(1)]
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        DiskTier(tmp_path / "b", np.bool_(True), BB)


def test_an_offline_policy_is_refused(tmp_path):
    """Found by a newcomer session: DiskTier(policy="belady") opened, and at the first
    eviction warned that with no oracle it evicts exactly as LRU (KVTierOffloadingSpec
    refuses offline policies up front)."""
    with pytest.raises(ValueError, match="offline"):
        DiskTier(tmp_path, 4, BB, policy="belady")
    assert not (tmp_path / "meta.json").exists()


def test_a_new_tier_that_fails_to_open_leaves_no_layout_behind(tmp_path, monkeypatch):
    """Noticed in session 9: ``DiskTier(num_blocks=2**31 - 1)`` created its files and
    meta.json, then failed with MemoryError reading the index; the directory then refused
    every later tier as 'made for another layout'. A tier that never opened now removes
    the files it created (a directory that already held a tier is left as it was)."""
    def no_memory(self):
        raise MemoryError("index too large")

    monkeypatch.setattr(DiskTier, "_load_index", no_memory)
    with pytest.raises(MemoryError):
        DiskTier(tmp_path / "d", 2**20, 64)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["lock"]
    monkeypatch.undo()
    tier = DiskTier(tmp_path / "d", 8, 64)  # the directory is usable: no layout mismatch
    tier.write(["k"], [b"x" * 64])
    tier.flush()
    tier.close()
    # an existing tier's files survive a failed reopen
    monkeypatch.setattr(DiskTier, "_load_index", no_memory)
    with pytest.raises(MemoryError):
        DiskTier(tmp_path / "d", 8, 64)
    monkeypatch.undo()
    tier = DiskTier(tmp_path / "d", 8, 64)
    assert tier.read(["k"]) == [b"x" * 64]
    tier.close()


def test_a_file_path_and_a_file_too_large_are_named(tmp_path, monkeypatch):
    """Found by newcomer12: a path that is a file raised "[Errno 17] File exists: PATH"
    (it does exist; the trouble is that it is no directory), and a tier larger than the file
    system takes (ext4: 16 TiB, e.g. 2**20 slots of 1 GiB) a bare "[Errno 27] File too
    large" naming no file and no size."""
    import errno

    file = tmp_path / "blocks"
    file.write_bytes(b"mine")
    with pytest.raises(DiskTierError, match="the path is a file; a disk tier is a directory"):
        DiskTier(file, 8, 64)
    assert file.read_bytes() == b"mine"

    real = os.ftruncate

    def efbig(fd, size):
        if size > 2**40:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        return real(fd, size)

    monkeypatch.setattr(disk_mod.os, "ftruncate", efbig)
    with pytest.raises(DiskTierError, match=r"cannot size blocks.dat to 1,125,899,906,842,624 "
                                            r"bytes \(1,048,576 slots; File too large\)"):
        DiskTier(tmp_path / "big", 2**20, 2**30)
    assert sorted(p.name for p in (tmp_path / "big").iterdir()) == ["lock"]
    DiskTier(tmp_path / "big", 8, 64).close()  # the directory is usable afterwards


def test_flush_takes_an_infinite_timeout_and_refuses_a_bad_one(tmp_path, monkeypatch):
    """Found by a newcomer session: flush(float("inf")) with writes in flight raised
    OverflowError ('timestamp out of range for platform time_t', from the Condition wait),
    flush(float("nan")) spun on a non-blocking wait until the writes were done, and
    flush("5") with writes in flight raised a bare TypeError from threading."""
    gate = hold_writes(monkeypatch)
    with DiskTier(tmp_path, 8, BB, workers=2) as t:
        assert t.write([1, 2], [blk(1), blk(2)]) == 2
        for bad in (float("nan"), "5", True):
            with pytest.raises(ValueError, match="flush: timeout must be None or a number"):
                t.flush(bad)
        threading.Timer(0.05, gate.set).start()
        assert t.flush(float("inf")) is True
        assert t.lookup_prefix([1, 2]) == 2


def test_flush_refuses_a_negative_timeout(tmp_path, monkeypatch):
    """Found by a newcomer session: flush(-1) was taken as "do not wait" (threading's
    reading) while NaN and bools were refused; a negative timeout is a sign error or a
    deadline already passed. Refused before anything is collected; 0 polls."""
    gate = hold_writes(monkeypatch)
    with DiskTier(tmp_path, 8, BB, workers=2) as t:
        assert t.write([1, 2], [blk(1), blk(2)]) == 2
        for bad in (-1, -0.5, -math.inf):
            with pytest.raises(ValueError, match=r"flush: timeout must be None or a number of "
                                                 rf"seconds >= 0, got {bad!r}"):
                t.flush(bad)
        assert t.flush(0) is False  # writes still held: 0 polls
        gate.set()
        assert t.flush(10) is True and t.lookup_prefix([1, 2]) == 2


def test_a_dict_as_the_key_list_is_refused(tmp_path):
    """Found by a newcomer session (on RedisTier; DiskTier did the same): write({6: 1},
    [block]) took the dict's keys as the key list and stored block 6."""
    with DiskTier(tmp_path, 4, BB) as t:
        for method, args in (("write", ([blk(6)],)), ("lookup_prefix", ()), ("read", ())):
            with pytest.raises(TypeError, match=rf"DiskTier.{method}: keys must be a list of "
                                                r"block keys, not a dict"):
                getattr(t, method)({6: 1}, *args)
        assert t.flush(5) and len(t) == 0 and t.stats().writes == 0


def test_a_block_that_is_not_bytes_like_is_named(tmp_path):
    """Found by a newcomer session: write([1], ["x" * 16]) raised a bare "memoryview: a
    bytes-like object is required, not 'str'", naming neither the key nor the rule."""
    with DiskTier(tmp_path, 4, BB) as t:
        # "is an int", not "is a int": grammar found by a newcomer session (seen failing)
        for bad, article in (("x" * BB, "a"), (None, "a"), (5, "an"), (object(), "an")):
            with pytest.raises(TypeError, match=rf"block for key 2 is {article} "
                                                rf"{type(bad).__name__}, not a bytes-like object"):
                t.write([1, 2], [blk(1), bad])
        assert t.flush(5) and len(t) == 0 and t.stats().writes == 0


def test_a_write_offers_its_keys_in_the_call_order(tmp_path, monkeypatch):
    """Found in the session's review: a write named its new keys, then its stored ones, in
    prepare_store (new + present), so a policy's on_store hook (the prefix-aware policies
    learn parent links from it) saw [1, 3, 2] for write([1, 2, 3]) with 2 stored. The offer
    is now the call's order, on the disk and in the simulation (kvtier.tiers.base.plan_write)."""
    from kvtier.tiersim import SimTier

    with DiskTier(tmp_path, 4, BB, policy="lru") as disk:
        sim = SimTier("sim", 4, block_bytes=BB)
        for tier in (disk, sim):
            offers = []
            real = tier.manager.prepare_store
            monkeypatch.setattr(tier.manager, "prepare_store",
                                lambda keys, *a, _real=real, **kw: offers.append(list(keys))
                                or _real(keys, *a, **kw))
            tier.write([2], [blk(2)])
            assert tier.flush(10)
            tier.write([1, 2, 3], [blk(1), blk(2), blk(3)])
            assert tier.flush(10)
            assert offers == [[2], [1, 2, 3]]
            # a tier without room for all: the new keys cut off leave the offer, in order
            tier.write([5, 1, 6, 7, 8], [blk(k) for k in (5, 1, 6, 7, 8)])
            assert tier.flush(10)
            # room 3: 1 free slot and 3 evictable blocks, 1 of them the call's own (1)
            assert offers[-1] == [5, 1, 6, 7]


def test_num_blocks_is_read_only(tmp_path):
    """Session 14, item 2: DiskTier.num_blocks was a plain attribute; a new value broke the
    file sizes, the checksums and the slot map. It is read-only, as the manager's."""
    with DiskTier(tmp_path, 4, BB) as t:
        with pytest.raises(AttributeError, match=r"DiskTier.num_blocks is fixed when the tier "
                                                 r"is opened \(4 slots\).*for 8"):
            t.num_blocks = 8
        assert t.num_blocks == 4 and type(t.num_blocks) is int
        assert t.stats().capacity_blocks == 4
        assert "num_blocks=4" in repr(t)


def test_in_answers_readable_blocks_only(tmp_path, monkeypatch):
    """``key in tier`` says the block is stored and readable. A block whose write was still
    running answered True while lookup_prefix and read said it was not there; a tier stack
    asks ``in`` to skip copying a host victim the tier holds, so a victim whose earlier disk
    write was still pending (and then failed) was dropped from both tiers."""
    gate = hold_writes(monkeypatch)
    with DiskTier(tmp_path, 8, BB, workers=1) as t:
        assert t.write([1], [blk(1)]) == 1
        assert t.lookup_prefix([1]) == 0 and t.read([1]) == [None]
        assert 1 not in t and len(t) == 1  # stored (a slot taken), not readable
        gate.set()
        assert t.flush(10)
        assert 1 in t and t.read([1]) == [blk(1)]


def test_in_and_len_from_another_thread_wait_for_the_engine_call(tmp_path, monkeypatch):
    """The class docstring (and docs/tiers.md) say ``in`` and ``len`` may be called from
    another thread, every public method that uses the manager running under one lock. Found
    by a newcomer session: they took no lock, so ``key in tier`` asked while the engine
    thread was collecting a failed write (complete_store(success=False): the key no longer
    pending, its slot not yet freed) answered True, and ``len`` counted the block, for a
    block that was never readable."""

    def fail(fd, data, offset):
        raise OSError("disk full")

    monkeypatch.setattr(disk_mod, "_pwrite_all", fail)
    t = DiskTier(tmp_path / "d", 4, BB, workers=1)
    assert t.write([1], [blk(1)]) == 1
    policy = t.manager.policy
    real_remove = policy.remove
    inside, go_on = threading.Event(), threading.Event()

    def remove(keys):  # the failed store's drop, inside complete_store
        inside.set()
        go_on.wait(10)
        return real_remove(keys)

    policy.remove = remove
    engine = threading.Thread(target=t.flush, args=(10,))  # collects the failed write
    engine.start()
    assert inside.wait(10)
    answers: list = []
    asker = threading.Thread(target=lambda: answers.append((1 in t, len(t))))
    asker.start()
    asker.join(0.3)
    go_on.set()
    engine.join(10)
    asker.join(10)
    assert answers == [(False, 0)]
    assert t.stats().writes_failed == 1 and 1 not in t and len(t) == 0
    t.close()


def fail_writes_of(monkeypatch, *failing: bytes) -> threading.Event:
    """Make the tier's data write of each block in ``failing`` wait (at most 10 s) for the
    returned event, then fail with EIO (once per block); other blocks are written."""
    gate = threading.Event()
    real = disk_mod._pwrite_all
    left = [bytes(b) for b in failing]

    def flaky(fd, data, offset):
        head = bytes(memoryview(data)[:64])
        for i, block in enumerate(left):
            if head == block[:64]:
                del left[i]
                gate.wait(10)
                raise OSError(5, "Input/output error")
        real(fd, data, offset)

    monkeypatch.setattr(disk_mod, "_pwrite_all", flaky)
    return gate


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_write_does_not_drop_a_newer_write_of_its_key(tmp_path, monkeypatch, workers):
    """Noticed in session 16, fixed in session 17: write([1], [a]) still in flight,
    write([1], [b]) skipped 1 as "being written"; when a's write then failed (disk full, EIO)
    block 1 was gone although b was offered: lookup 0, read None. Now the newer block waits
    behind the write in flight and is written when that write fails (the newest waiting
    block: c replaces b). The tier holds c, also after a restart."""
    a, b, c = blk("a"), blk("b"), blk("c")
    gate = fail_writes_of(monkeypatch, a)
    with DiskTier(tmp_path, 4, BB, workers=workers) as t:
        assert t.write([1], [a]) == 1
        t.write([2, 1], [blk(2), b])
        t.write([3, 1], [blk(3), c])
        assert t.lookup_prefix([1]) == 0 and t.read([1]) == [None]  # not readable yet
        gate.set()
        assert t.flush(10)
        assert t.lookup_prefix([1, 2, 3]) == 3
        assert t.read([1, 2, 3]) == [c, blk(2), blk(3)]
        st = t.stats()
        # a failed; c written and completed; b replaced by c before it was tried: skipped
        assert (st.writes, st.writes_failed, st.writes_completed, st.writes_skipped) == (
            4, 1, 3, 1)
        assert t.manager.stats().pending == 0
    with DiskTier(tmp_path, 4, BB) as t:
        assert t.read([1, 2, 3]) == [c, blk(2), blk(3)] and t.stats().read_errors == 0


def test_a_newer_write_behind_a_write_that_succeeds_is_skipped(tmp_path, monkeypatch):
    """The other outcome: the write in flight succeeds, so the key is stored and the block
    waiting behind it is skipped, as for any key the tier holds (a block key names its
    bytes: a stored key is not rewritten)."""
    gate = hold_writes(monkeypatch)
    with DiskTier(tmp_path, 4, BB, workers=2) as t:
        assert t.write([1], [blk(1)]) == 1
        assert t.write([1], [blk("other")]) == 0  # waits behind; counted when resolved
        gate.set()
        assert t.flush(10)
        assert t.read([1]) == [blk(1)]
        st = t.stats()
        assert (st.writes, st.writes_completed, st.writes_failed, st.writes_skipped) == (
            1, 1, 0, 1)
        assert st.bytes_written == BB


def test_a_failed_rewrite_of_a_bad_block_does_not_drop_a_newer_write(tmp_path, monkeypatch):
    """The same for a block rewritten in place after it failed verification: a rewrite in
    flight that fails leaves the newer block of the key to be written (it was skipped, and
    the key stayed a miss)."""
    with DiskTier(tmp_path, 4, BB, workers=2) as t:
        t.write([1], [blk(1)])
        assert t.flush(10)
        _flip(tmp_path / "blocks.dat", _file_slot(t, 1) * BB + 7)
        assert t.read([1]) == [None] and t.stats().read_errors == 1
        a, b = blk("a"), blk("b")
        gate = fail_writes_of(monkeypatch, a)
        assert t.write([1], [a]) == 1  # the rewrite in place
        t.write([1], [b])
        gate.set()
        assert t.flush(10)
        assert t.lookup_prefix([1]) == 1 and t.read([1]) == [b]
        st = t.stats()
        assert (st.writes_failed, st.writes_completed, st.read_errors) == (1, 2, 1)
        assert t.manager.ref_count(1) == 0  # no pin left behind


@pytest.mark.parametrize("reopen", [False, True])
def test_fsync_batch_a_power_loss_never_brings_back_an_evicted_block_as_an_error(
        tmp_path, monkeypatch, reopen):
    """Noticed in session 16, fixed in session 17: with fsync="batch" a write into the slot
    of an evicted block zeroed the block's record without syncing it, wrote and synced the
    new data, then wrote and synced the new record. A power loss between the two syncs
    could leave the evicted block's old record (the index's last synced state) over the new
    data: at the next open the block was offered and read as a counted error. Here each
    file's last synced content is taken after every fdatasync of that write (what a power
    loss may leave when none of the later page writes reached the device) and opened as a
    tier: every block it offers must read back intact (also when blocks 1 and 2 were
    recovered at open)."""
    blocks = {k: blk(k) for k in (1, 2, 3)}
    t = DiskTier(tmp_path / "t", 2, BB, fsync="batch", workers=1, policy="lru")
    for k in (1, 2):
        t.write([k], [blocks[k]])
        assert t.flush(10)
    if reopen:
        t.close()
        t = DiskTier(tmp_path / "t", 2, BB, fsync="batch", workers=1, policy="lru")

    def image(fd):
        return os.pread(fd, os.fstat(fd).st_size, 0)

    synced = {t._data_fd: image(t._data_fd), t._index_fd: image(t._index_fd)}
    crashes = []  # (blocks.dat, index.dat) as last synced, after each sync of the write
    real_sync = os.fdatasync

    def fdatasync(fd):
        real_sync(fd)
        if fd in synced:
            synced[fd] = image(fd)
            crashes.append((synced[t._data_fd], synced[t._index_fd]))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    t.write([3], [blocks[3]])  # evicts 1 (LRU): its slot gets block 3
    assert t.flush(10)
    assert 1 not in t and t.read([2, 3]) == [blocks[2], blocks[3]]
    monkeypatch.undo()
    t.close()
    assert len(crashes) >= 2
    for n, (data, index) in enumerate(crashes):
        d = tmp_path / f"crash{n}"
        d.mkdir()
        (d / "meta.json").write_bytes((tmp_path / "t" / "meta.json").read_bytes())
        (d / "blocks.dat").write_bytes(data)
        (d / "index.dat").write_bytes(index)
        with DiskTier(d, 2, BB) as c:
            keys = sorted(c.manager._slot_of)
            got = c.read(keys)
            bad = [k for k, b in zip(keys, got, strict=True) if b is None]
            assert c.stats().read_errors == 0, f"after sync {n + 1}: {keys} offered, {bad} bad"
            assert got == [blocks[k] for k in keys]
