"""What a hit is worth: bytes moved, prefill time saved and time to first token.

A replay (:func:`kvtier.replay.replay`) counts hit blocks per request; this module turns them
into deployment figures from four numbers describing the deployment (:class:`CostModel`):
KV bytes per token ``b`` (or a built-in model profile), prefill throughput ``P`` (tokens/s per
prefill instance), tier read bandwidth ``R`` (bytes/s, given in GB/s = 1e9 bytes/s) and the
number of prefill instances ``c``. Every formula, with its source, is in docs/replay.md
(*Cost model*); in short, per request ``r`` with ``L_r`` input tokens and ``H_r`` hit tokens::

    b          = 2 · layers · kv_heads · head_dim · dtype_bytes       (K and V, every layer)
    T0_r       = L_r / P                                               (prefill, no tier)
    T1_r       = (L_r − H_r) / P + H_r · b / R                         (suffix + load)
    saved      = Σ (T0_r − T1_r) = Σ H_r · (1/P − b/R)
    read bytes = Σ H_r · b;  written bytes = stored blocks · block_tokens · b
    TTFT_r     = finish_r − arrival_r, with FIFO over c instances:
                 start_r = max(arrival_r, earliest free instance), finish_r = start_r + T_r

Without timestamps there is no queue: ``TTFT_r = T_r``. Loads are not overlapped with
compute (conservative); decode time is not modelled. Not thread-safe (pure functions and
frozen dataclasses: safe to share read-only).
"""

from __future__ import annotations

import heapq
import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvtier.checks import _as_int, check_positive_int, counted

__all__ = ["AUTO_UTILIZATION", "DEFAULTS", "PROFILES", "CostModel", "ModelProfile", "evaluate", "input_lengths"]


@dataclass(frozen=True)
class ModelProfile:
    """A model's KV-cache shape, from its public ``config.json``.

    Attributes:
        name: profile name (``--model``).
        layers: ``num_hidden_layers``.
        kv_heads: ``num_key_value_heads``.
        head_dim: ``head_dim``, or ``hidden_size / num_attention_heads``.
        dtype_bytes: bytes per element of the KV cache (2 for bf16/fp16).
        source: where the numbers come from.
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    source: str

    @property
    def kv_bytes_per_token(self) -> int:
        """``2 · layers · kv_heads · head_dim · dtype_bytes`` (K and V of every layer)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


_HF = "https://huggingface.co/{}/blob/main/config.json"
PROFILES: dict[str, ModelProfile] = {p.name: p for p in (
    # num_hidden_layers 32, num_key_value_heads 8, hidden_size 4096 / 32 heads, bfloat16
    ModelProfile("llama-3.1-8b", 32, 8, 128, 2, _HF.format("meta-llama/Llama-3.1-8B")),
    # num_hidden_layers 80, num_key_value_heads 8, hidden_size 8192 / 64 heads, bfloat16
    ModelProfile("llama-3.1-70b", 80, 8, 128, 2, _HF.format("meta-llama/Llama-3.1-70B")),
    # num_hidden_layers 28, num_key_value_heads 4, hidden_size 3584 / 28 heads, bfloat16
    ModelProfile("qwen2.5-7b", 28, 4, 128, 2, _HF.format("Qwen/Qwen2.5-7B-Instruct")),
    # num_hidden_layers 32, num_key_value_heads 8, hidden_size 4096 / 32 heads, bfloat16
    ModelProfile("mistral-7b", 32, 8, 128, 2, _HF.format("mistralai/Mistral-7B-v0.1")),
)}
"""Built-in profiles (``--model``); each cites its config."""

DEFAULTS = {
    "model": "llama-3.1-8b",
    "prefill_tokens_per_s": 10_000.0,
    "read_gb_per_s": 25.0,
    "instances": None,
}
"""Defaults, printed with every result. Assumptions, not measurements: set them from your
engine's own benchmark (prefill tokens/s of one instance at your prompt lengths) and your
tier's measured read bandwidth (host -> device copy, disk or network). ``instances`` None
is *auto*: the fewest prefill instances that keep the no-tier load at or below
:data:`AUTO_UTILIZATION` of their time over the trace's span (1 without timestamps; 1 with a
``UserWarning`` when every request has the same timestamp: a span of 0 gives no rate)."""

AUTO_UTILIZATION = 0.8
"""Target no-tier utilization when the number of instances is chosen automatically."""


MAX_VALUES = {
    "kv_bytes_per_token": (1e9, "bytes/token; the largest models today use about 1e6"),
    "prefill_tokens_per_s": (1e9, "tokens/s of one instance; GPUs today prefill 1e4 to 1e5"),
    "read_gb_per_s": (1e6, "GB/s; GPU memory today reads about 5e3"),
}
"""Upper bounds of :class:`CostModel`'s sizes and rates, with their unit and why: a thousand
times and more what any hardware offers today, so no real deployment is refused, while an
absurd value (``--prefill-tps 1e308``) is refused by name instead of printing figures of
300 digits."""


def _finite(value: numbers.Real) -> bool:
    """``value`` is finite as a float (an int too large for a float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class CostModel:
    """The deployment the figures are computed for.

    Args:
        kv_bytes_per_token: bytes of KV cache per token (``b``), > 0.
        prefill_tokens_per_s: prefill throughput of one instance (``P``), tokens/s, > 0.
        read_gb_per_s: tier read bandwidth (``R``), GB/s (1e9 bytes/s), > 0.
        instances: prefill instances serving the trace's arrivals (``c``), >= 1, or
            ``None`` (auto, see :data:`DEFAULTS`).
        block_tokens: tokens per block, >= 1.
        model: the profile name ``kv_bytes_per_token`` came from, or ``None``.

    numpy numbers are taken and kept as plain ``int`` / ``float`` (bools are refused).

    Raises:
        ValueError: a value out of range (the message names it), including a size or rate
            above :data:`MAX_VALUES`.
    """

    kv_bytes_per_token: int
    prefill_tokens_per_s: float = DEFAULTS["prefill_tokens_per_s"]
    read_gb_per_s: float = DEFAULTS["read_gb_per_s"]
    instances: int | None = DEFAULTS["instances"]
    block_tokens: int = 512
    model: str | None = None

    def __post_init__(self) -> None:
        # numpy numbers are taken (as by OffloadingManager) and kept as plain int / float
        # an int too large for a float (10**400) is refused too: the formulas are float
        # arithmetic (before: OverflowError tracebacks, found by a newcomer session)
        for name in ("kv_bytes_per_token", "prefill_tokens_per_s", "read_gb_per_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not _finite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
            limit, why = MAX_VALUES[name]
            if value > limit:
                raise ValueError(f"{name} must be at most {limit:g} ({why}), got {value!r}")
            plain = int(value) if isinstance(value, numbers.Integral) else float(value)
            object.__setattr__(self, name, plain)
        for name in ("instances", "block_tokens"):
            value = getattr(self, name)
            if value is None and name == "instances":
                continue
            number = _as_int(value)
            if number is None or number < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
            if not _finite(number):
                raise ValueError(f"{name} must be an int a float can hold (below 1.8e308), "
                                 f"got {value!r}")
            object.__setattr__(self, name, number)

    @classmethod
    def build(cls, *, model: str | None = None, kv_bytes_per_token: int | None = None,
              prefill_tokens_per_s: float | None = None, read_gb_per_s: float | None = None,
              instances: int | None = None, block_tokens: int = 512) -> CostModel:
        """A model from options, defaults (:data:`DEFAULTS`) for those left ``None``.

        ``kv_bytes_per_token`` and ``model`` exclude each other; with neither, the default
        profile is used.

        Raises:
            ValueError: both ``model`` and ``kv_bytes_per_token``, an unknown profile (the
                message lists the known ones), or a value out of range.
        """
        if model is not None and kv_bytes_per_token is not None:
            raise ValueError("give a model profile or kv_bytes_per_token, not both")
        if kv_bytes_per_token is None:
            model = DEFAULTS["model"] if model is None else model
            profile = PROFILES.get(model)
            if profile is None:
                raise ValueError(f"unknown model profile {model!r}; known: "
                                 f"{', '.join(sorted(PROFILES))}")
            kv_bytes_per_token = profile.kv_bytes_per_token
        return cls(
            kv_bytes_per_token=kv_bytes_per_token,
            prefill_tokens_per_s=(DEFAULTS["prefill_tokens_per_s"] if prefill_tokens_per_s
                                  is None else prefill_tokens_per_s),
            read_gb_per_s=DEFAULTS["read_gb_per_s"] if read_gb_per_s is None else read_gb_per_s,
            instances=DEFAULTS["instances"] if instances is None else instances,
            block_tokens=block_tokens,
            model=model,
        )

    @property
    def load_s_per_token(self) -> float:
        """``b / R``: seconds to read one token's KV from the tier."""
        return self.kv_bytes_per_token / (self.read_gb_per_s * 1e9)

    @property
    def prefill_s_per_token(self) -> float:
        """``1 / P``: seconds to prefill one token."""
        return 1.0 / self.prefill_tokens_per_s

    def to_dict(self) -> dict:
        """The parameters, JSON-ready (printed with every result)."""
        out = asdict(self)
        out["source"] = PROFILES[self.model].source if self.model in PROFILES else None
        return out

    def _instances_text(self) -> str:
        if self.instances is None:
            return (f"instances auto (fewest keeping no-tier utilization <= "
                    f"{AUTO_UTILIZATION:g})")
        return counted(self.instances, "instance")

    def describe(self) -> str:
        """One line naming every parameter, for the terminal."""
        what = f"model {self.model} ({self.kv_bytes_per_token:,} KV bytes/token)" \
            if self.model else f"{self.kv_bytes_per_token:,} KV bytes/token"
        rate = self.prefill_tokens_per_s  # not rounded to 0 below 100 tokens/s (--prefill-tps)
        rate_text = f"{rate:,.0f}" if rate >= 100 else f"{rate:g}"
        return (f"cost model: {what}, prefill {rate_text} tokens/s per "
                f"instance, {self._instances_text()}, "
                f"tier read {self.read_gb_per_s:g} GB/s, {self.block_tokens} tokens/block; "
                "loads not overlapped with compute, FIFO queue over the trace's arrival "
                "times (none without timestamps)")


def input_lengths(requests: Sequence, block_tokens: int = 512) -> list[int]:
    """Per request, ``input_length``, or ``len(keys) · block_tokens`` where it is ``None``
    (the replay's ``input_tokens`` rule).

    Raises:
        ValueError: ``block_tokens`` is not an int >= 1.
        TypeError: a request has no ``input_length`` / ``keys`` (e.g. a bare list of keys:
            wrap it in :class:`kvtier.trace.Request`); it raised ``AttributeError`` before.
    """
    block_tokens = check_positive_int("block_tokens", block_tokens, "tokens")
    out = []
    for i, r in enumerate(requests):
        try:
            length = r.input_length
            out.append(length if length is not None else len(r.keys) * block_tokens)
        except AttributeError:
            raise TypeError(f"request {i} ({r!r:.40}) has no .input_length and .keys: "
                            "input_lengths() takes Request objects (kvtier.trace.Request(keys, "
                            "input_length, output_length, timestamp))") from None
    return out


def _percentiles(values: list[float]) -> dict:
    values = sorted(values)
    n = len(values)

    def rank(p: float) -> float | None:
        return values[max(0, math.ceil(p / 100.0 * n) - 1)] if n else None

    return {"median": rank(50), "p99": rank(99),
            "mean": math.fsum(values) / n if n else None}


def _warn_out_of_order(timestamps_ms: Sequence[float]) -> None:
    """Warn when arrivals go backwards: the FIFO queue takes requests in trace order, so a
    request stamped before an earlier one waits behind it (utilization and auto instances
    use the arrivals' range)."""
    latest, latest_i = -math.inf, 0
    first = None
    count = 0
    for i, t in enumerate(timestamps_ms):
        if t < latest:
            count += 1
            if first is None:
                first = (i + 1, t, latest, latest_i)
        else:
            latest, latest_i = t, i + 1
    if first is not None:
        i, t, before, j = first
        warnings.warn(
            f"cost model: request {i} arrives at {t:g} ms, before request {j} ({before:g} ms); "
            f"{count:,} of {len(timestamps_ms):,} requests {'is' if count == 1 else 'are'} out "
            "of arrival order and the "
            "FIFO queue serves them in trace order (sort the trace by timestamp)",
            stacklevel=3)


def _ttft(service: Sequence[float], arrivals: Sequence[float] | None, instances: int):
    """Per-request TTFT (s): FIFO in trace order over ``instances`` identical servers, each
    request to the one free earliest (Lindley's recursion for c servers); no queue without
    arrivals. Returns ``(ttft list, busy time / (instances · span))``."""
    if arrivals is None:
        return list(service), None
    # a heap of the times each instance becomes free; no more instances than requests can
    # ever be busy (10**20 instances made a traceback, 10**9 an 8 GB list). Free since
    # ever: from 0.0, arrivals before time 0 waited until 0 (found by a newcomer session)
    free = [-math.inf] * min(instances, len(arrivals))
    out = []
    first = arrivals[0] if arrivals else 0.0
    last_finish = first
    for a, s in zip(arrivals, service, strict=True):
        start = free[0] if free[0] > a else a
        finish = start + s
        heapq.heapreplace(free, finish)
        out.append(finish - a)
        if finish > last_finish:
            last_finish = finish
    span = (max(arrivals) - min(arrivals)) if arrivals else 0.0
    utilization = (math.fsum(service) / (instances * span)) if span > 0 else None
    return out, utilization


def _checked_counts(i: int, length, hits) -> tuple[int, int]:
    """Request ``i``'s input length and hit count as plain ints, or ValueError naming it."""
    for name, value in (("input_lengths", length), ("hit_blocks", hits)):
        number = _as_int(value)
        if number is None or number < 0:
            raise ValueError(f"{name}[{i}] is {value!r}: lengths (tokens) and hit counts "
                             "(blocks) are ints >= 0")
    return _as_int(length), _as_int(hits)  # type: ignore[return-value]


def evaluate(model: CostModel, input_lengths: Sequence[int | None],
             hit_blocks: Sequence[int], timestamps_ms: Sequence[float | None] | None,
             stored_blocks: int) -> dict:
    """Deployment figures of one replay.

    Args:
        model: the deployment.
        input_lengths: per request, its input tokens (ints; :func:`input_lengths` gives
            them from requests, ``blocks · block_tokens`` where a request has none, as the
            replay counts them).
        hit_blocks: per request, hit blocks (the replay's ``hits_out``).
        timestamps_ms: per request, arrival time in ms, or ``None`` for the whole trace
            (no queueing). A trace where some requests lack a timestamp is treated as having
            none, with a ``UserWarning`` giving the count and the first such request.
        stored_blocks: blocks written to the tier (the replay's ``stored_blocks``).

    Returns:
        A JSON-ready dict: ``read_bytes``, ``write_bytes``, ``bytes_moved``,
        ``prefill_s_no_tier``, ``prefill_s_with_tier``, ``load_s``, ``prefill_s_saved``,
        ``ttft_no_tier_s`` / ``ttft_with_tier_s`` (``median``, ``p99``, ``mean``),
        ``queue`` (``"fifo"`` or ``"none"``), ``instances`` (used; ``instances_auto``
        when chosen automatically), ``utilization_no_tier`` /
        ``utilization_with_tier`` (offered prefill work / (instances · trace span); > 1 means
        the queue grows without bound and TTFT reflects overload), ``hit_tokens``,
        ``input_tokens``.

    Raises:
        ValueError: ``input_lengths``, ``hit_blocks`` (and ``timestamps_ms``) differ in
            length, an input length is ``None``, an input length, hit count or
            ``stored_blocks`` is negative or not an int (numpy integers are taken; floats and
            bools are not), an input length or a timestamp is an int too large for a float
            (309 digits or more), or a timestamp is not a finite number (a bool is not; the
            message names the list and the position). Timestamps may be negative: the
            queue only compares them.
        TypeError: ``model`` is not a :class:`CostModel`.

    Warns:
        UserWarning: some but not all requests have a timestamp; timestamps go backwards;
            instances are automatic and two or more requests all share one timestamp (the
            automatic count is then 1: set ``instances``).
    """
    if not isinstance(model, CostModel):
        raise TypeError(f"model must be a CostModel (e.g. CostModel.build()), got "
                        f"{type(model).__name__}")
    n = len(hit_blocks)
    if len(input_lengths) != n or (timestamps_ms is not None and len(timestamps_ms) != n):
        raise ValueError(f"per-request inputs differ in length: {len(input_lengths)} input "
                         f"lengths, {n} hit counts"
                         + (f", {len(timestamps_ms)} timestamps" if timestamps_ms is not None
                            else ""))
    stored = _as_int(stored_blocks)
    if stored is None or stored < 0:
        raise ValueError(f"stored_blocks must be an int >= 0 (blocks), got {stored_blocks!r}")
    b = model.kv_bytes_per_token
    per_tok = model.prefill_s_per_token
    load_tok = model.load_s_per_token
    bt = model.block_tokens
    t0: list[float] = []
    t1: list[float] = []
    hit_tokens = input_tokens = 0
    for length, hits in zip(input_lengths, hit_blocks, strict=True):  # checked above
        if length is None:
            raise ValueError("input_lengths has None: pass blocks * block_tokens for requests "
                             "without a length")
        if type(length) is not int or type(hits) is not int or length < 0 or hits < 0:
            length, hits = _checked_counts(len(t0), length, hits)
        h = hits * bt
        if h > length:
            h = length
        hit_tokens += h
        input_tokens += length
        try:
            t0.append(length * per_tok)
            t1.append((length - h) * per_tok + h * load_tok)
        except OverflowError:  # an int of 309 digits or more (was a traceback)
            raise ValueError(f"input_lengths[{len(t0)}] is {length!r:.40}...: more tokens "
                             "than a float can hold (the times are float seconds)") from None
    arrivals = None
    unstamped = 0 if timestamps_ms is None else sum(t is None for t in timestamps_ms)
    if 0 < unstamped < n:  # the caption says "no timestamps": say how many had one
        first = next(i for i, t in enumerate(timestamps_ms) if t is None)  # type: ignore[arg-type]
        warnings.warn(
            f"cost model: {unstamped:,} of {n:,} requests {'has' if unstamped == 1 else 'have'} "
            "no timestamp (first: request "
            f"{first + 1}); no queue is modeled (TTFT = each request's own prefill and load "
            "time)", stacklevel=2)
    if timestamps_ms is not None and n and not unstamped:
        for i, t in enumerate(timestamps_ms):  # checked before the ms -> s division
            if (isinstance(t, bool) or type(t).__name__ == "bool_"
                    or not isinstance(t, numbers.Real) or not _finite(t)):
                # (_finite: an int too large for a float is not; math.isfinite raised
                # OverflowError for it)
                raise ValueError(f"timestamps_ms[{i}] is {t!r:.40}: arrival times are finite "
                                 "numbers of ms (a float holds them)")
        arrivals = [t / 1000.0 for t in timestamps_ms]  # type: ignore[operator]
        _warn_out_of_order(timestamps_ms)
    instances = model.instances
    if instances is None:
        span = (max(arrivals) - min(arrivals)) if arrivals else 0.0
        instances = (max(1, math.ceil(math.fsum(t0) / (AUTO_UTILIZATION * span)))
                     if span > 0 else 1)
        if arrivals is not None and n > 1 and span == 0:
            # a burst has no arrival rate to size a fleet by: 1 instance, said (it was
            # silent: TTFT p99 was the whole burst's queue, utilization shown as "-")
            warnings.warn(
                f"cost model: all {n:,} requests arrive at the same time "
                f"({arrivals[0] * 1000.0:g} ms), so the trace gives no arrival rate to size "
                "the prefill instances by: the automatic count is 1, TTFT includes the "
                "wait behind the whole burst and utilization is undefined; set the "
                "instance count (--instances, or CostModel.build(instances=...))",
                stacklevel=2)
    ttft0, util0 = _ttft(t0, arrivals, instances)
    ttft1, util1 = _ttft(t1, arrivals, instances)
    read = hit_tokens * b
    write = stored * bt * b
    no_tier = math.fsum(t0)
    with_tier = math.fsum(t1)
    return {
        "input_tokens": input_tokens,
        "hit_tokens": hit_tokens,
        "read_bytes": read,
        "write_bytes": write,
        "bytes_moved": read + write,
        "prefill_s_no_tier": no_tier,
        "prefill_s_with_tier": with_tier,
        "load_s": hit_tokens * load_tok,
        "prefill_s_saved": no_tier - with_tier,
        "queue": "fifo" if arrivals is not None else "none",
        "instances": instances,
        "instances_auto": model.instances is None,
        "utilization_no_tier": util0,
        "utilization_with_tier": util1,
        "ttft_no_tier_s": _percentiles(ttft0),
        "ttft_with_tier_s": _percentiles(ttft1),
    }
