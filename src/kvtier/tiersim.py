"""Multi-tier trace simulation: ``kvtier replay --tiers host:4000,disk:64000[,redis://...]``.

A request trace is replayed through a :class:`~kvtier.tiers.stack.TierStack` — the same
tiering logic the data plane uses (:class:`kvtier.dataplane.tiered.TieredOffloader`) — with a
host :class:`~kvtier.OffloadingManager` of the given size and, below it, a simulated disk tier
(:class:`SimTier`: a manager of the given size, no bytes) and optionally a real Redis tier
(``kvtier.tiers.redis.RedisTier``, when that module is importable; 64-byte payloads are
written under a namespace of the run's own with the fingerprint ``kvtier-tiersim`` and a
one-day TTL, each request's writes are flushed before the next request, and the run's keys
are deleted at its end; an unreachable server is an error before the run, and a tier that
failed during the run makes ``kvtier replay --tiers`` exit 1 after its table). Per request
(engine protocol, every load/store completed before the next request)::

    found = stack.lookup(keys)          # host run, then lower tiers, run by run
    host.touch(keys)
    n = stack.promote(keys, found)      # blocks found below are read and stored into the host
    host.prepare_load(keys[:n])         # the prefix stays pinned while the rest is stored
    out = host.prepare_store(keys[n:])
    host.complete_load(keys[:n]); host.complete_store(out.keys_to_store)
    stack.stored(out.keys_to_store)     # write-through: also written below
    stack.flush_demotions()             # write-back: host victims written below

Each of the ``n`` leading blocks counts as a hit of the tier that served it. With the host
alone this is exactly ``kvtier replay``'s prefix protocol with ``--inflight 0`` (tested).
"""

from __future__ import annotations

import numbers
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from kvtier.checks import counted
from kvtier.manager import OffloadingManager
from kvtier.replay import parse_capacity
from kvtier.tiers.base import BlockTier, Key, TierStats, plan_write
from kvtier.tiers.stack import DEMOTION_MODES, TierStack
from kvtier.trace import not_a_request

__all__ = ["SimTier", "TierResult", "TierSpec", "TiersReplayResult", "parse_tiers",
           "replay_tiers"]

SIM_BLOCK_BYTES = 64
"""Payload size of a simulated block (what a Redis tier receives in a simulation)."""


@dataclass(frozen=True)
class TierSpec:
    """One item of a ``--tiers`` spec: ``kind`` is ``"host"``, ``"disk"`` or ``"redis"``;
    ``capacity`` the size as written (blocks or %), ``None`` for Redis; ``url`` for Redis."""

    kind: str
    capacity: str | None = None
    url: str | None = None


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _shown(spec: str) -> str:
    """``spec`` as an error message may show it: each Redis URL's password replaced by
    ``***`` (without redis-py installed, the whole URL is replaced)."""
    try:
        from kvtier.tiers.redis import redact_url
    except ImportError:  # redis-py missing: show no URL at all
        def redact_url(url: str) -> str:
            return "<redis URL>"
    return ",".join(redact_url(item) if item.startswith(_REDIS_SCHEMES) else item
                    for item in _split_items(spec))


def _split_items(spec: str) -> list[str]:
    """The items of a ``--tiers`` spec, stripped: split at commas, except that a piece after
    a Redis URL that does not start a tier item (``host:``, ``disk:``, a Redis URL) is part
    of that URL (a password or query may hold commas; split there, an error message showed
    the password's tail)."""
    items: list[str] = []
    for raw in spec.split(","):
        item = raw.strip()
        if items and items[-1].startswith(_REDIS_SCHEMES) and not _starts_item(item):
            items[-1] += "," + raw
        else:
            items.append(item)
    return items


def _starts_item(item: str) -> bool:
    kind, sep, _ = item.partition(":")
    return item.startswith(_REDIS_SCHEMES) or (
        bool(sep) and kind.strip().lower() in ("host", "disk"))


def parse_tiers(spec: str) -> list[TierSpec]:
    """Parse ``host:CAP[,disk:CAP][,redis://...]``, top down.

    ``CAP`` is a block count or a percentage of the trace's distinct blocks (as
    ``--capacity``). The host tier comes first and is required; each kind appears once.

    Raises:
        ValueError: naming the item and the rule it broke.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("--tiers must name the tiers, e.g. host:4000,disk:64000; got "
                         f"{_shown(spec) if isinstance(spec, str) else spec!r}")
    out: list[TierSpec] = []
    for item in _split_items(spec):
        if not item:
            raise ValueError(f"--tiers {_shown(spec)!r}: empty item")
        if item.startswith(_REDIS_SCHEMES):
            tier = TierSpec("redis", None, item)
        else:
            kind, sep, cap = item.partition(":")
            kind = kind.strip().lower()
            if kind not in ("host", "disk") or not sep or not cap.strip():
                raise ValueError(f"--tiers item {item!r}: expected host:CAP, disk:CAP or a "
                                 "redis:// URL (CAP = blocks or %)")
            tier = TierSpec(kind, cap.strip())
        if any(t.kind == tier.kind for t in out):
            raise ValueError(f"--tiers {_shown(spec)!r}: tier {tier.kind!r} named twice")
        out.append(tier)
    if out[0].kind != "host":
        raise ValueError(f"--tiers {_shown(spec)!r}: the first tier must be host:CAP")
    return out


class SimTier(BlockTier):
    """A simulated lower tier: an :class:`~kvtier.OffloadingManager` of ``num_blocks`` slots,
    no bytes. Same bookkeeping as :class:`~kvtier.tiers.disk.DiskTier` (keys already present
    skipped, the head of a write kept when it exceeds the room, reads touch the hits), with
    every write done at once. ``read`` returns ``block_bytes`` zero bytes per present key."""

    def __init__(self, name: str, num_blocks: int, policy: str = "lru",
                 block_bytes: int = SIM_BLOCK_BYTES) -> None:
        self.name = name
        self.block_bytes = block_bytes
        self.manager = OffloadingManager(num_blocks, policy)
        self._stats = TierStats(name=name, capacity_blocks=num_blocks)
        self._zero = bytes(block_bytes)

    def lookup_prefix(self, keys: Sequence[Key]) -> int:
        n = self.manager.lookup_prefix(keys)
        self._stats.lookups += n + 1 if n < len(keys) else n
        self._stats.lookup_hits += n
        return n

    def read(self, keys: Sequence[Key]) -> list[bytes | None]:
        m = self.manager
        out = [self._zero if m.ref_count(k) == 0 else None for k in keys]
        hits = [k for k, b in zip(keys, out, strict=True) if b is not None]
        if hits:
            m.touch(hits)
        st = self._stats
        st.reads += len(keys)
        st.read_hits += len(hits)
        st.bytes_read += len(hits) * self.block_bytes
        return out

    def write(self, keys: Sequence[Key], blocks: Sequence[bytes]) -> int:
        if len(keys) != len(blocks):
            raise ValueError(f"write: {counted(len(keys), 'key')} but "
                             f"{counted(len(blocks), 'block')}")
        m = self.manager
        st = self._stats
        first = list(dict.fromkeys(keys))
        # stored keys protected by naming them, as on the disk (kvtier.tiers.base.plan_write)
        new, offer, _ = plan_write(m, first)
        st.writes_skipped += len(keys) - len(new)  # stored, named twice, or no room
        if not new:
            return 0
        out = m.prepare_store(offer)
        if out is None:  # cannot happen with every block evictable; counted if it does
            st.writes_skipped += len(new)
            return 0
        m.complete_store(out.keys_to_store)
        n = len(out.keys_to_store)
        st.writes += n
        st.writes_completed += n
        st.evictions += len(out.evicted_keys)
        st.bytes_written += n * self.block_bytes
        st.used_blocks = len(m)
        return n

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def __contains__(self, key: Key) -> bool:
        return self.manager.ref_count(key) is not None

    def stats(self) -> TierStats:
        st = self._stats
        return TierStats(**{f: getattr(st, f) for f in st.__dataclass_fields__})

    def close(self) -> None:
        pass


@dataclass
class TierResult:
    """One tier of a simulation: ``hit_blocks`` block references it served."""

    name: str
    kind: str
    capacity: int | None
    hit_blocks: int
    promoted: int  # blocks promoted from this tier into the host (0 for the host)
    stats: TierStats

    @property
    def failures(self) -> int:
        """Calls and writes that a real tier (Redis) failed, refused or dropped during the
        run (``backend_errors + calls_refused + writes_failed + writes_skipped`` of its
        ``RedisTierStats``); 0 for the simulated tiers. Non-zero means the tier's hit
        figures are lower than a healthy server's would be."""
        st = self.stats
        if not hasattr(st, "backend_errors"):
            return 0
        return st.backend_errors + st.calls_refused + st.writes_failed + st.writes_skipped


@dataclass
class TiersReplayResult:
    """A simulation of one policy over a tier stack (see the module docstring)."""

    policy: str
    demotion: str
    requests: int
    block_refs: int
    input_tokens: int
    hit_tokens: int
    store_failures: int
    demoted: int
    tiers: list[TierResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def hit_blocks(self) -> int:
        return sum(t.hit_blocks for t in self.tiers)

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    def tier_hit_ratio(self, name: str) -> float:
        """Share of block references served by tier ``name``."""
        for t in self.tiers:
            if t.name == name:
                return t.hit_blocks / self.block_refs if self.block_refs else 0.0
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "policy": self.policy, "demotion": self.demotion, "requests": self.requests,
            "block_refs": self.block_refs, "hit_blocks": self.hit_blocks,
            "block_hit_ratio": self.block_hit_ratio, "input_tokens": self.input_tokens,
            "hit_tokens": self.hit_tokens, "token_hit_ratio": self.token_hit_ratio,
            "store_failures": self.store_failures, "demoted": self.demoted,
            "seconds": self.seconds,
            "tiers": [{
                "name": t.name, "kind": t.kind, "capacity": t.capacity,
                "hit_blocks": t.hit_blocks, "hit_ratio": self.tier_hit_ratio(t.name),
                "promoted": t.promoted, "writes": t.stats.writes,
                "evictions": t.stats.evictions, "lookups": t.stats.lookups,
                "failures": t.failures,
            } for t in self.tiers],
        }


SIM_REDIS_TTL_S = 24 * 3600
"""Expiry of a simulation's Redis keys (seconds) unless the URL's query sets ``ttl_s``: a run
that is killed before its clean-up leaves nothing behind for longer than a day."""


def _redis_tier(url: str, block_bytes: int) -> BlockTier:
    """``kvtier.tiers.redis.RedisTier.from_url(url)`` for a simulation: 64-byte payloads under
    a namespace of this run only (``<namespace>-<12 hex digits>``, ``<namespace>`` from the
    URL's query or ``kvtier-tiersim``), fingerprint ``kvtier-tiersim``, keys that expire
    after :data:`SIM_REDIS_TTL_S` unless the query sets ``ttl_s``. The server is checked
    before the run (:meth:`RedisTier.ping`): an unreachable one is an error, not a run whose
    Redis tier answers miss. :func:`replay_tiers` deletes the run's keys at the end
    (:meth:`RedisTier.purge`).

    Raises:
        ValueError: redis-py is not installed, or a bad URL or option.
        ConnectionError: the server does not answer.
    """
    try:
        from kvtier.tiers.redis import RedisTier
    except ImportError as exc:
        raise ValueError(f"--tiers {_shown(url)}: the Redis tier (kvtier.tiers.redis.RedisTier) is "
                         f"not available: {exc}" + ("" if "pip install" in str(exc) else
                                                     " (install it: pip install 'kvtier[redis]')")
                         ) from None
    try:
        query = dict(parse_qsl(urlsplit(url).query))
    except ValueError:
        query = {}  # from_url raises the error, password redacted
    options: dict = {
        "block_bytes": block_bytes,
        "fingerprint": "kvtier-tiersim",
        "namespace": f"{query.get('namespace') or 'kvtier-tiersim'}-{uuid.uuid4().hex[:12]}",
    }
    if "ttl_s" not in query:
        options["ttl_s"] = SIM_REDIS_TTL_S
    tier = RedisTier.from_url(url, **options)
    try:
        tier.ping()
    except BaseException:
        tier.close()
        raise
    return tier


def _clean_up(tier: BlockTier) -> None:
    """Delete a real tier's keys of this run (a tier with ``purge``), after its writes;
    a failure is a warning (the keys expire with their TTL)."""
    purge = getattr(tier, "purge", None)
    if purge is None:
        return
    try:
        tier.flush(10.0)
        purge()
    except Exception as exc:  # noqa: BLE001 - any tier's failure (redis's are no OSError)
        warnings.warn(f"{tier.name} tier: this run's keys were not deleted ({exc}); they "
                      "expire with their TTL", RuntimeWarning, stacklevel=3)


def replay_tiers(
    requests: Iterable,
    tiers: Sequence[TierSpec],
    policy: str = "lru",
    *,
    unique_blocks: int | None = None,
    demotion: str = "write-back",
    block_tokens: int = 512,
    store_threshold: int = 1,
    redis_factory: Callable[[str, int], BlockTier] = _redis_tier,
) -> TiersReplayResult:
    """Simulate ``requests`` through the tier stack ``tiers`` (see the module docstring).

    Args:
        requests: :class:`~kvtier.trace.Request` s (``.keys``, ``.input_length``).
        tiers: from :func:`parse_tiers`; host first.
        policy: policy of the host and disk tiers (a registered name).
        unique_blocks: the trace's distinct blocks, for percentage capacities.
        demotion: ``"write-back"`` or ``"write-through"``.
        block_tokens: tokens per block (token counts).
        store_threshold: the host manager's admission threshold.
        redis_factory: builds the tier of a ``redis://`` item from ``(url, block_bytes)``.

    Raises:
        ValueError: a bad capacity, policy, demotion mode, an unavailable Redis tier, or a
            request whose ``input_length`` is negative (the requests before it were
            simulated; as :func:`kvtier.replay.replay`).
        TypeError: a request without ``.keys`` / ``.input_length`` (a bare key list) or
            whose ``input_length`` is not a number.
        ConnectionError: the Redis server does not answer before the run (the default
            ``redis_factory`` pings it).
    """
    if demotion not in DEMOTION_MODES:
        raise ValueError(f"demotion must be one of {', '.join(DEMOTION_MODES)}, got {demotion!r}")
    tiers = list(tiers)
    if not tiers or tiers[0].kind != "host":
        raise ValueError("tiers must start with the host tier")
    caps = []
    for t in tiers:
        try:
            caps.append(parse_capacity(t.capacity, unique_blocks)
                        if t.capacity is not None else None)
        except ValueError as exc:  # say which item of host:CAP,disk:CAP it is
            raise ValueError(f"--tiers item '{t.kind}:{t.capacity}': {exc}") from None
    host = OffloadingManager(caps[0], policy, store_threshold=store_threshold)
    lower: list[BlockTier] = []
    try:
        for t, cap in zip(tiers[1:], caps[1:], strict=True):
            if t.kind == "disk":
                lower.append(SimTier("disk", cap, policy))
            else:
                lower.append(redis_factory(t.url, SIM_BLOCK_BYTES))
        payload = bytes(SIM_BLOCK_BYTES)
        stack = TierStack(host, lower, SIM_BLOCK_BYTES, lambda slot: payload,
                          lambda slot, data: None, demotion=demotion)
        served = {name: 0 for name in stack.names}
        # real tiers (Redis) write in the background: waited for after each request's
        # writes, so a block is found by the next request as in the simulated tiers
        real = [t for t in lower if not isinstance(t, SimTier)]
        demoted = 0
        n_req = refs = in_tok = hit_tok = fails = 0
        t0 = time.perf_counter()
        touch, prepare_load, complete_load = host.touch, host.prepare_load, host.complete_load
        prepare_store, complete_store = host.prepare_store, host.complete_store
        for req in _checked_requests(requests, block_tokens):
            keys, length = req
            found = stack.lookup(keys)
            touch(keys)
            n = stack.promote(keys, found)
            stack.flush_demotions()
            if n:
                left = n
                for name, count in found.runs:
                    take = count if count < left else left
                    served[name] += take
                    left -= take
                    if not left:
                        break
                loaded = keys[:n]
                prepare_load(loaded)
            # the loaded prefix stays pinned while the rest is stored, then the loads and the
            # store complete, as kvtier replay's prefix protocol at W = 0 (completing the
            # loads first let the store evict the prefix: found by a newcomer session)
            stored = None
            if n < len(keys):
                out = prepare_store(keys[n:] if n else keys)
                if out is None:
                    fails += 1
                else:
                    stored = out.keys_to_store
            if n:
                complete_load(loaded)
            if stored:
                complete_store(stored)
                stack.stored(stored)
            if n < len(keys):
                stack.flush_demotions()
            if real and stack.demoted != demoted:
                demoted = stack.demoted
                for tier in real:
                    tier.flush(10.0)
            n_req += 1
            refs += len(keys)
            in_tok += length
            hit_tok += min(n * block_tokens, length)
        seconds = time.perf_counter() - t0
        stack.flush()
        stats = stack.stats()
        result = TiersReplayResult(
            policy=policy, demotion=demotion, requests=n_req, block_refs=refs,
            input_tokens=in_tok, hit_tokens=hit_tok, store_failures=fails,
            demoted=stack.demoted, seconds=seconds,
        )
        for t, name, cap in zip(tiers, stack.names, caps, strict=True):
            result.tiers.append(TierResult(
                name=name, kind=t.kind, capacity=cap, hit_blocks=served[name],
                promoted=stack.promoted.get(name, 0), stats=stats[name],
            ))
        return result
    finally:
        for tier in lower:
            try:
                _clean_up(tier)
            finally:
                tier.close()


def _checked_requests(requests: Iterable, block_tokens: int):
    """``(keys, input tokens)`` per request, each checked before it is simulated as
    :func:`kvtier.replay.replay` checks it: a request without ``.keys`` / ``.input_length``
    (a bare key list) and an ``input_length`` that is not a number are a ``TypeError``, a
    negative one a ``ValueError``, each naming the request (0-based, as replay() does);
    ``None`` is ``len(keys) · block_tokens``. (A negative length gave a token hit ratio
    above 100 %: found by a newcomer session.)"""
    req = None
    i = 0
    try:
        for i, req in enumerate(requests):
            keys, length = req.keys, req.input_length
            if length is None:
                length = len(keys) * block_tokens
            elif isinstance(length, bool) or not isinstance(length, numbers.Real):
                raise TypeError(f"request {i}: input_length must be an int (tokens) or None, "
                                f"got {type(length).__name__} {length!r:.40}")
            elif length < 0:
                raise ValueError(f"request {i}: input_length must be >= 0 (tokens), got "
                                 f"{length!r}")
            yield keys, length
    except AttributeError as exc:
        error = not_a_request(exc, req, i, ("keys", "input_length"), "replay_tiers")
        if error is None:
            raise
        raise error from None


def results_table(results: Sequence[TiersReplayResult], title: str):
    """A rich table: one row per (policy, tier), then the policy's total."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True, show_edge=False)
    for name in ("policy", "tier", "capacity\nblocks", "hit\nblocks", "block\nhit %",
                 "token\nhit %", "promoted\nto host", "writes", "evictions"):
        table.add_column(name, justify="left" if name in ("policy", "tier") else "right",
                         no_wrap=True)
    for r in results:
        for t in r.tiers:
            table.add_row(r.policy, t.name, "-" if t.capacity is None else f"{t.capacity:,}",
                          f"{t.hit_blocks:,}", f"{r.tier_hit_ratio(t.name) * 100:.2f}", "",
                          f"{t.promoted:,}" if t.kind != "host" else "",
                          f"{t.stats.writes:,}", f"{t.stats.evictions:,}")
        table.add_row(r.policy, "[bold]all[/]", "", f"{r.hit_blocks:,}",
                      f"{r.block_hit_ratio * 100:.2f}", f"{r.token_hit_ratio * 100:.2f}",
                      "", "", "", end_section=True)
    return table


def _note_smaller_lower_tiers(spec: Sequence[TierSpec], unique_blocks: int,
                              warn: Callable[[str], object]) -> None:
    """``warn`` about each sized tier smaller than the sized tier above it
    (``host:10%,disk:5%``): allowed, but a lower tier is meant to hold what the tier above
    evicts, so it is usually the larger one (a newcomer pass found it ran without a word).
    A capacity that does not parse is left to :func:`replay_tiers`, which names it."""
    above = None
    for t in spec:
        if t.capacity is None:  # redis: no size
            continue
        try:
            blocks = parse_capacity(t.capacity, unique_blocks)
        except ValueError:
            return
        if above is not None and blocks < above[1]:
            warn(f"--tiers {t.kind}:{t.capacity} ({counted(blocks, 'block')}) is smaller than "
                 f"{above[0].kind}:{above[0].capacity} ({counted(above[1], 'block')}) above "
                 "it: a lower tier holds what the tier above evicts (write-back) or a copy "
                 "of what it stores (write-through), so it is usually the larger one; "
                 "running the stack as given")
        above = (t, blocks)


def replay_tiers_cli(command, tiers: str, demotion: str, capacity_given: bool = False) -> None:
    """``kvtier replay --tiers ...``: one simulation per ``--policy`` of ``command`` (a
    :class:`kvtier.cli.ReplayCommand`); prints the per-tier table and writes ``--json``.
    Raises the CLI's user errors (exit status 1)."""
    from kvtier import cli
    from kvtier.trace import count_unique_blocks

    opts = command.replay
    if capacity_given:
        raise ValueError("--capacity sizes a single tier; with --tiers give each tier's "
                         "size in the spec (host:4000,disk:64000)")
    if opts.inflight or opts.protocol != "prefix":
        raise ValueError("--tiers simulates the engine protocol (prefix) with every load "
                         "and store completed at once: leave --inflight and --protocol")
    if demotion not in DEMOTION_MODES:
        raise ValueError(f"--demotion {demotion!r}: choose {' or '.join(DEMOTION_MODES)}")
    # options the tier simulation does not model: refused, never silently ignored
    if opts.admission != "all":
        raise ValueError("--tiers simulates admit-all stores (or --store-threshold): leave "
                         f"--admission {opts.admission}")
    if command.cost_model is not None:
        raise ValueError("--cost models one tier: leave it out with --tiers")
    spec = parse_tiers(tiers)
    cli._check_policies(command.policies)
    from kvtier.policies import get_policy

    offline = [p for p in command.policies if getattr(get_policy(p), "needs_future", False)]
    if offline:
        raise ValueError(f"--policy {offline[0]} (offline, needs the trace's future) is not "
                         "simulated with --tiers; replay it on one tier without --tiers")
    json_out = command.output.json
    cli._check_writable(json_out, "--json", command.source.path)
    stream = command.stream
    with cli._rereadable(command.source, needed=stream) as source:
        try:
            reader, it = source.open()
            t0 = time.perf_counter()
            requests = None if stream else list(it)
            parse_s = time.perf_counter() - t0
            n_req, n_refs, unique = count_unique_blocks(it if stream else requests)
        except KeyboardInterrupt:
            cli._warn("interrupted while reading the trace: nothing was replayed")
            raise cli._Interrupted from None
        if stream:
            parse_s = time.perf_counter() - t0
        info = cli._trace_info(command.source.path, reader, n_req, n_refs, unique, parse_s)
        _note_smaller_lower_tiers(spec, unique, cli._warn)
        results: list[TiersReplayResult] = []
        interrupted = False
        try:  # Ctrl-C: the runs that finished are shown and written, as by kvtier replay
            for p in command.policies:
                results.append(replay_tiers(source.open()[1] if stream else requests, spec, p,
                                            unique_blocks=unique, demotion=demotion,
                                            block_tokens=opts.block_tokens,
                                            store_threshold=opts.store_threshold))
        except KeyboardInterrupt:
            interrupted = True
    out = cli._out_console(json_out)
    # a Redis URL's password is never shown (title, JSON)
    names = ",".join(_shown(t.url) if t.kind == "redis" else f"{t.kind}:{t.capacity}"
                     for t in spec)
    out.print(results_table(results, f"kvtier replay --tiers {names} — demotion {demotion}"))
    out.print(cli._trace_caption(info), highlight=False, markup=False, soft_wrap=True)
    cli._write_json(json_out, {"trace": info,
                               "tiers": [{**t.__dict__, "url": t.url and _shown(t.url)}
                                         for t in spec],
                               "results": [r.to_dict() for r in results],
                               **({"interrupted": True} if interrupted else {})})
    # kvtier replay shows its store failures in a column; this table has none, so say it
    # (the hits fell with no word: found by a newcomer session)
    host = spec[0]
    for r in results:
        if r.store_failures:
            cli._warn(f"{r.policy} run: {r.store_failures:,} of {counted(r.requests, 'request')} "
                      f"could not store {'its' if r.store_failures == 1 else 'their'} new "
                      f"blocks in the host tier (host:{host.capacity}, "
                      f"{counted(r.tiers[0].capacity, 'block')}: too small for a request's "
                      "loaded prefix and new blocks together); store_failures in the JSON")
    if interrupted:
        cli._warn(cli._interrupted_note(len(results), len(command.policies), "run"))
        raise cli._Interrupted
    # a Redis tier that failed during the run served less than it would have: the figures
    # are not the tier's, so the command fails (exit status 1) after showing them
    failed = [(r.policy, t) for r in results for t in r.tiers if t.failures]
    if failed:
        raise ValueError("the Redis tier failed during the run, so its hit figures above are "
                         "too low: " + "; ".join(
                             f"{p} run: {t.stats.backend_errors:,} failed calls, "
                             f"{t.stats.calls_refused:,} refused by the open breaker, "
                             f"{t.stats.writes_failed + t.stats.writes_skipped:,} block writes "
                             "lost" for p, t in failed))
