"""Synthetic prefix-sharing traces: multi-turn sessions behind shared system prompts.

A reusable generator of :class:`~kvtier.trace.Request` lists with the properties that decide
how a KV offloading tier behaves, each set independently, so a policy can be checked on more
than the one real trace (the project's rule: never tune to the Mooncake trace alone).

Model (one request per *turn*; keys are ints, one per block, named like prefix hashes: equal
keys mean equal whole prefixes, as in Mooncake's ``hash_ids``):

* ``system_prompts`` distinct system prompts, each ``system_blocks`` blocks long; a session
  starts with one of them, chosen with Zipf-like popularity (weight ``1 / (rank + 1)``), so
  heads are shared by many sessions.
* A session has ``turns`` turns (uniform in the range). Turn *t* repeats the session's context
  so far (system prompt + every earlier turn's full blocks) and adds ``turn_blocks`` new full
  blocks (uniform in the range), which later turns of the session reuse.
* With probability ``dead_tail`` a turn also ends in a *partial* block: a key that is new each
  turn and never named again (the next turn fills the block, so its hash changes; e.g. the
  Mooncake conversation trace ends 12,009 of its 12,031 requests so). Otherwise the turn's
  last key is a full block, the parent of the next turn's blocks (a full-block engine, vLLM).
* A share ``one_shot`` of the sessions are single requests whose own blocks (after the system
  prompt) are never named again: one-hit wonders. Their length is ``one_shot_blocks``.
* Reuse distance: turns of a session are separated by a gap on a continuous clock that runs
  at about one request of the whole trace per unit: exponential (``random.expovariate``) with
  mean ``short_gap`` (an agent or user answering quickly), or, with probability
  ``long_share``, with mean ``long_gap`` (a user coming back later). Session starts are spread
  uniformly over the trace, and all sessions' turns are merged in time order, so the gap
  counted in requests between two turns is about that exponential draw (the number of other
  turns that fall in between).

Everything is drawn from ``random.Random(seed)``: the same arguments give the same trace, on
any machine and Python version with the same ``random`` algorithm (Mersenne Twister).

Cost: O(total block references) time and memory.
"""

from __future__ import annotations

import heapq
import numbers
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.checks import _as_int
from kvtier.trace import Request

__all__ = ["SyntheticSpec", "generate", "trace_profile"]


def _check_range(name: str, value: object, low: int) -> tuple[int, int]:
    """``value`` as a ``(low, high)`` tuple of plain ints (any sequence of two ints: a tuple,
    a list, a 1-d numpy array; numpy integers included), ``low <= value[0] <= value[1]``."""
    pair = None
    if ((isinstance(value, Sequence) and not isinstance(value, (str, bytes)))
            or (type(value).__name__ == "ndarray" and getattr(value, "ndim", 0) == 1)):
        pair = tuple(_as_int(v) for v in value) if len(value) == 2 else None  # type: ignore
    if pair is None or None in pair or pair[0] < low or pair[1] < pair[0]:
        raise ValueError(f"{name} must be a (low, high) pair (a sequence of two ints) with "
                         f"{low} <= low <= high, got {value!r}")
    return pair  # type: ignore[return-value]


def _check_share(name: str, value: object) -> float:
    """``value`` as a plain float in [0, 1] (an int or float, numpy's included; not a bool)."""
    if (isinstance(value, bool) or type(value).__name__ == "bool_"
            or not isinstance(value, numbers.Real) or not 0 <= value <= 1):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


_MAX_GAP = 10**300  # a mean gap, in requests, that a float holds with room to spare


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of :func:`generate` (see the module docstring for the model).

    Attributes:
        sessions: number of sessions (>= 1), multi-turn and one-shot together.
        turns: (min, max) turns of a multi-turn session (>= 1). This and the other
            (min, max) fields take any sequence of two ints (kept as a tuple).
        system_prompts: distinct shared system prompts (>= 1).
        system_blocks: (min, max) blocks of a system prompt (>= 0).
        turn_blocks: (min, max) new full blocks per turn (>= 1).
        dead_tail: probability in [0, 1] that a turn ends in a partial (dead) block.
        one_shot: share in [0, 1] of sessions that are one request of unique blocks.
        one_shot_blocks: (min, max) own blocks of a one-shot request (>= 1).
        short_gap: mean gap between a session's turns, in requests (1 to 1e300).
        long_gap: mean gap of a long pause, in requests (1 to 1e300).
        long_share: probability in [0, 1] that a gap is a long pause.
        seed: the random seed.

    Raises:
        ValueError: a field breaks its rule above (the message names it).
    """

    sessions: int = 2000
    turns: tuple[int, int] = (1, 8)
    system_prompts: int = 4
    system_blocks: tuple[int, int] = (1, 4)
    turn_blocks: tuple[int, int] = (1, 6)
    dead_tail: float = 1.0
    one_shot: float = 0.3
    one_shot_blocks: tuple[int, int] = (2, 12)
    short_gap: int = 20
    long_gap: int = 2000
    long_share: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        # every field checked first, then kept as plain Python numbers (numpy integers and
        # floats are accepted, as the manager accepts them)
        fixed: dict[str, object] = {}
        for name in ("sessions", "system_prompts", "short_gap", "long_gap"):
            value = getattr(self, name)
            number = _as_int(value)
            if number is None or number < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
            if name.endswith("_gap") and number > _MAX_GAP:
                # the gaps are drawn as floats: 10**400 stopped generate() half-way with
                # "OverflowError: int too large to convert to float"
                raise ValueError(f"{name} must be an int from 1 to {_MAX_GAP:.0e} "
                                 f"(requests), got {value!r}")
            fixed[name] = number
        fixed["turns"] = _check_range("turns", self.turns, 1)
        fixed["system_blocks"] = _check_range("system_blocks", self.system_blocks, 0)
        fixed["turn_blocks"] = _check_range("turn_blocks", self.turn_blocks, 1)
        fixed["one_shot_blocks"] = _check_range("one_shot_blocks", self.one_shot_blocks, 1)
        for name in ("dead_tail", "one_shot", "long_share"):
            fixed[name] = _check_share(name, getattr(self, name))
        seed = _as_int(self.seed)
        if seed is None:
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        fixed["seed"] = seed
        for name, value in fixed.items():
            object.__setattr__(self, name, value)  # frozen: set once, here


def generate(spec: SyntheticSpec | None = None, *, block_tokens: int = 512,
             **fields: object) -> list[Request]:
    """Generate a synthetic trace.

    Args:
        spec: the parameters; ``None`` for the defaults. Keyword ``fields`` override single
            fields (``generate(dead_tail=0.0, seed=3)``).
        block_tokens: tokens per block, for ``input_length`` (a partial tail counts half a
            block).

    Returns:
        The requests in time order; ``timestamp`` is the request's index (ms), and
        ``output_length`` is ``None``.

    Raises:
        ValueError: a bad field (see :class:`SyntheticSpec`), an unknown field name, or
            ``block_tokens`` < 2. TypeError: ``spec`` is neither a SyntheticSpec nor None.
    """
    if spec is None:
        spec = SyntheticSpec()
    elif not isinstance(spec, SyntheticSpec):
        example = (", ".join(f"{k}={v!r}" for k, v in spec.items()) if isinstance(spec, dict)
                   else "sessions=2000")
        raise TypeError(f"spec must be a SyntheticSpec or None, got {type(spec).__name__} "
                        f"(pass fields as keywords: generate({example}))")
    if fields:
        unknown = set(fields) - set(SyntheticSpec.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown SyntheticSpec field(s): {', '.join(sorted(unknown))}")
        spec = SyntheticSpec(**{**spec.__dict__, **fields})  # type: ignore[arg-type]
    tokens = _as_int(block_tokens)
    if tokens is None or tokens < 2:
        raise ValueError(f"block_tokens must be an int >= 2 (tokens), got {block_tokens!r}")
    block_tokens = tokens
    rng = random.Random(spec.seed)
    next_key = 0

    def new_keys(n: int) -> list[int]:
        nonlocal next_key
        out = list(range(next_key, next_key + n))
        next_key += n
        return out

    prompts = [new_keys(rng.randint(*spec.system_blocks)) for _ in range(spec.system_prompts)]
    weights = [1.0 / (rank + 1) for rank in range(spec.system_prompts)]

    def gap() -> float:
        mean = spec.long_gap if rng.random() < spec.long_share else spec.short_gap
        return rng.expovariate(1.0 / mean)

    # every session's turns with their times; the trace spans about one request per time unit
    events: list[tuple[float, int, list[int], bool]] = []
    seq = 0
    mean_turns = (spec.turns[0] + spec.turns[1]) / 2
    span = spec.sessions * (spec.one_shot + (1 - spec.one_shot) * mean_turns)
    for _ in range(spec.sessions):
        head = rng.choices(prompts, weights)[0]
        t = rng.uniform(0, span)
        if rng.random() < spec.one_shot:
            keys = head + new_keys(rng.randint(*spec.one_shot_blocks))
            events.append((t, seq, keys, False))
            seq += 1
            continue
        context = list(head)
        for _turn in range(rng.randint(*spec.turns)):
            context = context + new_keys(rng.randint(*spec.turn_blocks))
            partial = rng.random() < spec.dead_tail
            keys = context + new_keys(1) if partial else context
            events.append((t, seq, keys, partial))
            seq += 1
            t += gap()
    heapq.heapify(events)
    out = []
    while events:
        _, _, keys, partial = heapq.heappop(events)
        tokens = block_tokens * len(keys) - (block_tokens // 2 if partial else 0)
        out.append(Request(keys, tokens, None, float(len(out))))
    return out


def trace_profile(requests: list[Request]) -> dict:
    """Properties of a trace that matter to prefix-aware eviction.

    Returns:
        ``requests``, ``block_refs``, ``distinct`` (blocks); ``one_hit`` (share of distinct
        blocks named by one request only); ``leaf_reuse`` and ``inner_reuse``: of the requests
        followed by a later one, the share whose last key (the leaf), resp. whose
        second-to-last key, is named again by a later request (the quantities the prefix
        wrapper's leaf estimator compares, see :mod:`kvtier.policies.leaf_reuse`).

    ``requests`` is read twice: an iterator (a generator) is taken into a list first (its
    second pass was empty, so ``leaf_reuse`` and ``inner_reuse`` came back 0.0).

    Raises:
        TypeError: a request has no ``.keys`` (e.g. a bare list of keys: wrap it in
            :class:`kvtier.trace.Request`); it raised ``AttributeError`` before.
    """
    if not isinstance(requests, (list, tuple)):
        requests = list(requests)
    for i, req in enumerate(requests):
        if not hasattr(req, "keys") or isinstance(req, dict):
            raise TypeError(f"request {i} ({req!r:.40}) has no .keys: trace_profile() takes "
                            "Request objects (kvtier.trace.Request(keys, input_length, "
                            "output_length, timestamp))")
    counts: Counter = Counter()
    for req in requests:
        counts.update(set(req.keys))
    later: Counter = Counter(counts)
    leaf_re = inner_re = pairs = 0
    for req in requests:
        later.subtract(set(req.keys))
        if len(req.keys) >= 2:
            pairs += 1
            leaf_re += later[req.keys[-1]] > 0
            inner_re += later[req.keys[-2]] > 0
    return {
        "requests": len(requests),
        "block_refs": sum(len(r.keys) for r in requests),
        "distinct": len(counts),
        "one_hit": sum(1 for c in counts.values() if c == 1) / max(1, len(counts)),
        "leaf_reuse": leaf_re / max(1, pairs),
        "inner_reuse": inner_re / max(1, pairs),
    }
