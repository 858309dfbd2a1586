"""Trace replay: drive an :class:`~kvtier.OffloadingManager` with a request trace.

The question it answers: what block / token hit ratio would this tier size and this policy give
on this traffic, and what does the manager's bookkeeping cost per block reference? The manager
underneath is the real one (same calls an engine makes), not a simplified cache.

Protocol ``"prefix"`` (the engine's view), per request in trace order::

    hits = lookup_prefix(keys)            # leading blocks readable in the tier
    touch(keys)                           # every key, so ARC sees ghost hits
    if hits: prepare_load(keys[:hits])    # pin the prefix we read
    out = prepare_store(keys[hits:])      # the rest is computed and offloaded
    if out is None: store failure         # (not enough evictable blocks)

With ``inflight=W`` the loads and stores of the last ``W`` requests stay in flight (pinned /
pending); when a request leaves that window (oldest first) its ``complete_load`` then
``complete_store`` run. ``W=0`` completes each request before the next. At the end of the
trace the window is drained. ``prepare_store`` is not called when every key hit.

Protocol ``"request"`` (vLLM 0.33's request-scoped use; the manager's request mode,
docs/manager.md), per request ``r`` (a fresh context each)::

    on_new_request(r)
    hits = lookup_prefix(keys, r)
    if hits: prepare_load(keys[:hits], r)     # recorded as reused
    out = prepare_store(keys[hits:], r)       # new keys: ghost learning, then inserted
    ... when r leaves the window: complete_load, complete_store, on_request_finished(r)

No ``touch``: the request's one use is applied when it finishes (``keys`` head first,
inserted vs reused told apart), after its transfers complete. The window ``W`` works as in
``"prefix"``; the manager allows ``max(4096, W + 1)`` open requests, so none is finished early.

Protocol ``"get"`` (the cache literature's view): every key reference is one get-with-insert::

    if lookup(key) is HIT: touch([key])                       # hit
    else: touch([key]); complete_store(prepare_store([key]))  # miss: insert

Under ``"get"`` LRU gives exactly the hits of a textbook LRU (tested against libCacheSim).

Offline policies (a class with ``needs_future = True``, e.g. ``"belady"``) need the whole
trace up front: ``requests`` must be a list or tuple; the replay builds a
:class:`~kvtier.oracle.NextUseOracle` from it, binds it to the policy, and advances its clock
by each request's keys before the request's calls (``"prefix"``) or by each key before its
get-with-insert (``"get"``). The oracle's cost is included in ``bookkeeping_ns``.

See ``docs/replay.md`` for the formats, the output fields and measured costs.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from kvtier.admission_adaptive import ADMISSION_MODES
from kvtier.checks import _as_int, key_list, unhashable_error
from kvtier.manager import MAX_BLOCKS, OffloadingManager
from kvtier.oracle import NextUseOracle
from kvtier.policies import get_policy
from kvtier.trace import not_a_request
from kvtier.types import LookupResult

__all__ = ["PROTOCOLS", "ReplayOptions", "ReplayResult", "parse_capacity", "replay"]

PROTOCOLS = ("prefix", "request", "get")
"""Accepted values of ``protocol``."""

_PROGRESS_EVERY = 1024  # requests between progress callbacks
DIGITS_PATTERN = r"\d+(?:_\d+)*"
r"""A run of ASCII digits, optionally grouped by single underscores between digits as in a
Python literal (``16_000``; not ``1__0``, ``_1`` or ``1_``): the one rule of digits of the
command line's numbers, counts and decimals (use with ``re.ASCII``: ``\d`` takes any
Unicode digit, ``"\u0663"``, Arabic-Indic 3, was a count; ``[\d_]*`` took ``"1__0"``)."""
# a block count: digits alone
_CAPACITY_RE = re.compile(rf"^\s*({DIGITS_PATTERN})\s*$", re.ASCII)
DECIMAL_PATTERN = (rf"((?:{DIGITS_PATTERN}(?:\.(?:{DIGITS_PATTERN})?)?|\.{DIGITS_PATTERN})"
                   rf"(?:[eE][+-]?{DIGITS_PATTERN})?)")
"""A decimal number: :data:`DIGITS_PATTERN` digits, an optional fraction and exponent, no
sign (``25``, ``2.5``, ``.5``, ``1e4``, ``1_000.5``; not ``1._5`` or ``1e_5``): what
Python's ``float()`` takes of such text. A percentage's number here, the float options' on
the command line (use with ``re.ASCII``). Before session 15 it took no ``_`` at all."""
# a percentage is a decimal number, exponent allowed ("1e-3%"; "1e-9%" was refused as
# neither a count nor a percentage)
_PERCENT_RE = re.compile(rf"^\s*{DECIMAL_PATTERN}\s*%\s*$", re.ASCII)
_CAPACITY_FORMS = ("a block count (ASCII digits, optionally grouped by _: 4000, 16_000) or a "
                   "percentage of the trace's distinct blocks (10%, 2.5%, 1e-3%)")


def parse_count(text: str) -> int | None:
    """``text`` as a count by the rule of a block count in :func:`parse_capacity`: ASCII
    digits, optionally grouped by single underscores between digits (``"16_000"``), spaces
    around ignored; ``None`` for anything else (``"\u0663"``, ``"+5"``, ``"1e3"``, ``"1.0"``,
    ``"1__0"``). The one checker of the command line's counts (``--capacity`` and every int
    option).

    Raises:
        ValueError: a count of more digits (leading zeros aside) than Python converts from
            text to an int (``sys.get_int_max_str_digits()``, 4,300 by default); its
            ``int()`` raised Python's own message naming ``sys.set_int_max_str_digits``.
    """
    m = _CAPACITY_RE.match(text)
    if m is None:
        return None
    digits = m.group(1).replace("_", "").lstrip("0") or "0"
    # (the limit is in CPython 3.11 and 3.10.7+; earlier 3.10 releases convert any length)
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if limit and len(digits) > limit:
        raise ValueError(f"{text.strip()!r} has {len(digits):,} digits: a count has at most "
                         f"{limit:,} (Python's limit for converting text to an int)")
    return int(digits)


def negated(text: str) -> str | None:
    """What follows a leading ``-`` in ``text`` (spaces around it ignored) when a digit or a
    point comes right after the sign, else ``None``: how the command line tells a negative
    number (said to be below the minimum) from text that is no number at all (``"- 5"``)."""
    text = text.strip()
    return text[1:] if text[:1] == "-" and text[1:2].strip() else None


def check_capacity(value: object, name: str = "capacity") -> int:
    """``value`` as a tier size in blocks: an int (numpy ints taken, bools not) from 1 to
    :data:`kvtier.manager.MAX_BLOCKS`; a ``ValueError`` naming ``name`` otherwise (the
    manager's own error named its argument, ``num_blocks``, which replay() does not have)."""
    number = _as_int(value)
    if number is None or not 1 <= number <= MAX_BLOCKS:
        raise ValueError(f"{name} must be an int from 1 to {MAX_BLOCKS:,} (blocks), got "
                         f"{value!r}")
    return number


def _positive_int(name: str, value: object, unit: str, minimum: int = 1) -> int:
    """``value`` as a plain int >= ``minimum`` (numpy ints taken, as by the manager)."""
    number = _as_int(value)
    if number is None or number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum} ({unit}), got {value!r}")
    return number


@dataclass(frozen=True)
class ReplayOptions:
    """How one replay drives the manager (everything but the trace, policy and capacity).

    Built once (by the CLI from its flags, or by a caller) and passed to :func:`replay` and
    :func:`kvtier.sweep.run_grid`; the values are checked when the object is made.

    Attributes:
        inflight: in-flight window ``W`` in requests (>= 0), ``"prefix"`` and ``"request"``
            protocols only.
        protocol: ``"prefix"``, ``"request"`` or ``"get"`` (see the module docstring).
        block_tokens: tokens per block, for the token counts (>= 1).
        store_threshold: the manager's admission threshold in lookups (>= 1; 1 admits
            everything).
        admission: the manager's admission mode, ``"all"``, ``"adaptive"`` (see
            :mod:`kvtier.admission_adaptive`) or ``"tinylfu"`` (see
            :mod:`kvtier.admission_tinylfu`); not with ``store_threshold >= 2``.

    Raises:
        ValueError: unknown protocol or admission mode, a negative window, a non-positive
            ``block_tokens`` or ``store_threshold``, ``inflight > 0`` with
            ``protocol="get"``, or an admission mode other than ``"all"`` with
            ``store_threshold >= 2``.
    """

    inflight: int = 0
    protocol: str = "prefix"
    block_tokens: int = 512
    store_threshold: int = 1
    admission: str = "all"

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown protocol {self.protocol!r}; expected one of {', '.join(PROTOCOLS)}"
            )
        # kept as plain ints: the options are pickled to sweep workers and shown in JSON
        object.__setattr__(self, "inflight",
                           _positive_int("inflight", self.inflight, "requests", minimum=0))
        if self.protocol == "get" and self.inflight:
            raise ValueError(
                "inflight > 0 needs protocol 'prefix' or 'request' ('get' completes every access)"
            )
        object.__setattr__(self, "block_tokens",
                           _positive_int("block_tokens", self.block_tokens, "tokens"))
        object.__setattr__(self, "store_threshold",
                           _positive_int("store_threshold", self.store_threshold, "lookups"))
        if self.admission not in ADMISSION_MODES:
            raise ValueError(f"unknown admission {self.admission!r}; expected one of "
                             f"{', '.join(ADMISSION_MODES)}")
        if self.admission != "all" and self.store_threshold >= 2:
            raise ValueError(f"admission={self.admission!r} cannot be combined with "
                             f"store_threshold={self.store_threshold} (choose one rule)")


@dataclass
class ReplayResult:
    """Counts and cost of one replay of one (policy, capacity).

    Attributes:
        policy: policy name.
        capacity: tier size in blocks.
        protocol: ``"prefix"``, ``"request"`` or ``"get"``.
        inflight: in-flight window ``W`` in requests (0 for ``"get"``).
        block_tokens: tokens per block (used for the token counts).
        store_threshold: the manager's admission threshold (1 = admit all).
        requests: requests replayed.
        block_refs: block references (keys over all requests).
        hit_blocks: block references that hit (prefix hits under ``"prefix"``).
        input_tokens: sum of ``input_length`` (``len(keys) * block_tokens`` where a request
            has none).
        hit_tokens: sum over requests of ``min(hit blocks * block_tokens, input tokens)``.
        store_failures: ``prepare_store`` calls that returned ``None``.
        store_failed_blocks: blocks those calls asked to store.
        stored_blocks: blocks allocated by ``prepare_store`` (manager ``stats().stores``).
        evictions: blocks evicted (manager ``stats().evictions``).
        bookkeeping_ns: wall time of the manager calls, in ns (trace parsing excluded).
        parse_ns: when ``requests`` was a stream (not a list), wall time spent outside the
            manager calls, i.e. reading and parsing the trace, in ns; else ``None``.
        admission: the manager's admission mode (``"all"``, ``"adaptive"`` or ``"tinylfu"``).
        refused_blocks: new blocks admission refused to store (manager
            ``stats().skipped_stores``; also counts ``store_threshold`` refusals).
    """

    policy: str
    capacity: int
    protocol: str
    inflight: int
    block_tokens: int
    store_threshold: int
    requests: int
    block_refs: int
    hit_blocks: int
    input_tokens: int
    hit_tokens: int
    store_failures: int
    store_failed_blocks: int
    stored_blocks: int
    evictions: int
    bookkeeping_ns: int
    parse_ns: int | None = None
    admission: str = "all"
    refused_blocks: int = 0

    @property
    def block_hit_ratio(self) -> float:
        """hit_blocks / block_refs (0.0 for an empty replay)."""
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0

    @property
    def miss_ratio(self) -> float:
        """1 - block_hit_ratio."""
        return 1.0 - self.block_hit_ratio

    @property
    def token_hit_ratio(self) -> float:
        """hit_tokens / input_tokens (0.0 when there are no input tokens)."""
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def ns_per_block_ref(self) -> float:
        """Bookkeeping cost per block reference, in ns."""
        return self.bookkeeping_ns / self.block_refs if self.block_refs else 0.0

    @property
    def bookkeeping_s(self) -> float:
        """Bookkeeping wall time, in seconds."""
        return self.bookkeeping_ns / 1e9

    def to_dict(self) -> dict:
        """All fields plus the derived ratios and costs, JSON-ready."""
        out = asdict(self)
        out["block_hit_ratio"] = self.block_hit_ratio
        out["miss_ratio"] = self.miss_ratio
        out["token_hit_ratio"] = self.token_hit_ratio
        out["ns_per_block_ref"] = self.ns_per_block_ref
        out["bookkeeping_s"] = self.bookkeeping_s
        return out


def parse_capacity(spec: str | int, unique_blocks: int | None = None) -> int:
    """Parse a capacity: a block count (``"4000"``, ``"16_000"``, ``4000``, a numpy integer)
    or a percentage of the trace's distinct blocks (``"10%"``, ``"2.5%"``, ``"1e-3%"``;
    rounded, at least 1 block: a percentage that gives under half a block is a tier of 1
    block, and the command line warns about it).

    A count in text is ASCII digits, optionally grouped by single underscores between digits
    as in a Python literal; a sign (``"+5"``), an exponent (``"1e3"``) or other Unicode
    digits (``"\u0663"``) are not a count. A percentage's number is ASCII too (a decimal,
    exponent allowed, grouped by ``_`` by the same rule: ``"1_0.5%"``). Spaces around either
    are ignored.

    Raises:
        ValueError: not a positive count or percentage, a percentage without
            ``unique_blocks``, or more blocks than a tier can hold
            (:data:`kvtier.manager.MAX_BLOCKS`).
    """
    if not isinstance(spec, str):
        value = _as_int(spec)  # numpy ints taken as the manager takes them; bools refused
        if value is None:
            raise ValueError(f"capacity must be {_CAPACITY_FORMS}, got {spec!r}")
    else:
        try:
            count = parse_count(spec)
        except ValueError:  # thousands of digits: as above as a count of 20 digits is
            raise ValueError(f"capacity {spec!r} is above the most blocks a tier can hold "
                             f"({MAX_BLOCKS:,})") from None
        if count is not None:
            value = count
        else:
            p = _PERCENT_RE.match(spec)
            if not p:
                rest = negated(spec)  # "- 5" is no number
                if rest is not None and _CAPACITY_RE.match(rest):
                    raise ValueError(f"capacity must be >= 1 block, got {spec!r}")
                if rest is not None and _PERCENT_RE.match(rest):
                    raise ValueError(f"capacity {spec!r} must be > 0%")
                raise ValueError(f"capacity {spec!r} is neither a block count nor a percentage: "
                                 f"a capacity is {_CAPACITY_FORMS}")
            if unique_blocks is None:
                raise ValueError(
                    f"capacity {spec!r} is a percentage but the trace's distinct block "
                    "count is unknown"
                )
            # zero from the text, not the float: "1e-400%" is positive though its float is
            # 0.0 (it was refused as "must be > 0%" while "1e-9%" ran at 1 block); the
            # numeral has no sign, so it is zero exactly when its mantissa has no digit 1-9
            if not p.group(1).lower().partition("e")[0].strip("0._"):
                raise ValueError(f"capacity {spec!r} must be > 0%")
            pct = float(p.group(1))
            blocks = unique_blocks * pct / 100.0  # inf for a percentage of 400 digits
            if blocks > MAX_BLOCKS:
                raise ValueError(f"capacity {spec!r} = {blocks:,.0f} blocks is above the "
                                 f"most a tier can hold ({MAX_BLOCKS:,} blocks)")
            return max(1, round(blocks))
    if value < 1:
        raise ValueError(f"capacity must be >= 1 block, got {spec!r}")
    if value > MAX_BLOCKS:
        raise ValueError(f"capacity {spec!r} is above the most blocks a tier can hold "
                         f"({MAX_BLOCKS:,})")
    return value


def replay(
    requests: Iterable,
    policy: str,
    capacity: int,
    options: ReplayOptions | None = None,
    *,
    inflight: int | None = None,
    protocol: str | None = None,
    block_tokens: int | None = None,
    store_threshold: int | None = None,
    progress: Callable[[int], object] | None = None,
    admission: str | None = None,
    hits_out: list | None = None,
) -> ReplayResult:
    """Replay ``requests`` through a fresh ``OffloadingManager(capacity, policy)``.

    Args:
        requests: :class:`~kvtier.trace.Request` s (anything with ``.keys`` and
            ``.input_length``) in trace order. A list is timed as a whole (all manager time);
            any other iterable is streamed and only the manager calls are timed, the rest is
            reported as ``parse_ns``.
        policy: a registered policy name (:func:`kvtier.available_policies`).
        capacity: tier size in blocks (>= 1).
        options: a :class:`ReplayOptions` (default: ``ReplayOptions()``).
        inflight, protocol, block_tokens, store_threshold, admission: override that field of
            ``options`` (see :class:`ReplayOptions`); ``None`` keeps it.
        progress: called with the number of requests done since the previous call, every
            1,024 requests and once at the end.
        hits_out: when given (a list or ``array``), each request's hit blocks are appended
            to it in trace order (for :mod:`kvtier.costmodel`).

    Returns:
        A :class:`ReplayResult`.

    Raises:
        ValueError: unknown protocol or policy, a non-positive capacity / block_tokens /
            threshold, a negative window, ``inflight > 0`` with ``protocol="get"``, an
            offline policy (``belady``) given a stream instead of a list, or a request whose
            ``input_length`` is negative (refused as a wrong type is, below).
        TypeError: ``requests`` is not iterable, ``hits_out`` has no ``.append``,
            ``options`` is not a :class:`ReplayOptions`, a request has no ``.keys`` list
            (e.g. a bare list of keys: wrap it in :class:`~kvtier.trace.Request`), or a
            request's ``input_length`` is not an int or ``None`` (that request is refused
            before the manager or ``hits_out`` sees it; earlier ones were replayed).
        kvtier.trace.TraceFormatError: raised by a streamed trace reader.
    """
    if not hasattr(requests, "__iter__"):  # not iter(): that may open a trace reader's file
        raise TypeError("requests must be an iterable of kvtier.trace.Request (e.g. "
                        f"kvtier.trace.read_trace(path)), got {type(requests).__name__}")
    if hits_out is not None and not callable(getattr(hits_out, "append", None)):
        raise TypeError("hits_out must be a list or array (anything with .append, one int "
                        f"per request), got {type(hits_out).__name__}")
    if options is None:
        options = ReplayOptions()
    elif not isinstance(options, ReplayOptions):
        raise TypeError(f"options must be a ReplayOptions, got {type(options).__name__}")
    given = {"inflight": inflight, "protocol": protocol, "block_tokens": block_tokens,
             "store_threshold": store_threshold, "admission": admission}
    overrides = {k: v for k, v in given.items() if v is not None}
    if overrides:
        options = replace(options, **overrides)
    inflight, protocol = options.inflight, options.protocol
    block_tokens, store_threshold = options.block_tokens, options.store_threshold
    admission = options.admission
    streamed = not isinstance(requests, (list, tuple))
    offline = getattr(get_policy(policy) if isinstance(policy, str) else policy,
                      "needs_future", False)
    if offline and streamed:
        raise ValueError(
            f"policy {policy if isinstance(policy, str) else policy.name!r} is offline: it "
            "needs the whole trace up front (each block's next use), so it cannot replay a "
            "stream; pass the requests as a list (the CLI: drop --stream)"
        )
    capacity = check_capacity(capacity)
    manager = OffloadingManager(capacity, policy, store_threshold=store_threshold,
                                admission=admission, max_open_requests=max(4096, inflight + 1))
    advance = None
    if offline:
        oracle = _oracle(requests)
        manager.policy.bind(oracle)  # type: ignore[attr-defined]
        advance = oracle.advance
    protocol_steps = {"prefix": _prefix_protocol, "request": _request_protocol,
                      "get": _get_protocol}[protocol]
    step, drain = protocol_steps(manager, inflight, advance)
    counts, manager_ns, total_ns = _run(step, drain, requests, block_tokens, progress, streamed,
                                        hits_out)
    stats = manager.stats()
    return ReplayResult(
        policy=policy if isinstance(policy, str) else getattr(policy, "name", str(policy)),
        capacity=manager.num_blocks,  # a plain int (numpy capacities are taken)
        protocol=protocol,
        inflight=inflight,
        block_tokens=block_tokens,
        store_threshold=store_threshold,
        requests=counts[0],
        block_refs=counts[1],
        hit_blocks=counts[2],
        input_tokens=counts[3],
        hit_tokens=counts[4],
        store_failures=counts[5],
        store_failed_blocks=counts[6],
        stored_blocks=stats.stores,
        evictions=stats.evictions,
        bookkeeping_ns=manager_ns if streamed else total_ns,
        parse_ns=(total_ns - manager_ns) if streamed else None,
        admission=admission,
        refused_blocks=stats.skipped_stores,
    )


def _oracle(requests) -> NextUseOracle:
    """The next-use oracle of ``requests`` (a list), with the replay's errors: a request
    without ``.keys`` (a bare key list) and an unhashable key are named as the online
    policies' replays name them (they were a bare AttributeError / "unhashable type")."""
    key_lists = []
    req = None
    try:
        for req in requests:
            key_lists.append(req.keys)
    except AttributeError as exc:
        error = not_a_request(exc, req, len(key_lists), ("keys",), "replay")
        if error is None:
            raise
        raise error from None
    try:
        return NextUseOracle(key_lists)
    except TypeError:
        for i, keys in enumerate(key_lists):
            where = f"replay: request {i}"
            keys = key_list(keys, where)  # not a list of keys: named here
            try:
                hash(tuple(keys))
            except TypeError:
                raise unhashable_error(keys, where) from None
        raise


def _with_clock(step, advance):
    """``step``, or ``step`` preceded by ``advance(keys)`` (an offline policy's clock)."""
    if advance is None:
        return step

    def clocked(keys):
        advance(keys)
        return step(keys)

    return clocked


def _prefix_protocol(manager: OffloadingManager, window_size: int, advance=None):
    """``(step, drain)`` of the engine's protocol; ``step(keys)`` handles one request and
    returns ``(hit blocks, failed prepare_store calls, blocks they failed to store)``.
    ``advance(keys)``, when given, runs first (an offline policy's clock)."""
    lookup_prefix = manager.lookup_prefix
    touch = manager.touch
    prepare_load = manager.prepare_load
    complete_load = manager.complete_load
    prepare_store = manager.prepare_store
    complete_store = manager.complete_store
    window: deque = deque()

    def complete(loaded, stored) -> None:
        if loaded:
            complete_load(loaded)
        if stored:
            complete_store(stored)

    def step(keys):
        n = len(keys)
        hits = lookup_prefix(keys)
        touch(keys)
        loaded = stored = None
        fails = failed_blocks = 0
        if hits:
            loaded = keys[:hits]
            prepare_load(loaded)
        if hits < n:
            out = prepare_store(keys[hits:] if hits else keys)
            if out is None:
                fails, failed_blocks = 1, n - hits
            else:
                stored = out.keys_to_store
        if window_size == 0:
            complete(loaded, stored)
        else:
            window.append((loaded, stored))
            if len(window) > window_size:
                complete(*window.popleft())
        return hits, fails, failed_blocks

    def drain() -> None:  # the last W requests complete, oldest first
        while window:
            complete(*window.popleft())

    return _with_clock(step, advance), drain


def _request_protocol(manager: OffloadingManager, window_size: int, advance=None):
    """``(step, drain)`` of vLLM 0.33's request-scoped protocol (module docstring): like
    ``"prefix"`` without ``touch``, each request's calls under its own context, finished
    (``on_request_finished``) after its transfers complete."""
    on_new_request = manager.on_new_request
    on_request_finished = manager.on_request_finished
    lookup_prefix = manager.lookup_prefix
    prepare_load = manager.prepare_load
    complete_load = manager.complete_load
    prepare_store = manager.prepare_store
    complete_store = manager.complete_store
    window: deque = deque()
    counter = iter(range(1 << 62))  # the contexts: one int per request

    def complete(ctx, loaded, stored) -> None:
        if loaded:
            complete_load(loaded, ctx)
        if stored:
            complete_store(stored, ctx)
        on_request_finished(ctx)

    def step(keys):
        ctx = next(counter)
        on_new_request(ctx)
        n = len(keys)
        hits = lookup_prefix(keys, ctx)
        loaded = stored = None
        fails = failed_blocks = 0
        if hits:
            loaded = keys[:hits]
            prepare_load(loaded, ctx)
        if hits < n:
            out = prepare_store(keys[hits:] if hits else keys, ctx)
            if out is None:
                fails, failed_blocks = 1, n - hits
            else:
                stored = out.keys_to_store
        if window_size == 0:
            complete(ctx, loaded, stored)
        else:
            window.append((ctx, loaded, stored))
            if len(window) > window_size:
                complete(*window.popleft())
        return hits, fails, failed_blocks

    def drain() -> None:  # the last W requests complete and finish, oldest first
        while window:
            complete(*window.popleft())

    return _with_clock(step, advance), drain


def _get_protocol(manager: OffloadingManager, window_size: int, advance=None):
    """``(step, drain)`` of the cache literature's protocol: one get-with-insert per key;
    ``advance((key,))``, when given, runs before each (an offline policy's clock)."""
    lookup = manager.lookup
    touch = manager.touch
    prepare_store = manager.prepare_store
    complete_store = manager.complete_store
    hit = LookupResult.HIT

    def step(keys):
        hits = fails = 0
        for key in keys:
            single = (key,)
            if advance is not None:
                advance(single)
            if lookup(key) is hit:
                hits += 1
                touch(single)
            else:
                touch(single)
                out = prepare_store(single)
                if out is None:
                    fails += 1
                elif out.keys_to_store:
                    complete_store(out.keys_to_store)
        return hits, fails, fails

    def drain() -> None:
        pass

    return step, drain


def _run(step, drain, requests, block_tokens, progress, streamed, hits_out=None):
    """Drive ``step`` over the requests and count; the counting is the same for every
    protocol. Returns ``(counts, manager ns, total ns)``; ``manager ns`` is only measured
    (per request) when the requests are streamed."""
    now = time.perf_counter_ns
    n_req = refs = hit_blocks = in_tok = hit_tok = fails = failed_blocks = 0
    manager_ns = 0
    t0 = 0
    mask = _PROGRESS_EVERY - 1
    req = None
    start = now()
    try:  # free when nothing raises (3.11+); turns a bare key list into a clear TypeError
        for req in requests:
            keys = req.keys
            length = req.input_length
            n = len(keys)
            if length is None:
                length = n * block_tokens
            elif length < 0:  # a str length raises TypeError here (below)
                raise ValueError(f"request {n_req}: input_length must be >= 0 (tokens), got "
                                 f"{length!r}")
            in_tok += length  # before the manager sees the request
            if streamed:
                t0 = now()
            hits, failed_calls, failed = step(keys)
            if streamed:
                manager_ns += now() - t0
            fails += failed_calls
            failed_blocks += failed
            if hits_out is not None:
                hits_out.append(hits)
            n_req += 1
            refs += n
            if hits:
                hit_blocks += hits
                tok = hits * block_tokens
                hit_tok += tok if tok < length else length
            if progress is not None and not n_req & mask:
                progress(_PROGRESS_EVERY)
    except AttributeError as exc:
        error = not_a_request(exc, req, n_req, ("keys", "input_length"), "replay")
        if error is None:
            raise
        raise error from None
    except TypeError:
        length = getattr(req, "input_length", None)
        # a number (numpy's integers too) was added fine: the error is another's (a key's)
        if length is None or isinstance(length, numbers.Number):
            raise
        raise TypeError(f"request {n_req}: input_length must be an int (tokens) or None, got "
                        f"{type(length).__name__} {length!r:.40}") from None
    t0 = now()
    drain()
    end = now()
    manager_ns += end - t0
    if progress is not None and n_req & mask:
        progress(n_req & mask)
    return (n_req, refs, hit_blocks, in_tok, hit_tok, fails, failed_blocks), manager_ns, end - start


def log_grid(lo: int, hi: int, points: int) -> list[int]:
    """``points`` distinct block counts spaced evenly on a log scale from ``lo`` to ``hi``.

    Fewer come back when the range holds fewer distinct integers.

    Raises:
        ValueError: ``lo < 1``, ``hi < lo`` or ``points < 1``.
    """
    if lo < 1 or hi < lo or points < 1:
        raise ValueError(f"bad grid: lo={lo}, hi={hi}, points={points}")
    if points == 1 or lo == hi:
        return [hi]
    ratio = math.log(hi / lo)
    if hi * ratio <= points - 1:
        # consecutive values are less than 1 apart (the widest step, the last, is
        # hi * (1 - exp(-ratio / (points - 1))) < hi * ratio / (points - 1)), so every size
        # of the range is hit: no loop over the points (--points 10**20 never ended)
        return list(range(lo, hi + 1))
    values = [round(lo * math.exp(ratio * i / (points - 1))) for i in range(points)]
    return sorted(set(values))
