"""DiskTier: a local-disk block tier of fixed-size slots, surviving restarts.

Layout of a tier directory (format version 1, see ``docs/tiers.md``)::

    meta.json    {"format": "kvtier-disk", "version": 1, "block_bytes": B, "num_blocks": N,
                  "record_bytes": 256}  -- written once, atomically (tmp + fsync + rename)
    blocks.dat   N slots of B bytes; slot s at offset s * B
    index.dat    N records of 256 bytes; the record of slot s at offset s * 256
    lock         flock()ed while a process has the tier open (a second opener gets an error)

A record (little-endian) says which block slot ``s`` holds::

    0   magic  b"KVTR"        4   version u16 (1)     6   key length u16 (<= 216)
    8   seq u64 (write order)  16  data length u64    24  data checksum u64
    32  key bytes (encode_key), zero-padded to 248    248 record checksum u64

The data checksum is ``xxh3_64(data, seed=xxh3_64(key bytes))`` (so a slot's bytes also prove
*which* block they are); the record checksum is ``xxh3_64(record[0:248])``. An all-zero or
otherwise invalid record means "slot empty".

Crash consistency. A batch of blocks is written as: (1) their slots' records are overwritten
with zeros, (2) with ``fsync="batch"``, when one of the slots may hold a valid record on the
device (an evicted block's, a bad one's, a failed write's), the index file is
``fdatasync``-ed, (3) the data is written, (4) with ``fsync="batch"`` the data file is
``fdatasync``-ed, (5) the new records are written, (6) with ``fsync="batch"`` the index file
is ``fdatasync``-ed; only then are the blocks readable. A process killed at any point (and,
with ``fsync="batch"``, a power loss) leaves each slot's record either the old valid one (old
data untouched), empty, or the new valid one over fully written data. On open every record
is checked (magic, version, record checksum) and the valid ones rebuild the index; every read
verifies the data checksum, so a block torn by a power loss (whose page writes the kernel
reordered, with ``fsync="none"``) reads as a miss plus a counted error.

Slots are managed by a kvtier :class:`~kvtier.OffloadingManager` (same policies and contract
as the host tier). The manager hands out *logical* slots; a permutation maps them to file
slots, so blocks recovered at open keep the file slots they are in.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import operator
import os
import queue
import struct
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

from kvtier.checks import (
    check_positive_int,
    check_timeout,
    counted,
    key_list,
    unhashable_error,
)
from kvtier.manager import OffloadingManager
from kvtier.policies import CachePolicy, get_policy
from kvtier.tiers.base import (
    BlockTier,
    Key,
    TierStats,
    block_list,
    block_nbytes,
    encode_key,
    plan_write,
)
from kvtier.types import OffloadingEvent

__all__ = ["FSYNC_MODES", "DiskTier", "DiskTierError", "decode_key"]

FORMAT = "kvtier-disk"
VERSION = 1
RECORD_BYTES = 256
MAGIC = b"KVTR"
MAX_KEY_BYTES = 216  # 248 - 32: the key area of a record
FSYNC_MODES = ("none", "batch")
"""Accepted values of ``DiskTier(fsync=...)``."""

_HEAD = struct.Struct("<4sHHQQQ")  # magic, version, key length, seq, data length, checksum
_RECORD_HASH_AT = RECORD_BYTES - 8
_EMPTY = bytes(RECORD_BYTES)
_MAX_FILE_BYTES = 2**63 - 1  # the largest off_t: the slot file's size must fit
_hash64 = xxhash.xxh3_64_intdigest


class DiskTierError(OSError):
    """The tier directory cannot be used: held by another process, or made for another
    block size / slot count / format. Names the directory and what differs.

    Attributes:
        differences: for a directory made for another layout, ``{field: (value there,
            value asked)}`` (e.g. ``{"num_blocks": (4, 5)}``); empty otherwise.
    """

    differences: dict[str, tuple[Any, Any]] = {}  # noqa: RUF012  (read-only default)


def decode_key(data: bytes) -> Key:
    """Inverse of :func:`kvtier.tiers.base.encode_key`.

    Raises:
        ValueError: ``data`` is not an encoding made by ``encode_key``.
    """
    tag, body = data[:1], data[1:]
    if tag == b"i" and len(body) == 8:
        return struct.unpack(">q", body)[0]
    if tag == b"I" and body:
        return int.from_bytes(body, "big", signed=True)
    if tag == b"b":
        return bytes(body)
    if tag == b"s":
        return body.decode("utf-8")
    raise ValueError(f"not an encoded block key: {data[:16]!r}")


def _data_checksum(key_bytes: bytes, data: Any) -> int:
    return _hash64(data, _hash64(key_bytes))


def _make_record(key_bytes: bytes, seq: int, length: int, checksum: int) -> bytes:
    rec = bytearray(RECORD_BYTES)
    _HEAD.pack_into(rec, 0, MAGIC, VERSION, len(key_bytes), seq, length, checksum)
    rec[32 : 32 + len(key_bytes)] = key_bytes
    struct.pack_into("<Q", rec, _RECORD_HASH_AT, _hash64(memoryview(rec)[:_RECORD_HASH_AT]))
    return bytes(rec)


def _parse_record(rec: memoryview, block_bytes: int) -> tuple[bytes, int, int] | None:
    """``(key bytes, seq, data checksum)`` of a valid record, else ``None`` (empty/torn)."""
    magic, version, key_len, seq, length, checksum = _HEAD.unpack_from(rec, 0)
    if magic != MAGIC or version != VERSION or key_len > MAX_KEY_BYTES or key_len == 0:
        return None
    if length != block_bytes:
        return None
    (stored,) = struct.unpack_from("<Q", rec, _RECORD_HASH_AT)
    if stored != _hash64(rec[:_RECORD_HASH_AT]):
        return None
    return bytes(rec[32 : 32 + key_len]), seq, checksum


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _serialized(method: Any) -> Any:
    """Run ``method`` under the tier's ``_call_lock``: a metrics scrape calls :meth:`stats`
    on its own thread, and stats collects finished writes into the manager, which must not
    run beside the engine thread's call (not thread-safe)."""

    @functools.wraps(method)
    def call(self: DiskTier, *args: Any, **kwargs: Any) -> Any:
        with self._call_lock:
            return method(self, *args, **kwargs)

    return call


class DiskTier(BlockTier):
    """A tier of ``num_blocks`` fixed-size slots of ``block_bytes`` in directory ``path``.

    Opening a directory that holds a tier of the same ``block_bytes`` and ``num_blocks``
    recovers every block whose write had completed (its record is valid); their policy order
    is their write order (the latest most recent). A new directory is created.

    Args:
        path: the tier directory (created if missing).
        num_blocks: capacity in blocks (slots), >= 1.
        block_bytes: bytes per block, >= 1 (all layers' K and V of one block).
        policy: eviction policy of the disk slots: a registered name (``"lru"``, ``"arc"``,
            ...) or a :class:`~kvtier.policies.CachePolicy` subclass.
        fsync: ``"none"`` — a block is readable once its data and record are written to the
            OS (they survive a killed process, not a power loss: a torn block then reads as a
            miss plus an error); ``"batch"`` — each write batch (the blocks of one
            :meth:`write` call handled by one worker) is ``fdatasync``-ed, data before
            record, before its blocks become readable (they survive a power loss too); a
            batch that reuses slots (a full tier) first syncs their zeroed records, one
            ``fdatasync`` more, so a power loss never leaves an evicted block's record over
            new data.
        workers: threads that write blocks (>= 1). Each :meth:`write` call is split into at
            most ``workers`` batches.
        name: the tier's name in stats and events (a str with a non-space character).
        enable_events: record the disk manager's stored/removed events for
            :meth:`take_events`.

    Raises:
        ValueError: a bad argument (named), e.g. an empty path, an unknown fsync mode or
            policy, or an offline policy (``belady``).
        DiskTierError: the directory is already open (another process or DiskTier:
            ``flock``), holds a tier of another format, block size or slot count, or an
            unreadable ``meta.json``; ``path`` is a file; or the file system refuses files
            of the tier's size (``blocks.dat`` is ``num_blocks * block_bytes`` bytes).
        OSError: the files cannot be created or read.

    Thread safety: the public methods are meant for one thread (the engine's); writes run on
    the tier's own worker threads, which never touch the manager. :meth:`stats` (and
    ``in`` / ``len``) may also be called from another thread, e.g. a metrics scrape: the
    public methods that use the manager run under one lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        num_blocks: int,
        block_bytes: int,
        *,
        policy: str | type[CachePolicy] = "lru",
        fsync: str = "none",
        workers: int = 4,
        name: str = "disk",
        enable_events: bool = False,
    ) -> None:
        # numpy integers accepted (as by OffloadingManager), kept as plain ints
        num_blocks = check_positive_int("num_blocks", num_blocks, "slots")
        block_bytes = check_positive_int("block_bytes", block_bytes, "bytes")
        workers = check_positive_int("workers", workers, "threads")
        if num_blocks * block_bytes > _MAX_FILE_BYTES:  # ftruncate's off_t (OverflowError)
            raise ValueError(
                f"num_blocks x block_bytes = {num_blocks} x {block_bytes} bytes is more than a "
                f"file can hold ({_MAX_FILE_BYTES} bytes)")
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            # Path("") is the current directory: an unset setting would fill it with files
            raise ValueError(f"path must be a non-empty directory path, got {path!r}")
        self.name = name
        self.block_bytes = block_bytes
        self._num_blocks = num_blocks  # read through the class property num_blocks
        self.fsync = fsync
        policy_cls = get_policy(policy) if isinstance(policy, str) else policy
        if getattr(policy_cls, "needs_future", False):  # an offline reference (belady)
            raise ValueError(
                f"policy {policy!r} is offline (it needs each block's next use, known only "
                "to a trace replay): a disk tier cannot use it; choose lru, arc, s3fifo, ...")
        self.path = Path(path)
        self.manager = OffloadingManager(num_blocks, policy, enable_events=enable_events)
        self._closed = True  # until fully open
        self._fds: list[int] = []
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # was "[Errno 17] File exists: PATH", for a path that exists
            raise DiskTierError(
                f"disk tier {self.path}: the path is a file; a disk tier is a directory (of "
                "meta.json, index.dat, blocks.dat): give a directory path") from None
        self._lock_fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DiskTierError(
                f"disk tier {self.path} is already open (in another process, or by another "
                "DiskTier in this one: close it first)") from None
        fresh = not (self.path / "meta.json").exists()
        # per file slot: 1 when the device may hold a valid record there (found at open, or
        # a record written since); with fsync="batch" such a record's zeroing is synced
        # before new data overwrites its slot (see _write_batch)
        self._had_record = bytearray(num_blocks)
        try:
            self._open_files()
            recovered = self._load_index()
        except BaseException:
            self._close_fds()
            if fresh:  # a tier that never opened leaves no layout behind to refuse later
                for file in ("meta.json", "meta.json.tmp", "index.dat", "blocks.dat"):
                    (self.path / file).unlink(missing_ok=True)
            raise
        self._stats = TierStats(name=name, capacity_blocks=num_blocks)
        self._hash: list[int] = [0] * num_blocks  # data checksum per logical slot
        self._bad: set[Hashable] = set()  # ready in the manager but failed verification
        self._rewriting: set[Hashable] = set()
        # key -> (encoded key, bytes) of the newest block written for a key whose write (a
        # new store, or a rewrite in place) was in flight: written into the same slot if that
        # write fails, dropped (counted skipped) if it succeeds; see write()
        self._behind: dict[Hashable, tuple[bytes, bytes]] = {}
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        # write call -> [batches left, finished batches, longest batch latency so far]
        self._calls: dict[int, list] = {}
        self._call_ids = itertools.count()
        self._cv = threading.Condition()
        self._in_flight = 0
        # taken by every public method that reads or changes the manager (see _serialized)
        self._call_lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"kvtier-{name}")
        self._read_pool = ThreadPoolExecutor(max_workers=workers,
                                             thread_name_prefix=f"kvtier-{name}-read")
        self._workers = workers
        self._closed = False
        self._recover(recovered)

    # -- opening ---------------------------------------------------------------------------
    def _open_files(self) -> None:
        meta_path = self.path / "meta.json"
        want = {"format": FORMAT, "version": VERSION, "block_bytes": self.block_bytes,
                "num_blocks": self.num_blocks, "record_bytes": RECORD_BYTES}
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError) as exc:
                raise DiskTierError(f"disk tier {self.path}: unreadable meta.json ({exc})") from None
            if not isinstance(meta, dict):
                raise DiskTierError(f"disk tier {self.path}: meta.json holds a JSON "
                                    f"{type(meta).__name__}, not the tier's layout object")
            diff = {k: (meta.get(k), v) for k, v in want.items() if meta.get(k) != v}
            if diff:
                text = ", ".join(f"{k} is {a!r} there, {b!r} asked" for k, (a, b) in diff.items())
                err = DiskTierError(f"disk tier {self.path} was made for another layout: {text}")
                err.differences = diff
                raise err
        flags = os.O_RDWR | os.O_CREAT
        data_fd = os.open(self.path / "blocks.dat", flags, 0o644)
        self._fds.append(data_fd)
        index_fd = os.open(self.path / "index.dat", flags, 0o644)
        self._fds.append(index_fd)
        self._data_fd, self._index_fd = data_fd, index_fd
        for fd, size in ((data_fd, self.num_blocks * self.block_bytes),
                         (index_fd, self.num_blocks * RECORD_BYTES)):
            if os.fstat(fd).st_size != size:
                try:
                    os.ftruncate(fd, size)  # sparse: slots take disk space once written
                except OSError as exc:  # was a bare "[Errno 27] File too large" (ext4: 16 TiB)
                    name = "blocks.dat" if fd == data_fd else "index.dat"
                    raise DiskTierError(
                        f"disk tier {self.path}: cannot size {name} to {size:,} bytes "
                        f"({self.num_blocks:,} slots; {exc.strerror or exc}): this file "
                        "system refuses a file that large; choose fewer slots") from None
        if not meta_path.exists():
            os.fsync(data_fd)
            os.fsync(index_fd)
            tmp = self.path / "meta.json.tmp"
            with open(tmp, "w") as f:
                json.dump(want, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, meta_path)
            dir_fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def _load_index(self) -> list[tuple[int, Key, int, int]]:
        """Valid records as ``(seq, key, file slot, checksum)``, one per key (latest seq)."""
        size = self.num_blocks * RECORD_BYTES
        raw = bytearray(size)
        view = memoryview(raw)
        got = 0
        while got < size:
            n = os.preadv(self._index_fd, [view[got:]], got)
            if n == 0:
                break
            got += n
        best: dict[Key, tuple[int, Key, int, int]] = {}
        block_bytes = self.block_bytes
        for slot in range(self.num_blocks):
            off = slot * RECORD_BYTES
            if raw[off : off + 4] != MAGIC:
                continue
            parsed = _parse_record(view[off : off + RECORD_BYTES], block_bytes)
            if parsed is None:
                continue
            self._had_record[slot] = 1  # a valid record, recovered or an older duplicate
            key_bytes, seq, checksum = parsed
            try:
                key = decode_key(key_bytes)
            except ValueError:
                continue
            old = best.get(key)
            if old is None or seq > old[0]:
                best[key] = (seq, key, slot, checksum)
        return sorted(best.values())

    def _recover(self, recovered: list[tuple[int, Key, int, int]]) -> None:
        """Enter the recovered blocks into the manager and build the logical -> file slot
        permutation (recovered blocks keep their file slots)."""
        self._seq = recovered[-1][0] + 1 if recovered else 1
        if not recovered:
            self._phys = list(range(self.num_blocks))
            return
        newest_first = recovered[::-1]
        keys = [r[1] for r in newest_first]
        out = self.manager.prepare_store(keys)
        if out is None or out.keys_to_store != keys:  # an empty manager takes them all
            raise RuntimeError(f"disk tier {self.path}: could not enter the recovered blocks")
        phys = [-1] * self.num_blocks
        used = set()
        for logical, rec in zip(out.block_ids, newest_first, strict=True):
            phys[logical] = rec[2]
            used.add(rec[2])
            self._hash[logical] = rec[3]
        spare = iter(s for s in range(self.num_blocks) if s not in used)
        for logical in range(self.num_blocks):
            if phys[logical] < 0:
                phys[logical] = next(spare)
        self._phys = phys
        self.manager.complete_store(keys)  # keys[0] (the newest) ends most recent
        self._stats.used_blocks = len(self.manager)

    # -- BlockTier -------------------------------------------------------------------------
    @_serialized
    def lookup_prefix(self, keys: Sequence[Key]) -> int:
        """Leading ``keys`` readable here (completed writes, not known corrupt). No I/O.

        Raises:
            ValueError: the tier is closed.
            TypeError: an examined key is not hashable.
        """
        if type(keys) is not list and type(keys) is not tuple:  # a lone str: TypeError
            keys = key_list(keys, "DiskTier.lookup_prefix")
        self._check_open()
        self._drain()
        n = self.manager.lookup_prefix(keys)
        if self._bad and n:
            bad = self._bad
            for i in range(n):
                if keys[i] in bad:
                    n = i
                    break
        st = self._stats
        st.lookups += n + 1 if n < len(keys) else n
        st.lookup_hits += n
        return n

    @_serialized
    def read(self, keys: Sequence[Key]) -> list[bytes | None]:
        """Verified bytes of each key, ``None`` where absent, pending or failing its checksum
        (then counted in ``read_errors`` and dropped from lookups until rewritten or evicted).
        Blocks read are touched in the policy (``keys[0]`` most recent).

        Raises:
            ValueError: the tier is closed.
            TypeError: a key is not hashable, or has no stable encoding (as for
                :meth:`write`; ``np.int64(1)`` or ``True`` for a stored ``1``). Nothing is
                counted then.
        """
        if type(keys) is not list and type(keys) is not tuple:  # a lone str: TypeError
            keys = key_list(keys, "DiskTier.read")
        self._check_open()
        self._drain()
        keys = list(keys)
        out: list[bytes | None] = [None] * len(keys)
        m = self.manager
        try:  # validate first: an unhashable key changes nothing, counters included
            ready = [i for i, k in enumerate(keys) if m.ref_count(k) is not None
                     and m.ref_count(k) >= 0 and k not in self._bad]
        except TypeError:
            raise unhashable_error(keys, "DiskTier.read") from None
        # the checksums need each key's encoding: every key checked before anything counts
        # (a key equal to a stored one but with no encoding failed half-way, found by a
        # newcomer's fuzz)
        encoded = list(map(encode_key, keys))
        st = self._stats
        st.reads += len(keys)
        if not ready:
            return out
        ready_keys = [keys[i] for i in ready]
        slots = m.prepare_load(ready_keys)  # pinned while read: not evicted under us
        try:
            t0 = time.perf_counter()
            offsets = [self._phys[logical] * self.block_bytes for logical in slots]
            if len(offsets) > 1 and self._workers > 1:
                # preads release the GIL: on several threads the kernel's copies (and the
                # page faults of the new buffers) overlap (2 MiB blocks, 2 cores: 0.70 ->
                # 1.2 GB/s from the page cache, see docs/tiers.md)
                datas = list(self._read_pool.map(self._pread, offsets))
            else:
                datas = [self._pread(off) for off in offsets]
            per_block = (time.perf_counter() - t0) / len(offsets)
            for i, key, logical, data in zip(ready, ready_keys, slots, datas, strict=True):
                t0 = time.perf_counter()
                if (len(data) == self.block_bytes
                        and _data_checksum(encoded[i], data) == self._hash[logical]):
                    out[i] = data
                    st.read_hits += 1
                    st.bytes_read += len(data)
                else:
                    st.read_errors += 1
                    self._mark_bad(key, logical)
                st.read_latency.observe(per_block + time.perf_counter() - t0)
        finally:
            m.complete_load(ready_keys)
        hit_keys = [k for k, d in zip(keys, out, strict=True) if d is not None]
        if hit_keys:
            m.touch(hit_keys)
        return out

    def _pread(self, offset: int) -> bytes:
        try:
            return os.pread(self._data_fd, self.block_bytes, offset)
        except OSError:
            return b""

    def _mark_bad(self, key: Key, logical: int) -> None:
        self._bad.add(key)
        try:  # forget it on disk too, so a restart does not offer it again
            os.pwrite(self._index_fd, _EMPTY, self._phys[logical] * RECORD_BYTES)
        except OSError:
            pass

    @_serialized
    def write(self, keys: Sequence[Key], blocks: Sequence[bytes | bytearray | memoryview]) -> int:
        """Queue ``blocks[i]`` for writing under ``keys[i]``; returns the blocks accepted.

        Keys already stored are skipped (``writes_skipped``) and never evicted to make room
        for the call's new keys; so are the new keys the manager cannot make room for (slots
        pending), the call's head kept. A key whose write is still in flight (an earlier
        call's, not yet collected) is not skipped at once: its block waits behind that write
        (not counted in the return value nor in ``writes`` yet). If that write fails, the
        waiting block is written into the same slot (counted in ``writes`` then; the key
        stays unreadable until it is done); if it succeeds, the key is stored and the waiting
        block is skipped. Per key one block waits, the newest: an older waiting block is
        skipped when a newer one replaces it. The
        call's blocks become readable together once every worker batch of the call has
        written (and, per ``fsync``, synced) them and a later call collected that; the
        call's ``keys[0]`` then ends most recent in the policy. ``bytes`` blocks are kept by reference (immutable); others are copied
        before the call returns.

        Raises:
            ValueError: lengths differ, a block is not ``block_bytes`` long, an encoded key
                is longer than 216 bytes, or the tier is closed. Nothing is written then.
            TypeError: a key has no stable encoding or is not hashable, or a block is not
                bytes-like (names the key). Nothing is written.
        """
        if type(keys) is not list and type(keys) is not tuple:  # a lone str: TypeError
            keys = key_list(keys, "DiskTier.write")
        self._check_open()
        keys = list(keys)
        blocks = block_list(blocks, "DiskTier.write")
        if len(keys) != len(blocks):
            raise ValueError(f"write: {counted(len(keys), 'key')} but "
                             f"{counted(len(blocks), 'block')}")
        encoded = []
        for key, block in zip(keys, blocks, strict=True):
            kb = encode_key(key)
            if len(kb) > MAX_KEY_BYTES:
                raise ValueError(f"write: block key {key!r} encodes to {len(kb)} bytes; a disk "
                                 f"tier record holds at most {MAX_KEY_BYTES}")
            nbytes = block_nbytes(block, key)
            if nbytes != self.block_bytes:
                raise ValueError(f"write: block for key {key!r} is {counted(nbytes, 'byte')}; "
                                 f"this tier's blocks are {self.block_bytes}")
            encoded.append(kb)
        self._drain()
        st = self._stats
        m = self.manager
        first: dict[Key, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        # blocks that failed verification are rewritten in place, pinned meanwhile
        redo = [k for k in first if k in self._bad and k not in self._rewriting]
        # a key whose write is in flight (a store still pending, or a rewrite in place):
        # its block waits behind that write, in case it fails (see _drain)
        rewriting, ref_count = self._rewriting, m.ref_count
        behind = [k for k in first if k in rewriting or ref_count(k) == -1]
        new = [k for k in first if k not in m]
        st.writes_skipped += len(keys) - len(new) - len(redo) - len(behind)
        for key in behind:
            if key in self._behind:  # replaced by the newer block before it was tried
                st.writes_skipped += 1
            i = first[key]
            b = blocks[i]
            self._behind[key] = (encoded[i], b if type(b) is bytes else memoryview(b).tobytes())
        jobs: list[tuple[Key, bytes, int, Any, bool]] = []
        if redo:
            for key, logical in zip(redo, m.prepare_load(redo), strict=True):
                i = first[key]
                jobs.append((key, encoded[i], logical, blocks[i], True))
            self._rewriting.update(redo)
        if new:
            # the call's stored keys are named in prepare_store too, which protects them: a
            # write must not evict its own head to store its tail (found by a newcomer session)
            new, offer, skipped = plan_write(m, list(first))
            st.writes_skipped += skipped
        if new:
            out = m.prepare_store(offer)
            if out is None:
                st.writes_skipped += len(new)
            else:
                for key in out.evicted_keys:
                    self._bad.discard(key)
                st.evictions += len(out.evicted_keys)
                for key, logical in zip(out.keys_to_store, out.block_ids, strict=True):
                    i = first[key]
                    jobs.append((key, encoded[i], logical, blocks[i], False))
        if not jobs:
            st.used_blocks = len(m)
            return 0
        # the caller may reuse its buffers once we return: keep bytes, copy anything else
        # (tobytes: in order also from a non-contiguous view, which cast("B") refuses)
        jobs = [(k, kb, lg, b if type(b) is bytes else memoryview(b).tobytes(), redo_)
                for k, kb, lg, b, redo_ in jobs]
        self._submit(jobs)
        st.used_blocks = len(m)
        return len(jobs)

    def _submit(self, jobs: list[tuple[Key, bytes, int, bytes, bool]]) -> None:
        """Hand ``jobs`` ``(key, encoded key, logical slot, bytes, rewrite in place)`` to
        the workers as one call of at most ``workers`` batches (caller's thread, under the
        call lock; the slots are reserved in the manager and no other job writes them)."""
        self._stats.writes += len(jobs)
        n_batches = min(self._workers, len(jobs))
        per = -(-len(jobs) // n_batches)
        n_batches = -(-len(jobs) // per)
        with self._cv:
            self._in_flight += n_batches
        call = next(self._call_ids)
        self._calls[call] = [n_batches, [], 0.0]
        t0 = time.perf_counter()
        had = self._had_record
        sync = self.fsync == "batch"
        for start in range(0, len(jobs), per):
            batch = [(kb, self._phys[lg], b) for _, kb, lg, b, _ in jobs[start : start + per]]
            seqs = list(range(self._seq, self._seq + len(batch)))
            self._seq += len(batch)
            meta = [(k, lg, r) for k, _, lg, _, r in jobs[start : start + per]]
            # a slot whose old record may be on the device (an evicted block's, a bad one's,
            # a failed write's): its zeroing is synced before the new data is written
            presync = sync and any(had[slot] for _, slot, _ in batch)
            for _, slot, _ in batch:
                had[slot] = 1
            self._pool.submit(self._write_batch, batch, seqs, (call, start, meta), t0, presync)

    def _write_batch(self, batch, seqs, meta, t0, presync) -> None:
        """Worker thread: write one batch (see the module docstring for the order).
        ``presync``: ``fdatasync`` the zeroed records before writing the data (fsync="batch",
        a slot of the batch may hold a valid record on the device)."""
        checksums: list[int] = []
        ok = True
        try:
            data_fd, index_fd, bb = self._data_fd, self._index_fd, self.block_bytes
            for _, slot, _ in batch:
                os.pwrite(index_fd, _EMPTY, slot * RECORD_BYTES)
            if presync:  # else a power loss could keep an old record over the new data
                os.fdatasync(index_fd)
            for kb, slot, data in batch:
                _pwrite_all(data_fd, data, slot * bb)
                checksums.append(_data_checksum(kb, data))
            if self.fsync == "batch":
                os.fdatasync(data_fd)
            for (kb, slot, _), seq, checksum in zip(batch, seqs, checksums, strict=True):
                os.pwrite(index_fd, _make_record(kb, seq, bb, checksum), slot * RECORD_BYTES)
            if self.fsync == "batch":
                os.fdatasync(index_fd)
        except Exception:  # noqa: BLE001 (failed writes, never raised into the engine)
            ok = False
        self._done.put((meta, checksums, ok, len(batch) * self.block_bytes,
                        time.perf_counter() - t0))
        with self._cv:
            self._in_flight -= 1
            self._cv.notify_all()

    def _drain(self) -> None:
        """Apply finished writes to the manager (caller's thread): a :meth:`write` call's
        blocks become readable together once all its batches are done, in one
        ``complete_store`` in the call's order (so ``keys[0]`` ends most recent, whatever
        order the workers finished in). A failed block whose key has a newer block waiting
        (``_behind``) stays pending (or pinned, for a rewrite) and that block is submitted
        into its slot; a stored one's waiting block is skipped."""
        done = self._done
        m = self.manager
        st = self._stats
        behind = self._behind
        retry: list[tuple[Key, bytes, int, bytes, bool]] = []
        while True:
            try:
                (call, start, meta), checksums, ok, nbytes, latency = done.get_nowait()
            except queue.Empty:
                break
            if ok:
                for (key, logical, redo), checksum in zip(meta, checksums, strict=True):
                    self._hash[logical] = checksum
                st.bytes_written += nbytes
            entry = self._calls[call]
            entry[0] -= 1
            entry[1].append((start, ok, meta))
            entry[2] = max(entry[2], latency)
            if entry[0]:
                continue
            del self._calls[call]
            # one observation per call, until its last batch was done: the batches overlap,
            # and summing them counted the call's time once per worker (newcomer session)
            st.write_latency.observe(entry[2])
            entry[1].sort(key=lambda e: e[0])
            for success in (True, False):
                metas = [x for _, ok_, meta_ in entry[1] if ok_ is success for x in meta_]
                if not metas:
                    continue
                if success:
                    st.writes_completed += len(metas)
                    self._bad.difference_update(k for k, _, r in metas if r)
                    if behind:  # stored: a block waiting behind is skipped, as for any
                        for k, _, _ in metas:  # stored key
                            if behind.pop(k, None) is not None:
                                st.writes_skipped += 1
                else:
                    st.writes_failed += len(metas)
                    if behind:
                        # a key with a newer block waiting: that block is written into the
                        # same slot, the key staying pending (a rewrite: pinned and in
                        # _rewriting) until it is done
                        rest = []
                        for key, logical, redo in metas:
                            if key in behind:
                                kb, data = behind.pop(key)
                                retry.append((key, kb, logical, data, redo))
                            else:
                                rest.append((key, logical, redo))
                        metas = rest
                        if not metas:
                            continue
                redo_keys = [k for k, _, r in metas if r]
                new_keys = [k for k, _, r in metas if not r]
                if redo_keys:
                    self._rewriting.difference_update(redo_keys)
                    m.complete_load(redo_keys)
                if new_keys:
                    m.complete_store(new_keys, success=success)
        if retry:
            self._submit(retry)
        st.used_blocks = len(m)

    def check_keys(self, keys: Sequence[Key]) -> None:
        """Raise if :meth:`write` would refuse one of ``keys``: no stable encoding
        (``TypeError``), an encoding longer than 216 bytes or a closed tier (``ValueError``).
        No I/O."""
        self._check_open()
        for key in keys:
            kb = encode_key(key)
            if len(kb) > MAX_KEY_BYTES:
                raise ValueError(f"block key {key!r} encodes to {len(kb)} bytes; a disk tier "
                                 f"record holds at most {MAX_KEY_BYTES}")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted write is done (or failed) and collect them, blocks that
        waited behind a failed write of their key included (see :meth:`write`).

        Returns ``False`` when ``timeout`` seconds passed first (``None`` or ``inf``: wait as
        long as it takes).

        Raises:
            ValueError: ``timeout`` is negative, NaN, a bool or not a number.
        """
        timeout = check_timeout(timeout, "flush")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                return True
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            with self._cv:
                done = self._cv.wait_for(lambda: self._in_flight == 0, left)
            with self._call_lock:
                if self._closed:
                    return True
                self._drain()  # may submit the blocks waiting behind failed writes
                if not done or not self._calls:
                    return done

    @_serialized
    def stats(self) -> TierStats:
        """A fresh copy of the counters (collects finished writes first)."""
        if not self._closed:
            self._drain()
        st = self._stats
        out = TierStats(**{f: getattr(st, f) for f in st.__dataclass_fields__})
        out.read_latency = st.read_latency.copy()
        out.write_latency = st.write_latency.copy()
        return out

    @_serialized
    def take_events(self) -> list[OffloadingEvent]:
        """Stored (``removed=False``) and evicted (``removed=True``) events of the disk slots
        since the last call, oldest first (empty unless ``enable_events``)."""
        if not self._closed:
            self._drain()
        return self.manager.take_events()

    def close(self) -> None:
        """Finish the writes in flight, sync per ``fsync``, close the files. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=True)
        with self._call_lock:  # a scrape's stats() either ran before or sees it closed
            self._closed = True
        if self.fsync == "batch":
            for fd in (self._data_fd, self._index_fd):
                try:
                    os.fdatasync(fd)
                except OSError:
                    pass
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        os.close(self._lock_fd)  # releases the flock

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"disk tier {self.path} is closed")

    def __contains__(self, key: Key) -> bool:
        """``key`` is stored and readable (a block still being written, or one that failed
        verification, is not). Raises ValueError when the tier is closed (as :meth:`read`
        and :meth:`write` do), TypeError for an unhashable key."""
        if self._closed:  # one attribute test: vllm_tiers asks this per chunk of a store job
            self._check_open()
        # a block being written (ref count -1) is not readable yet: before, it answered
        # True, and a tier stack skipped copying a host victim whose disk write then failed.
        # Under the lock (as _serialized, without its frame): asked from another thread
        # while the engine's call collected a failed write (no longer pending, its slot not
        # yet freed), it answered True for a block never readable
        with self._call_lock:
            try:
                ref = self.manager.ref_count(key)
            except TypeError:
                raise unhashable_error((key,), "in (DiskTier.__contains__)") from None
            return ref is not None and ref >= 0 and key not in self._bad

    @_serialized  # (from another thread it counted a failed write being collected)
    def __len__(self) -> int:
        """Blocks stored (readable and being written). Raises ValueError when the tier is
        closed (as :meth:`read` and :meth:`write` do)."""
        self._check_open()
        return len(self.manager)

    def _set_num_blocks(self, value: Any) -> None:
        raise AttributeError(
            f"DiskTier.num_blocks is fixed when the tier is opened ({self._num_blocks} slots): "
            "the files, the index and the host manager of its slots are sized by it; open a "
            f"new tier (another directory) for {value!r}"
        )

    # read-only, as OffloadingManager.num_blocks: a new value broke the file sizes, the
    # checksum list and the slot map (session 14)
    num_blocks = property(operator.attrgetter("_num_blocks"), _set_num_blocks,
                          doc="The tier's capacity in blocks (slots; read-only).")

    def __repr__(self) -> str:
        return (f"DiskTier({str(self.path)!r}, num_blocks={self.num_blocks}, "
                f"block_bytes={self.block_bytes}, fsync={self.fsync!r})")
