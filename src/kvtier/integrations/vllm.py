"""kvtier inside vLLM 0.33's offloading connector (``OffloadingConnector``).

Two drop-ins, each chosen by one JSON string (``--kv-transfer-config``), no vLLM patch:

1. **kvtier's policies in vLLM's own manager.** One vLLM ``CachePolicy`` class per registered
   kvtier policy (:data:`POLICY_CLASSES`: ``KVTierLRU``, ``KVTierARC``, ``KVTierS3FIFO``,
   ``KVTierSieve``, ``KVTierLFU``, ``KVTierPrefixLRU``, ``KVTierPrefixARC``, ...), loaded by
   vLLM's ``CachePolicyFactory`` from ``kv_connector_extra_config = {"eviction_policy":
   "KVTierARC", "cache_policy_module_path": "kvtier.integrations.vllm"}``. vLLM's
   ``CPUOffloadingManager`` keeps its ref counts, chunk pool and events; the kvtier policy
   orders blocks and picks victims.
2. **kvtier's whole manager.** :class:`KVTierOffloadingSpec` (a ``CPUOffloadingSpec``
   subclass, so the worker and the CPU buffer are vLLM's own and bytes move exactly as with the
   built-in spec), loaded by vLLM's ``OffloadingSpecFactory`` from ``{"spec_name":
   "KVTierOffloadingSpec", "spec_module_path": "kvtier.integrations.vllm", "kvtier_policy":
   "arc", ...}``. Its ``get_manager()`` returns :class:`KVTierOffloadingManager`, vLLM's
   ``OffloadingManager`` ABC implemented on :class:`kvtier.OffloadingManager` (public API only).

Recency and frequency under vLLM's call protocol (docs/vllm.md has the details). vLLM 0.33's
scheduler never calls ``touch``: a request's use of the cache is reported once, when it
finishes (``on_request_finished``), with the keys it *reused* (loaded, or found ready when it
offered them for storing) apart from the keys it only *inserted*. kvtier has the same model
(its manager's request mode and the policy hook ``on_request_finished(keys, inserted,
reused)``, docs/manager.md), so both drop-ins pass it through:

* a store miss (a key offered for storing that is not in the tier) is one ``touch`` before the
  store, once per request: ARC-style policies learn ghost hits from it (vLLM's
  ``on_store_miss``);
* at request end the policy's ``on_request_finished`` gets the request's keys head first and
  the inserted-only / reused split: kvtier's ARC promotes reused keys only and refreshes
  inserted ones in place, as vLLM's ARC; other policies apply one use of every key (vLLM's
  default, and vLLM's LRU).

:class:`KVTierOffloadingManager` drives kvtier's manager in request mode (``on_new_request``
opens the request under a private token, ``prepare_load`` / ``prepare_store`` are recorded,
``on_request_finished`` applies the use). One deliberate difference from vLLM's manager: a
``prepare_store`` that fails (``None``) changes no policy state, so its store misses teach
ghost lists nothing (vLLM's ``on_store_miss`` runs before its eviction can fail). A
``prepare_load`` / ``prepare_store`` under a context ``on_new_request`` never opened opens the
request itself (as vLLM's manager), but only once its keys are checked: a call that raises
(a key not stored, in flight or not hashable) opens nothing and changes nothing, and one
that raises after opening it (a faulty policy's ``PolicyError``) closes it again. With
``store_threshold >= 2``, ``kv_offload_stores_skipped`` counts as vLLM's: every refused
occurrence of a key not in the tier (a key named twice in a call and refused counts 2).

ARC differs from vLLM's ``ARCCachePolicy`` in one place: a key that comes back while its ghost
entry is in B1/B2 is inserted straight into T2 (the paper's ARC; vLLM inserts it into T1).

Thread safety: like vLLM's own CPU manager, neither drop-in is thread-safe; vLLM's scheduler
calls them from one thread under ``manager.lock`` (a no-op here).

Requires ``vllm==0.33.0`` (import-only set: ``pip install --no-deps vllm==0.33.0`` plus the
``kvtier[vllm]`` extra).
"""

from __future__ import annotations

import difflib
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from kvtier.integrations import require_vllm

require_vllm(__name__)  # names the install command when vLLM is missing

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import (
    CPULoadStoreSpec,
    CPUOffloadingInfo,
    CPUOffloadingMetrics,
)
from vllm.v1.kv_offload.cpu.policies.base import (
    CachePolicy,
    ChunkStatus,
    order_request_keys,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvtier
from kvtier.checks import unhashable_error
from kvtier.errors import BlockStateError
from kvtier.policies import available_policies, get_policy
from kvtier.types import LookupResult as KVTierLookupResult

__all__ = [
    "MODULE_PATH",
    "POLICY_CLASSES",
    "KVTierCachePolicy",
    "KVTierOffloadingManager",
    "KVTierOffloadingSpec",
    "policy_class_name",
    "vllm_cache_policy",
]

MODULE_PATH = __name__
"""The value for ``cache_policy_module_path`` / ``spec_module_path``."""


# ---------------------------------------------------------------------------------------------
# The one place that calls kvtier's CachePolicy hooks (kvtier.policies.base). The contract is
# being reshaped (keys only, vLLM hook names): re-target this class and nothing else.
# ---------------------------------------------------------------------------------------------
class _KVTierHooks:
    """A kvtier policy instance behind the few operations the vLLM adapter needs (kvtier's
    keys-only contract, :mod:`kvtier.policies.base`: keys in, keys out)."""

    __slots__ = ("policy",)

    def __init__(self, name: str, capacity: int) -> None:
        self.policy = get_policy(name)(capacity)

    def insert(self, keys: list[Any]) -> None:
        """New blocks of one store call, head first; stores in flight (pending, not
        evictable)."""
        self.policy.insert(keys)

    def stored(self, keys: Sequence[Any]) -> None:
        """One successful store call's new keys, head first (prefix policies learn links)."""
        self.policy.on_store(keys)

    def evictable(self, keys: list[Any]) -> None:
        """Blocks that became evictable in one call, head first: ``keys[0]`` ends most
        recent."""
        self.policy.mark_evictable(keys)

    def unevictable(self, key: Any) -> None:
        """A block pinned by a load (ref count 0 -> 1)."""
        self.policy.mark_non_evictable([key])

    def remove(self, key: Any) -> None:
        """A pending block whose store failed: dropped, no ghost entry."""
        self.policy.remove([key])

    def use(self, keys: Sequence[Any]) -> None:
        """One use of ``keys``; ``keys[0]`` ends most recent; non-resident keys teach ghosts."""
        self.policy.touch(keys)

    def request_finished(
        self, keys: Sequence[Any], inserted: Collection[Any], reused: Collection[Any]
    ) -> None:
        """A finished request's one use: its keys head first, inserted-only vs reused."""
        self.policy.on_request_finished(tuple(keys), frozenset(inserted), frozenset(reused))

    def evict(self, n: int, protected: Collection[Any]) -> list[Any] | None:
        """``n`` victims (keys) or ``None`` with nothing changed."""
        return self.policy.evict(n, protected)

    def clear(self) -> None:
        self.policy.clear()


# ---------------------------------------------------------------------------------------------
# Option 1: kvtier policies as vLLM CachePolicy classes
# ---------------------------------------------------------------------------------------------
class KVTierCachePolicy(CachePolicy):
    """A vLLM ``CachePolicy`` running a kvtier policy (``kvtier_policy``, set per subclass).

    vLLM's ``CPUOffloadingManager`` owns the ``ChunkStatus`` of each block (it mutates
    ``ref_cnt``); this class keeps ``key -> ChunkStatus`` for :meth:`get` and forwards every
    state change to the kvtier policy:

    ==========================  ===================================================
    vLLM hook                   kvtier policy
    ==========================  ===================================================
    ``insert``                  ``insert`` (pending); a run of inserts (one
                                ``prepare_store``) is then one ``on_store``
    ``mark_evictable``          ``blocks_evictable``; the releases of one
                                ``complete_store`` / ``complete_load`` are applied in
                                reverse, head ending most recent, as kvtier's manager
    ``mark_non_evictable``      ``block_unevictable``
    ``remove``                  ``remove``
    ``touch``, ``on_store_miss``  ``touch``
    ``on_request_finished``     ``on_request_finished(keys, inserted, reused)``, the
                                key groups flattened head to tail as vLLM orders them
    ``on_request_access``       nothing (kvtier issue #11)
    ``evict`` (atomic)          ``evict``: ``None`` and nothing changed, or the victims
    ==========================  ===================================================

    Releases are buffered and applied at the next other hook, or when the kind of release
    changes (store completions vs load releases): the calls of one ``complete_*`` are
    consecutive, and vLLM gives the policy no other call boundary. Two ``complete_*`` calls of
    the same kind with nothing in between are therefore applied as one.

    Stricter than vLLM's own policies: inserting a key that is already resident raises
    :class:`kvtier.BlockStateError` (vLLM's manager does so when one ``prepare_store`` names a
    new key twice) and nothing changes.

    Args:
        cache_capacity: the tier's size in chunks (vLLM passes ``num_chunks``).

    Raises:
        ValueError: ``cache_capacity`` is not a positive int (the message names vLLM's
            ``cpu_bytes_to_use``, which holds no chunk then), or the kvtier policy is offline
            (``KVTierBelady``: it needs the trace's future; option 2 refuses it too).
        TypeError: the abstract class itself is instantiated.
    """

    kvtier_policy: ClassVar[str] = ""
    """Registered kvtier policy name (:func:`kvtier.available_policies`)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        if not self.kvtier_policy:
            raise TypeError(
                "KVTierCachePolicy is abstract: use a policy class such as KVTierARC "
                "(kvtier.integrations.vllm.POLICY_CLASSES) or vllm_cache_policy(name)"
            )
        cls_name = type(self).__name__
        if (isinstance(cache_capacity, bool) or not isinstance(cache_capacity, int)
                or cache_capacity < 1):
            # vLLM passes its num_chunks: 0 when cpu_bytes_to_use holds no chunk
            raise ValueError(
                f"{cls_name}: the CPU tier holds {cache_capacity!r} chunks (vLLM's num_chunks); "
                "cpu_bytes_to_use must hold at least one chunk of the KV cache"
            )
        if getattr(get_policy(self.kvtier_policy), "needs_future", False):
            online = ", ".join(
                policy_class_name(p) for p in available_policies()
                if not getattr(get_policy(p), "needs_future", False)
            )
            raise ValueError(
                f"eviction_policy {cls_name!r} is offline (kvtier policy "
                f"{self.kvtier_policy!r} needs the trace's future, which an engine does not "
                f"have): use it in 'kvtier replay'; an engine runs {online}"
            )
        self._hooks = _KVTierHooks(self.kvtier_policy, cache_capacity)
        self._chunks: dict[OffloadKey, ChunkStatus] = {}
        self._pending: set[OffloadKey] = set()  # inserted, store not completed
        self._inserted: list[OffloadKey] = []  # the current run of inserts
        self._released: list[OffloadKey] = []  # buffered mark_evictable keys
        self._released_stores = False  # kind of the buffered releases
        self._offer: list[OffloadKey] | None = None  # last on_request_access keys

    @property
    def kvtier(self) -> kvtier.CachePolicy:
        """The wrapped kvtier policy (for inspection; do not call its hooks)."""
        return self._hooks.policy

    def _flush(self) -> None:
        if self._inserted:
            inserted, self._inserted = self._inserted, []
            # one insert call per run of vLLM's per-key inserts (one prepare_store): policies
            # may order a call's keys (S3-FIFO's first fill takes them tail first)
            self._hooks.insert(inserted)
            offer, self._offer = self._offer, None
            # the store call's keys as vLLM reported them to on_request_access just before
            # (inserted + already ready, head first) when they cover the inserted ones
            if offer is not None and len(offer) > len(inserted) and set(offer).issuperset(inserted):
                inserted = offer
            self._hooks.stored(inserted)
        self._offer = None
        if self._released:
            released, self._released = self._released, []
            self._hooks.evictable(released)

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self._chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        if key in self._chunks:
            raise BlockStateError(key, "insert: block is already resident (named twice?)")
        if self._released:
            self._flush()
        self._chunks[key] = chunk
        self._pending.add(key)
        self._inserted.append(key)  # given to the kvtier policy at the next other hook

    def remove(self, key: OffloadKey) -> None:
        self._flush()
        self._chunks.pop(key, None)
        self._pending.discard(key)
        self._hooks.remove(key)

    def mark_evictable(self, key: OffloadKey) -> None:
        if self._inserted:
            self._flush()
        store_done = key in self._pending
        if store_done:
            self._pending.discard(key)
        if self._released and store_done is not self._released_stores:
            self._flush()
        self._released_stores = store_done
        self._released.append(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._flush()
        self._hooks.unevictable(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self._flush()
        keys = list(keys)
        if keys:
            self._hooks.use(keys)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # one use of the missed keys before they are inserted: ARC learns ghost hits from it
        self.touch(keys, req_context)

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self._flush()
        self._offer = list(keys)  # a prepare_store's offer, if inserts follow

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        self._flush()
        keys = order_request_keys(key_groups, req_context)
        if keys:
            self._hooks.request_finished(keys, insertion_only_keys, reused_keys)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        offer = self._offer  # vLLM evicts between on_request_access and the inserts
        self._flush()
        self._offer = offer
        if n <= 0:
            return []
        victims = self._hooks.evict(n, protected)
        if victims is None:
            return None
        pop = self._chunks.pop
        return [(key, pop(key)) for key in victims]

    def clear(self) -> None:
        self._chunks.clear()
        self._pending.clear()
        self._inserted.clear()
        self._released.clear()
        self._offer = None
        self._hooks.clear()


_NAME_PARTS = {"lru": "LRU", "arc": "ARC", "s3fifo": "S3FIFO", "lfu": "LFU", "sieve": "Sieve"}


def policy_class_name(name: str) -> str:
    """The vLLM class name for registered kvtier policy ``name``: ``"arc"`` -> ``"KVTierARC"``,
    ``"prefix-s3fifo"`` -> ``"KVTierPrefixS3FIFO"``; other names are CamelCased
    (``"my-policy"`` -> ``"KVTierMyPolicy"``)."""
    parts = re.split(r"[^0-9A-Za-z]+", name)
    return "KVTier" + "".join(_NAME_PARTS.get(p, p[:1].upper() + p[1:]) for p in parts if p)


_CLASS_CACHE: dict[str, type[KVTierCachePolicy]] = {}


def vllm_cache_policy(name: str) -> type[KVTierCachePolicy]:
    """The vLLM ``CachePolicy`` class running registered kvtier policy ``name`` (one class per
    name, created on first use; built-in ones are also module attributes, which is how vLLM's
    factory finds them by ``eviction_policy``).

    Raises:
        ValueError: no kvtier policy is registered as ``name``.
    """
    cls = _CLASS_CACHE.get(name)
    if cls is None:
        kv_cls = get_policy(name)  # raises ValueError listing the known names
        cls_name = policy_class_name(name)
        cls = type(
            cls_name,
            (KVTierCachePolicy,),
            {
                "kvtier_policy": name,
                "__module__": __name__,
                "__doc__": f"vLLM CachePolicy running kvtier's {name!r} policy "
                f"({kv_cls.__module__}.{kv_cls.__qualname__}); see KVTierCachePolicy.",
            },
        )
        _CLASS_CACHE[name] = cls
    return cls


POLICY_CLASSES: dict[str, type[KVTierCachePolicy]] = {}
"""vLLM class name -> class, one per kvtier policy registered at import time."""

for _name in available_policies():
    _cls = vllm_cache_policy(_name)
    POLICY_CLASSES[_cls.__name__] = _cls
    globals()[_cls.__name__] = _cls
del _name, _cls


def __getattr__(attr: str) -> type[KVTierCachePolicy]:
    # policies registered after this module was imported (entry points, register_policy)
    if attr.startswith("KVTier"):
        for name in available_policies():
            if policy_class_name(name) == attr:
                cls = vllm_cache_policy(name)
                POLICY_CLASSES[attr] = cls
                return cls
    message = f"module {__name__!r} has no attribute {attr!r}"
    if not (attr.startswith("__") and attr.endswith("__")):  # Python's own probes: plain
        # vLLM's CachePolicyFactory resolves eviction_policy with getattr(module, name), so
        # this is the message a misspelt eviction_policy gets: name the classes
        message += f"; as eviction_policy {attr!r}: {_eviction_policy_hint(attr)}"
    raise AttributeError(message)


def _eviction_policy_hint(attr: str) -> str:
    """The classes an engine can run, and the one ``attr`` most likely meant."""
    online = {
        policy_class_name(p): p for p in available_policies()
        if not getattr(get_policy(p), "needs_future", False)
    }
    by_policy = {p: c for c, p in online.items()}
    meant = by_policy.get(attr)  # a kvtier policy name ("s3fifo") given as the class name
    if meant is None:
        folded = {c.lower(): c for c in online}
        meant = folded.get(attr.lower()) or folded.get(policy_class_name(attr).lower())
    if meant is None:
        close = difflib.get_close_matches(attr, list(online), 1, 0.8)
        meant = close[0] if close else None
    known = f"the kvtier classes are {', '.join(sorted(online))}"
    return f"did you mean {meant!r}? {known}" if meant else known


# ---------------------------------------------------------------------------------------------
# Option 2: kvtier's manager as a vLLM OffloadingManager / OffloadingSpec
# ---------------------------------------------------------------------------------------------
_LOOKUP = {
    KVTierLookupResult.MISS: LookupResult.MISS,
    KVTierLookupResult.HIT: LookupResult.HIT,
    KVTierLookupResult.HIT_PENDING: LookupResult.HIT_PENDING,
}
_K_HIT, _K_MISS = KVTierLookupResult.HIT, KVTierLookupResult.MISS
_V_HIT, _V_MISS = LookupResult.HIT, LookupResult.MISS
_V_HIT_PENDING = LookupResult.HIT_PENDING


class _Manager(kvtier.OffloadingManager):
    """kvtier's manager under :class:`KVTierOffloadingManager`, with one method more:
    :meth:`vllm_lookup`, its ``lookup`` answering vLLM's ``LookupResult``, which the adapter
    binds as its own ``lookup`` (one Python frame per lookup instead of two; ~3.6 lookups per
    request: docs/performance.md, "Request mode, round 6"). The adapter builds it without a
    tracker or admission (it keeps vLLM's admission itself), so a lookup counts and answers
    only."""

    def vllm_lookup(self, key: OffloadKey, req_context: Any = None) -> LookupResult:
        """:meth:`kvtier.OffloadingManager.lookup` (no tracker, no admission) answering
        vLLM's ``LookupResult``: the same counts, the same answers. O(1).

        Raises:
            TypeError: ``key`` is not hashable.
        """
        try:
            stored = key in self._slot_of
        except TypeError:
            raise unhashable_error((key,), "lookup") from None
        if not stored:
            self._misses += 1
            return _V_MISS
        if key in self._pending_keys:
            self._pending_hits += 1
            return _V_HIT_PENDING
        self._hits += 1
        return _V_HIT


    def discard_request(self, req_context: Hashable) -> None:
        """Close open request ``req_context`` without applying its use (no policy call, no
        counter): the adapter's undo of a request opened by a call that then raised. O(1).
        A context that is not open is ignored."""
        self._requests.pop(req_context, None)

    def check_load(self, keys: Sequence[OffloadKey]) -> None:
        """Raise what :meth:`prepare_load` of ``keys`` would raise, changing nothing
        (the adapter checks a load before it opens a request for it). O(len(keys)).

        Raises:
            BlockStateError: a key is not stored, or its store is still in flight.
            TypeError: a key is not hashable.
        """
        self._slots_of(keys, "prepare_load")  # names the first key not stored
        pending = self._pending_keys
        if pending and not pending.isdisjoint(keys):
            key = next(filter(pending.__contains__, keys))
            raise BlockStateError(
                key, "prepare_load: block's store is still in flight (HIT_PENDING)"
            )


def _check_hashable(keys: Sequence[OffloadKey], method: str) -> None:
    """Raise the TypeError naming the first unhashable key of ``keys``, if any."""
    try:
        hash(tuple(keys))
    except TypeError:
        raise unhashable_error(keys, method) from None


# a dtype instance, not the type np.int32: np.fromiter skips the type -> dtype conversion
# (-150 instructions per spec, callgrind; docs/performance.md, "Request mode, round 5
# (manager and adapter)")
_INT32 = np.dtype(np.int32)
_fromiter = np.fromiter
_new_spec = object.__new__
_new = object.__new__
_CHUNK_LEVEL = OffloadPolicy.CHUNK_LEVEL

# vLLM opens a request when it is added to the scheduler (waiting ones included: an offline
# batch or a burst opens thousands before the first runs) and finishes every one of them, so
# the adapter's manager must not finish the oldest early at kvtier's default cap of 4,096
# open requests (that request's later loads and stores were then no use at all). An open
# request that has not run holds an empty record (~320 bytes; vLLM's own is bigger):
# this cap bounds memory only if vLLM ever leaked requests.
MAX_OPEN_REQUESTS = 1 << 20


def _spec_layout_known() -> bool:
    """Whether vLLM's ``CPULoadStoreSpec(ids)`` is exactly an object whose one attribute
    ``block_ids`` is a C-contiguous int32 ndarray of ``ids`` (vLLM 0.33), so the adapter may
    build the same object without its ``__init__`` (see ``_SPECS``)."""
    probe = CPULoadStoreSpec([3, 1])
    ids = vars(probe).get("block_ids")
    return (
        vars(probe).keys() == {"block_ids"}
        and isinstance(ids, np.ndarray)
        and ids.dtype == _INT32
        and ids.flags.c_contiguous
        and ids.tolist() == [3, 1]
    )


# _SPECS: prepare_load / prepare_store build vLLM's CPULoadStoreSpec as its __init__ does
# (block_ids an int32 ndarray) but with np.fromiter of a known length instead of np.array of
# the list (24 ids: 7,868 instead of 9,516 instructions, callgrind) and without the __init__
# frame (-367): ~2,000 instructions less per spec, two specs per request
# (docs/performance.md, "Request mode, round 4"). Only when the probe above finds vLLM's
# layout; else the constructor.
_FAST_SPECS = _spec_layout_known()


class _RequestAccess:
    """One request's handle on this manager, kept in its ``ReqContext`` state. The handle is
    itself the hashable context under which the request is open in kvtier's manager (request
    mode; vLLM's ``ReqContext`` is not hashable; identity hash). ``epoch``: the manager's
    epoch object when it was opened (one per manager and ``reset_cache``: a handle of another
    manager, or from before a reset, is stale); ``finished``: closed by
    ``on_request_finished``. No ``__init__``: ``KVTierOffloadingManager.on_new_request`` sets both
    (a dataclass ``__init__`` was one Python frame more per request)."""

    __slots__ = ("epoch", "finished")

    epoch: object
    finished: bool


def _plain_layout_known() -> bool:
    """Whether vLLM's ``PrepareStoreOutput`` and ``RequestOffloadingContext`` are plain
    dataclasses whose ``__init__`` only sets their fields, and ``ReqContext``'s request state
    is the dict ``_state`` keyed by the value's type (vLLM 0.33), so the adapter may build the
    first two without their ``__init__`` and read and write the state without
    ``get_state`` / ``set_state`` (see ``_PLAIN``)."""
    out = PrepareStoreOutput([1], None, [2])
    fast_out = _new(PrepareStoreOutput)
    fast_out.keys_to_store, fast_out.store_spec, fast_out.evicted_keys = [1], None, [2]
    ctx = RequestOffloadingContext()
    fast_ctx = _new(RequestOffloadingContext)
    fast_ctx.policy = _CHUNK_LEVEL
    req = ReqContext("probe")
    token = _RequestAccess()
    req.set_state(token)
    state = vars(req).get("_state")
    return (
        vars(out) == vars(fast_out) and out == fast_out
        and vars(ctx) == vars(fast_ctx) and ctx == fast_ctx
        and isinstance(state, dict) and state.get(_RequestAccess) is token
        and req.get_state(_RequestAccess) is token and len(state) == 1
    )


# _PLAIN: per request, the adapter reads its handle from vLLM's ReqContext four times and
# returns a RequestOffloadingContext and a PrepareStoreOutput: with the probe above it reads
# ``req_context._state`` directly and builds the two dataclasses without their __init__, a
# Python frame less each (seven per request; with the manager's record without __init__,
# spec replay -122 per block reference: docs/performance.md, "Request mode, round 5 (manager
# and adapter)").
# Else vLLM's methods and constructors.
_FAST_PLAIN = _plain_layout_known()


class KVTierOffloadingManager(OffloadingManager):
    """vLLM's ``OffloadingManager`` on :class:`kvtier.OffloadingManager`.

    Same signatures and return types as vLLM's ``CPUOffloadingManager``: ``prepare_load``
    returns a ``CPULoadStoreSpec`` of chunk ids, ``prepare_store`` a vLLM
    ``PrepareStoreOutput`` (or ``None``), events carry ``Medium.CPU``, ``get_stats`` reports
    vLLM's CPU metrics. kvtier's behaviour underneath: atomic stores (``None`` changes
    nothing), eviction cost O(k) however many blocks are pinned, and a clear
    :class:`kvtier.BlockStateError` (nothing changed) where vLLM asserts (loading a block that
    is not stored or still pending, releasing a pin that was never taken).

    Args:
        num_blocks: tier size in chunks (>= 1).
        policy: registered kvtier policy name.
        enable_events: record ``OffloadingEvent`` s for :meth:`take_events`.
        store_threshold: admission as in vLLM: a new key is stored only once it has been
            offered to :meth:`prepare_store` this many times (0 or 1: everything).
        max_tracker_size: keys the admission tracker remembers (LRU of offer counts).
        info: vLLM's static CPU facts for :meth:`config_info`.

    Raises:
        ValueError: bad sizes or an unknown policy name.

    Not thread-safe; vLLM's scheduler calls it from one thread.
    """

    def __init__(
        self,
        num_blocks: int,
        policy: str = "lru",
        *,
        enable_events: bool = False,
        store_threshold: int = 0,
        max_tracker_size: int = 64_000,
        info: CPUOffloadingInfo | None = None,
    ) -> None:
        _check_int("store_threshold", store_threshold, 0)
        _check_int("max_tracker_size", max_tracker_size, 1)
        self.medium: Medium = Medium.CPU
        self.manager: kvtier.OffloadingManager = _Manager(
            num_blocks, policy, enable_events=enable_events, max_open_requests=MAX_OPEN_REQUESTS
        )
        self.policy_name = policy
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self._events_on = enable_events
        self._events: list[OffloadingEvent] = []
        self._config_info: ConfigInfoMapping = info.as_config_info() if info else {}
        self._counts: OrderedDict[OffloadKey, int] | None = (
            OrderedDict() if store_threshold >= 2 else None
        )
        self._skipped = 0
        self._allocation_sizes: list[int] = []
        # identity of this manager and its reset_cache generation in one object: one `is`
        # test per call tells a current handle (_RequestAccess) from a stale one
        self._epoch = object()
        # bound once: the per-call paths below use them
        self._lookup = self.manager.lookup
        # vLLM's lookup is kvtier's, answering vLLM's LookupResult (see _Manager): one frame
        # per lookup, not two
        if self.manager._tracker is None and self.manager.admission is None:
            self.lookup = self.manager.vllm_lookup
        # kvtier's complete_load / complete_store take vLLM's arguments as they are (keys as
        # a list, tuple or other collection; the ReqContext unused; success a bool):
        # bound here, a Python frame less per call (docs/performance.md, "Request mode,
        # round 6"); complete_store only without events (a failed store's removal event)
        self.complete_load = self.manager.complete_load
        if not enable_events:
            self.complete_store = self.manager.complete_store

    @property
    def num_blocks(self) -> int:
        """The tier's capacity in chunks: kvtier's manager's, read-only as there (a plain
        attribute here could be set without resizing anything). Not on a per-call path."""
        return self.manager.num_blocks

    @num_blocks.setter
    def num_blocks(self, value: Any) -> None:
        self.manager.num_blocks = value  # raises AttributeError naming the rule

    # -- per-request state -------------------------------------------------------------------
    # The per-request paths read the ReqContext's handle inline (directly from its state dict
    # with _FAST_PLAIN) and open a request only when it has none (or a stale one): one
    # Python frame less per call, and no dataclass __init__ (docs/performance.md, "Request
    # mode, round 4" and "round 5 (manager and adapter)")
    def _call_opening(
        self, call: Callable[[list[OffloadKey], ReqContext], Any], keys: list[OffloadKey],
        req_context: ReqContext,
    ) -> Any:
        """``prepare_load`` / ``prepare_store`` (``call``) of a request that has no current
        handle (not opened by ``on_new_request``, or opened before ``reset_cache``): open it
        now, then make the call under it. If the call raises (e.g. a ``PolicyError`` of a
        faulty policy), the request it opened is closed again without a use and the
        context's handle is what it was (none, or the stale one), so no half-open request is
        left; a request the manager's ``max_open_requests`` cap finished early to make room
        stays finished (its use was applied). Off the per-call paths: vLLM opens its
        requests with ``on_new_request``."""
        prior = req_context.get_state(_RequestAccess)
        self.on_new_request(req_context)
        state = req_context.get_state(_RequestAccess)
        try:
            return call(keys, req_context)
        except BaseException:
            self.manager.discard_request(state)
            if _FAST_PLAIN:  # see _PLAIN
                if prior is None:
                    del req_context._state[_RequestAccess]
                else:
                    req_context._state[_RequestAccess] = prior
            elif prior is not None:
                req_context.set_state(prior)
            else:  # vLLM's ReqContext cannot drop a state: a handle of no manager instead
                state.epoch = None
            raise

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        state = (req_context._state.get(_RequestAccess) if _FAST_PLAIN  # see _PLAIN
                 else req_context.get_state(_RequestAccess))
        if state is None or state.epoch is not self._epoch:
            # a new request (or one from before reset_cache, which vLLM's manager also starts
            # afresh): open it in kvtier's manager under a new handle
            state = _RequestAccess()
            state.epoch = self._epoch
            state.finished = False
            # kvtier's manager first: when it raises (a faulty policy's hook, run when the
            # cap finishes the oldest request early), the context gets no handle of a
            # request that is not open
            self.manager.on_new_request(state)
            if _FAST_PLAIN:
                req_context._state[_RequestAccess] = state
            else:
                req_context.set_state(state)
        if _FAST_PLAIN:  # no dataclass __init__
            out = _new(RequestOffloadingContext)
            out.policy = _CHUNK_LEVEL
            return out
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request's one use, by kvtier's request mode: the policy's
        ``on_request_finished(keys, inserted, reused)``, keys head first in the order the
        request first named them (vLLM sorts by the scheduler's token positions instead,
        which equals that order whenever a request names its blocks head first)."""
        state = (req_context._state.get(_RequestAccess) if _FAST_PLAIN  # see _PLAIN
                 else req_context.get_state(_RequestAccess))
        if state is None or state.epoch is not self._epoch or state.finished:
            return
        state.finished = True
        self.manager.on_request_finished(state)

    # -- lookups and loads -------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        # identity tests, not _LOOKUP[r] (an Enum's __hash__ is a Python call): 2,229 instead
        # of 2,950 instructions per lookup (docs/vllm.md "Where the time goes")
        r = self._lookup(key)
        if r is _K_HIT:
            return _V_HIT
        return _V_MISS if r is _K_MISS else _LOOKUP[r]

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        """Pin ready blocks; their chunk ids in order.

        Raises:
            kvtier.BlockStateError: a key is not stored or still pending (nothing pinned,
                and a request vLLM never opened is not opened).
            TypeError: a key is not hashable (nothing changed).
        """
        if type(keys) is not list:
            keys = list(keys)
        state = (req_context._state.get(_RequestAccess) if _FAST_PLAIN  # see _PLAIN
                 else req_context.get_state(_RequestAccess))
        if state is None or state.epoch is not self._epoch:
            self.manager.check_load(keys)  # a refused load opens no request
            return self._call_opening(self.prepare_load, keys, req_context)
        slots = self.manager.prepare_load(keys, state)
        if _FAST_SPECS:  # see _SPECS
            spec = _new_spec(CPULoadStoreSpec)
            spec.block_ids = _fromiter(slots, _INT32, len(slots))
            return spec
        return CPULoadStoreSpec(slots)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.manager.touch(keys if type(keys) is list else list(keys))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.manager.complete_load(keys if type(keys) is list else list(keys))

    # -- stores ------------------------------------------------------------------------------
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Allocate chunks for the keys not yet stored, evicting if needed; atomic.

        Returns ``None`` (nothing changed in the tier) when not enough blocks can be evicted.
        """
        keys = list(keys)
        token = (req_context._state.get(_RequestAccess) if _FAST_PLAIN  # see _PLAIN
                 else req_context.get_state(_RequestAccess))
        if token is None or token.epoch is not self._epoch:
            _check_hashable(keys, "prepare_store")  # a refused store opens no request
            return self._call_opening(self.prepare_store, keys, req_context)
        m = self.manager
        if self._counts is not None:
            _check_hashable(keys, "prepare_store")  # before any count changes
            self._record_offer(keys)
            counts, threshold = self._counts, self.store_threshold
            # vLLM's stores_skipped counts the refused occurrences of keys not in the tier
            # (a key named twice counts twice), not distinct keys
            refused = [k for k in m.missing(keys) if counts.get(k, 0) < threshold]
            if refused:
                self._skipped += len(refused)
                refused_set = set(refused)
                keys = [k for k in keys if k not in refused_set]
        # request mode records the offer (ready keys reused, new keys inserted) and lets the
        # policy learn ghost hits from the new keys once per request (vLLM's on_store_miss)
        out = m.prepare_store(keys, token)
        # vLLM's histogram counts the chunks each call asks for, granted or not: the distinct
        # keys not stored, which a successful store allocates (kvtier's manager here admits
        # every new key), so they are counted only when the store fails (no membership pass
        # per call, docs/performance.md, "ARC hot paths")
        if out is None:
            misses = m.missing(keys)  # the failed store changed nothing
            if misses:
                self._allocation_sizes.append(len(set(misses)))
            return None
        stored = out.keys_to_store
        if stored:
            self._allocation_sizes.append(len(stored))
        # positional (keys_to_store, store_spec, evicted_keys): 2,027 instead of 3,614
        # instructions per output, no keyword parsing (docs/vllm.md "Where the time goes")
        block_ids = out.block_ids
        if _FAST_SPECS:  # see _SPECS
            spec = _new_spec(CPULoadStoreSpec)
            spec.block_ids = _fromiter(block_ids, _INT32, len(block_ids))
        else:
            spec = CPULoadStoreSpec(block_ids)
        if _FAST_PLAIN:  # see _PLAIN: no dataclass __init__
            result = _new(PrepareStoreOutput)
            result.keys_to_store = stored
            result.store_spec = spec
            result.evicted_keys = out.evicted_keys
            return result
        return PrepareStoreOutput(stored, spec, out.evicted_keys)

    def _record_offer(self, keys: Sequence[OffloadKey]) -> None:
        counts = self._counts
        if counts is None:  # only called with admission on (store_threshold >= 2)
            raise RuntimeError("_record_offer without an admission tracker")
        # vLLM 0.33's rule (CPUOffloadingManager's tracker), which decides what is stored:
        # a key already tracked counts one more per time it is named and moves to the newest
        # end, safe from this call's trimming; a new key is tracked once (count 1, however
        # often the call names it), after dropping the oldest entry not named in this call,
        # and not at all when every entry was named. (Counting first and trimming after
        # could drop the call's own keys: with a tracker smaller than a request, the
        # prefix's head lost its count and only the tail was stored.)
        protected = 0
        for key in keys:
            if key in counts:
                counts[key] += 1
                counts.move_to_end(key)
                protected += 1
        if protected:
            protected = len({k for k in keys if k in counts})  # once per distinct key
        unprotected = len(counts) - protected
        limit = self.max_tracker_size
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= limit:
                if not unprotected:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Pending blocks become readable (``success=True``) or are dropped, their chunks freed.
        Keys that are not pending are ignored.

        Raises:
            TypeError: ``success`` is not a bool (nothing changed).
        """
        if type(keys) is not list:
            keys = list(keys)
        if success is not True and self._events_on and type(success) is bool:
            m = self.manager
            failed = [k for k in dict.fromkeys(keys) if m.ref_count(k) == -1]
            m.complete_store(keys, success=False)
            if failed:
                self._drain_events()  # keep the order of events
                self._events.append(
                    OffloadingEvent(
                        keys=failed, medium=self.medium, removed=True, metadata_only=True
                    )
                )
            return
        self.manager.complete_store(keys, success=success)

    # -- whole tier --------------------------------------------------------------------------
    def _drain_events(self) -> None:
        medium = self.medium
        self._events.extend(
            OffloadingEvent(keys=list(ev.keys), medium=medium, removed=ev.removed)
            for ev in self.manager.take_events()
        )

    def take_events(self) -> Iterable[OffloadingEvent]:
        if not self._events_on:
            return []
        self._drain_events()
        events, self._events = self._events, []
        if any(ev.metadata_only for ev in events):
            # as vLLM's manager: a failed store's keys that a retry put back into the tier
            # before this call are the retry's now, so their metadata is not released
            stored = self.manager.__contains__
            kept = []
            for ev in events:
                if ev.metadata_only:
                    keys = [k for k in ev.keys if not stored(k)]
                    if not keys:
                        continue
                    ev.keys = keys
                kept.append(ev)
            events = kept
        return events

    def reset_cache(self) -> None:
        """Drop every block (no removal events, as vLLM's manager), admission counts and the
        per-request state; events not yet taken are kept."""
        if self._events_on:
            self._drain_events()
        self.manager.reset_cache()
        if self._counts is not None:
            self._counts.clear()
        self._epoch = object()  # every handle opened before is stale now

    def get_stats(self) -> OffloadingConnectorStats:
        """vLLM's CPU metrics: cache usage (pinned + pending share of the tier), its write
        (pending) and read (pinned) parts, allocation sizes since the last call and, with
        admission, stores skipped since the last call."""
        s = self.manager.stats()
        stats = OffloadingConnectorStats()
        num = self.num_blocks
        usage = (s.pending + s.pinned) / num
        write_usage = s.pending / num
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        for size in self._allocation_sizes:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        self._allocation_sizes.clear()
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
        stats.set_gauge(
            CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, max(usage - write_usage, 0.0)
        )
        if self.store_threshold >= 2:
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, self._skipped)
            self._skipped = 0
        return stats

    def config_info(self) -> Sequence[ConfigInfoMapping]:
        return [self._config_info]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class KVTierOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with kvtier's manager (:class:`KVTierOffloadingManager`).

    Everything else is ``CPUOffloadingSpec``'s: ``cpu_bytes_to_use`` sizes the tier, the worker
    (``get_worker``) and the metrics are vLLM's. Options in ``kv_connector_extra_config``:

    * ``kvtier_policy``: registered kvtier policy name (default ``"lru"``; see
      :func:`kvtier.available_policies`);
    * ``store_threshold``: int >= 0, vLLM's meaning (offers before a block is stored; < 2:
      store everything);
    * ``max_tracker_size``: int >= 1 (default 64,000), keys the admission tracker remembers.

    Raises:
        ValueError: at construction (engine start), an option of the wrong type or range, an
            unknown ``kvtier_*`` option, a key that is a near miss of an option
            (``store_treshold``, ``store-threshold``: difflib ratio >= 0.8), an unknown or
            offline policy (``belady``), or
            ``eviction_policy`` / ``cache_policy_module_path`` (those select vLLM's own manager's policy; use
            ``kvtier_policy``). The message names the option.
    """

    OPTIONS: ClassVar[tuple[str, ...]] = ("kvtier_policy", "store_threshold", "max_tracker_size")

    def __init__(self, config: OffloadingConfig) -> None:
        self.kvtier_options = parse_options(config.extra_config)
        super().__init__(config)

    def get_manager(self) -> OffloadingManager:
        if not self._manager:
            if self.num_chunks < 1:
                raise ValueError(
                    f"KVTierOffloadingSpec: cpu_bytes_to_use="
                    f"{self.extra_config.get('cpu_bytes_to_use')!r} holds no chunk of "
                    f"{self.kv_bytes_per_chunk} bytes (num_chunks={self.num_chunks})"
                )
            opts = self.kvtier_options
            self._manager = KVTierOffloadingManager(
                self.num_chunks,
                opts["kvtier_policy"],
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=opts["store_threshold"],
                max_tracker_size=opts["max_tracker_size"],
                info=self.cpu_info,
            )
        return self._manager


def parse_options(extra_config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate :class:`KVTierOffloadingSpec`'s options in ``kv_connector_extra_config``.

    Returns:
        ``{"kvtier_policy": str, "store_threshold": int, "max_tracker_size": int}``.

    Raises:
        ValueError: see :class:`KVTierOffloadingSpec`.
    """
    for key in ("eviction_policy", "cache_policy_module_path"):
        if key in extra_config:
            raise ValueError(
                f"KVTierOffloadingSpec: {key!r} selects the policy of vLLM's own manager; "
                "with spec_name KVTierOffloadingSpec set 'kvtier_policy' instead"
            )
    options = KVTierOffloadingSpec.OPTIONS
    unknown = sorted(k for k in extra_config if k.startswith("kvtier_") and k not in options)
    if unknown:
        raise ValueError(
            f"KVTierOffloadingSpec: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(options)}"
        )
    # the config is shared with vLLM's own keys, so only a near miss of an option is an error
    for key in extra_config:
        if isinstance(key, str) and key not in options:
            near = difflib.get_close_matches(key.replace("-", "_").lower(), options, 1, 0.8)
            if near:
                raise ValueError(
                    f"KVTierOffloadingSpec: unknown option {key!r}; did you mean {near[0]!r}? "
                    f"known: {', '.join(options)}"
                )
    online = [p for p in available_policies() if not getattr(get_policy(p), "needs_future", False)]
    policy = extra_config.get("kvtier_policy", "lru")
    if not isinstance(policy, str) or policy not in available_policies():
        raise ValueError(
            f"KVTierOffloadingSpec: kvtier_policy must be one of "
            f"{', '.join(online)}, got {policy!r}"
        )
    if getattr(get_policy(policy), "needs_future", False):
        raise ValueError(
            f"KVTierOffloadingSpec: kvtier_policy {policy!r} is offline (it needs the trace's "
            "future, which an engine does not have): use it in 'kvtier replay'"
        )
    opts = {"kvtier_policy": policy}
    for key, default, minimum in (("store_threshold", 0, 0), ("max_tracker_size", 64_000, 1)):
        value = extra_config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"KVTierOffloadingSpec: {key} must be an int >= {minimum}, got {value!r}"
            )
        opts[key] = value
    return opts
