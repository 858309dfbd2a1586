"""A shared block tier in Redis (standalone server or Redis Cluster), through redis-py.

Several engine processes, on one machine or many, point a :class:`RedisTier` at the same Redis
and reuse each other's prefixes: a block one process wrote is found by another's
:meth:`RedisTier.lookup_prefix` and read back verified. Capacity and eviction are Redis's own
(``maxmemory`` with ``allkeys-lru`` or ``allkeys-lfu``, see docs/redis.md); the tier never
deletes blocks itself, except on request (:meth:`RedisTier.purge`, for a throw-away namespace).

Keys and values (format version 1; docs/redis.md has the byte layout):

* key = ``namespace`` + ``b":"`` + 16 hex digits of the fingerprint id + ``b":"`` +
  :func:`~kvtier.tiers.base.encode_key` of the block key. The fingerprint id is the xxh3-64
  hash of the caller's model/layout ``fingerprint`` string and ``block_bytes``, so two
  different models (or layouts, dtypes, block sizes) never share a key.
* value = a 40-byte header (magic ``b"KVTB"``, format version, codec, fingerprint id, block
  length, payload length, xxh3-64 checksum of the Redis key and the uncompressed block) + the
  payload (the block bytes, or their zstd frame when ``compression="zstd"`` and it saves at
  least 10 %). :meth:`RedisTier.read` checks every field before it returns bytes; a foreign,
  truncated or corrupt value is a miss plus one ``read_errors``.

Failure handling: every server call is guarded by a :class:`CircuitBreaker` and short socket
timeouts (``timeout_s``, default 50 ms, connect and each socket operation, no retries). A
failing server makes lookups answer 0 and reads ``None`` (counted in ``backend_errors``);
writes go through a bounded queue to one background thread and are dropped and counted
(``writes_skipped``) when the queue is full or the breaker is open, or ``writes_failed`` when
the server call fails. A write the server refuses (an error reply: ``OOM`` under ``maxmemory``
with ``noeviction``, ``NOPERM``, ``READONLY``, ...) is failed too, block by block as the
server answered (a batch of SETs, with ``ttl_s`` or in a cluster, may be refused in part),
but it does not count against the breaker: the server is up, and lookups and reads of the
blocks it holds go on. Nothing here raises into the caller for a server failure.

Redis Cluster: keys carry **no hash tag**, so the blocks of one prefix spread over all slots
and nodes (even memory use and eviction pressure); a lookup, read or write of a request's
blocks is one pipelined batch per node (redis-py's cluster pipeline writes every node's batch
before reading any reply), i.e. one round trip in parallel over the nodes.

Thread safety: every public method may be called from any thread, :meth:`RedisTier.close`
included; counters are updated under one lock. One background thread per tier performs the
writes. A call that starts after ``close()`` began raises ``RuntimeError`` (closed); a
``lookup_prefix``, ``read`` or ``write`` already running when ``close()`` runs either completes
or raises the same ``RuntimeError`` (counted nowhere, not a server failure), and no call opens a
connection once ``close()`` has closed them: redis-py reconnects lazily, so every new
connection checks, once its socket is open, a flag that ``close()`` sets before it closes the
clients (no lock on the call path).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

import xxhash

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ModuleNotFoundError as _exc:
    if (_exc.name or "").split(".")[0] != "redis":
        raise
    raise ModuleNotFoundError(
        "kvtier.tiers.redis needs redis-py, which is not installed: pip install 'kvtier[redis]'",
        name="redis") from None

from kvtier.checks import _as_int, check_positive_int, check_timeout, counted, key_list
from kvtier.tiers.base import (
    BlockTier,
    Key,
    TierStats,
    block_list,
    block_nbytes,
    encode_key,
    join_fingerprint_fields,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAGIC = b"KVTB"
CODEC_RAW = 0
CODEC_ZSTD = 1
# magic, version, codec, reserved, fingerprint id, block length, payload length, checksum
HEADER = struct.Struct("<4sBBHQQQQ")
HEADER_BYTES = HEADER.size  # 40

# Environment variables read by RedisTier.from_url (never logged).
ENV_URL = "KVTIER_REDIS_URL"
ENV_PASSWORD = "KVTIER_REDIS_PASSWORD"

def _query_bool(text: str) -> bool:
    """A URL query flag: 1/true/yes/on or 0/false/no/off (any case); anything else raises
    ``ValueError`` (``?cluster=2`` built a standalone tier in silence)."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


# Query parameters of a tier URL that are kvtier's, not redis-py's (removed before redis-py
# parses the URL).
_TIER_QUERY_OPTIONS = {
    "fingerprint": str,
    "block_bytes": int,
    "namespace": str,
    "name": str,
    "timeout_s": float,
    "read_timeout_s": float,
    "write_timeout_s": float,
    "compression": str,
    "ttl_s": int,
    "cluster": _query_bool,
    "lookup_mode": str,
    "max_queue_bytes": int,
    "write_batch_bytes": int,
    "breaker_failures": int,
    "breaker_cooldown_s": float,
}

# what a query value must look like, by converter (for the error message)
_QUERY_RULES = {int: "an int", float: "a number", _query_bool: "1/true/yes/on or 0/false/no/off"}

# Standalone prefix lookup in one command: the number of leading KEYS that exist. EXISTS does
# not touch the keys' LRU/LFU data (only reads do).
_PREFIX_SCRIPT = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then return i - 1 end
end
return #KEYS
"""


def _no_client_setinfo() -> dict[str, Any]:
    """redis-py client options that skip ``CLIENT SETINFO`` on connect: ``driver_info=None``
    from redis-py 7.2 (``redis.DriverInfo``; ``lib_name``/``lib_version`` are deprecated
    there and warn), ``lib_name=None, lib_version=None`` before."""
    try:
        from redis import DriverInfo  # noqa: F401  (redis-py >= 7.2)
    except ImportError:
        return {"lib_name": None, "lib_version": None}
    return {"driver_info": None}


_NO_CLIENT_SETINFO = _no_client_setinfo()


_SCHEMES = ("redis", "rediss", "unix")

# the largest ttl_s: Redis answers "invalid expire time" when now (ms) + EX * 1000 passes
# 2**63 - 1, i.e. above about 9.22e15 s (every write then failed, counted as backend errors)
_MAX_TTL_S = 9 * 10**15


def _unsplit(parts: Any) -> str:
    """``urlunsplit(parts)``, keeping the ``//`` of a URL with an empty host: urlunsplit
    writes ``unix:///tmp/redis.sock`` back as ``unix:/tmp/redis.sock``, which redis-py
    refuses ("must specify one of the following schemes")."""
    url = urlunsplit(parts)
    # only for the schemes that take a ``//``: a URL without one (``localhost:6379``, or no
    # scheme at all) is written back as given, for the error that names it
    if (not parts.netloc and parts.scheme in _SCHEMES
            and not url.startswith(f"{parts.scheme}://")):
        url = f"{parts.scheme}://{url[len(parts.scheme) + 1:]}"
    return url


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``; user, host, port, path and
    query are kept. Never raises (an unparsable URL becomes ``"<unparsable redis URL>"``)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            # a query parameter named password is redacted too
            query = _redact_query(parts.query)
            return _unsplit(parts._replace(query=query))
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:***@{host}"
        if parts.port is not None:
            netloc += f":{parts.port}"
        return _unsplit(parts._replace(netloc=netloc, query=_redact_query(parts.query)))
    except ValueError:
        return "<unparsable redis URL>"


def _redact_query(query: str) -> str:
    if not query:
        return query
    # each name=value item kept as written (not re-encoded: urlencode wrote *** as
    # %2A%2A%2A), a password's value replaced by ***
    items = query.split("&")
    for i, item in enumerate(items):
        name = item.split("=", 1)[0]
        if unquote_plus(name).lower() == "password":
            items[i] = f"{name}=***"
    return "&".join(items)


def fingerprint_id(fingerprint: str, block_bytes: int) -> int:
    """The 64-bit id of a model/layout ``fingerprint`` string and block size (xxh3-64 of
    ``"<fingerprint>|block_bytes=<n>"``), stored in keys and value headers."""
    return xxhash.xxh3_64_intdigest(f"{fingerprint}|block_bytes={block_bytes}".encode())


def layout_fingerprint(
    model: str,
    *,
    dtype: str,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    block_tokens: int,
    **extra: Any,
) -> str:
    """A canonical fingerprint string of a model's KV layout, for :class:`RedisTier`.

    Everything that changes the meaning of a block's bytes belongs in it: the model (name and
    revision), KV dtype, layer count, KV heads (per tensor-parallel rank), head dim, tokens per
    block, and anything else in ``extra`` (e.g. ``tp_rank=0``, ``kv_layout="NHD"``), sorted by
    name. ``\\``, ``|`` and ``=`` inside a value are escaped with ``\\``, so two different
    layouts never give one fingerprint (a value without them is written as it is).

    Raises:
        ValueError: ``model`` or ``dtype`` is not a non-empty str, or ``num_layers``,
            ``num_kv_heads``, ``head_dim`` or ``block_tokens`` is not an int >= 1 (numpy
            integers are taken as ints). Before, ``layout_fingerprint("", num_layers=-1,
            ...)`` gave ``"...|model=|num_layers=-1"``: a forgotten model name made every
            such engine share one fingerprint.
    """
    for name, text in (("model", model), ("dtype", dtype)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"layout_fingerprint: {name} must be a non-empty str, got {text!r}")
    num_layers = check_positive_int("layout_fingerprint: num_layers", num_layers, "layers")
    num_kv_heads = check_positive_int("layout_fingerprint: num_kv_heads", num_kv_heads,
                                      "KV heads per rank")
    head_dim = check_positive_int("layout_fingerprint: head_dim", head_dim, "elements")
    block_tokens = check_positive_int("layout_fingerprint: block_tokens", block_tokens,
                                      "tokens")
    items = {
        "model": model,
        "dtype": dtype,
        "num_layers": num_layers,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "block_tokens": block_tokens,
        **extra,
    }
    return join_fingerprint_fields(items)


def _positive_seconds(value: object) -> bool:
    """``value`` is a finite int/float > 0 (not a bool): a timeout or cooldown in seconds
    (an infinite socket timeout made every call fail, an infinite cooldown never closed the
    breaker again)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


class _TierClosed(redis.exceptions.RedisError):
    """Raised inside redis-py when a connection would open after :meth:`RedisTier.close` closed
    the tier's clients (redis-py disconnects it); the tier turns it into ``RuntimeError``."""


class CircuitBreaker:
    """Closed / open / half-open breaker over server calls (Nygard, *Release It!*).

    Closed: every call goes to the server. ``failure_threshold`` consecutive failed calls open
    it: for ``cooldown_s`` seconds every call is refused at once (lookups answer miss, writes
    are dropped). After the cooldown one probe call is let through (half-open); its success
    closes the breaker, its failure opens it for another cooldown. Thread-safe.
    """

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __init__(self, failure_threshold: int = 3, cooldown_s: float = 1.0) -> None:
        threshold = _as_int(failure_threshold)  # numpy ints taken, kept as plain ints
        if threshold is None or threshold < 1:
            raise ValueError(f"breaker_failures must be an int >= 1, got {failure_threshold!r}")
        failure_threshold = threshold
        if not _positive_seconds(cooldown_s):
            raise ValueError(
                f"breaker_cooldown_s must be a finite number > 0 seconds, got {cooldown_s!r}")
        self.failure_threshold = failure_threshold
        self.cooldown_s = float(cooldown_s)
        self._lock = threading.Lock()
        self._state = self.CLOSED
        self._failures = 0
        self._open_until = 0.0
        self.opens = 0  # times the breaker opened

    @property
    def state(self) -> str:
        with self._lock:
            if self._state == self.OPEN and time.monotonic() >= self._open_until:
                return self.HALF_OPEN  # the next call will be a probe
            return self._state

    def allow(self) -> bool:
        """May a call go to the server now? Every ``True`` must be followed by
        :meth:`success` or :meth:`failure`."""
        with self._lock:
            if self._state == self.CLOSED:
                return True
            if self._state == self.OPEN and time.monotonic() >= self._open_until:
                self._state = self.HALF_OPEN  # this call is the probe
                return True
            return False  # open, or a probe is in flight

    def success(self) -> None:
        with self._lock:
            self._state = self.CLOSED
            self._failures = 0

    def abandon(self) -> None:
        """A call :meth:`allow` let through ended without an answer (e.g. KeyboardInterrupt
        inside it): a half-open probe is given back, so the next call probes again (before,
        the breaker stayed half-open with its probe in flight and refused every call)."""
        with self._lock:
            if self._state == self.HALF_OPEN:
                self._state = self.OPEN  # _open_until has passed: the next allow() probes

    def failure(self) -> bool:
        """Record a failed call; ``True`` when this failure opened the breaker."""
        with self._lock:
            self._failures += 1
            if self._state == self.HALF_OPEN or self._failures >= self.failure_threshold:
                opened = self._state != self.OPEN
                self._state = self.OPEN
                self._open_until = time.monotonic() + self.cooldown_s
                if opened:
                    self.opens += 1
                return opened
            return False


@dataclass
class RedisTierStats(TierStats):
    """:class:`~kvtier.tiers.base.TierStats` plus the Redis tier's own counters.

    ``backend_errors``: server calls that failed (timeout, connection refused, server error),
    ``calls_refused``: calls the open breaker answered without trying, ``breaker_opens``: times
    the breaker opened, ``breaker_state``: ``closed``/``open``/``half_open`` at the snapshot,
    ``queued_blocks`` / ``queued_bytes``: writes accepted but not yet sent.
    """

    backend_errors: int = 0
    calls_refused: int = 0
    breaker_opens: int = 0
    breaker_state: str = CircuitBreaker.CLOSED
    queued_blocks: int = 0
    queued_bytes: int = 0


class RedisTier(BlockTier):
    """Blocks of ``block_bytes`` bytes in a Redis server or cluster, shared between processes.

    Args:
        url: a redis-py URL: ``redis://[user:password@]host:port/db``, ``rediss://`` for TLS
            (``ssl_*`` query parameters as redis-py takes them), ``unix://``. The password is
            never logged or shown by ``repr``/``str``.
        block_bytes: size of one block in bytes (> 0).
        fingerprint: the model/layout fingerprint (see :func:`layout_fingerprint`); blocks are
            shared only between tiers with equal ``fingerprint`` and ``block_bytes``.
        namespace: key prefix (default ``"kvtier"``); must not contain ``{`` or ``}`` (hash
            tags are deliberately not used, see the module doc).
        name: the tier's name in stats and metric labels (a str with a non-space character).
        cluster: ``True`` for Redis Cluster (redis-py's ``RedisCluster``; ``url`` names any
            node), ``False`` for a standalone server.
        timeout_s: connect and socket timeout of lookups (and connect timeout of reads),
            seconds (default 0.05). A lookup takes at most about one connect plus one request
            at this timeout; there are no retries.
        read_timeout_s: socket timeout of reads (default 0.5): an MGET of 16 x 2 MiB blocks
            is 32 MiB, which a loaded host may not deliver without a 50 ms pause. A read
            follows a lookup that just succeeded, and a failed one opens the breaker as well.
        write_timeout_s: the same for the background writer (default 2.0): a batch of
            megabyte blocks takes longer to send than a lookup.
        compression: ``"none"`` (default) or ``"zstd"`` (level 1; a block is stored compressed
            only when that saves at least 10 %). Random-ish bf16 KV compresses about 1.28x at
            ~0.16 GB/s per core, slower than loopback Redis: see docs/redis.md.
        ttl_s: optional expiry of written blocks, seconds (``None``: Redis's eviction only;
            at most 9e15, the largest Redis takes).
        lookup_mode: ``"script"`` (standalone default: one Lua script call that stops at the
            first missing key) or ``"pipeline"`` (one EXISTS per key in one pipeline; the only
            mode for a cluster).
        max_queue_bytes: bound of the write queue in value bytes (default 256 MiB; at least
            one value, ``block_bytes`` + 40); blocks that do not fit are dropped and counted
            in ``writes_skipped``.
        write_batch_bytes: the writer sends up to this many value bytes per round trip
            (default 32 MiB).
        breaker_failures, breaker_cooldown_s: the :class:`CircuitBreaker`'s thresholds
            (defaults 3 consecutive failures, 1.0 s).
        client_options: more keyword arguments for the redis-py client (e.g. ``ssl_ca_certs``;
            not ``socket_timeout`` / ``socket_connect_timeout``, which the tier sets).

    Raises:
        ValueError: a bad option (names it), a URL redis-py cannot parse (password
            redacted in the message), or a database index the server does not have.
        TypeError: ``fingerprint`` is not a string.

    The server need not be up when the tier is built: calls answer miss until it is. A
    standalone URL with a database index other than 0 is checked with one connect at
    ``timeout_s`` when the tier is built: an index the server does not have raises
    ``ValueError`` (an unreachable server does not).
    """

    def __init__(
        self,
        url: str,
        *,
        block_bytes: int,
        fingerprint: str,
        namespace: str = "kvtier",
        name: str = "redis",
        cluster: bool = False,
        timeout_s: float = 0.05,
        read_timeout_s: float = 0.5,
        write_timeout_s: float = 2.0,
        compression: str = "none",
        ttl_s: int | None = None,
        lookup_mode: str | None = None,
        max_queue_bytes: int = 256 << 20,
        write_batch_bytes: int = 32 << 20,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 1.0,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        # validate everything first; sizes take numpy ints (as DiskTier), kept as plain ints
        size = _as_int(block_bytes)
        if size is None or size <= 0:
            raise ValueError(f"block_bytes must be an int > 0, got {block_bytes!r}")
        block_bytes = size
        if not isinstance(name, str) or not name.strip():  # its label in metrics and events
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        if not isinstance(fingerprint, str):
            raise TypeError(
                f"fingerprint must be a str describing the model/layout, got "
                f"{type(fingerprint).__name__}"
            )
        if not fingerprint:
            raise ValueError("fingerprint must be a non-empty model/layout description")
        if not isinstance(namespace, str) or not namespace or "{" in namespace or "}" in namespace:
            raise ValueError(
                f"namespace must be a non-empty str without '{{' or '}}' (no hash tags), "
                f"got {namespace!r}"
            )
        for opt, val in (("timeout_s", timeout_s), ("read_timeout_s", read_timeout_s),
                         ("write_timeout_s", write_timeout_s)):
            if not _positive_seconds(val):
                raise ValueError(f"{opt} must be a finite number > 0 seconds, got {val!r}")
        if compression not in ("none", "zstd"):
            raise ValueError(f"compression must be 'none' or 'zstd', got {compression!r}")
        if ttl_s is not None:
            ttl = _as_int(ttl_s)  # numpy ints taken, kept as plain ints
            if ttl is None or ttl <= 0 or ttl > _MAX_TTL_S:
                raise ValueError(
                    f"ttl_s must be None or an int > 0 seconds, at most {_MAX_TTL_S:,} (Redis "
                    f"refuses an EX whose expiry in ms overflows 64 bits), got {ttl_s!r}")
            ttl_s = ttl
        if type(cluster) is not bool and type(cluster).__name__ != "bool_":
            raise ValueError(f"cluster must be a bool, got {cluster!r}")
        if lookup_mode is None:
            lookup_mode = "pipeline" if cluster else "script"
        if lookup_mode not in ("script", "pipeline"):
            raise ValueError(f"lookup_mode must be 'script' or 'pipeline', got {lookup_mode!r}")
        if cluster and lookup_mode == "script":
            raise ValueError(
                "lookup_mode='script' needs all keys in one slot; with cluster=True use "
                "'pipeline'"
            )
        sizes = []
        for opt, val in (
            ("max_queue_bytes", max_queue_bytes), ("write_batch_bytes", write_batch_bytes)
        ):
            size = _as_int(val)
            if size is None or size <= 0:
                raise ValueError(f"{opt} must be an int > 0, got {val!r}")
            sizes.append(size)
        max_queue_bytes, write_batch_bytes = sizes
        if max_queue_bytes < HEADER_BYTES + block_bytes:
            # a queue that holds no value accepted no write, in silence (all writes_skipped)
            raise ValueError(
                f"max_queue_bytes must hold at least one value ({HEADER_BYTES} + block_bytes "
                f"= {HEADER_BYTES + block_bytes} bytes), got {max_queue_bytes}")
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        self._url_redacted = redact_url(url)
        try:
            parts = urlsplit(url)
        except ValueError:
            raise ValueError(f"unparsable Redis URL {self._url_redacted}") from None
        if parts.scheme not in _SCHEMES:
            raise ValueError(
                f"Redis URL {self._url_redacted!r} must use redis://, rediss:// or unix://"
            )
        query_names = {k for k, _ in parse_qsl(parts.query)}
        tier_opts = sorted(query_names & set(_TIER_QUERY_OPTIONS))
        if tier_opts:
            raise ValueError(
                f"Redis URL query sets the tier options {tier_opts}: build the tier with "
                "RedisTier.from_url(url), which reads them, or pass them as keywords"
            )
        # redis-py lets URL query timeouts override keyword ones: refuse them, so that the
        # engine-facing timeouts are always the tier's
        overriding = sorted(
            query_names
            & {"socket_timeout", "socket_connect_timeout", "timeout", "retry_on_timeout",
               "retry_on_error"}
        )
        if overriding:
            raise ValueError(
                f"Redis URL query sets {overriding}; use the tier's timeout_s, read_timeout_s "
                "and write_timeout_s (the tier never retries)"
            )
        # the tier sets these per kind of call: a client option of that name was replaced
        # in silence
        replaced = sorted({"socket_timeout", "socket_connect_timeout"} & set(client_options or {}))
        if replaced:
            raise ValueError(
                f"client_options sets {replaced}, which the tier sets itself; use its "
                "timeout_s, read_timeout_s and write_timeout_s")
        self._breaker = CircuitBreaker(breaker_failures, breaker_cooldown_s)
        # one warning per tier and kind of refused write ("oom": a full server; "refused":
        # any other error reply), the rest at debug level
        self._warned: set[str] = set()

        self.name = name
        self.block_bytes = block_bytes
        self.fingerprint = fingerprint
        self.namespace = namespace
        self.cluster = bool(cluster)
        self.timeout_s = float(timeout_s)
        self.read_timeout_s = float(read_timeout_s)
        self.write_timeout_s = float(write_timeout_s)
        self.compression = compression
        self.ttl_s = ttl_s
        self.lookup_mode = lookup_mode
        self.max_queue_bytes = max_queue_bytes
        self.write_batch_bytes = write_batch_bytes
        self.fingerprint_id = fingerprint_id(fingerprint, block_bytes)
        self._key_prefix = f"{namespace}:{self.fingerprint_id:016x}:".encode()

        # redis-py clients: one for the engine-facing calls (short timeouts), one for the
        # writer thread. No retries: a failed call is a miss / a dropped write. No
        # CLIENT SETINFO on connect: one round trip less per new connection.
        base_opts: dict[str, Any] = dict(client_options or {})
        base_opts.setdefault("retry", Retry(NoBackoff(), 0))
        # set by close() before it closes the clients: a connection opened after that (redis-py
        # reconnects lazily, e.g. for a lookup that passed its closed check as close() ran) is
        # refused and disconnected by _refuse_after_close, which redis-py runs once the
        # socket is open. The flag is only read when a connection opens: no cost per call.
        self._disconnected = False
        user_connect = base_opts.pop("redis_connect_func", None)

        def on_connect(conn: Any) -> None:
            self._refuse_after_close(conn)
            if user_connect is not None:  # redis-py's contract: it does the handshake itself
                user_connect(conn)
            elif not cluster:  # a cluster client does the handshake before calling this
                conn.on_connect()

        base_opts["redis_connect_func"] = on_connect
        for opt, value in _NO_CLIENT_SETINFO.items():
            base_opts.setdefault(opt, value)
        self._url = url
        # one client (connection pool) per kind of call, each with its own timeouts
        self._opts = {
            "lookup": dict(base_opts, socket_timeout=self.timeout_s,
                           socket_connect_timeout=self.timeout_s),
            "read": dict(base_opts, socket_timeout=self.read_timeout_s,
                         socket_connect_timeout=self.timeout_s),
            "write": dict(base_opts, socket_timeout=self.write_timeout_s,
                          socket_connect_timeout=min(self.write_timeout_s,
                                                     max(self.timeout_s, 0.5))),
        }
        self._client_lock = threading.Lock()
        self._client_map: dict[str, Any] | None = None
        self._script = None
        if not self.cluster:
            # a standalone client connects lazily: building it needs no server
            try:
                self._client_map = {
                    kind: redis.Redis.from_url(url, **opts) for kind, opts in self._opts.items()
                }
                # build (not connect) one connection object now: redis-py hands unknown URL
                # query parameters to the connection class, which would otherwise fail on
                # every call as a silent miss
                pool = self._client_map["lookup"].connection_pool
                probe = pool.connection_class(**pool.connection_kwargs)
            except (ValueError, TypeError) as exc:
                raise ValueError(
                    f"bad Redis URL or client option for {self._url_redacted}: "
                    f"{_scrub(str(exc), url)}"
                ) from None
            self._check_db(pool.connection_kwargs.get("db") or 0, probe)
            self._script = self._client_map["lookup"].register_script(_PREFIX_SCRIPT)

        self._zstd_c = None  # used by the writer thread only
        # one decompressor per reading thread: a ZstdDecompressor is not safe for concurrent
        # use, and read() may be called from any thread (4 threads sharing one: 7 of 9,600
        # good blocks read back as corrupt)
        self._zstd_local = threading.local()
        if compression == "zstd":
            import zstandard

            self._zstd_c = zstandard.ZstdCompressor(level=1)

        self._stats = RedisTierStats(name=name)
        self._lock = threading.Lock()  # counters, queue accounting
        self._done = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._queued_blocks = 0
        self._queued_bytes = 0
        self._inflight = 0  # blocks taken by the writer, not yet finished
        self._closed = False
        # set by a close() whose timeout passed: the writer drops what is still queued
        self._abandoned = False
        self._writer = threading.Thread(
            target=self._write_loop, name=f"kvtier-redis-writer-{name}", daemon=True
        )
        self._writer.start()

    def _refuse_after_close(self, conn: Any) -> None:
        """Run (through the clients' ``redis_connect_func``) on every new connection once its
        socket is open: raises :class:`_TierClosed`, which makes redis-py disconnect it,
        after :meth:`close` set ``_disconnected``. The socket is published (``conn._sock``)
        before this check, and ``close()`` sets the flag before it disconnects every
        connection of its pools, so one of the two always sees the other: no connection
        outlives ``close()``."""
        if self._disconnected:
            raise _TierClosed(f"{self._url_redacted}: the tier is closed; no new connection")

    def _check_db(self, db: int, probe: Any) -> None:
        """Refuse a database index the server does not have, at construction: otherwise
        every call fails on connect (``SELECT``) and answers miss. Index 0 always exists and
        is not probed; another one costs one connect at ``timeout_s`` now. An unreachable
        server is not an error here (calls answer miss until it is up)."""
        if db < 0:
            raise ValueError(f"Redis URL {self._url_redacted}: the database index (the path, "
                             f"/db) must be an int >= 0, got {db}")
        if db == 0:
            return
        try:
            probe.connect()  # redis-py sends AUTH and SELECT <db> on connect
        except redis.ResponseError as exc:
            if "DB index" not in str(exc):
                return  # e.g. a bad password: the calls' own failures report it
            raise ValueError(
                f"Redis URL {self._url_redacted}: the server has no database {db} ({exc}; "
                "redis-server has 16, 0-15, unless its `databases` setting says more)"
            ) from None
        except (redis.RedisError, OSError):  # not reachable now: the calls answer miss until it is
            return
        finally:
            probe.disconnect()

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_url(cls, url: str | None = None, **options: Any) -> RedisTier:
        """A tier from a URL whose query may also carry kvtier's options.

        ``url`` ``None`` reads :data:`ENV_URL` (``KVTIER_REDIS_URL``). When the URL has no
        password and :data:`ENV_PASSWORD` (``KVTIER_REDIS_PASSWORD``) is set, that password is
        used. Query parameters named like :class:`RedisTier`'s options (``fingerprint``,
        ``block_bytes``, ``namespace``, ``cluster``, ``timeout_s``, ``compression``, ...) are
        taken out of the URL and given to the constructor (keyword ``options`` win); the rest
        of the query goes to redis-py (e.g. ``ssl_cert_reqs``). Example::

            RedisTier.from_url("redis://localhost:6379/0?cluster=0",
                               block_bytes=2 << 20, fingerprint=layout_fingerprint(...))

        Raises:
            ValueError: no URL given and none in the environment; a bad option value (named,
                with its rule); a tier option given twice in the query.
        """
        if url is None:
            url = os.environ.get(ENV_URL)
            if not url:
                raise ValueError(f"no Redis URL given and ${ENV_URL} is not set")
        try:
            parts = urlsplit(url)
            pairs = parse_qsl(parts.query, keep_blank_values=True)
        except ValueError:
            raise ValueError(f"unparsable Redis URL {redact_url(url)}") from None
        rest = []
        from_query: dict[str, Any] = {}
        for key, value in pairs:
            conv = _TIER_QUERY_OPTIONS.get(key)
            if conv is None:
                rest.append((key, value))
                continue
            if key in from_query:  # the last one would win in silence
                given = tuple(v for k, v in pairs if k == key)
                raise ValueError(f"Redis URL option {key} is given twice in the query "
                                 f"{given}: give it once")
            try:
                from_query[key] = conv(value)
            except ValueError:
                raise ValueError(
                    f"Redis URL option {key}={value!r} is not a valid {key}: "
                    f"{_QUERY_RULES.get(conv, 'a str')}"
                ) from None
        parts = parts._replace(query=urlencode(rest))
        password = os.environ.get(ENV_PASSWORD)
        if password and parts.password is None:  # unix:// too: unix://:pw@/path works
            from urllib.parse import quote

            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = f"{quote(parts.username or '', safe='')}:{quote(password, safe='')}@{host}"
            if parts.port is not None:
                netloc += f":{parts.port}"
            parts = parts._replace(netloc=netloc)
        return cls(_unsplit(parts), **{**from_query, **options})

    def __repr__(self) -> str:
        return (
            f"RedisTier(url={self._url_redacted!r}, name={self.name!r}, "
            f"block_bytes={self.block_bytes}, cluster={self.cluster}, "
            f"namespace={self.namespace!r}, fingerprint_id={self.fingerprint_id:016x})"
        )

    __str__ = __repr__

    # -- clients ---------------------------------------------------------------------------
    def _client(self, kind: str) -> Any:
        """The client for ``kind`` (``lookup``/``read``/``write``); cluster clients are built
        on first use (building one contacts the cluster), and the error is raised if the
        cluster cannot be reached; after :meth:`close` closed the clients, none is built
        (:class:`_TierClosed`)."""
        clients = self._client_map
        if clients is not None:
            return clients[kind]
        with self._client_lock:  # close() takes it too: it closes what was built before
            if self._disconnected:
                raise _TierClosed(f"{self._url_redacted}: the tier is closed; no new client")
            if self._client_map is None:
                from redis.cluster import RedisCluster

                built: dict[str, Any] = {}
                try:
                    for k, opts in self._opts.items():
                        built[k] = RedisCluster.from_url(self._url, **opts)
                except BaseException:
                    for c in built.values():
                        c.close()
                    raise
                self._client_map = built
            return self._client_map[kind]

    def redis_key(self, key: Key) -> bytes:
        """The Redis key of block ``key`` (namespace, fingerprint id, encoded key).

        Raises:
            TypeError: ``key`` has no stable encoding.
        """
        return self._key_prefix + encode_key(key)

    # -- checks and clean-up (not engine calls: these raise) ---------------------------------
    def ping(self) -> None:
        """Check now that the server answers (one ``PING`` at ``timeout_s``; in a cluster,
        building the client reaches the cluster). The engine-facing calls never raise for a
        dead server (they answer miss); a tool that must not run against one (the trace
        simulation ``kvtier replay --tiers``) calls this first. Not counted in the stats and
        not seen by the breaker.

        Raises:
            ConnectionError: the server cannot be reached or refused the call (the message
                names the redacted URL and the cause). RuntimeError: the tier is closed.
        """
        self._check_open()
        try:
            self._client("lookup").ping()
        except Exception as exc:  # noqa: BLE001 (any failure of the ping: unreachable)
            if self._disconnected:  # close() overtook the ping
                raise self._closed_error() from None
            raise ConnectionError(
                f"Redis tier {self._url_redacted} is not reachable: "
                f"{_scrub(f'{type(exc).__name__}: {exc}', self._url)}"
            ) from None

    def purge(self, batch: int = 1000) -> int:
        """Delete every block of this tier's namespace and fingerprint from Redis (``SCAN``
        with ``MATCH <namespace>:<fingerprint id>:*`` over every node, ``UNLINK`` in batches
        of ``batch`` keys); returns how many keys were deleted. Other namespaces and
        fingerprints are left alone. Call :meth:`flush` first, or blocks still queued are
        written after the purge. Takes one SCAN pass over the whole keyspace: for a tier
        that is thrown away (a simulation run, a test), not for an engine's hot path.

        Raises:
            ValueError: ``batch`` is not an int > 0.
            ConnectionError: the server failed during the purge (names the redacted URL;
                the keys not reached yet remain). RuntimeError: the tier is closed.
        """
        if type(batch) is not int or batch <= 0:
            raise ValueError(f"batch must be an int > 0, got {batch!r}")
        self._check_open()
        # the namespace may hold glob characters: escaped for MATCH
        pattern = b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c])
                           for c in self._key_prefix) + b"*"
        deleted = 0
        try:
            client = self._client("write")
            pending: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=batch):
                pending.append(key)
                if len(pending) >= batch:
                    deleted += client.unlink(*pending)
                    pending = []
            if pending:
                deleted += client.unlink(*pending)
        except Exception as exc:  # noqa: BLE001 (any failure: raised as ConnectionError)
            if self._disconnected:  # close() overtook the purge
                raise self._closed_error() from None
            raise ConnectionError(
                f"Redis tier {self._url_redacted}: purge of {self._key_prefix.decode()}* "
                f"failed after {deleted} keys: "
                f"{_scrub(f'{type(exc).__name__}: {exc}', self._url)}"
            ) from None
        return deleted

    def _redis_keys(self, keys: Sequence[Key], method: str) -> list[bytes]:
        """The Redis keys of a call's ``keys`` (a lone str/bytes is refused: TypeError
        naming ``RedisTier.<method>``), after checking that the tier is open."""
        if type(keys) is not list and type(keys) is not tuple:  # a lone str: TypeError
            keys = key_list(keys, f"RedisTier.{method}")
        self._check_open()
        return [self.redis_key(k) for k in keys]

    # -- guarded server calls --------------------------------------------------------------
    def _call(self, what: str, fn, *args) -> Any:
        """Run ``fn(*args)`` under the breaker; returns ``_FAILED`` when refused or failed."""
        if not self._breaker.allow():
            with self._lock:
                self._stats.calls_refused += 1
            return _FAILED
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 (RedisError, OSError, a bug: not to the engine)
            if self._disconnected:
                # close() closed the connections under this call (or refused it a new one):
                # no server failure, nothing counted; raised as a call after close() is
                self._breaker.abandon()
                raise self._closed_error() from None
            opened = self._breaker.failure()
            with self._lock:
                self._stats.backend_errors += 1
            self._log_failure(what, exc, opened)
            return _FAILED
        except BaseException:  # KeyboardInterrupt, SystemExit: no answer, not a failure
            self._breaker.abandon()
            raise
        self._breaker.success()
        return result

    def _log_failure(self, what: str, exc: BaseException, opened: bool) -> None:
        msg = _scrub(f"{type(exc).__name__}: {exc}", self._url)
        if opened:
            logger.warning(
                "%s: %s failed (%s); circuit breaker open for %.2f s",
                self._url_redacted, what, msg, self._breaker.cooldown_s,
            )
        else:
            logger.debug("%s: %s failed (%s)", self._url_redacted, what, msg)

    # -- BlockTier -------------------------------------------------------------------------
    def lookup_prefix(self, keys: Sequence[Key]) -> int:
        """Number of leading ``keys`` present in Redis (one round trip; no data read).

        Standalone with ``lookup_mode="script"``: one EVALSHA that stops at the first missing
        key. Otherwise one pipeline of EXISTS (per node in a cluster). ``lookups`` counts the
        keys examined as the interface defines them: the leading hits plus the first miss (a
        failed or refused call is one miss, and counts in ``backend_errors`` or
        ``calls_refused``).
        A present value that later fails verification is still counted here (:meth:`read`
        then answers ``None``).

        Raises:
            TypeError: a key has no stable encoding. RuntimeError: the tier is closed, or
            :meth:`close` closed it on another thread during the call (nothing counted).
        """
        rkeys = self._redis_keys(keys, "lookup_prefix")
        if not rkeys:
            return 0
        result = self._call("lookup", self._lookup, rkeys)
        n = 0 if result is _FAILED else result
        with self._lock:  # keys examined: the hits and the first miss (a failed call: 1 miss)
            self._stats.lookups += min(n + 1, len(rkeys))
            self._stats.lookup_hits += n
        return n

    def _lookup(self, rkeys: list[bytes]) -> int:
        reader = self._client("lookup")
        if self.lookup_mode == "script":
            return int(self._script(keys=rkeys, client=reader))
        n = 0
        for present in _pipelined(reader, "exists", rkeys):
            if not present:
                break
            n += 1
        return n

    def read(self, keys: Sequence[Key]) -> list[bytes | None]:
        """Verified bytes of each block (``None``: absent, foreign, truncated or corrupt).

        One MGET (standalone) or one pipelined GET batch per node (cluster). Each value's
        header (magic, format version, fingerprint id, lengths) and xxh3-64 checksum are
        checked before its bytes are returned; a failed check is counted in
        ``read_errors`` and answers ``None``. A server failure answers all ``None``.

        Raises:
            TypeError: a key has no stable encoding. RuntimeError: the tier is closed, or
            :meth:`close` closed it on another thread during the call (nothing counted).
        """
        rkeys = self._redis_keys(keys, "read")
        if not rkeys:
            return []
        t0 = time.perf_counter()
        values = self._call("read", self._mget, rkeys)
        elapsed = time.perf_counter() - t0
        if values is _FAILED:
            with self._lock:
                self._stats.reads += len(rkeys)
            return [None] * len(rkeys)
        out: list[bytes | None] = []
        errors = hits = nbytes = 0
        for rkey, value in zip(rkeys, values, strict=True):
            if value is None:
                out.append(None)
                continue
            block = self._decode(rkey, value)
            if block is None:
                errors += 1
            else:
                hits += 1
                nbytes += len(value)
            out.append(block)
        with self._lock:
            s = self._stats
            s.reads += len(rkeys)
            s.read_hits += hits
            s.read_errors += errors
            s.bytes_read += nbytes
            s.read_latency.observe(elapsed)
        if errors:
            logger.warning(
                "%s: %d of %d values read failed verification (foreign, truncated or corrupt)",
                self._url_redacted, errors, len(rkeys),
            )
        return out

    def _mget(self, rkeys: list[bytes]) -> list[bytes | None]:
        reader = self._client("read")
        if not self.cluster:
            return reader.mget(rkeys)
        return _pipelined(reader, "get", rkeys)

    def _decode(self, rkey: bytes, value: bytes) -> bytes | None:
        """The verified block in ``value`` stored under ``rkey``, or ``None``."""
        if len(value) < HEADER_BYTES:
            return None
        magic, version, codec, _res, fp, length, payload_len, checksum = HEADER.unpack_from(
            value
        )
        if (
            magic != MAGIC
            or version != FORMAT_VERSION
            or fp != self.fingerprint_id
            or length != self.block_bytes
            or payload_len != len(value) - HEADER_BYTES
        ):
            return None
        if codec == CODEC_RAW:
            if payload_len != length:
                return None
            block = value[HEADER_BYTES:]
        elif codec == CODEC_ZSTD:
            decompressor = getattr(self._zstd_local, "d", None)
            if decompressor is None:
                import zstandard

                decompressor = self._zstd_local.d = zstandard.ZstdDecompressor()
            try:
                block = decompressor.decompress(
                    memoryview(value)[HEADER_BYTES:], max_output_size=length
                )
            except Exception:  # noqa: BLE001 (a corrupt payload, whatever zstd raises: a miss)
                return None
            if len(block) != length:
                return None
        else:
            return None
        h = xxhash.xxh3_64(rkey)
        h.update(block)
        if h.intdigest() != checksum:
            return None
        return block

    def check_keys(self, keys: Sequence[Key]) -> None:
        """Raise if :meth:`write` would refuse one of ``keys``: no stable encoding
        (``TypeError``) or a closed tier (``RuntimeError``). No I/O."""
        self._check_open()
        super().check_keys(keys)

    def write(self, keys: Sequence[Key], blocks: Sequence[bytes | bytearray | memoryview]) -> int:
        """Queue ``blocks[i]`` for ``keys[i]``; returns how many were accepted.

        A ``bytes`` block is kept as it is (immutable); a ``bytearray``/``memoryview`` is
        copied before the call returns, so the caller may reuse it. The background writer
        adds the header (checksum, optional compression) and sends batches (MSET, or
        pipelined SET with ``ttl_s`` or in a cluster). A block becomes readable when its
        batch is done.
        Blocks that do not fit in the queue (``max_queue_bytes``) or arrive while the breaker
        is open are dropped and counted in ``writes_skipped``; so are the repeats of a key
        named more than once in the call (its first occurrence is written, as on the disk
        tier).

        Raises:
            ValueError: lengths differ, or a block is not ``block_bytes`` long (names it).
            TypeError: a key has no stable encoding, or a block is not bytes-like (names
            the key). RuntimeError: the tier is closed.
        """
        if type(keys) is not list and type(keys) is not tuple:  # a lone str: TypeError
            keys = key_list(keys, "RedisTier.write")
        self._check_open()
        if type(blocks) is not list and type(blocks) is not tuple:  # any iterable, as DiskTier
            blocks = block_list(blocks, "RedisTier.write")
        if len(keys) != len(blocks):
            raise ValueError(f"write got {counted(len(keys), 'key')} but "
                             f"{counted(len(blocks), 'block')}")
        rkeys = [self.redis_key(k) for k in keys]
        for i, b in enumerate(blocks):
            n = block_nbytes(b, keys[i])
            if n != self.block_bytes:
                raise ValueError(
                    f"block {i} (key {keys[i]!r}) is {counted(n, 'byte')}, the tier's blocks "
                    f"are {self.block_bytes}"
                )
        if not rkeys:
            return 0
        repeats = 0
        if len(set(rkeys)) != len(rkeys):
            # a key named twice in one write: its first occurrence is written and the repeats
            # counted in writes_skipped, as the disk tier does (SET of each would let the last
            # occurrence win, so the two tiers could hold different bytes for one key)
            first: dict[str, int] = {}
            for i, rkey in enumerate(rkeys):
                first.setdefault(rkey, i)
            repeats = len(rkeys) - len(first)
            rkeys = list(first)
            blocks = [blocks[i] for i in first.values()]
        if self._breaker.state == CircuitBreaker.OPEN:
            with self._lock:
                self._stats.writes_skipped += len(rkeys) + repeats
                self._stats.calls_refused += 1
            return 0
        size = HEADER_BYTES + self.block_bytes
        with self._lock:
            room = (self.max_queue_bytes - self._queued_bytes) // size
            take = min(len(rkeys), max(room, 0))
            self._queued_blocks += take
            self._queued_bytes += take * size
            self._stats.writes += take
            self._stats.writes_skipped += len(rkeys) - take + repeats
        # bytes are immutable: kept as they are (0 copies, the raw MSET's cost); a
        # bytearray/memoryview the caller may reuse is copied once (outside the lock)
        items = [(rkeys[i], b if type(b) is bytes else bytes(memoryview(b)))
                 for i, b in zip(range(take), blocks, strict=False)]
        with self._lock:
            # enqueued under the lock close() takes to stop the writer: a write that passed
            # the closed check while another thread closed the tier queued its blocks after
            # the writer had stopped (accepted, never sent; flush() then never returned)
            if self._closed:
                self._queued_blocks -= take
                self._queued_bytes -= take * size
                self._stats.writes -= take
                self._stats.writes_skipped -= len(rkeys) - take + repeats
                raise RuntimeError(f"{self!r} is closed")
            for item in items:
                self._queue.put(item)
        return take

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted write is done or failed; ``False`` on timeout.

        ``timeout``: seconds, ``None`` or ``inf`` to wait as long as it takes.

        Raises:
            ValueError: ``timeout`` is negative, NaN, a bool or not a number.
        """
        timeout = check_timeout(timeout, "flush")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._done:
            while self._queued_blocks or self._inflight:
                if deadline is None:
                    self._done.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._done.wait(left)
        return True

    def stats(self) -> RedisTierStats:
        """A fresh copy of the counters (``used_blocks`` is 0: Redis owns capacity, and
        counting keys would cost a SCAN)."""
        with self._lock:
            s = self._stats
            out = RedisTierStats(
                **{f.name: getattr(s, f.name) for f in fields(s)
                   if f.name not in ("read_latency", "write_latency")},
                read_latency=s.read_latency.copy(),
                write_latency=s.write_latency.copy(),
            )
            out.queued_blocks = self._queued_blocks
            out.queued_bytes = self._queued_bytes
        out.breaker_opens = self._breaker.opens
        out.breaker_state = self._breaker.state
        return out

    @property
    def breaker(self) -> CircuitBreaker:
        """The tier's circuit breaker (read its ``state``; for tests and operators)."""
        return self._breaker

    def close(self, timeout: float | None = 5.0) -> None:
        """Finish queued writes (up to ``timeout`` seconds; the rest are dropped and counted
        as failed), stop the writer and close the connections (a client whose ``close``
        raises is dropped, its error logged at DEBUG). Idempotent. ``timeout``:
        seconds, ``None`` or ``inf`` to wait as long as it takes.

        May run while other threads call the tier: a call that starts after ``close()``
        began raises ``RuntimeError``; one already running either completes (its answer
        came before the connections were closed) or raises the same ``RuntimeError``, and
        it counts nothing. No connection is opened after the connections are closed (a
        new connection is refused once its socket opens; see the module doc).

        Raises:
            ValueError: ``timeout`` is negative, NaN, a bool or not a number (the tier stays open).
        """
        timeout = check_timeout(timeout, "close")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)  # after every block a write enqueued (see write)
        self._writer.join(timeout)
        if self._writer.is_alive():
            # the rest is dropped: before, the writer went on sending it after close had
            # returned, on a connection it opened after the clients below were closed
            self._abandoned = True
            logger.warning("%s: writer did not finish within %s s; the writes still queued "
                           "are dropped", self._url_redacted, timeout)
        with self._client_lock:  # a cluster client being built is finished, then closed
            # from now on no connection opens (_refuse_after_close) and no client is built
            self._disconnected = True
            clients = dict(self._client_map or {})
        for kind, client in clients.items():
            if client is not None:
                try:
                    self._close_client(client)
                except Exception as exc:  # noqa: BLE001 (best effort: the client is dropped)
                    logger.debug("%s: closing the %s client failed (%s); dropped",
                                 self._url_redacted, kind,
                                 _scrub(f"{type(exc).__name__}: {exc}", self._url))

    def _close_client(self, client: Any) -> None:
        """Close a redis-py client and its connections. A ``RedisCluster``'s ``close()``
        closes each node's ``Redis`` client, but those clients sit on connection pools that
        ``Redis.close()`` leaves open (it disconnects only a pool it made itself), so every
        node connection stayed open after the tier's ``close()``: those pools are
        disconnected here."""
        pools = []
        if self.cluster:
            pools = [node.redis_connection.connection_pool for node in client.get_nodes()
                     if node.redis_connection is not None]
        try:
            client.close()
        finally:
            for pool in pools:
                pool.disconnect()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _closed_error(self) -> RuntimeError:
        """The error of a call that :meth:`close` overtook (its connection was closed or
        refused under it): the one a call made after ``close()`` raises."""
        return RuntimeError(f"{self!r} is closed")

    # -- background writer -----------------------------------------------------------------
    def _write_loop(self) -> None:
        stop = False
        dropped = 0
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            if self._abandoned:  # close() timed out: nothing more is sent
                dropped = 1
                break
            batch = [item]
            size = HEADER_BYTES + self.block_bytes  # the queue's unit, as write() counted it
            nbytes = size
            while nbytes < self.write_batch_bytes:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
                nbytes += size
            with self._lock:
                self._queued_blocks -= len(batch)
                self._queued_bytes -= nbytes
                self._inflight += len(batch)
            try:
                self._write_batch(batch)
            except Exception as exc:  # noqa: BLE001 (keep the writer alive: flush waits on it)
                with self._lock:
                    self._stats.writes_failed += len(batch)
                logger.error("%s: writer error: %s", self._url_redacted,
                             _scrub(f"{type(exc).__name__}: {exc}", self._url))
            finally:
                with self._done:
                    self._inflight -= len(batch)
                    self._done.notify_all()
        # closing: anything still queued was not sent
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                dropped += 1
        with self._done:
            if dropped:
                self._stats.writes_failed += dropped
            self._queued_blocks = 0
            self._queued_bytes = 0
            self._done.notify_all()
        if self._abandoned:  # a batch sent after close() closed the clients reconnected
            client = (self._client_map or {}).get("write")
            if client is not None:
                try:
                    self._close_client(client)
                except Exception:  # noqa: BLE001, S110 (close() logged this client already)
                    pass

    def _seal(self, rkey: bytes, block: bytes) -> tuple[bytes, bytes]:
        """(header, payload) of one block: checksum, and zstd when that saves >= 10 %."""
        h = xxhash.xxh3_64(rkey)
        h.update(block)
        checksum = h.intdigest()
        codec, payload = CODEC_RAW, block
        if self._zstd_c is not None:
            packed = self._zstd_c.compress(block)
            if len(packed) <= 0.9 * self.block_bytes:
                codec, payload = CODEC_ZSTD, packed
        header = HEADER.pack(
            MAGIC, FORMAT_VERSION, codec, 0, self.fingerprint_id, self.block_bytes,
            len(payload), checksum,
        )
        return header, payload

    def _write_batch(self, batch: list[tuple[bytes, bytes]]) -> None:
        if not self._breaker.allow():
            with self._lock:  # accepted, then dropped without trying: a failed write
                self._stats.writes_failed += len(batch)
                self._stats.calls_refused += 1
            return
        t0 = time.perf_counter()
        try:
            sealed = [(k, *self._seal(k, v)) for k, v in batch]
            refused = self._send(sealed)
        except redis.exceptions.ResponseError as exc:  # an error reply to the whole call
            refused = [exc] * len(batch)
        except Exception as exc:  # noqa: BLE001 (any failure: counted, breaker told)
            if self._disconnected:
                # close() gave up waiting and closed the connection under this batch (or
                # refused it a new one): dropped as close() says, not a server failure
                self._breaker.abandon()
                with self._lock:
                    self._stats.writes_failed += len(batch)
                return
            opened = self._breaker.failure()
            with self._lock:
                self._stats.writes_failed += len(batch)
                self._stats.backend_errors += 1
            self._log_failure("write", exc, opened)
            return
        # The server answered every command: it is up, even where it refused a write (OOM:
        # full, maxmemory under noeviction; MISCONF, NOREPLICAS, READONLY, NOPERM, ...). A
        # refusal is not a breaker failure, so lookups and reads of what it holds go on
        # (docs/redis.md; before session 10 an OOM was, and before session 16 any other
        # refusal: 3 refused batches opened the breaker and lookups answered miss). Each
        # block counts as its own reply says: with ttl_s or in a cluster a batch is one SET
        # per block, which the server may refuse for some blocks only (an OOM once maxmemory
        # is reached, a NOPERM for some keys); before session 17 the whole batch was counted
        # failed, the stored blocks too. An MSET is refused or written as a whole.
        self._breaker.success()
        elapsed = time.perf_counter() - t0
        written = [p for (_, _, p), err in zip(sealed, refused, strict=True) if err is None]
        errors = [err for err in refused if err is not None]
        with self._lock:
            s = self._stats
            s.writes_completed += len(written)
            s.bytes_written += sum(HEADER_BYTES + len(p) for p in written)
            if written:
                s.write_latency.observe(elapsed)
            if errors:
                s.writes_failed += len(errors)
                s.backend_errors += 1  # one refused call
        if errors:
            self._log_refused(errors)

    def _log_refused(self, errors: list[Exception]) -> None:
        """One WARNING per tier and kind of refused write ("oom", "refused": any other error
        reply), quoting the server's reply; later ones at DEBUG."""
        first: dict[type, Exception] = {}
        for err in errors:  # each type of reply once, as first seen
            first.setdefault(type(err), err)
        for exc in first.values():
            if isinstance(exc, redis.exceptions.OutOfMemoryError):
                kind, text = "oom", ("write refused, the server is out of memory (%s); set "
                                     "maxmemory-policy to allkeys-lru or volatile-lru "
                                     "(docs/redis.md)")
                reply = str(exc)
            else:
                kind, text = "refused", "write refused by the server (%s); lookups and reads go on"
                reply = f"{type(exc).__name__}: {exc}"
            with self._lock:
                warned = kind in self._warned
                self._warned.add(kind)
            log = logger.debug if warned else logger.warning
            log("%s: " + text, self._url_redacted, _scrub(reply, self._url))

    def _send(self, sealed: list[tuple[bytes, bytes, bytes]]) -> list[Exception | None]:
        """Send one batch; per block, ``None`` (stored) or the server's error reply that
        refused it. Raises for a failed call (connection, timeout, ...)."""
        writer = self._client("write")
        if self.cluster:
            pipe = writer.pipeline(transaction=False)
            for k, header, payload in sealed:
                pipe.set(k, header + payload, ex=self.ttl_s)
            results = pipe.execute(raise_on_error=False)
            for r in results:  # a node that failed (not refused): the call failed
                if isinstance(r, Exception) and not isinstance(r, redis.exceptions.ResponseError):
                    raise r
            return [r if isinstance(r, Exception) else None for r in results]
        # Standalone: the command packed here so that a value goes out as its 40-byte header
        # and the block's own bytes, never joined into a new 2 MiB string (a join cost 0.75 ms
        # per 2 MiB block on the 2-core dev host, ~20 % of a loopback MSET).
        chunks, ncmds = _pack_sets(sealed, self.ttl_s)
        pool = writer.connection_pool
        conn = pool.get_connection()
        replies: list[Exception | None] = []
        try:
            conn.send_packed_command(chunks)
            for _ in range(ncmds):
                try:
                    conn.read_response()
                    replies.append(None)
                except redis.exceptions.ResponseError as exc:
                    # an error reply, read whole: the connection stays in step, and the
                    # replies after it are read too (before, the first one was raised and
                    # the connection dropped with the rest unread)
                    replies.append(exc)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if ncmds == 1:  # one MSET: all blocks or none
            return replies * len(sealed)
        return replies


def _pack_sets(
    sealed: list[tuple[bytes, bytes, bytes]], ttl_s: int | None
) -> tuple[list[bytes], int]:
    """RESP chunks of one MSET (or, with a TTL, one ``SET k v EX ttl`` per block) and the
    number of replies to read. Small pieces are joined; block payloads are sent as they are."""
    chunks: list[bytes] = []
    small: list[bytes] = []
    if ttl_s is None:
        small.append(b"*%d\r\n$4\r\nMSET\r\n" % (1 + 2 * len(sealed)))
        ncmds = 1
    else:
        ncmds = len(sealed)
        ex = str(ttl_s).encode()
        tail = b"\r\n$2\r\nEX\r\n$%d\r\n%s\r\n" % (len(ex), ex)
    for k, header, payload in sealed:
        if ttl_s is not None:
            small.append(b"*5\r\n$3\r\nSET\r\n")
        small.append(b"$%d\r\n%s\r\n$%d\r\n%s" % (len(k), k, len(header) + len(payload), header))
        chunks.append(b"".join(small))
        chunks.append(payload)
        small = [tail if ttl_s is not None else b"\r\n"]
    chunks.append(b"".join(small))
    return chunks, ncmds


def _pipelined(client: Any, command: str, rkeys: list[bytes]) -> list[Any]:
    """One reply per key of ``client.<command>(key)`` for every key, sent as one pipeline
    without MULTI (in a cluster, redis-py sends one batch per node)."""
    pipe = client.pipeline(transaction=False)
    call = getattr(pipe, command)
    for k in rkeys:
        call(k)
    return pipe.execute()


class _Failed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<failed>"


_FAILED = _Failed()


def _scrub(text: str, url: str) -> str:
    """``text`` with the URL's password (raw and percent-decoded) replaced by ``***``."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        from urllib.parse import quote, unquote

        for form in {password, unquote(password), quote(password, safe="")}:
            if form:
                text = text.replace(form, "***")
    env_pw = os.environ.get(ENV_PASSWORD)
    if env_pw:
        text = text.replace(env_pw, "***")
    return text
