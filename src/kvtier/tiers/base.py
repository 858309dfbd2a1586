"""The interface of a block tier below host memory (local disk, Redis, ...).

A :class:`BlockTier` stores whole KV blocks as bytes, keyed by block key. It sits below the host
tier (:mod:`kvtier.dataplane`): blocks the host tier evicts are written down to it, and a
request whose prefix the host tier misses may find the blocks here and have them promoted back
into host slots. Tiers answer *how many leading blocks of a prefix they hold* (one round trip /
no data I/O), read verified bytes, and write asynchronously.

Rules every tier keeps:

* **Nothing unverified reaches the caller.** :meth:`BlockTier.read` returns a block's bytes
  only after its checksum (and, for shared tiers, its model/layout fingerprint) matched; a torn,
  corrupt or foreign block reads as ``None`` and counts in ``TierStats.read_errors``.
* **A write becomes readable only when done** (durable per the tier's documented setting): until
  then :meth:`BlockTier.lookup_prefix` does not count the block.
* **A slow or failed backend never raises into the engine's loop** from lookups, reads or
  writes: it answers miss / drops the write and counts it. Misuse (wrong block size, an
  unencodable key, a closed tier) raises.
* Thread safety: each method may be called from one engine thread; implementations say what
  else they allow.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvtier.checks import type_phrase

if TYPE_CHECKING:  # typing.Self is Python 3.11+; kvtier supports 3.10
    from typing_extensions import Self

Key = Hashable

# Upper bounds (seconds) of the latency histogram buckets; the last bucket is +Inf.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)


@dataclass
class LatencyHistogram:
    """Cumulative latency histogram in seconds (Prometheus-style buckets, see
    :data:`LATENCY_BUCKETS_S`). ``counts[i]`` is the number of observations in bucket ``i``
    (not cumulative); the last entry is the +Inf bucket."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    total: int = 0
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        """Record one observation of ``seconds`` (>= 0)."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += 1
        self.sum_s += seconds

    def copy(self) -> LatencyHistogram:
        return LatencyHistogram(self.bounds, list(self.counts), self.total, self.sum_s)


@dataclass
class TierStats:
    """Counters of one tier since it was opened (blocks unless named otherwise).

    ``capacity_blocks`` is ``None`` where the backend owns capacity (Redis ``maxmemory``).
    """

    name: str
    lookups: int = 0  # keys examined by lookup_prefix
    lookup_hits: int = 0  # keys lookup_prefix counted as present
    reads: int = 0  # blocks asked for by read
    read_hits: int = 0  # blocks returned verified
    read_errors: int = 0  # blocks present but torn/corrupt/foreign (returned as None)
    writes: int = 0  # blocks accepted by write
    writes_completed: int = 0  # blocks that became readable
    writes_failed: int = 0  # blocks whose write failed (I/O error, server down)
    writes_skipped: int = 0  # blocks dropped without trying (breaker open, queue full, present)
    evictions: int = 0  # blocks the tier evicted to make room (where it decides)
    bytes_read: int = 0
    bytes_written: int = 0
    used_blocks: int = 0
    capacity_blocks: int | None = None
    read_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    write_latency: LatencyHistogram = field(default_factory=LatencyHistogram)


def block_nbytes(block: Any, key: Key) -> int:
    """Bytes in ``block``, a bytes-like object (``bytes``, ``bytearray``, ``memoryview``, a
    numpy array...) to be written under ``key``.

    Raises:
        TypeError: ``block`` is not bytes-like (names the key and the block's type).
    """
    try:
        return memoryview(block).nbytes
    except TypeError:
        raise TypeError(f"block for key {key!r} is {type_phrase(block)}, not a bytes-like "
                        "object (bytes, bytearray, memoryview or an array)") from None


def block_list(blocks: Any, method: str) -> list[Any]:
    """``blocks`` (a write's blocks: any iterable of bytes-like blocks, e.g. a list or a 2-D
    array's rows) as a list.

    Raises:
        TypeError: ``blocks`` is one ``bytes`` / ``bytearray`` / ``memoryview`` (a forgotten
            list: its byte values would be taken as blocks) or is not iterable.
    """
    if isinstance(blocks, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"{method}: blocks must be a list of blocks, not a single "
            f"{type(blocks).__name__} object of {memoryview(blocks).nbytes} bytes (wrap it in "
            "a list)")
    try:
        return list(blocks)
    except TypeError:
        raise TypeError(f"{method}: blocks must be an iterable of blocks, got {blocks!r}") from None


def encode_key(key: Key) -> bytes:
    """A stable byte encoding of a block key, the same in every process and across restarts.

    ``int`` (any size, ``bool`` excluded) -> ``b"i"`` + signed big-endian bytes; ``bytes`` ->
    ``b"b"`` + the bytes; ``str`` -> ``b"s"`` + UTF-8. Two keys that are equal as Python keys of
    these types get the same encoding, and different keys different encodings.

    Raises:
        TypeError: any other key type (it has no stable encoding across processes), or a
            str that is not valid Unicode (a lone surrogate).
    """
    if type(key) is int:
        if -(2**63) <= key < 2**63:
            return b"i" + struct.pack(">q", key)
        length = (key.bit_length() + 8) // 8
        return b"I" + key.to_bytes(length, "big", signed=True)
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, str):
        try:
            return b"s" + key.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (os.fsdecode of undecodable bytes)
            raise TypeError(f"block key {key!r} has no stable byte encoding (a str with a "
                            "lone surrogate is not UTF-8)") from None
    raise TypeError(
        f"block key {key!r} of type {type(key).__name__} has no stable byte encoding "
        "(tiers below host memory take int, bytes or str keys)"
    )


def join_fingerprint_fields(items: dict[str, Any]) -> str:
    """``k=v|k=v...`` sorted by name, with ``\\``, ``|`` and ``=`` in names and values
    escaped by ``\\`` (unescaped, a value holding ``|x=1`` spelled out another field: two
    layouts, one fingerprint, each other's blocks read as verified)."""
    def esc(text: object) -> str:
        text = str(text)
        if "\\" in text or "|" in text or "=" in text:
            text = text.replace("\\", "\\\\").replace("|", "\\|").replace("=", "\\=")
        return text

    return "|".join(f"{esc(k)}={esc(items[k])}" for k in sorted(items))


def plan_write(manager: Any, keys: Sequence[Key]) -> tuple[list[Key], list[Key], int]:
    """A lower tier's write of ``keys`` (distinct, the call's order) into ``manager`` (its
    :class:`~kvtier.OffloadingManager`, explicit mode): ``(new, offer, skipped)``.

    ``new`` is the head of the call's keys not yet stored, as many as the manager can make
    room for now (free slots plus evictable blocks, the call's own evictable blocks
    excepted); ``skipped`` the new keys cut off. ``offer`` is what to pass to
    ``prepare_store``: ``new`` and the call's keys already stored, in the call's order, so
    the stored ones are protected from the store's eviction (a write never evicts its own
    head to store its tail) and an ``on_store`` hook sees the call's order. O(len(keys)).
    """
    new = [k for k in keys if k not in manager]
    own = sum(1 for k in keys if k in manager and manager.ref_count(k) == 0)
    ms = manager.stats()
    room = max(ms.free + ms.evictable - own, 0)
    skipped = 0
    if len(new) > room:  # keep the head of the batch (a prefix's head is worth most)
        skipped = len(new) - room
        cut = set(new[room:])
        new = new[:room]
        offer = [k for k in keys if k not in cut]
    else:
        offer = list(keys)
    return new, offer, skipped


class BlockTier(ABC):
    """A store of whole KV blocks of ``block_bytes`` bytes each, keyed by block key.

    Attributes:
        name: the tier's name in events, stats and metric labels (``"disk"``, ``"redis"``).
        block_bytes: size of one block in bytes (all layers' K and V of one block).
    """

    name: str
    block_bytes: int

    @abstractmethod
    def lookup_prefix(self, keys: Sequence[Key]) -> int:
        """Number of leading ``keys`` the tier holds readable, stopping at the first absent one.

        One round trip at most (no block data is read). Never raises for backend failures
        (answers 0 and counts them).
        """

    @abstractmethod
    def read(self, keys: Sequence[Key]) -> list[bytes | None]:
        """The verified bytes of each key (``block_bytes`` long), ``None`` where the block is
        absent or failed verification (counted in ``read_errors``). Same order as ``keys``."""

    @abstractmethod
    def write(self, keys: Sequence[Key], blocks: Sequence[bytes | bytearray | memoryview]) -> int:
        """Start writing ``blocks[i]`` under ``keys[i]``; returns how many were accepted.

        Asynchronous where the tier says so: a block becomes readable only once its write is
        done. The caller may reuse the buffers after the call returns (the tier copies or
        finishes with them first). A key named twice in one call is written once, with its
        first block; the repeat counts in ``writes_skipped`` (disk and Redis tiers).

        Raises:
            ValueError: a block is not ``block_bytes`` long, or keys and blocks differ in length.
            TypeError: a key has no stable encoding (:func:`encode_key`).
        """

    def check_keys(self, keys: Sequence[Key]) -> None:
        """Raise if :meth:`write` would refuse one of ``keys`` (changes nothing).

        A tier stack calls it before a host store whose victims may later be written here:
        a key refused only at demotion time would be lost, and the error would surface far
        from its cause. The default is the key-type rule of :func:`encode_key`; tiers with
        more rules (the disk tier's key length) add them.

        Raises:
            TypeError: a key has no stable encoding (named).
            ValueError / RuntimeError: the tier is closed (as its :meth:`write` raises;
                tiers that can be closed check it here).
        """
        for key in keys:
            encode_key(key)

    @abstractmethod
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted write is done (or failed); ``False`` on timeout."""

    @abstractmethod
    def stats(self) -> TierStats:
        """A fresh copy of the tier's counters (no internal state refers to it)."""

    @abstractmethod
    def close(self) -> None:
        """Finish or drop in-flight writes and release files/connections. Idempotent."""

    def __enter__(self) -> Self:  # a subclass's returns the subclass
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
