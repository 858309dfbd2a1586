"""The offloading manager: block bookkeeping of one offloaded KV-cache tier.

Modelled on vLLM's ``CPUOffloadingManager`` (``vllm/v1/kv_offload``): same method names and
meaning, so an engine can switch. The manager alone owns slots, residency, pending stores and
pins — the key -> slot map, ref counts, events and statistics, with the free slots in a
:class:`~kvtier.slots.SlotAllocator` and admission in an
:class:`~kvtier.admission.AdmissionTracker` — and delegates only the *order* of evictable
blocks and the choice of victims to a :class:`~kvtier.policies.CachePolicy`, which deals in
keys only and whose answers it checks (:class:`~kvtier.errors.PolicyError`).

Per-block state is one dict (key -> slot) plus, for the few blocks in flight, the set of
pending keys and a dict of pin counts (key -> pins, pinned blocks only), so nothing is
allocated per slot up front and the cyclic garbage collector has no per-block objects to walk
even at 10^6 blocks.

Ref count of a cached block (as :meth:`OffloadingManager.ref_count` reports it)::

    -1  store in flight (pending): answers HIT_PENDING, cannot be loaded or evicted
     0  ready and evictable
    >0  ready and pinned by that many in-flight loads: cannot be evicted

A pending block is in ``_pending_keys``, a pinned one in ``_pins``; a ready, evictable block is
in neither, so storing, loading and releasing blocks touch small collections only.

Every public method accepts an optional ``req_context`` so vLLM-style callers fit. It is
ignored (explicit mode: uses are the caller's ``touch`` calls) unless the context was opened
with :meth:`OffloadingManager.on_new_request` (request mode, vLLM 0.33's model): then the
keys the request loads and names in ``prepare_store`` are recorded and applied as one use
when :meth:`OffloadingManager.on_request_finished` closes it (docs/manager.md, "Request
mode"). Every method validates all its keys before it changes anything: a bad call raises
and leaves the manager exactly as it was. Keys must be hashable and equal to themselves: a
NaN key (``float("nan")``) is stored but never found again by another NaN object (key
lists are not scanned for it: a check per key would cost every call; docs/manager.md, "The
rules"). Not thread-safe: one thread at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, KeysView, Sequence
from functools import partial
from itertools import compress, filterfalse, repeat
from operator import attrgetter, not_
from typing import Any

from kvtier.admission import AdmissionTracker
from kvtier.admission_adaptive import ADMISSION_MODES, make_admission
from kvtier.checks import (
    check_bool,
    check_positive_int,
    key_collection,
    key_list,
    unhashable_error,
)
from kvtier.errors import BlockStateError, PolicyError, RequestStateError
from kvtier.policies import CachePolicy, get_policy
from kvtier.policies.base import protected_set
from kvtier.slots import SlotAllocator
from kvtier.types import LookupResult, ManagerStats, OffloadingEvent, PrepareStoreOutput

_MISS = LookupResult.MISS
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING
_PENDING = -1
# key types whose hashing cannot fail: single-key fast paths skip validation for them
_PLAIN_KEY_TYPES = frozenset({int, str, bytes})


# ``_output((keys, block_ids, evicted))`` builds a PrepareStoreOutput in C, without the
# NamedTuple's Python-level ``__new__`` (and without a Python frame)
_output = partial(tuple.__new__, PrepareStoreOutput)
_new_record = object.__new__

# a request record's held place (_Request): the value of a key the request offered while
# another request's store of it was in flight (a recorded key's is None: ``not_`` of the
# values selects the recorded keys in C); and ``merged`` of a record that holds one
_HELD = True
_MERGED_HELD = 2

# _FRAMES: on request mode's usual path (prepare_store, prepare_load, on_request_finished)
# the small private helpers are spelled out where they would be one Python frame each
# (docs/performance.md, "Request mode, round 4")

# _HOOK_ERRORS: prepare_store catches any exception out of the policy (a hook or evict
# raising, or the PolicyError of a bad answer) in one handler per path, which takes back the
# call's changes and re-raises it unchanged: the admission's answer, and the new blocks when
# insert or on_store raised after they were stored (their evictions stand: the victims are
# gone from the policy already). The manager's other changes come after the last hook (the
# skipped count, request mode's record of the offer). complete_store and complete_load do
# the same around mark_evictable / remove: the blocks are pending or pinned again. A try
# costs one NOP per call when nothing raises (docs/manager.md, "The rules").

# _CELLS: the hot methods use no comprehension or generator expression over their locals,
# even on their error paths: on Python 3.11 a local that a nested scope reads becomes a cell,
# allocated and freed at every call of the method (one-key ARC store + complete 22,785 ->
# 21,994 instructions, docs/performance.md, "ARC hot paths", third round); C-level
# filter / map over a bound method instead.


MAX_BLOCKS = 2**31 - 1
"""Largest ``num_blocks``: slot ids and ref counts are stored as 32-bit ints."""


class _RequestLog:
    """Request mode's bookkeeping besides the open requests: the contexts finished early at
    the cap (oldest first, at most ``max_open`` of them), the counters, the policy's
    ghost-learning hook and whether the manager trusts its victims' held state. One
    attribute of the manager, not seven: an instance with 30 or more attributes loses
    CPython's shared-key dict and every ``self.x`` lookup gets dearer (replay +1.1 %
    instructions per block reference, benchmarks/instr_count.py; the manager's 30th
    attribute: LRU replay +0.7 %, docs/performance.md, "Request mode, round 6"). The manager
    has 29."""

    __slots__ = ("early", "finished", "finished_early", "late", "max_open", "store_miss",
                 "trusted")

    def __init__(self, max_open: int, store_miss: Any, trusted: bool = False) -> None:
        self.max_open = max_open
        # the policy's ghost-learning hook (see OffloadingManager.__init__): here, not a 30th
        # attribute of the manager (that one cost LRU's explicit replay +40 instructions per
        # block reference, docs/performance.md, "Request mode, round 6")
        self.store_miss = store_miss
        # the policy's victims are never pending nor pinned (_trusts_victims): the manager
        # skips those two checks of evict's answer (here too, not a 30th attribute)
        self.trusted = trusted
        self.early: dict[Hashable, None] = {}
        self.finished = 0
        self.finished_early = 0
        self.late = 0


class _Request:
    """What one open request did to the tier (request mode): the input of its one use.

    The request's distinct keys, the ones it loaded or named in ``prepare_store`` (stored or
    found ready), first occurrence first, at most ``num_blocks`` (:meth:`keys_in_order`);
    ``inserted`` / ``reused`` subsets of them: newly stored, loaded or found ready (not after
    storing it itself). ``inserted`` is also the set of keys already used once for ghost
    learning (a store's new keys are touched, then all of them inserted).

    ``keys`` is a dict used as an ordered set (key -> None), ``inserted`` and ``reused`` sets
    (the policy gets them as they are). While ``merged`` is false (the usual request: its
    loads, then its stores of new keys), ``keys`` holds the keys that are not in
    ``inserted``, ``order`` the inserted ones in order (a list), and the request's keys are
    ``keys`` then ``order``: a store's new keys are recorded once, in ``inserted`` (the first
    store's new-key set *is* ``inserted``) and ``order``, not also in ``keys`` (vLLM spec
    replay, docs/performance.md, "Request mode, round 7" and "round 8"). Anything else (a
    load or a ready key after a store, a new key already recorded, the ``num_blocks`` cap)
    first merges ``order`` into ``keys`` (:meth:`merge`): ``merged``, ``keys`` holds every
    key and ``order`` is no longer read.

    Held places: a key the request offers while another request's store of it is in flight
    is not recorded (vLLM's order: vLLM records only new and ready keys), but its place is:
    it enters ``keys`` with the value ``_HELD`` (recorded keys have ``None``) and ``merged``
    becomes ``_MERGED_HELD``; a later load or store of the key by the request records it
    at that place (a dict update keeps a key's position), and a place still held when the
    request finishes is dropped. vLLM orders a request's keys by their token positions at
    finish; kvtier has no positions, and without held places such a key was recorded
    behind the request's tail (session 17).

    No ``__init__``: :meth:`OffloadingManager.on_new_request` sets the five attributes (an
    ``__init__`` was one Python frame per request; docs/performance.md, "Request mode, round
    5 (manager and adapter)").
    """

    __slots__ = ("inserted", "keys", "merged", "order", "reused")

    keys: dict[Hashable, None]
    inserted: set[Hashable]
    order: list[Hashable] | tuple[()]
    reused: set[Hashable] | KeysView[Hashable]
    merged: bool

    def keys_in_order(self) -> tuple[Hashable, ...]:
        """The request's distinct keys, first occurrence first."""
        if self.merged is _MERGED_HELD:
            return self.recorded_keys()
        if self.merged or not self.inserted:
            return tuple(self.keys)
        return (*self.keys, *self.order)

    def recorded_keys(self) -> tuple[Hashable, ...]:
        """``keys`` less the places still held (a merged record)."""
        keys = self.keys
        return tuple(compress(keys, map(not_, keys.values())))  # C-level, no frame per key

    def merge(self) -> None:
        """From now on ``keys`` holds every key (the inserted ones after the others, their
        order)."""
        if not self.merged:
            if type(self.reused) is not set:  # a view of keys (_record_load): a set of its own
                self.reused = set(self.reused)
            if self.inserted:
                self.keys.update(dict.fromkeys(self.order))
            self.merged = True


def _overrides(policy: CachePolicy, hook: str) -> bool:
    """Whether ``policy``'s class overrides the optional hook ``hook`` of the base class."""
    return getattr(type(policy), hook) is not getattr(CachePolicy, hook)


def _trusts_victims(policy: CachePolicy) -> bool:
    """Whether the manager may skip the pending and pin checks of ``policy``'s victims
    (``CachePolicy``'s "Victims the manager trusts"): the policy's own class, shipped in
    kvtier, declares ``checks_shared_victims`` (a subclass, or a user's class, does not
    inherit it). The caller also requires that the policy shares the manager's held state."""
    cls = type(policy)
    module = cls.__module__ or ""
    return (vars(cls).get("checks_shared_victims") is True
            and (module == "kvtier" or module.startswith("kvtier.")))


class OffloadingManager:
    """Bookkeeping of an offloaded KV-cache tier of ``num_blocks`` slots.

    Args:
        num_blocks: capacity of the tier, in blocks (>= 1). Slot ids are ``0..num_blocks-1``.
        policy: a registered policy name (see :func:`kvtier.policies.available_policies`) or a
            :class:`~kvtier.policies.CachePolicy` subclass; it is instantiated with
            ``num_blocks``.
        enable_events: record :class:`~kvtier.types.OffloadingEvent` s for
            :meth:`take_events`.
        store_threshold: admission. With ``N >= 2``, :meth:`prepare_store` skips keys looked
            up fewer than ``N`` times (lookups counted by :meth:`lookup` and
            :meth:`lookup_prefix`). ``1`` admits everything.
        max_tracker_size: how many keys the admission tracker remembers (an LRU of lookup
            counts); only used when ``store_threshold >= 2``.
        admission: ``"all"`` (default: every new block is stored, unless ``store_threshold``
            says otherwise) or ``"adaptive"``: :class:`~kvtier.admission_adaptive.
            DuelingAdmission` learns online whether to store every new block or only those
            seen before, and :meth:`prepare_store` stores the leading keys it admits (never a
            block after one it refused in the same call); or ``"tinylfu"``:
            :class:`~kvtier.admission_tinylfu.TinyLFUAdmission` (a frequency sketch with a
            doorkeeper; a new block is stored when its estimate beats the recent victims'
            mean; Einziger, Friedman and Manes, ACM ToS 2017), also prefix-closed. Cannot be combined with
            ``store_threshold >= 2``. Figures: docs/policies.md, "Admission".
        max_open_requests: request mode's memory cap: at most this many requests open at
            once (>= 1). Opening one more first finishes the oldest open request early (its
            use applied as by :meth:`on_request_finished`); a later finish of that context
            is ignored and counted (``stats().late_finishes``), for the last
            ``max_open_requests`` contexts finished early.

    Raises:
        ValueError: a non-positive size, threshold or ``max_open_requests``, an unknown
            policy or admission name, ``admission`` other than ``"all"`` together with
            ``store_threshold >= 2``, or ``enable_events`` not a bool.
        TypeError: ``policy`` is neither a name nor a CachePolicy subclass.

    Example::

        m = OffloadingManager(1024, policy="arc")
        out = m.prepare_store(["h0", "h1"])        # slots to write the blocks to
        m.complete_store(out.keys_to_store)        # writes done: blocks readable
        n = m.lookup_prefix(["h0", "h1", "h2"])    # -> 2
        slots = m.prepare_load(["h0", "h1"])       # pinned while we read them
        m.complete_load(["h0", "h1"])
    """

    def __init__(
        self,
        num_blocks: int,
        policy: str | type[CachePolicy] = "lru",
        *,
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        admission: str = "all",
        max_open_requests: int = 4096,
    ) -> None:
        num_blocks = check_positive_int("num_blocks", num_blocks, "blocks")
        max_open_requests = check_positive_int("max_open_requests", max_open_requests,
                                               "requests")
        if num_blocks > MAX_BLOCKS:
            raise ValueError(f"num_blocks must be at most {MAX_BLOCKS}, got {num_blocks}")
        store_threshold = check_positive_int("store_threshold", store_threshold, "lookups")
        max_tracker_size = check_positive_int("max_tracker_size", max_tracker_size, "keys")
        enable_events = check_bool("enable_events", enable_events)  # "no" would read as true
        if not isinstance(admission, str) or admission not in ADMISSION_MODES:
            # named first: with store_threshold >= 2 an unknown name was reported as a rule
            # that cannot be combined ("admission='adaptve' cannot be combined with ...")
            raise ValueError(f"unknown admission {admission!r}; expected one of "
                             f"{', '.join(ADMISSION_MODES)}")
        if admission != "all" and store_threshold >= 2:
            raise ValueError(
                f"admission={admission!r} cannot be combined with store_threshold="
                f"{store_threshold} (choose one admission rule)"
            )
        if isinstance(policy, str):
            policy_cls = get_policy(policy)
        elif isinstance(policy, type) and issubclass(policy, CachePolicy):
            policy_cls = policy
        else:
            raise TypeError(
                f"policy must be a registered name or a CachePolicy subclass, got {policy!r}"
            )
        self._num_blocks = num_blocks  # read through the class property num_blocks
        self.policy: CachePolicy = policy_cls(num_blocks)
        # the admission object, or None when every new block is stored (no per-call hooks)
        self.admission = make_admission(admission, num_blocks, policy_cls)
        self._admission_mode = admission  # read-only properties, as num_blocks (below)
        self._on_evict = getattr(self.admission, "evicted", None)
        # errors name the policy as the caller did: a class registered under two names has
        # one class ``name``
        self._policy_name = (policy if isinstance(policy, str)
                             else policy_cls.name or policy_cls.__name__)
        # optional hooks the policy does not override are not called at all
        self._insert = self.policy.insert if _overrides(self.policy, "insert") else None
        self._on_store = self.policy.on_store if _overrides(self.policy, "on_store") else None
        self._enable_events = enable_events  # read through the class property enable_events
        self._store_threshold = store_threshold
        self._max_tracker_size = max_tracker_size
        # request mode's ghost learning: touch, unless the policy has a cheaper hook for keys
        # none of which is resident (ARC: spec replay, docs/performance.md, "Request mode,
        # round 6")
        store_miss = (self.policy.on_store_miss if _overrides(self.policy, "on_store_miss")
                      else self.policy.touch)
        self._req_log = _RequestLog(max_open_requests, store_miss)
        self._init_state()

    def _set_num_blocks(self, value: Any) -> None:
        raise AttributeError(
            f"num_blocks is fixed at construction ({self._num_blocks} blocks): the slots, the "
            f"policy and the admission are sized by it; build a new manager for {value!r}"
        )

    # read-only: a user who set it broke the free-slot count and the slot ids. A property on
    # the class, no instance attribute more (_num_blocks replaces the former plain
    # num_blocks); its getter is C (attrgetter, no Python frame), and the manager's own paths
    # read _num_blocks (through the property, replay lru 16000 W=32 cost 6,970 -> 7,002
    # instructions per block reference: docs/performance.md, "num_blocks read-only")
    num_blocks = property(attrgetter("_num_blocks"), _set_num_blocks,
                          doc="The tier's capacity in blocks (read-only).")

    def _set_enable_events(self, value: Any) -> None:
        self._enable_events = check_bool("enable_events", value)  # "no" would read as true

    # checked as the constructor checks it ("no" was taken as true, and read back "no"); a
    # property on the class over _enable_events, no instance attribute more; the manager's
    # own paths read _enable_events (see num_blocks)
    enable_events = property(attrgetter("_enable_events"), _set_enable_events,
                             doc="Record events for :meth:`take_events` (a bool; setting "
                                 "anything else raises ValueError, nothing changed).")

    def _set_admission_rule(self, value: Any, name: str = "") -> None:
        raise AttributeError(
            f"{name} is fixed at construction (admission={self._admission_mode!r}, "
            f"store_threshold={self._store_threshold}, max_tracker_size="
            f"{self._max_tracker_size}): the admission and its tracker are built from them "
            "and checked together; build a new manager for another rule"
        )

    # read-only (newcomer finding): as plain attributes, a new value was taken unchecked and
    # only read by the next reset_cache(), which then built a tracker beside an adaptive
    # admission (refused by the constructor) or raised a bare TypeError for "2". Read only
    # by _init_state, so the properties cost the hot paths nothing
    store_threshold = property(
        attrgetter("_store_threshold"),
        lambda self, value: self._set_admission_rule(value, "store_threshold"),
        doc="Lookups a key needs before it is stored (``1``: every key; read-only).")
    max_tracker_size = property(
        attrgetter("_max_tracker_size"),
        lambda self, value: self._set_admission_rule(value, "max_tracker_size"),
        doc="Keys the ``store_threshold`` tracker remembers (read-only).")
    admission_mode = property(
        attrgetter("_admission_mode"),
        lambda self, value: self._set_admission_rule(value, "admission_mode"),
        doc="The ``admission`` argument: ``\"all\"``, ``\"adaptive\"`` or ``\"tinylfu\"`` "
            "(read-only).")

    @property
    def max_open_requests(self) -> int:
        """Request mode's cap on open requests (see the class docstring)."""
        return self._req_log.max_open

    def _init_state(self) -> None:
        self._slot_of: dict[Hashable, int] = {}
        # pin counts (>= 1) of the pinned blocks only: a load in flight is an entry here, and
        # releasing the last pin deletes it
        self._pins: dict[Hashable, int] = {}
        self._pending_keys: set[Hashable] = set()
        # a policy that reads held blocks from these two (CachePolicy.share_held_state) is
        # not told of pins: no per-key set work of its own at insert, completion and pin
        # (spec replay, docs/performance.md, "Request mode, round 6")
        policy = self.policy
        shared = bool(policy.share_held_state(self._pending_keys, self._pins))
        self._on_pin = None if shared else policy.mark_non_evictable
        self._slots = SlotAllocator(self._num_blocks)
        self._evictable = 0
        self._hits = 0
        self._pending_hits = 0
        self._misses = 0
        # no counter of stores: every block prepare_store allocated is pending, completed or
        # failed, so stats() sums those (one counter update less per store: one-key ARC
        # store + complete 20,760 -> 20,458, docs/performance.md, "ARC hot paths", third round)
        self._completed_stores = 0
        self._failed_stores = 0
        self._skipped_stores = 0
        self._evictions = 0
        self._loads = 0
        self._events: list[OffloadingEvent] = []
        # request mode: open requests, oldest first; the rest in the log
        self._requests: dict[Hashable, _Request] = {}
        # a sharing policy of kvtier's that checks its victims against the shared state
        # itself (ARC) is not checked twice: vLLM spec replay, first 1,000 requests, -259 /
        # -77 instructions per block reference at 4,000 / 16,000 blocks (docs/performance.md,
        # "Request mode, round 8")
        self._req_log = _RequestLog(self._req_log.max_open, self._req_log.store_miss,
                                    shared and _trusts_victims(policy))
        self._tracker: AdmissionTracker | None = (
            AdmissionTracker(self._store_threshold, self._max_tracker_size)
            if self._store_threshold >= 2
            else None
        )
        if self.admission is not None:
            self.admission.clear()

    def _victim_slots(
        self, victims: Any, n: int, protected: Collection[Hashable]
    ) -> list[int]:
        """Check what the policy's ``evict(n, protected)`` returned and take the victims out
        of the key -> slot map; return their slots. O(n).

        Raises:
            PolicyError: not a list of ``n`` distinct resident keys that are evictable
                (neither pending nor pinned; not checked for a policy the manager trusts,
                see _trusts_victims) and not protected. The manager is unchanged.
        """
        if type(victims) is not list or len(victims) != n:
            count = len(victims) if isinstance(victims, list) else type(victims).__name__
            raise self._policy_error(f"evict({n}) returned {count} victims, not a list of {n}")
        slot_of = self._slot_of
        slots: list[int] = []
        try:
            if not self._req_log.trusted:
                pending, pins = self._pending_keys, self._pins
                if pending and not pending.isdisjoint(victims):
                    # filters, no generator expressions: see _CELLS
                    key = next(filter(pending.__contains__, victims))
                    raise self._policy_error(
                        f"evict({n}) chose block {key!r}, whose store is pending")
                if pins and not pins.keys().isdisjoint(victims):
                    key = next(filter(pins.__contains__, victims))
                    raise self._policy_error(f"evict({n}) chose block {key!r}, which is pinned")
            if protected and any(map(protected.__contains__, victims)):
                key = next(filter(protected.__contains__, victims))
                raise self._policy_error(f"evict({n}) chose block {key!r}, which is protected")
            # C-level pops: a victim not stored or named twice stops them at a KeyError, an
            # unhashable one at a TypeError, with the slots popped so far in slots
            # (list.extend keeps them), put back below. (It was list(map(pop, victims,
            # repeat(None))) and a length test, which lost the slots popped before an
            # unhashable victim when nothing was pending, pinned or protected.)
            slots.extend(map(slot_of.pop, victims))
        except (TypeError, KeyError) as error:
            for key, slot in zip(victims, slots, strict=False):  # the slots popped so far
                slot_of[key] = slot
            raise self._bad_victims(victims, n, error) from None
        return slots

    def _bad_victims(self, victims: list, n: int, error: Exception) -> PolicyError:
        """The PolicyError for victims whose slot pops failed with ``error`` (the manager
        put back what was popped): an unhashable, repeated or unknown key."""
        if isinstance(error, TypeError):
            return self._policy_error(f"evict({n}) returned an unhashable key")
        seen: set[Hashable] = set()
        for key in victims:
            if key in seen:
                return self._policy_error(f"evict({n}) returned block {key!r} twice")
            seen.add(key)
            if key not in self._slot_of:
                return self._policy_error(f"evict({n}) chose block {key!r}, not stored")
        # a KeyError raised by a key's own __hash__ or __eq__
        return self._policy_error(f"evict({n}) returned a key whose lookup raised {error!r}")

    def _stores(self) -> int:
        """Blocks allocated by prepare_store since the last reset: pending, completed or
        failed (see _init_state)."""
        return self._completed_stores + self._failed_stores + len(self._pending_keys)

    def _policy_error(self, rule: str) -> PolicyError:
        """The PolicyError for an answer of the policy's ``evict`` that breaks ``rule``. Every
        one comes from prepare_store's check of the victims, after the admission answered
        for the call: prepare_store's handler for any exception out of the policy takes
        the admission's answer back (_HOOK_ERRORS), so the error leaves the manager as it
        was."""
        return PolicyError(
            self._policy_name,
            f"{type(self.policy).__name__}.{rule}; the manager is unchanged, the policy's "
            "state may not be (reset_cache() or a new manager)",
        )

    # -- lookups -------------------------------------------------------------------------
    def lookup(self, key: Hashable, req_context: Any = None) -> LookupResult:
        """Is block ``key`` in the tier? O(1).

        Returns:
            ``MISS``, ``HIT`` (readable) or ``HIT_PENDING`` (its store is in flight).

        Raises:
            TypeError: ``key`` is not hashable.
        """
        try:
            if self._tracker is not None:
                self._tracker.record((key,))  # hashes the key before counting it
            if self.admission is not None:  # hashes the key before counting it
                self.admission.record((key,), len(self._slot_of) - self._evictable,
                                      len(self._pending_keys))
            stored = key in self._slot_of
        except TypeError:
            raise unhashable_error((key,), "lookup") from None
        if not stored:
            self._misses += 1
            return _MISS
        if key in self._pending_keys:
            self._pending_hits += 1
            return _HIT_PENDING
        self._hits += 1
        return _HIT

    def lookup_prefix(self, keys: Sequence[Hashable], req_context: Any = None) -> int:
        """Number of leading ``keys`` that are HIT, stopping at the first MISS or HIT_PENDING.

        Each examined key counts as one lookup in :meth:`stats`; for admission every key of
        ``keys`` counts as looked up (the caller asked about the whole prefix).

        Raises:
            TypeError: an examined key is not hashable (nothing is counted). Keys after the
                first MISS or HIT_PENDING are not examined, so not checked, unless admission
                is on: ``store_threshold >= 2`` and ``admission="tinylfu"`` count every key,
                so hash every key first; ``"adaptive"`` hashes every key, or only a sample
                of them while admit-all leads by far.
            whatever a key's own ``__hash__`` raises besides ``TypeError``, unchanged (nothing
                is counted either).
        """
        if type(keys) is not list and type(keys) is not tuple:
            keys = key_list(keys, "lookup_prefix")
        slot_of = self._slot_of
        pending = self._pending_keys
        hits = 0
        if self._tracker is not None:
            try:
                self._tracker.record(keys)  # validates every key before counting anything
            except TypeError:
                raise unhashable_error(keys, "lookup_prefix") from None
        try:
            for key in keys:
                if key not in slot_of:
                    self._misses += 1
                    break
                if key in pending:
                    self._pending_hits += 1
                    break
                hits += 1
            # after the loop: adaptive admission may hash only a sample of the keys, so the
            # keys the loop examines are checked before it counts anything
            if self.admission is not None:  # validates the keys it hashes before counting
                self.admission.record(keys, len(slot_of) - self._evictable, len(pending))
        except TypeError:
            self._uncount_prefix_end(keys, hits)
            raise unhashable_error(keys, "lookup_prefix") from None
        except Exception:  # a key's own __hash__ raised something else: raised as it is,
            self._uncount_prefix_end(keys, hits)  # counted nothing either (the admission
            raise  # hashes before it counts; it left the prefix's miss counted)
        self._hits += hits
        return hits

    def _uncount_prefix_end(self, keys: Sequence[Hashable], hits: int) -> None:
        """lookup_prefix's error path: when the admission raised after the loop had counted
        the key that ended the prefix (a MISS or HIT_PENDING at ``keys[hits]``), take that
        count back; when the loop itself raised, it counted nothing."""
        if hits >= len(keys):
            return
        key = keys[hits]
        try:
            stored = key in self._slot_of
        except Exception:  # the loop raised here (TypeError, or whatever the key's own
            return  # __hash__ raises): nothing was counted
        if not stored:
            self._misses -= 1
        else:
            self._pending_hits -= 1

    # -- loads ---------------------------------------------------------------------------
    def _slots_of(self, keys: Sequence[Hashable], method: str) -> list[int]:
        """Slots of ``keys``, or the error naming the first key that is not stored."""
        slot_of = self._slot_of
        try:
            return list(map(slot_of.__getitem__, keys))  # C-level loop: no comprehension frame
        except KeyError:
            key = next(filterfalse(slot_of.__contains__, keys))  # not a genexp: see _CELLS
            raise BlockStateError(key, f"{method}: block is not stored in the tier") from None
        except TypeError:
            raise unhashable_error(keys, method) from None

    def prepare_load(self, keys: Sequence[Hashable], req_context: Any = None) -> list[int]:
        """Pin ready blocks for reading: ref count +1 each. O(len(keys)).

        A key may appear several times (and be loaded by several requests at once); each
        occurrence takes one pin and needs one :meth:`complete_load`.

        Returns:
            The slot id of each key, in order.

        Raises:
            BlockStateError: a key is not stored, or its store is still in flight. Nothing
                is pinned then.
            TypeError: a key is not hashable.
            whatever the policy's ``mark_non_evictable`` raises (a policy that does not
                share the manager's held state is told of new pins): the manager takes the
                pins back and is exactly as before the call.
        """
        if type(keys) is not list and type(keys) is not tuple:
            keys = key_list(keys, "prepare_load")
        pins = self._pins
        if len(keys) == 1:  # fast path; anything unusual falls through to the checks below
            key = keys[0]
            slot = self._slot_of.get(key) if type(key) in _PLAIN_KEY_TYPES else None
            if slot is not None and key not in self._pending_keys:
                count = pins.get(key, 0)
                if count == 0:
                    if self._on_pin is not None:  # first: if the policy's hook raises,
                        self._on_pin(keys)        # nothing changed (no try: see below)
                    self._evictable -= 1
                pins[key] = count + 1
                self._loads += 1
                if req_context is not None and self._requests:  # request mode only
                    self._record_load(req_context, keys)
                return [slot]
        try:  # _slots_of's usual case spelled out (_FRAMES); it names the bad key
            slots = list(map(self._slot_of.__getitem__, keys))
        except (KeyError, TypeError):
            slots = self._slots_of(keys, "prepare_load")  # raises
        pending = self._pending_keys
        if pending and not pending.isdisjoint(keys):
            key = next(filter(pending.__contains__, keys))  # not a genexp: see _CELLS
            raise BlockStateError(
                key, "prepare_load: block's store is still in flight (HIT_PENDING)"
            )
        # the usual load names each block once: one pin each, written in C; the few blocks
        # other loads already pin (e.g. the head of a shared prompt) get their count + 1
        new_counts = dict.fromkeys(keys, 1)
        newly_pinned: Sequence[Hashable]
        if len(new_counts) == len(keys):
            # no set built when no key is pinned yet (isdisjoint walks the smaller side; vLLM
            # spec replay, docs/performance.md, "Request mode, round 9")
            if pins and not pins.keys().isdisjoint(new_counts.keys()):
                already = pins.keys() & new_counts.keys()
                for key in already:
                    new_counts[key] = pins[key] + 1
                newly_pinned = list(filterfalse(already.__contains__, keys))
            else:
                newly_pinned = keys
        else:  # a key named several times: one pin per occurrence
            newly_pinned = []
            new_counts = {}
            for key in keys:
                count = new_counts.get(key)
                if count is None:  # its first occurrence here
                    count = pins.get(key, 0)
                    if count == 0:
                        newly_pinned.append(key)
                new_counts[key] = count + 1
        if newly_pinned:
            # the policy's hook first: if it raises, nothing changed (the pins are written
            # below; a try here costs a NOP and a jump on every load: explicit op load LRU
            # 9,716 -> 9,741 instructions, benchmarks/instr_count.py)
            if self._on_pin is not None:
                self._on_pin(newly_pinned)
            self._evictable -= len(newly_pinned)
        pins.update(new_counts)
        self._loads += len(slots)
        if req_context is not None and self._requests:  # request mode only
            try:  # the open request, if any (see _record_load)
                rec = self._requests.get(req_context)
            except TypeError:
                rec = None
            if rec is not None:
                if (rec.keys or rec.inserted or rec.merged
                        or len(keys) > self._num_blocks):
                    self._record_load(req_context, keys)
                else:  # the request's first load, nothing stored yet: _record_load spelled
                    # out (one Python frame less per load; vLLM spec replay,
                    # docs/performance.md, "Request mode, round 9")
                    rec.keys = dict.fromkeys(keys)
                    rec.reused = rec.keys.keys()
        return slots

    def complete_load(self, keys: Sequence[Hashable], req_context: Any = None) -> None:
        """Release one pin per key (ref count -1); a block at 0 becomes evictable again.

        Releasing a pin moves nothing: a block that becomes evictable is eligible at its
        logical place (recency changes only on a use: store, touch, finished request).

        Raises:
            BlockStateError: a key is not stored, is pending, or is released more times than
                it was pinned. Nothing is released then.
            TypeError: a key is not hashable.
            whatever the policy's ``mark_evictable`` raises, unchanged: every pin is back,
                the manager as before the call (the policy's own state may not be).
        """
        if type(keys) is not list and type(keys) is not tuple:
            keys = key_collection(keys, "complete_load")  # a set is taken (vLLM passes one)
        pins = self._pins
        if len(keys) == 1:  # fast path; anything unusual falls through to the checks below
            key = keys[0]
            count = pins.get(key, 0) if type(key) in _PLAIN_KEY_TYPES else 0
            if count > 1:
                pins[key] = count - 1
                return
            if count == 1:
                del pins[key]
                self._evictable += 1
                try:
                    self.policy.mark_evictable(keys)
                except BaseException:  # pinned again, as before the call (_HOOK_ERRORS)
                    pins[key] = 1
                    self._evictable -= 1
                    raise
                else:  # (an else that returns: no jump past the handler, _HOOK_ERRORS)
                    return
        # the usual release names each pinned block once: take each count out, put back the
        # blocks other loads still pin; anything else (a key not pinned, or named twice) puts
        # everything back and is checked key by key. No residency pass first: a pinned key
        # is stored (vLLM spec replay, docs/performance.md, "Request mode, round 9")
        before = len(pins)
        counts: list[int] = []
        try:  # list.extend keeps the counts popped before an unhashable key
            counts.extend(map(pins.pop, keys, repeat(0)))  # not a comprehension: see _CELLS
        except TypeError:  # the counts popped before the unhashable key: fewer than keys
            pins.update(item for item in zip(keys, counts, strict=False) if item[1])
            self._slots_of(keys, "complete_load")  # raises (names the first bad key)
            raise
        if before - len(pins) == len(keys):
            if counts.count(1) == len(keys):  # every pin released was its block's last
                freed_keys = keys
            else:
                freed_keys = []
                # (equal lengths: every key's count was popped; no strict=True, see the
                # store's zip in prepare_store)
                for key, count in zip(keys, counts):
                    if count > 1:
                        pins[key] = count - 1
                    else:
                        freed_keys.append(key)
        else:
            pins.update(item for item in zip(keys, counts, strict=True) if item[1])
            try:  # every key stored and hashable (_slots_of spelled out, _FRAMES)
                list(map(self._slot_of.__getitem__, keys))
            except (KeyError, TypeError):
                self._slots_of(keys, "complete_load")  # raises
            for key in keys:
                if key not in pins:  # pending, or ready and not pinned
                    if key in self._pending_keys:
                        raise BlockStateError(
                            key, "complete_load: its store is still in flight (HIT_PENDING), "
                            "so it was never loaded (complete_load must follow prepare_load)")
                    raise BlockStateError(
                        key,
                        "complete_load: block is not pinned (ref count "
                        f"{self.ref_count(key)}; complete_load must follow prepare_load)",
                    )
            releases: dict[Hashable, int] = {}
            for key in keys:
                releases[key] = releases.get(key, 0) + 1
            for key in keys:
                if releases[key] > pins[key]:
                    raise BlockStateError(
                        key,
                        f"complete_load: released {releases[key]} times in one call but "
                        f"pinned only {pins[key]} times",
                    )
            freed_keys = []
            for key in reversed(keys):  # a key named several times is freed at its first
                count = pins[key] - 1
                if count:
                    pins[key] = count
                else:
                    del pins[key]
                    freed_keys.append(key)
            freed_keys.reverse()
        if freed_keys:
            self._evictable += len(freed_keys)
            try:
                self.policy.mark_evictable(freed_keys)
            except BaseException:  # every pin released by this call taken back (one per
                self._evictable -= len(freed_keys)  # occurrence), as before the call
                for key in keys:  # (_HOOK_ERRORS; a loop, not a comprehension: _CELLS)
                    pins[key] = pins.get(key, 0) + 1
                raise
            else:
                return

    # -- use -----------------------------------------------------------------------------
    def touch(self, keys: Sequence[Hashable], req_context: Any = None) -> None:
        """Record a use of ``keys``; ``keys[0]`` ends up most recently used.

        Keys not in the tier are passed on too (ARC learns from ghost hits).

        Raises:
            TypeError: a key is not hashable (nothing is recorded).
        """
        if type(keys) is not list and type(keys) is not tuple:
            keys = key_list(keys, "touch")
        if len(keys) > 1:  # a single key fails on its first (hashing) use: nothing changes
            try:
                hash(tuple(keys))  # hashes every key: validates them all before any change
            except TypeError:
                raise unhashable_error(keys, "touch") from None
        try:
            self.policy.touch(keys)
        except TypeError:
            raise unhashable_error(keys, "touch") from None

    # -- stores --------------------------------------------------------------------------
    def prepare_store(
        self, keys: Sequence[Hashable], req_context: Any = None
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not yet stored, evicting if it must. Atomic.

        Keys already stored (ready or pending) are left alone; a key repeated in the call is
        stored once; with admission (``store_threshold >= 2``) keys looked up fewer than the
        threshold are skipped. If the free slots do not suffice, exactly the shortfall is
        evicted by the policy — never a pinned block, a pending block, or any key named in
        this call. New blocks are pending until :meth:`complete_store`.

        Returns:
            A :class:`~kvtier.types.PrepareStoreOutput` (empty when there is nothing to
            store), or ``None`` when not enough blocks can be evicted; then *nothing* changed:
            policy order, ghost lists, adaptive target, counters, free list, admission.

        Raises:
            TypeError: a key is not hashable (nothing changed).
            PolicyError: the policy's ``evict`` broke its contract (wrong count, a repeated,
                unknown, pending, pinned or protected key); nothing in the manager changed.
            whatever the policy raises (``evict``, ``count_eligible``, request mode's
                ``touch`` / ``on_store_miss``, ``insert``, ``on_store``), unchanged: the
                manager is as before the call, except that blocks evicted before a raising
                ``insert`` / ``on_store`` stay evicted (counted, and reported by an event);
                the new blocks are not stored and the admission takes back its answer. The
                policy's own state is as the raising hook left it (docs/manager.md, "The
                rules").
        """
        if type(keys) is not list and type(keys) is not tuple:
            keys = key_list(keys, "prepare_store")
        slot_of = self._slot_of
        if (
            len(keys) == 1
            and self._tracker is None
            and self._on_evict is None
            and (req_context is None or not self._requests)  # explicit mode: one cheap test
        ):
            # one key, no tracker, no admission that learns from victims: the same steps
            # with fewer checks. In a full tier every slot is used (the free list is empty)
            # and the victim's slot is the new block's, as the general path's free list
            # would give it; a tier with a free slot evicts nothing.
            key = keys[0]
            try:
                stored = key in slot_of
            except TypeError:
                raise unhashable_error(keys, "prepare_store") from None
            if stored:
                if self._on_store is not None:
                    self._on_store(keys)
                return _output(([], [], []))
            admission = self.admission
            if admission is not None and not admission.admit(
                keys, self._num_blocks - len(slot_of) + self._evictable
            ):  # (adaptive admission; one-key stores take this path: docs/performance.md)
                if self._on_store is not None:  # first: if it raises, nothing changed (a
                    self._on_store(keys)        # refusal changes nothing in DuelingAdmission)
                self._skipped_stores += 1
                return _output(([], [], []))
            # whatever the policy raises from here on (evict, insert, on_store, or the
            # PolicyError of a bad answer) is caught once, below, to take back this call's
            # changes (_HOOK_ERRORS)
            try:
                evicted_keys: list[Hashable]
                if len(slot_of) < self._num_blocks:
                    first_fresh = self._slots.next_fresh  # (for _unstore)
                    slot = self._slots.take_one()
                    evicted_keys = []
                else:
                    if not self._evictable:
                        return self._no_room()  # fast fail: the policy is not asked
                    # the manager's evictable count is exact and nothing is protected, so
                    # the policy's recount (CachePolicy.evict) is skipped
                    # (docs/performance.md)
                    victims = self.policy._evict(1, ())
                    # the check of what the policy returned, in its cheap form for one
                    # victim (try costs nothing when nothing is raised; docs/performance.md)
                    try:
                        if victims.__class__ is not list:
                            raise TypeError
                        (victim,) = victims
                        slot = slot_of.pop(victim)
                    except (TypeError, ValueError, KeyError):
                        slot = self._victim_slots(victims, 1, ())[0]  # raises PolicyError
                    if victim in self._pending_keys or victim in self._pins:
                        slot_of[victim] = slot  # (checked for every policy, trusted or not)
                        raise self._policy_error(
                            f"evict(1) chose block {victim!r}, "
                            + ("whose store is pending" if victim in self._pending_keys
                               else "which is pinned"))
                    evicted_keys = victims
                    self._evictable -= 1
                    self._evictions += 1
                    if self._enable_events:
                        self._events.append(OffloadingEvent(tuple(victims), True))
                slot_of[key] = slot
                self._pending_keys.add(key)
                if self._insert is not None:
                    self._insert(keys)
                if self._on_store is not None:
                    self._on_store(keys)
                return _output(([key], [slot], evicted_keys))
            except BaseException:
                if key in slot_of:  # stored, then insert or on_store raised: the victim's
                    # slot (its eviction stands) or the slot taken goes back
                    self._unstore(keys, [slot], self._slots.next_fresh if evicted_keys
                                  else first_fresh)
                self._no_room()
                raise
        # request mode: the open request's record, else None (explicit mode; a context that
        # is not hashable is ignored); a dict lookup here, not a helper's frame (_FRAMES)
        rec = None
        if req_context is not None and self._requests:
            try:
                rec = self._requests.get(req_context)
            except TypeError:  # not hashable: explicit mode, the context is ignored
                pass
        try:
            # the usual offer names no stored key: one C-level disjointness pass and a copy,
            # not a filter calling __contains__ per key (spec replay -124 with prepare_load's
            # first record, docs/performance.md, "Request mode, round 5 (manager and
            # adapter)"); isdisjoint stops at the first stored key
            if slot_of.keys().isdisjoint(keys):
                new_keys = list(keys)
            else:
                new_keys = list(filterfalse(slot_of.__contains__, keys))  # in order
        except TypeError:
            raise unhashable_error(keys, "prepare_store") from None
        num_resident = len(keys) - len(new_keys)  # occurrences of keys already stored
        # a key named twice is stored once; request mode records this set as is (one
        # hash-table build per key, not two; with the other request-record changes, the
        # manager's own part of the spec's prepare_store 4,464 -> 3,204 per block reference:
        # docs/performance.md, "Request mode, round 3"). A set, not a dict.fromkeys (the
        # request's order is new_keys itself): ~60 % of its instructions, a list is not
        # presized for fromkeys (vLLM spec replay, "Request mode, round 8")
        fresh = None
        if len(new_keys) > 1:
            fresh = set(new_keys)
            if len(fresh) != len(new_keys):
                new_keys = list(dict.fromkeys(new_keys))
        skipped = 0
        tracker = self._tracker
        if tracker is not None and new_keys:
            admitted = tracker.admit(new_keys)
            skipped = len(new_keys) - len(admitted)
            new_keys = admitted
            fresh = None
        elif self.admission is not None and new_keys:
            room = self._num_blocks - len(slot_of) + self._evictable
            admitted_count = self.admission.admit(new_keys, room)  # leading keys only
            if admitted_count < len(new_keys):
                skipped = len(new_keys) - admitted_count
                new_keys = new_keys[:admitted_count]
            fresh = None
        all_recorded = lazy = False
        if rec is not None:
            # vLLM's order: the call's admitted new keys and ready keys are recorded before
            # any early return (a failed store still records them); inserted only below.
            # Any other offer is recorded once the policy's hooks are done (an exception
            # from one leaves the record as it was, _HOOK_ERRORS): the usual one (lazy) and
            # the others at their insert below, or by _record_offer / _record_unstored when
            # the store fails.
            # The usual offer (nothing stored yet, every new key fits under the cap) is
            # _record_store + _add_keys spelled out (_FRAMES)
            rkeys, inserted = rec.keys, rec.inserted
            room = self._num_blocks - len(rkeys) - (0 if rec.merged else len(inserted))
            if not num_resident and len(new_keys) <= room:
                if fresh is None:
                    fresh = set(new_keys)
                if (not rec.merged and (not rkeys or rkeys.keys().isdisjoint(fresh))
                        and (not inserted or inserted.isdisjoint(fresh))):
                    # the usual store: recorded in inserted below, not in keys too (see
                    # _Request; isdisjoint walks the smaller side; vLLM spec replay -206 per
                    # block reference, docs/performance.md, "Request mode, round 7")
                    lazy = True
                all_recorded = True
        # whatever the policy raises from here on (count_eligible, the ghost-learning touch /
        # on_store_miss, evict, insert, on_store, or the PolicyError of a bad answer) is
        # caught once, below, to take back this call's changes (_HOOK_ERRORS)
        try:
            if not new_keys:
                if self._on_store is not None:  # first: if it raises, nothing changed
                    self._on_store(keys)
                if rec is not None and num_resident:  # its ready keys
                    rec.merge()
                    self._record_store(rec, keys, new_keys, num_resident)
                self._skipped_stores += skipped
                return _output(([], [], []))

            num_new = len(new_keys)
            shortfall = num_new - (self._num_blocks - len(slot_of))
            evicted_keys = []
            if shortfall > 0:
                if shortfall > self._evictable:
                    if lazy:  # a failed store records its new keys, not inserted
                        self._record_unstored(rec, new_keys)
                    elif rec is not None:
                        self._record_offer(rec, keys, new_keys, num_resident)
                    return self._no_room()  # fast fail: the policy is not asked
                # only the call's keys that are already stored can be victims, so only they
                # are passed as protected; usually there are none
                # (a set, not a list: membership by hash, never `==` between keys of
                # different types, e.g. numpy's int == a tuple returns an array whose truth
                # value raises)
                if num_resident == 0:
                    protected: Collection[Hashable] = ()
                else:
                    protected = set(filter(slot_of.__contains__, keys))  # see _CELLS
                if rec is not None:
                    # request mode: ghost learning (a touch of the new keys) must come before
                    # the eviction, as vLLM's on_store_miss, and only when the store will
                    # succeed
                    if protected:
                        protected = protected_set(protected)
                        if self.policy.count_eligible(protected) < shortfall:
                            if lazy:
                                self._record_unstored(rec, new_keys)
                            else:
                                self._record_offer(rec, keys, new_keys, num_resident)
                            return self._no_room()
                    if rec.inserted:
                        self._learn_misses(rec, new_keys)
                    else:  # nothing used for ghost learning yet: all of them (_FRAMES)
                        self._req_log.store_miss(new_keys)
                    victims = self.policy._evict(shortfall, protected)
                    # SlotAllocator.release spelled out (_FRAMES)
                    self._slots.free.extend(self._victim_slots(victims, shortfall, protected))
                else:
                    if protected:
                        victims = self.policy.evict(shortfall, protected)
                        if victims is None:
                            return self._no_room()
                    else:  # the manager's count is exact: no recount (see the one-key path)
                        victims = self.policy._evict(shortfall, ())
                    self._slots.free.extend(self._victim_slots(victims, shortfall, protected))
                evicted_keys = victims
                if self._on_evict is not None:  # TinyLFU admission learns the victims'
                    self._on_evict(victims)     # frequency
                self._evictable -= shortfall
                self._evictions += shortfall
                if self._enable_events:
                    self._events.append(OffloadingEvent(tuple(victims), True))
            elif rec is not None:
                if rec.inserted:
                    self._learn_misses(rec, new_keys)
                else:
                    self._req_log.store_miss(new_keys)

            slots = self._slots
            # (first_fresh: for _unstore)
            if (first_fresh := slots.next_fresh) == self._num_blocks:  # every slot used once:
                free = slots.free  # SlotAllocator.take spelled out for this case (_FRAMES)
                block_ids = free[-num_new:]
                block_ids.reverse()
                del free[-num_new:]
            else:
                block_ids = slots.take(num_new)
            if num_new == 1:
                slot_of[new_keys[0]] = block_ids[0]
                self._pending_keys.add(new_keys[0])
            else:
                # equal lengths (block_ids taken for new_keys); no strict=True: a keyword
                # argument makes zip parse its keywords at every store
                slot_of.update(zip(new_keys, block_ids))
                self._pending_keys.update(new_keys)
            if self._insert is not None:
                self._insert(new_keys)
            if self._on_store is not None:
                self._on_store(keys)
            if rec is not None:
                # every new key was recorded (the usual case): no membership pass
                # (request-mode records, docs/performance.md, "Request mode, round 3"); else
                # C-level filter
                if lazy:  # the new keys' set is the record of them, their order a copy of
                    if rec.inserted:  # the list (new_keys is the caller's: see _Request)
                        rec.inserted.update(fresh)
                        rec.order += new_keys
                    else:
                        rec.inserted = fresh
                        rec.order = new_keys[:]
                else:
                    # the offer, recorded now that no hook can raise: _record_offer spelled
                    # out, its usual case (every new key fits, none stored) without
                    # _record_store's frames (_FRAMES)
                    rec.merge()
                    if (not num_resident
                            and len(new_keys) <= self._num_blocks - len(rec.keys)):
                        if rec.keys:
                            rec.keys.update(dict.fromkeys(new_keys))
                        else:  # the request's first keys
                            rec.keys = dict.fromkeys(new_keys)
                    else:
                        all_recorded = self._record_store(rec, keys, new_keys,
                                                          num_resident)
                    if all_recorded:
                        # from the new keys' set when there is one (the same keys): an
                        # update from a set is sized once and reuses its hashes (spec
                        # replay, docs/performance.md, "Request mode, round 6")
                        rec.inserted.update(new_keys if fresh is None else fresh)
                    else:
                        rec.inserted.update(filter(rec.keys.__contains__, new_keys))
            self._skipped_stores += skipped
            return _output((new_keys, block_ids, evicted_keys))
        except BaseException:
            freed = None
            if new_keys and new_keys[0] in slot_of:  # stored, then insert or on_store
                # raised: the new blocks go (the evictions stand)
                self._unstore(new_keys, block_ids, first_fresh)
                freed = evicted_keys
            if self.admission is not None and (new_keys or skipped):  # it answered
                self.admission.undo_admit(len(new_keys))
                if freed:  # the victims' slots are free now: TinyLFU counts them so, as
                    released = getattr(self.admission, "released", None)  # complete_store's
                    if released is not None:  # failed stores'
                        released(freed)
            raise

    def _record_offer(
        self, rec: _Request, keys: Sequence[Hashable], new_keys: Sequence[Hashable],
        num_resident: int,
    ) -> bool:
        """Record a :meth:`prepare_store` offer that is not the usual store (see _Request)
        and that evicts: deferred until the eviction is done (or known to fail), so that a
        :class:`PolicyError` leaves the record as it was. Return whether every key of
        ``new_keys`` is now recorded (:meth:`_record_store`)."""
        rec.merge()  # its new keys recorded in keys, then inserted
        return self._record_store(rec, keys, new_keys, num_resident)

    @staticmethod
    def _record_unstored(rec: _Request, new_keys: list) -> None:
        """Record a failed store's new keys, which the call deferred to its insert (see
        _Request): seen, not inserted."""
        if rec.inserted:
            rec.merge()
        elif type(rec.reused) is not set:  # a view of keys (see _record_load): its own set
            rec.reused = set(rec.reused)
        rec.keys.update(dict.fromkeys(new_keys))

    def _no_room(self) -> None:
        """:meth:`prepare_store`'s ``None`` (not enough evictable blocks), or an exception
        out of the policy in its one-key path: the admission takes back its answer for the
        call, so that the failed store changes nothing."""
        if self.admission is not None:  # (asked whenever it is set and the call got here)
            self.admission.undo_admit()

    def _unstore(self, new_keys: Sequence[Hashable], block_ids: list[int],
                 first_fresh: int) -> None:
        """:meth:`prepare_store`'s new blocks ``new_keys``, stored in slots ``block_ids``,
        leave again (a policy hook raised after they were stored: _HOOK_ERRORS): not stored,
        not pending, and the slots free as before they were taken: the fresh ones (the
        first ``next_fresh - first_fresh`` of ``block_ids``, ``first_fresh`` being
        ``next_fresh`` before the take) fresh again, the others back on the free list in
        the order they were taken from its end (a victim's slot is among these)."""
        slot_of = self._slot_of
        for key in new_keys:
            del slot_of[key]
        self._pending_keys.difference_update(new_keys)
        slots = self._slots
        fresh = slots.next_fresh - first_fresh
        slots.next_fresh = first_fresh
        reused = block_ids[fresh:]
        reused.reverse()
        slots.free.extend(reused)

    def complete_store(
        self, keys: Sequence[Hashable], req_context: Any = None, success: bool = True
    ) -> None:
        """Finish the stores of ``keys``.

        The parameters are in vLLM's order, ``complete_store(keys, req_context, success)``;
        a bool where ``req_context`` goes is refused (``complete_store(keys, False)`` would
        otherwise read as a context and store the blocks), so pass ``success=`` by keyword.

        With ``success=True`` pending blocks become ready and evictable at the place their
        store gave them (a completion moves nothing: logical recency); with ``success=False`` they are dropped and their slots freed. Keys
        that are not pending are ignored (a store may be completed by whichever caller
        finishes first).

        Raises:
            TypeError: a key is not hashable, ``success`` is not a bool, or ``req_context``
                is a bool or ``numpy.bool_`` (nothing changed).
            whatever the policy's ``mark_evictable`` (success) or ``remove`` (failure)
                raises, unchanged: the blocks are pending again, the manager as before the
                call (the policy's own state may not be).
        """
        if req_context is not None and type(req_context).__name__ in ("bool", "bool_"):
            # bool, and numpy's bool (no bool subclass; named bool_ before numpy 2): a success
            # flag in the context's place
            raise TypeError(
                f"complete_store: req_context is {req_context!r}; the order is "
                "complete_store(keys, req_context=None, success=True) as in vLLM: pass "
                f"success={req_context!r} by keyword"
            )
        if type(keys) is not list and type(keys) is not tuple:
            keys = key_collection(keys, "complete_store")  # a set is taken (vLLM passes one)
        pending = self._pending_keys
        # fast path for one key of a type whose hashing cannot fail (a set's membership test
        # would quietly take a mutable set key for the equal frozenset)
        if len(keys) == 1 and success is True and type(key := keys[0]) in _PLAIN_KEY_TYPES:
            if key in pending:
                pending.remove(key)
                try:
                    self.policy.mark_evictable(keys)
                except BaseException:  # pending again, as before the call (_HOOK_ERRORS)
                    pending.add(key)
                    raise
                else:  # (an else that returns: no jump past the handler, _HOOK_ERRORS)
                    self._evictable += 1
                    self._completed_stores += 1
                    if self._enable_events:
                        self._events.append(OffloadingEvent((key,), False))
                    return
            return
        if type(success) is not bool:
            raise TypeError(f"complete_store: success must be a bool, got {success!r}")
        try:
            all_pending = len(keys) > 0 and pending.issuperset(keys)
            if not all_pending:  # issuperset stopped at the first key not pending
                hash(tuple(keys))  # hashes every key: validates them all before any change
        except TypeError:
            raise unhashable_error(keys, "complete_store") from None
        done: Sequence[Hashable]
        if all_pending:  # the usual call: each key is pending, and named once
            before = len(pending)
            pending.difference_update(keys)
            if before - len(pending) == len(keys):
                done = keys
            else:  # a key named several times counts at its first occurrence
                done = list(dict.fromkeys(keys))
        else:
            done = list(filter(pending.__contains__, dict.fromkeys(keys)))  # see _CELLS
            pending.difference_update(done)
        if not done:
            return
        if success:
            try:
                self.policy.mark_evictable(done)
            except BaseException:  # pending again, as before the call (_HOOK_ERRORS)
                pending.update(done)
                raise
            else:
                self._evictable += len(done)
                self._completed_stores += len(done)
                if self._enable_events:
                    self._events.append(OffloadingEvent(tuple(done), False))
                return
        try:
            self.policy.remove(done)
        except BaseException:  # pending again, as before the call (_HOOK_ERRORS)
            pending.update(done)
            raise
        else:
            slot_of = self._slot_of
            self._slots.release(list(map(slot_of.pop, done)))  # see _CELLS
            self._failed_stores += len(done)
            # an admission that counts the tier's free slots (TinyLFU) gets these back
            released = getattr(self.admission, "released", None)
            if released is not None:
                released(done)

    # -- request mode ----------------------------------------------------------------------
    def on_new_request(self, req_context: Hashable) -> None:
        """Open request ``req_context``: from now on the keys it loads (:meth:`prepare_load`)
        and names in :meth:`prepare_store` with this context are recorded, head first, until
        :meth:`on_request_finished` applies them as one use (vLLM 0.33's request-scoped
        accounting; docs/manager.md, "Request mode"). O(1).

        At the cap (``max_open_requests`` open requests) the oldest open request is first
        finished early: its use is applied now, and a later :meth:`on_request_finished` of
        its context is ignored (counted in ``stats().late_finishes``).

        Raises:
            TypeError: ``req_context`` is not hashable, or is ``None`` (which means "no
                request" to prepare_load / prepare_store); nothing changed.
            RequestStateError: ``req_context`` is already open (nothing changed).
            whatever the policy's ``on_request_finished`` raises while the cap finishes the
                oldest request early: that request stays open, ``req_context`` is not
                opened, and the manager is as before the call (the policy's own state may
                not be).
        """
        if req_context is None:  # prepare_load / prepare_store read None as "no request"
            raise TypeError(
                "on_new_request: req_context is None, which means 'no request' in "
                "prepare_load / prepare_store (explicit mode); open requests under a real "
                "context (e.g. the request id)"
            )
        try:
            is_open = req_context in self._requests
        except TypeError:
            raise TypeError(
                f"on_new_request: req_context {req_context!r} is not hashable; request "
                "mode keys its records by the context (pass e.g. the request id)"
            ) from None
        if is_open:
            raise RequestStateError(
                req_context,
                "on_new_request: request is already open (finish it with "
                "on_request_finished before opening it again)",
            )
        log = self._req_log
        early = log.early
        if len(self._requests) >= log.max_open:
            # finished, then dropped, and only then anything else changed: when the
            # policy's on_request_finished raises, the oldest request stays open and the
            # manager is as before (it was dropped first, so a later finish of it raised
            # RequestStateError)
            oldest = next(iter(self._requests))
            self._finish(self._requests[oldest])
            del self._requests[oldest]
            early.pop(req_context, None)  # the same context, a new request
            log.finished_early += 1
            early[oldest] = None
            if len(early) > log.max_open:
                del early[next(iter(early))]
        elif early:  # (empty until the cap first finishes a request early)
            early.pop(req_context, None)  # the same context, a new request
        rec = _new_record(_Request)  # no __init__ frame (see _Request)
        rec.keys = {}
        rec.inserted = set()
        rec.order = ()
        rec.reused = set()
        rec.merged = False
        self._requests[req_context] = rec

    def on_request_finished(self, req_context: Hashable) -> None:
        """Close request ``req_context`` and apply its use: one policy call,
        ``policy.on_request_finished(keys, inserted, reused)`` (see
        :meth:`kvtier.policies.CachePolicy.on_request_finished`). O(keys recorded).

        A request the ``max_open_requests`` cap already finished early is ignored (its use
        was applied then) and counted in ``stats().late_finishes``.

        Raises:
            TypeError: ``req_context`` is not hashable (nothing changed).
            RequestStateError: ``req_context`` is not open: never opened with
                :meth:`on_new_request`, or already finished (nothing changed).
            whatever the policy's ``on_request_finished`` raises: the request is closed
                all the same (its record is dropped, not counted in
                ``stats().requests_finished``; putting it back at its place among the open
                requests would cost every finish a dict operation more).
        """
        try:
            hash(req_context)  # dict.pop of an empty dict would not hash it
            rec = self._requests.pop(req_context, None)
        except TypeError:
            raise TypeError(
                f"on_request_finished: req_context {req_context!r} is not hashable (a "
                "request is opened and finished under a hashable context)"
            ) from None
        if rec is None:
            log = self._req_log
            if req_context in log.early:
                del log.early[req_context]
                log.late += 1
                return
            raise RequestStateError(
                req_context,
                "on_request_finished: request is not open (never opened with "
                "on_new_request, or already finished)",
            )
        self._finish(rec)

    def _finish(self, rec: _Request) -> None:
        """Apply a closed request's one use (vLLM's ``inserted_keys - reused_keys``); counted
        once the policy took it."""
        if rec.keys or rec.inserted:
            # the record's own sets, not frozenset copies: the record is dropped here (request
            # mode, docs/performance.md, "Request mode, round 3"); inserted - reused only when
            # they meet (rare: a key reused, then evicted and stored again by the request):
            # isdisjoint walks the smaller set, usually the few reused keys, where the
            # difference built a set of every inserted key (docs/performance.md, "Request
            # mode, round 4")
            reused, inserted = rec.reused, rec.inserted
            if reused and not reused.isdisjoint(inserted):  # (reused may be a keys view)
                inserted = inserted - reused
            # _Request.keys_in_order spelled out (_FRAMES); held places are tested for only
            # in a merged record (vLLM spec replay, ARC 16,000 W=32: 45 of 12,031 finished
            # requests are merged, each with a held place)
            if rec.merged:
                if rec.merged is _MERGED_HELD:  # places held and never recorded: dropped
                    keys = rec.recorded_keys()
                    if not keys:  # (held places only: the request recorded nothing)
                        self._req_log.finished += 1
                        return
                else:
                    keys = tuple(rec.keys)
            elif not rec.inserted:
                keys = tuple(rec.keys)
            else:
                keys = (*rec.keys, *rec.order) if rec.keys else tuple(rec.order)
            self.policy.on_request_finished(keys, inserted, reused)
        self._req_log.finished += 1

    def _add_keys(self, rec: _Request, keys: Any, fresh: dict | None = None) -> bool:
        """Record ``keys`` (validated, in order) as seen by ``rec``: first occurrence only,
        at most ``num_blocks`` distinct keys (the head is kept). ``fresh``: ``keys`` as a
        ``dict.fromkeys`` nobody else keeps, if the caller built one. Return whether every
        key of ``keys`` is now recorded (``False`` only when the cap left some out)."""
        if type(rec.reused) is not set:  # a view of keys (see _record_load): its own set now
            rec.reused = set(rec.reused)
        rkeys = rec.keys
        room = self._num_blocks - len(rkeys)
        # the usual case, every new key fits: one C-level update (this and the C-level
        # filters of request mode's records below: request-mode call log W = 32 15,355 ->
        # 14,617 instructions per block reference, docs/performance.md, "ARC hot paths")
        if len(keys) <= room:
            if fresh is None:
                fresh = dict.fromkeys(keys)
            if rkeys:
                rkeys.update(fresh)
            else:  # the request's first keys: the dict is the record, no copy
                rec.keys = fresh
            return True
        for key in keys:
            if key not in rkeys:
                if room <= 0:
                    return False
                rkeys[key] = None
                room -= 1
            elif rkeys[key] is _HELD:  # recorded at the place the request held for it
                rkeys[key] = None
        return True

    def _record_load(self, req_context: Any, keys: Sequence[Hashable]) -> None:
        """Record a successful :meth:`prepare_load` of ``keys`` by ``req_context``'s open
        request (if any): seen, and reused unless the request inserted them itself."""
        try:  # the open request, if any (explicit mode otherwise; see prepare_store)
            rec = self._requests.get(req_context)
        except TypeError:
            return
        if rec is None:
            return
        if rec.inserted:  # a load after a store: every key in keys (see _Request)
            rec.merge()
        # C-level filters, no frame per key (see _add_keys); none when every key was
        # recorded and the request inserted nothing yet (the usual load, first in its
        # request: docs/performance.md, "Request mode, round 3"); the request's first keys
        # recorded without _add_keys (_FRAMES)
        if not rec.keys and len(keys) <= self._num_blocks:
            rec.keys = dict.fromkeys(keys)
            if rec.merged:
                rec.reused.update(keys)  # nothing inserted yet
            else:  # nothing inserted yet: every key of keys is reused, a view of them until
                # keys gets any other key (merge, _add_keys, _record_unstored make it a set;
                # vLLM spec replay, docs/performance.md, "Request mode, round 9")
                rec.reused = rec.keys.keys()
        elif self._add_keys(rec, keys):
            if rec.inserted:
                rec.reused.update(filterfalse(rec.inserted.__contains__, keys))
            else:
                rec.reused.update(keys)
        else:
            rec.reused.update(filterfalse(rec.inserted.__contains__,
                                          filter(rec.keys.__contains__, keys)))

    def _record_store(
        self, rec: _Request, keys: Sequence[Hashable], new_keys: Sequence[Hashable],
        num_resident: int,
    ) -> bool:
        """Record a :meth:`prepare_store` offer (vLLM's order): its admitted new keys and the
        keys already ready (not pending) are seen, in the call's order; the ready ones are
        reused unless the request inserted them itself. Pending keys are not recorded.
        ``num_resident``: occurrences in ``keys`` of keys already stored. Return whether
        every key of ``new_keys`` is now recorded."""
        if not num_resident:  # nothing stored yet, so nothing ready: no membership pass
            return self._add_keys(rec, new_keys)
        slot_of, pending = self._slot_of, self._pending_keys
        # C-level filters, no frame per key (see _add_keys)
        ready = list(filterfalse(pending.__contains__, filter(slot_of.__contains__, keys)))
        if len(ready) != num_resident:  # a key of the offer is pending: its place is held
            return self._record_store_holding(rec, keys, new_keys, ready)
        if new_keys and ready:
            offered = set(new_keys)
            offered.update(ready)
            all_recorded = self._add_keys(rec, list(filter(offered.__contains__, keys)))
        else:
            all_recorded = self._add_keys(rec, ready or new_keys)
        if ready:
            rec.reused.update(filterfalse(rec.inserted.__contains__,
                                          filter(rec.keys.__contains__, ready)))
        return all_recorded

    def _record_store_holding(
        self, rec: _Request, keys: Sequence[Hashable], new_keys: Sequence[Hashable],
        ready: list,
    ) -> bool:
        """:meth:`_record_store` of an offer that names a pending key (another request's
        store of it in flight; ``rec`` is merged): in the call's order, its new and ready
        keys are recorded and a pending key not recorded yet gets a held place (see
        _Request), all under the ``num_blocks`` cap. Return whether every offered (new or
        ready) key is now recorded."""
        rkeys = rec.keys
        # C-level passes, no frame per key (see _add_keys): the pending keys that are not
        # this call's new ones (stored and pending already when the store succeeded) and not
        # recorded yet, then the offer's keys in order, marked (a dict update keeps the
        # place of a key already in rkeys and records a held one there)
        offered = set(new_keys)
        offered.update(ready)
        held = list(filterfalse(offered.__contains__, filterfalse(
            rkeys.__contains__, filter(self._pending_keys.__contains__, keys))))
        offered.update(held)
        marks = dict.fromkeys(filter(offered.__contains__, keys))
        if held:
            marks.update(dict.fromkeys(held, _HELD))
            rec.merged = _MERGED_HELD
        all_recorded = True
        if len(marks) <= self._num_blocks - len(rkeys):  # the usual case: all of them fit
            rkeys.update(marks)
        else:  # the cap: in order, while there is room
            room = self._num_blocks - len(rkeys)
            for key, mark in marks.items():
                if key in rkeys:
                    if mark is None:
                        rkeys[key] = None  # (at its held place, if it had one)
                elif room > 0:
                    rkeys[key] = mark
                    room -= 1
                elif mark is None:
                    all_recorded = False
        if ready:
            rec.reused.update(filterfalse(rec.inserted.__contains__,
                                          filter(rkeys.__contains__, ready)))
        return all_recorded

    def _learn_misses(self, rec: _Request, new_keys: Sequence[Hashable]) -> None:
        """Request mode's ghost learning (vLLM's ``on_store_miss``): one use of the keys
        about to be stored that this request has not stored before (the policy's
        ``on_store_miss`` if it has its own, else ``touch``); called only when the
        store will succeed, before the eviction and the policy's ``insert``. The keys used
        once this way are exactly ``rec.inserted`` (all of them are inserted right after):
        no set of their own (request-mode records, docs/performance.md, "Request mode,
        round 3")."""
        inserted = rec.inserted
        # C-level filter, no frame per key (see _add_keys)
        misses = list(filterfalse(inserted.__contains__, new_keys)) if inserted else new_keys
        if misses:
            self._req_log.store_miss(misses)

    # -- whole-tier operations -----------------------------------------------------------
    def reset_cache(self) -> None:
        """Drop every block, ghost list, admission count, event and counter, and forget the
        open requests (request mode; a later finish of one of them raises).

        Pinned blocks and blocks whose store is in flight are dropped too and their slots
        become free: the caller must let those copies finish (or abandon them) first, since
        a later ``complete_load`` of their keys raises
        :class:`~kvtier.errors.BlockStateError`, a later ``complete_store`` ignores them (as
        any key that is not pending), and a new store may reuse the slots while the old copy
        still writes them (``KVOffloader.reset_cache`` waits for its jobs before it calls
        this)."""
        self.policy.clear()
        self._init_state()

    def take_events(self) -> list[OffloadingEvent]:
        """Return and clear the events recorded since the last call (oldest first).

        One event per ``prepare_store`` that evicted (``removed=True``) and one per
        ``complete_store`` that made blocks ready (``removed=False``). Always empty when the
        manager was built with ``enable_events=False``.
        """
        events, self._events = self._events, []
        return events

    def stats(self) -> ManagerStats:
        """A snapshot of the counters and block counts (see :class:`ManagerStats`)."""
        used = len(self._slot_of)
        lookups = self._hits + self._pending_hits + self._misses
        return ManagerStats(
            num_blocks=self.num_blocks,
            lookups=lookups,
            hits=self._hits,
            pending_hits=self._pending_hits,
            misses=self._misses,
            stores=self._stores(),
            completed_stores=self._completed_stores,
            failed_stores=self._failed_stores,
            skipped_stores=self._skipped_stores,
            evictions=self._evictions,
            loads=self._loads,
            used=used,
            pending=len(self._pending_keys),
            pinned=len(self._pins),
            evictable=self._evictable,
            free=self._num_blocks - used,
            requests_open=len(self._requests),
            requests_finished=self._req_log.finished,
            requests_finished_early=self._req_log.finished_early,
            late_finishes=self._req_log.late,
        )

    def slot_of(self, key: Hashable) -> int | None:
        """The slot of stored block ``key`` (pending or ready), or ``None``. O(1).

        For data planes that must copy a victim's bytes before its slot is reused: inside the
        policy's eviction (``CachePolicy._evict``) a victim still has its slot here; once
        ``prepare_store`` returns, the slot may belong to a new block.

        Raises:
            TypeError: ``key`` is not hashable (named in the message).
        """
        try:
            return self._slot_of.get(key)
        except TypeError:
            raise unhashable_error((key,), "slot_of") from None

    def missing(self, keys: Sequence[Hashable]) -> list[Hashable]:
        """The keys of ``keys`` not stored in the tier (neither pending nor ready), in order,
        repeats kept: what :meth:`prepare_store` would allocate before admission and
        de-duplication. O(len(keys)) in one C-level pass (a ``key in manager`` per key costs
        a Python call each, docs/performance.md, "ARC hot paths"). Counts no lookup.

        Raises:
            TypeError: a key is not hashable.
        """
        if type(keys) is not list and type(keys) is not tuple:
            keys = key_list(keys, "missing")
        try:
            return list(filterfalse(self._slot_of.__contains__, keys))
        except TypeError:
            raise unhashable_error(keys, "missing") from None

    def ref_count(self, key: Hashable) -> int | None:
        """Ref count of ``key`` (-1 pending, 0 evictable, >0 pinned), or None if not stored.

        Raises:
            TypeError: ``key`` is not hashable (named in the message).
        """
        try:
            slot = self._slot_of.get(key)
        except TypeError:
            raise unhashable_error((key,), "ref_count") from None
        if slot is None:
            return None
        if key in self._pending_keys:
            return _PENDING
        return self._pins.get(key, 0)

    def __len__(self) -> int:
        """Blocks stored (pending and ready)."""
        return len(self._slot_of)

    def __contains__(self, key: Hashable) -> bool:
        """Whether block ``key`` is stored (pending or ready). O(1).

        Raises:
            TypeError: ``key`` is not hashable (named in the message).
        """
        try:
            return key in self._slot_of
        except TypeError:
            raise unhashable_error((key,), "in (OffloadingManager.__contains__)") from None

    def snapshot(self) -> dict:
        """A comparable copy of the whole state (manager and policy), for tests and debugging.

        Costs O(slots ever used); two snapshots are ``==`` exactly when nothing changed.
        """
        slots = self._slots
        ref = [0] * slots.next_fresh  # per slot; later slots were never used
        for key, count in self._pins.items():
            ref[self._slot_of[key]] = count
        for key in self._pending_keys:
            ref[self._slot_of[key]] = _PENDING
        return {
            "slot_of": dict(self._slot_of),
            "ref": ref,
            "free": list(slots.free),
            "pending_keys": set(self._pending_keys),
            "next_fresh": slots.next_fresh,
            "counts": (self._evictable, len(self._pending_keys), len(self._pins)),
            "counters": (
                self._hits, self._pending_hits, self._misses, self._stores(),
                self._completed_stores, self._failed_stores, self._skipped_stores,
                self._evictions, self._loads,
            ),
            "tracker": None if self._tracker is None else self._tracker.items(),
            "admission": None if self.admission is None else self.admission.snapshot(),
            "events": list(self._events),
            "requests": [
                (ctx, r.keys_in_order(), set(r.inserted), set(r.reused))
                for ctx, r in self._requests.items()
            ],
            "finished_early": list(self._req_log.early),
            "request_counters": (
                self._req_log.finished, self._req_log.finished_early, self._req_log.late,
            ),
            "policy": self.policy.snapshot(),
        }
