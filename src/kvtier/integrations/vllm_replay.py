"""Replay a request trace through a vLLM 0.33 ``OffloadingManager`` with vLLM's call protocol.

What vLLM's scheduler-side offloading connector calls, per request, in trace order::

    on_new_request(ctx)
    h = leading keys whose lookup(key, ctx) is HIT (stops at the first other answer)
    if h:      prepare_load(keys[:h], ctx)           # pinned while the load is in flight
    if keys[h:]: out = prepare_store(keys[h:], ctx)  # None: store failure
    ... later, when the request leaves the in-flight window (oldest first):
    complete_load(keys[:h], ctx); complete_store(out.keys_to_store, ctx)
    on_request_finished(ctx)

With ``inflight=W`` the last ``W`` requests stay in flight (their loads pinned, stores
pending); ``W=0`` completes each request before the next. :func:`replay_vllm` drives any vLLM
``OffloadingManager`` (vLLM's ``CPUOffloadingManager`` with any policy, or
:class:`~kvtier.integrations.vllm.KVTierOffloadingManager`); :func:`replay_kvtier` drives a
plain :class:`kvtier.OffloadingManager` in request mode, the same calls one to one (an int
context per request), as ``KVTierOffloadingManager`` translates them, so both must count the
same hits and evictions for the same kvtier policy.

Keys: each trace block hash becomes an ``OffloadKey`` (8-byte hash + KV group 0), as vLLM's
keys are bytes; a key named twice in one request is kept once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from kvtier.integrations import require_vllm

require_vllm(__name__)  # names the install command when vLLM is missing

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    make_offload_key,
)

import kvtier
from kvtier.types import LookupResult as KVTierLookupResult

__all__ = ["ProtocolResult", "offload_keys", "replay_kvtier", "replay_vllm"]


@dataclass
class ProtocolResult:
    """Counts and cost of one replay.

    Attributes:
        requests: requests replayed.
        block_refs: keys over all requests.
        hit_blocks: keys served from the tier (the leading HITs of each request).
        stored_blocks: blocks allocated by ``prepare_store``.
        evictions: blocks evicted (``evicted_keys`` over all stores).
        store_failures: ``prepare_store`` calls that returned ``None``.
        elapsed_ns: wall time of the replay loop (manager calls plus the loop itself), in ns.
    """

    requests: int
    block_refs: int
    hit_blocks: int
    stored_blocks: int
    evictions: int
    store_failures: int
    elapsed_ns: int

    @property
    def hit_ratio(self) -> float:
        """hit_blocks / block_refs (0.0 for an empty replay)."""
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0

    @property
    def ns_per_block_ref(self) -> float:
        """Wall time per block reference, in ns."""
        return self.elapsed_ns / self.block_refs if self.block_refs else 0.0

    def counts(self) -> tuple[int, int, int, int]:
        """``(hit_blocks, stored_blocks, evictions, store_failures)``, for comparisons."""
        return (self.hit_blocks, self.stored_blocks, self.evictions, self.store_failures)


def offload_keys(requests: Iterable, group_idx: int = 0) -> list[list[OffloadKey]]:
    """Each request's block hashes (``.keys``, ints >= 0) as vLLM ``OffloadKey`` s, a key
    named twice in one request kept once (vLLM's keys are chained hashes, never repeated)."""
    out = []
    for request in requests:
        keys = [make_offload_key(int(h).to_bytes(8, "big"), group_idx) for h in request.keys]
        out.append(list(dict.fromkeys(keys)))
    return out


def _check_inflight(inflight: int) -> None:
    if isinstance(inflight, bool) or not isinstance(inflight, int) or inflight < 0:
        raise ValueError(f"inflight must be an int >= 0 (requests), got {inflight!r}")


def replay_vllm(
    manager: OffloadingManager, keys_per_request: list[list[OffloadKey]], *, inflight: int = 0
) -> ProtocolResult:
    """Replay ``keys_per_request`` (see :func:`offload_keys`) through a vLLM manager.

    Raises:
        ValueError: ``inflight`` is not an int >= 0.
    """
    _check_inflight(inflight)
    HIT = LookupResult.HIT
    lookup = manager.lookup
    prepare_load = manager.prepare_load
    prepare_store = manager.prepare_store
    complete_load = manager.complete_load
    complete_store = manager.complete_store
    finished = manager.on_request_finished
    window: deque = deque()
    refs = hits = stored = evicted = failures = 0

    def complete(ctx, loaded, to_store) -> None:
        if loaded:
            complete_load(loaded, ctx)
        if to_store:
            complete_store(to_store, ctx)
        finished(ctx)

    t0 = time.perf_counter_ns()
    for i, keys in enumerate(keys_per_request):
        ctx = ReqContext(str(i))
        manager.on_new_request(ctx)
        h = 0
        for key in keys:
            if lookup(key, ctx) is not HIT:
                break
            h += 1
        loaded = keys[:h]
        if h:
            prepare_load(loaded, ctx)
        to_store: list = []
        if h < len(keys):
            out = prepare_store(keys[h:], ctx)
            if out is None:
                failures += 1
            else:
                to_store = out.keys_to_store
                stored += len(to_store)
                evicted += len(out.evicted_keys)
        refs += len(keys)
        hits += h
        window.append((ctx, loaded, to_store))
        if len(window) > inflight:
            complete(*window.popleft())
    while window:
        complete(*window.popleft())
    elapsed = time.perf_counter_ns() - t0
    return ProtocolResult(
        len(keys_per_request), refs, hits, stored, evicted, failures, elapsed
    )


def replay_kvtier(
    manager: kvtier.OffloadingManager,
    keys_per_request: list[list[OffloadKey]],
    *,
    inflight: int = 0,
) -> ProtocolResult:
    """The same protocol on a plain :class:`kvtier.OffloadingManager` in request mode
    (docs/manager.md), call for call: ``on_new_request(i)``, ``lookup`` per key,
    ``prepare_load`` / ``prepare_store`` with context ``i``, then ``complete_load``,
    ``complete_store`` and ``on_request_finished(i)`` when the request leaves the window. No
    admission, no ``touch``.

    Raises:
        ValueError: ``inflight`` is not an int >= 0.
    """
    _check_inflight(inflight)
    HIT = KVTierLookupResult.HIT
    m = manager
    lookup = m.lookup
    window: deque = deque()
    refs = hits = stored = evicted = failures = 0

    def complete(ctx, loaded, to_store) -> None:
        if loaded:
            m.complete_load(loaded, ctx)
        if to_store:
            m.complete_store(to_store, ctx, success=True)
        m.on_request_finished(ctx)

    t0 = time.perf_counter_ns()
    for ctx, keys in enumerate(keys_per_request):
        m.on_new_request(ctx)
        h = 0
        for key in keys:
            if lookup(key, ctx) is not HIT:
                break
            h += 1
        loaded = keys[:h]
        if h:
            m.prepare_load(loaded, ctx)
        to_store: list = []
        if h < len(keys):
            out = m.prepare_store(keys[h:], ctx)
            if out is None:
                failures += 1
            else:
                to_store = out.keys_to_store
                stored += len(to_store)
                evicted += len(out.evicted_keys)
        refs += len(keys)
        hits += h
        window.append((ctx, loaded, to_store))
        if len(window) > inflight:
            complete(*window.popleft())
    while window:
        complete(*window.popleft())
    elapsed = time.perf_counter_ns() - t0
    return ProtocolResult(
        len(keys_per_request), refs, hits, stored, evicted, failures, elapsed
    )
