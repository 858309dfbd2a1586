"""Adaptive admission for the offloaded tier: store what will be reused, learned online.

Most blocks offered to an offloaded KV-cache tier are never read again, so storing every block
(*admit-all*) evicts useful blocks for one-hit wonders; storing a block only when it is seen
for the second time (*admit-on-second-sight*) protects the tier from them but loses the first
reuse of every block, which costs when most blocks *are* reused. Which of the two wins depends
on the traffic and the tier size (see docs/policies.md, "Admission"), and it can change during
a run. :class:`DuelingAdmission` runs both on a small sampled shadow of the key space and lets
the tier follow the one with fewer misses there.

**Set dueling** (Qureshi, Jaleel, Patt, Steely, Emer, "Adaptive insertion policies for high
performance caching", ISCA 2007): two leader groups, one per policy, feed a counter (PSEL)
with their misses; the followers use the policy PSEL favours. A fully associative tier has
no sets, so the leaders here are two *miniature simulations* of the tier (Waldspurger,
Saemundsson, Ahmad, Park, "Cache Modeling and Optimization using Miniature Simulations",
USENIX ATC 2017): the tier's own policy class, at ``rate * num_blocks`` blocks (after the
fill, times the measured share of stores at the sampled depths when it is clearly below the
nominal one: see ``_end_fill``), over a spatial sample of the key space (SHARDS, Waldspurger
et al., FAST'15), so that its hit ratio estimates that of the tier. Shadow A admits every miss; shadow B admits a missed key only
when it was looked up before *and* so were the sampled keys before it in the call
(prefix-closed, as the real tier). Each sampled lookup adds the shadows' difference of hits
to PSEL, and PSEL decays by ``1 / (HORIZON * shadow_capacity)`` per sampled reference that
is not a hit in both shadows (a hit in both is no evidence either way and changes neither
shadow): it is a running sum over about the last :data:`HORIZON` shadow turnovers of such
references, so evidence from an earlier phase is forgotten at that pace.

**The choice** (:meth:`DuelingAdmission._decide`). *Fill:* until the shadows are full both
store every miss (a free slot costs nothing, so the tier stores every block then too), so
PSEL does not pile up the lead admit-all always has while a cache fills, which says nothing
about the steady state (a cold-start bias, as cache simulations drop their warm-up). The
tier starts with admit-all. *Settling:* after the fill the second-sight shadow still holds
the fill's unfiltered contents (admit-all's), which handicaps it until its own stores have
replaced them; when it has stored one shadow size of keys the duel restarts (PSEL and its
variance from 0), unless the tier already follows second sight, PSEL points to second sight
(evidence gathered despite the handicap), or PSEL shows admit-all ahead beyond the switch
test (:meth:`DuelingAdmission._settling`; docs/policies.md, "versions tried": `s3fifo` 1,828
blocks W=0 -0.70 -> +0.07). *No hits:* after the fill, while the admit-all shadow had less
than one hit in PSEL's horizon, second sight (storing would be only wasted writes, e.g.
traffic that is never reused; at most one tier size of them is written, during the fill:
before the fill came first, a trace whose first sampled reuse came late was refused from
its first request, docs/policies.md "versions tried"). *Otherwise* the
tier keeps its rule until PSEL shows the other one ahead by more than :data:`SWITCH_Z`
standard errors of PSEL under equal rules (``sqrt(s2)``, ``s2 = sum(w_i**2 d_i**2)`` the
sum of squared disagreements ``d_i`` with PSEL's own decayed weights ``w_i``, squared),
plus Student's small-sample correction (below), a two-sided test at about 95 %: where the
two rules are close, a switch on noise costs a tier turnover of the wrong contents
(docs/policies.md: 105 switches and -0.26 points on one synthetic mix without it). The
test is exact from the first sampled reference: an earlier version estimated the variance
as ``sum(w_i d_i**2) / 2``, which holds only once PSEL has seen many horizons (the weights
then span their whole decay) and under-estimated it by up to ``sqrt(2)`` before, so early
switches took about 1.4 standard errors. With few disagreements the estimated standard
error is itself noisy, so the bar is the t-quantile's first-order expansion (Cornish-Fisher;
Student's t with about ``s2`` degrees of freedom for +-1 disagreements):
``z * se + (z**3 + z) / 4 / se``, within 5 % of ``z * se`` once ``s2`` > 25 and within 1 %
once ``s2`` > 125. With z = 2, a run of disagreements in one direction at the start now
switches after 6 of them (with the earlier estimate: 3).

**The sample.** Keys are prefix block hashes (a key names its whole prefix), so a key always
sits at the same depth in a request; a key is sampled when its depth is a multiple of
``stride`` (1 to 4) and ``hash(key) % modulus == modulus // 2`` (``modulus`` odd, so keys
that step by a power of two are still sampled evenly; the residue is not 0, since
``0 % m == 0`` for every ``m`` would put the key 0, in a trace of sequential block ids the
head every request shares, in every sample): ``rate = 1 / (stride * modulus)``, about
``SHADOW_BLOCKS / num_blocks`` and at least :data:`MIN_RATE`. The depth stride lets the
per-key cost skip most keys (a slice); keys that are not prefix hashes (a key seen at several
depths) are sampled at some of their references only, which makes the shadows see less reuse.

**Doorkeeper** ("seen before"): the keys looked up in the current generation and the one
before it, two Python sets; a generation ends after ``WINDOW_FACTOR * num_blocks`` distinct
keys (as TinyLFU's doorkeeper is reset every sample of W references, Einziger, Friedman and
Manes, ACM ToS 2017). A key counts as seen before when its previous lookup is at most one to
two generations old. The tier's doorkeeper is not kept while admit-all leads by more than
:data:`KEEP_LEAD` shadow hits per sampled reference (except for calls that may not fit):
then every looked-up block is stored anyway; kept again, it resumes with what it held (the
blocks first seen during the pause were all stored). While admit-all is chosen nothing
reads the tier's doorkeeper but a call that may not fit, so its updates wait in a log (a
copy of each lookup's keys) applied when it is read (that call, second sight, a lookup at
which a generation may end, :meth:`snapshot`): the same doorkeeper whenever it is read,
without its set work for the lookups it never serves. The shadows have their own doorkeeper
over the sampled keys, with generations of ``rate * WINDOW_FACTOR * num_blocks`` sampled
keys (the same span of time).

**Requests in flight.** A block whose store is in flight is not readable (HIT_PENDING, a
miss, and the lookup stops there) and not evictable. The shadows model both: a key a shadow
stores stays pending for the tier's in-flight depth ``D`` in calls, and a shadow's store
fails as a whole when too few of its keys are evictable (the tier's atomic
``prepare_store``). ``D`` is estimated from the ``pending`` count the manager passes at each
lookup: the store calls :meth:`admit` answered form a FIFO (stores complete oldest first);
the oldest calls whose blocks exceed ``pending`` have completed, and the age of the oldest
left is one observation of ``D``; ``D`` is their maximum, decaying by 1/256 per call (a call
that stored nothing shows no age, so one observation is only a lower bound). A key a
shadow's lookup hits is loaded: pinned (readable, not evictable) for ``D`` calls too, as the
tier's ``prepare_load`` pins the prefix it reads until the request completes (pins hold 20
to 30 % of a 1 %-of-distinct-blocks tier with 32 requests in flight; unmodelled, the shadows
read half the tier's hits there). When a call's
admitted blocks cannot fit at all (the whole store would fail), admit-all falls back to the
second-sight answer for that call.

The shadows run the tier's policy class through its public hooks (touch the looked-up
keys, evict for room, insert and mark evictable the admitted ones, on_store), so the module
composes with every registered policy; an offline policy (``needs_future``) is shadowed by
LRU. LRU and ARC shadows take the same steps spelled out (``_LRUMini``, ``_ARCMini``; tested
equal to the hooks), a speed trick (docs/performance.md). They count hits per key (a sampled key hits when it and the sampled keys before it in
the call are in the shadow and not pending), not the tier's exact prefix hits.

State (independent of the trace's length): the doorkeepers hold at most ``2 * (G + L)`` keys
(``G = WINDOW_FACTOR * num_blocks``, ``L`` the longest call; the tier's log of lookups not
yet applied included: it is applied before the generation and the log together pass ``G``)
and ``2 * (rate * G + L + S)`` sampled keys (``S`` the shadows' size, at most
``ceil(rate * num_blocks)``: a lookup whose sampled keys all hit in both shadows adds them
without the test for the generation's end, which only a lookup that misses makes; between two
such tests the keys resident in both shadows stay the same, so they add at most ``S``), the
shadows at most ``2 * S`` keys plus their policies' ghost state (bounded by their capacity), their pending and pinned
keys (at most their capacity) and the FIFO of their pins (at most twice their pinned keys
plus one lookup's), the last :data:`RECENT_LOOKUPS` lookups (references to the doorkeeper's
copies of their keys) and a map of the keys of the last 64 to 128 of them (see
:meth:`DuelingAdmission._first_sights`), the FIFO of store calls in flight at most ``num_blocks + L`` entries
(after each lookup its blocks but the oldest entry's are fewer than the tier's pending
blocks) plus the last answered call (held aside until the next call), plus a few counters.
Time per key looked up: a slice and a hash for ``1 / stride`` of the keys, and two shadow
policy updates for a sampled key; while second sight is chosen, also one hash, one set
insertion and one or two set lookups per key (the leading run of keys seen before; while
admit-all keeps the doorkeeper, one copy into its log instead); the end of a generation
drops one set of ``G`` keys (O(1) amortized per key). :meth:`admit` is O(1) per key of its
call.

Deterministic for a given sequence of calls whose keys hash deterministically: ints (every
kvtier trace reader), tuples of ints, bools, None. ``str`` and ``bytes`` keys hash differently
in each process unless ``PYTHONHASHSEED`` is set, so the *sample* (not the correctness of
the bookkeeping) then varies from run to run.

Not thread-safe: the manager calls it under whatever lock guards the manager.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence

__all__ = [
    "ADMISSION_MODES",
    "DuelingAdmission",
    "MAX_STRIDE",
    "HORIZON",
    "KEEP_LEAD",
    "MIN_RATE",
    "RECENT_LOOKUPS",
    "SHADOW_BLOCKS",
    "WINDOW_FACTOR",
    "make_admission",
]

ADMISSION_MODES = ("all", "adaptive", "tinylfu")
"""Accepted ``admission`` names: ``"all"`` stores every new block, ``"adaptive"`` is
:class:`DuelingAdmission`, ``"tinylfu"`` :class:`kvtier.admission_tinylfu.TinyLFUAdmission`."""

WINDOW_FACTOR = 8
"""Doorkeeper generation, in distinct keys per tier block. 8 keeps a key's first sight for
8 to 16 tier sizes of new keys: a block reused within that is admitted on its second sight.
Caffeine (TinyLFU) resets its sketch every 10 tier sizes; the figure is generic, not fitted
to a trace."""

SHADOW_BLOCKS = 512
"""Wanted size of each shadow cache, in blocks: the sampling rate is about
``SHADOW_BLOCKS / num_blocks`` (between :data:`MIN_RATE` and 1), so a tier of at most 512
blocks is shadowed in full."""

MIN_RATE = 1 / 64
"""Lowest sampling rate: in a huge tier, one key in 64 still feeds the shadows, so they see
enough references to decide quickly."""

MAX_STRIDE = 4
"""Largest depth stride of the sample (see the module docstring): the sampling hash is
computed for one key in ``stride`` only."""

HORIZON = 8
"""PSEL's memory, in shadow turnovers: each sampled reference that is not a hit in both
shadows decays PSEL by ``1 / (HORIZON * shadow_capacity)``, so the duel weighs the last
``8 * shadow_capacity`` such references (about eight times the shadows' size) and forgets
what the shadows saw before, as a saturating counter does not (see docs/policies.md,
"versions tried"). A hit in both is no evidence either way and changes neither shadow, so
it does not age the evidence (before, every sampled reference did, so a stretch of shared
hits washed it out)."""

KEEP_LEAD = 0.005
"""The tier's doorkeeper is not kept up while admit-all leads by more than this many shadow
hits per sampled reference (PSEL below ``-KEEP_LEAD * HORIZON * shadow_capacity``): then
every looked-up block is stored anyway. It is kept again when PSEL passes back above this
line or second sight is chosen, with what it held before the pause (second sight no longer
waits for a whole generation of fresh sights: docs/policies.md, "versions tried")."""

SWITCH_Z = 2.0
"""Hysteresis of the tier's choice, in standard errors of PSEL: the tier changes rule when
PSEL shows the other rule ahead by more than this many standard errors of PSEL under equal
rules (see :meth:`DuelingAdmission._decide`), plus ``(z**3 + z) / 4`` over the standard
error (Student's small-sample correction, see the module docstring). 2 is the usual
two-sided 95 % level; on the 72 cells of docs/policies.md's grid, z = 0 / 1 / 2 / 3 left
2 / 6 / 1 / 1 cells more than 0.2 points below the better static rule (mean margins
+0.065 / +0.070 / +0.095 / +0.089; measured with the variance estimate before the exact
one)."""

RECENT_LOOKUPS = 64
"""Lookups whose first sights second sight remembers (their keys and leading runs seen
before), for store calls that come after later lookups: an engine looks up a batch of requests
before their prefills are stored, and the doorkeeper already holds each request's own keys by
then (see :meth:`DuelingAdmission.admit`). Not a fitted figure: a bound on the memory (their
keys, shared with the lookups' copies) and on the work of a store call that is not the tail
of the last lookup."""

_EMA_CALLS = 256
_EMA_ALPHA = 1 / _EMA_CALLS  # the in-flight depth estimate's decay per call


class DuelingAdmission:
    """Set dueling between admit-all and admit-on-second-sight (see the module docstring).

    The manager calls :meth:`record` with the keys of every lookup (head to tail) and
    :meth:`admit` with a store call's new keys (head to tail); the answer is how many
    leading keys to store, so a block is never stored after one refused in the same call.

    Args:
        num_blocks: the tier's capacity in blocks (>= 1).
        window_factor: doorkeeper generation in distinct keys per tier block (>= 1).
        shadow_blocks: wanted shadow size in blocks (>= 1).
        min_rate: lowest sampling rate, in (0, 1].
        horizon: PSEL's memory in shadow turnovers (>= 1), see :data:`HORIZON`.
        shadow_policy: the tier's policy class (a
            :class:`~kvtier.policies.CachePolicy` subclass), run by the shadows (default
            and for offline policies: LRU).
        switch_z: the switch test's bar in standard errors of PSEL (a finite number >= 0),
            see :data:`SWITCH_Z`.

    Raises:
        ValueError: an argument out of its range (named in the message).
        TypeError: ``shadow_policy`` is neither ``None`` nor a ``CachePolicy`` subclass.
    """

    name = "adaptive"

    def __init__(
        self,
        num_blocks: int,
        *,
        window_factor: int = WINDOW_FACTOR,
        shadow_blocks: int = SHADOW_BLOCKS,
        min_rate: float = MIN_RATE,
        horizon: int = HORIZON,
        shadow_policy: type | None = None,
        switch_z: float = SWITCH_Z,
    ) -> None:
        for arg, value in (("num_blocks", num_blocks), ("window_factor", window_factor),
                           ("shadow_blocks", shadow_blocks), ("horizon", horizon)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if isinstance(min_rate, bool) or not isinstance(min_rate, (int, float)) or not (
            0 < min_rate <= 1
        ):
            raise ValueError(f"min_rate must be a number in (0, 1], got {min_rate!r}")
        # (checked here: a str was a bare TypeError from `**`, -1 or nan a test that switched
        # on noise or never, a non-policy class an AttributeError at the first lookup)
        if isinstance(switch_z, bool) or not isinstance(switch_z, (int, float)) or not (
            0 <= switch_z < float("inf")
        ):
            raise ValueError(f"switch_z must be a finite number >= 0, got {switch_z!r}")
        from kvtier.policies import CachePolicy  # noqa: PLC0415 (import cycle)

        if shadow_policy is not None and not (
            isinstance(shadow_policy, type) and issubclass(shadow_policy, CachePolicy)
        ):
            raise TypeError(
                f"shadow_policy must be None or a CachePolicy subclass, got {shadow_policy!r}"
            )
        self.num_blocks = num_blocks
        self.window = window_factor * num_blocks
        # 1 / rate = stride * modulus ~ num_blocks / shadow_blocks, at most 1 / min_rate
        inverse = max(1.0, min(num_blocks / shadow_blocks, 1 / min_rate))
        self.stride = max(1, min(MAX_STRIDE, int(inverse)))
        modulus = max(1, int(inverse / self.stride))
        self.modulus = modulus if modulus % 2 or modulus == 1 else modulus - 1
        # (modulus > 1 needs inverse >= 2, so stride >= 2: record slices without a test)
        # record's slice of the depths sampled, made once (no slice object a lookup: LRU
        # 16,000 blocks, call log 732 -> 726, docs/policies.md "Cost")
        self._pick = slice(None, None, self.stride)
        self.residue = self.modulus // 2  # not 0: see the module docstring, "The sample"
        self.rate = 1 / (self.stride * self.modulus)
        self._nominal = max(1, round(self.rate * num_blocks))  # the shadows' size at start
        self.horizon = horizon
        self._z = switch_z
        self._tc = (switch_z ** 3 + switch_z) / 4  # the small-sample term, see _decide
        if shadow_policy is None or getattr(shadow_policy, "needs_future", False):
            from kvtier.policies.lru import LRUPolicy  # noqa: PLC0415 (import cycle)

            shadow_policy = LRUPolicy  # an offline policy cannot run on the shadows
        self.shadow_policy = shadow_policy
        self.clear()

    def _size_shadows(self, capacity: int) -> None:
        """The shadows' size in blocks and what follows from it: the sampled doorkeeper's
        generation (``rate`` times the tier's, scaled as the shadows) and PSEL's decay."""
        self.shadow_capacity = capacity
        self.sample_window = max(1, round(self.rate * self.window * capacity / self._nominal))
        self._decay = 1 / (self.horizon * capacity)  # PSEL's decay per sampled ref
        self._keep_above = -KEEP_LEAD / self._decay  # the doorkeeper is kept while PSEL > this
        self._keep1 = 1 - self._decay  # ... its factor per sampled ref

    def clear(self) -> None:
        """Forget everything (the state of a new instance)."""
        self._size_shadows(self._nominal)
        # the fill's store calls that are the tail of their lookup: their new blocks, and
        # those at the sampled depths (see _end_fill)
        self._fill_new = 0
        self._fill_sampled = 0
        # what the last admit added to them, for undo_admit (None: nothing)
        self._fill_undo: tuple[int, int] | None = None
        self._seen: set[Hashable] = set()  # keys looked up in this generation
        self._seen_old: set[Hashable] = set()  # ... and in the previous one
        # lookups not yet added to _seen (tuples, oldest first) and their keys in all: while
        # admit-all is chosen nothing reads the doorkeeper until a call may not fit, so its
        # updates wait here (see _apply_log)
        self._log: list[tuple] = []
        self._logged = 0
        self._sseen: set[int] = set()  # the same for sampled keys (by hash)
        self._sseen_old: set[int] = set()
        self._lru_minis = self.shadow_policy is _lru_class()
        self._arc_minis = self.shadow_policy is _arc_class()
        mini = _LRUMini if self._lru_minis else _ARCMini if self._arc_minis else _Mini
        self._mini_a = mini(self.shadow_policy, self.shadow_capacity)  # admit-all
        self._mini_b = mini(self.shadow_policy, self.shadow_capacity)  # second sight
        # PSEL: the duel's evidence for second sight (see _decide for how it picks the rule)
        self.psel = 0.0
        self._s2 = 0.0  # sum of squared disagreements, squared weights (PSEL's variance)
        self._ha = 0.0  # decayed hits of the admit-all shadow
        self._filling = True  # until the shadows are full, both store every miss
        # after the fill: the second-sight shadow's stores left until it has replaced one
        # shadow size of the fill's contents (see _settling)
        self._settle = 0
        self.selective = False  # the tier's current choice: True second sight, False admit-all
        # (admit-all first: the fill, see _decide)
        self.switches = 0
        self.sampled_refs = 0
        self.shadow_hits_all = 0
        self.shadow_hits_second = 0
        self.generations = 0
        # requests in flight: the tier's store calls not known complete, [call, blocks]
        # (FIFO), their blocks, the calls recorded, and the in-flight depth in calls
        self._flight: deque = deque()
        self._flight_blocks = 0
        # the store call admit answered last, not yet in _flight: its blocks (its call is
        # _calls), or None; it joins _flight at the next record or admit (most lookups have
        # one store call and nothing pending: no tuple, no deque append and clear; LRU
        # 16,000 blocks, call log 913 -> 882, docs/policies.md "Cost")
        self._adm: int | None = None
        self._calls = 0
        self._depth = 0.0
        self._inflight = False  # depth >= 1 or a shadow holds pending keys
        # the last lookup's keys and how many of them lead that were seen before it (or -1)
        self._last: Sequence[Hashable] = ()
        self._last_run = -1
        # the last RECENT_LOOKUPS lookups kept in the doorkeeper, oldest first: (call number,
        # keys, leading run seen before it; None while it waits in the log); and, for a store
        # call that is not the tail of the last lookup, each key of them -> whether it was a
        # first sight at the latest of them that names it (built on demand, see
        # _first_sights), the call number of the last lookup merged into it, and the lookups
        # merged since it was built
        self._recent: deque = deque(maxlen=RECENT_LOOKUPS)
        self._verdict: dict | None = None
        self._merged = -1
        self._merges = 0

    # -- the manager's hooks -------------------------------------------------------------
    def record(self, keys: Sequence[Hashable], busy: int = 0, pending: int = 0) -> None:
        """Count one lookup of each of ``keys`` (head to tail, as the request names them).

        ``busy``: the tier's blocks that cannot hold a cached block now (pending stores and
        pinned loads); see the module docstring.

        Raises:
            TypeError: a key is not hashable; nothing changed then. While admit-all is
                chosen and the call fits the tier, only the sampled depths are hashed, so
                only they are checked (as without admission, the manager checks the others
                when it needs them).
        """
        # the sample: every stride-th key, then hash % modulus == residue (hashing validates
        # them)
        modulus = self.modulus
        if modulus == 1:
            stride = self.stride
            sampled = list(map(hash, keys[::stride] if stride > 1 else keys))
            first = sampled[0] if sampled else None
            if len(sampled) < 2:
                sampled = None
        else:  # a plain loop: -1,700 instructions a call against a comprehension (3.11
            # makes a function for it), -3,100 against filterfalse (cachegrind, 6 keys)
            residue = self.residue
            # the first sampled key, and a list only once a second one is sampled (half
            # the lookups sample none, most others one: call log 726 -> 718)
            first = sampled = None
            # (modulus > 1 only where the stride is >= 2, see __init__: no stride test,
            # LRU 16,000 blocks, call log 882 -> 876, docs/policies.md "Cost")
            for h in map(hash, keys[self._pick]):
                if h % modulus == residue:
                    if first is None:
                        first = h
                    elif sampled is None:
                        sampled = [first, h]
                    else:
                        sampled.append(h)
        # the real tier's doorkeeper: needed by second sight, and by admit-all when the call
        # may not fit (see admit); not kept up while admit-all leads by more than half of
        # PSEL's range, since then it stores every looked-up block and is unlikely to lose
        # its lead soon (LRU 16,000 blocks: -290 instructions per block ref)
        keep = self.selective or self.psel > self._keep_above
        if keep or 2 * len(keys) > self.num_blocks - busy:
            last = tuple(keys)  # (a copy: the caller may reuse its list)
            if self.stride > 1:
                hash(last)  # hashes the keys the sample skipped: validate first
            # kept again after a pause: it resumes with what it holds (and its log of the
            # lookups before the pause), and second sight may follow at once (it used to be
            # emptied, and second sight held back until it held a whole generation of
            # sights: with shadows that model pinned loads that cost up to 1.1 points on
            # reuse-heavy traffic, docs/policies.md "versions tried")
            if not self.selective and len(self._seen) + self._logged < self.window:
                # admit-all, and no new generation can start at this lookup: the sights
                # wait in the log until something reads them (_apply_log), or are dropped
                # with the doorkeeper (LRU 16,000 blocks: the fill's, never read; call log
                # 856 -> 791, docs/policies.md "Cost")
                self._log.append(last)
                self._logged += len(last)
                self._last = last
                self._last_run = None  # the leading run seen before: when applied
                self._recent.append((self._calls, last, None))  # (its run: when applied)
            else:
                if self._log:
                    self._apply_log()
                seen = self._seen
                if len(seen) >= self.window:  # a new generation: the oldest sights are
                    self._seen_old = seen  # forgotten
                    self._seen = seen = set()
                    self.generations += 1
                self._last = last
                self._last_run = run = self._leading_seen(last)
                self._recent.append((self._calls, last, run))
                seen.update(last)
        else:
            self._last_run = -1
            if self._recent:  # (its sights are not in the doorkeeper: the lookups before
                self._recent.clear()  # it no longer tell what is seen, see _first_sights)
                self._verdict = None
        if pending:
            n = self._adm
            if n is not None:  # _push spelled out (no frame: W=32 call log 1,373 -> 1,345)
                self._adm = None
                self._flight.append((self._calls, n))
                self._flight_blocks += n
            self._calls += 1
            self._observe_depth(pending)
        else:
            self._calls += 1
            self._adm = None  # (the stores completed: no test, call log 743 -> 740)
            if self._flight:
                self._flight.clear()
                self._flight_blocks = 0
        if first is None:
            return
        self._duel([first] if sampled is None else sampled)

    def _apply_log(self) -> None:
        """Add the logged lookups to the doorkeeper, as :meth:`record` would have at each
        (no generation can end among them: they were logged only while ``_seen`` and the
        log held fewer than ``window`` keys), and the leading runs of those still in
        ``_recent`` (their run None), the last lookup's when it is one of them (``_last_run``
        None)."""
        log = self._log
        seen = self._seen
        recent = self._recent
        # the logged lookups still remembered (run None): _recent's last entries, and the
        # log's last ones (a lookup that is not kept empties _recent); their leading runs as
        # record would have found them, the last lookup's included
        waiting = 0
        for entry in reversed(recent):
            if entry[2] is not None:
                break
            waiting += 1
        if waiting:
            split = len(log) - waiting
            base = len(recent) - waiting
            for keys in log[:split]:
                seen.update(keys)
            run = -1
            for i in range(split, len(log)):
                keys = log[i]
                run = self._leading_seen(keys)
                j = base + i - split
                recent[j] = (recent[j][0], keys, run)
                seen.update(keys)
            if self._last_run is None:
                self._last_run = run  # (the log's last lookup is the last lookup)
        else:
            last = log.pop()
            for keys in log:
                seen.update(keys)
            if self._last_run is None:
                self._last_run = self._leading_seen(last)
            seen.update(last)
        self._log = []
        self._logged = 0

    def _leading_seen(self, keys: Sequence[Hashable]) -> int:
        """How many leading ``keys`` are in the doorkeeper (either generation)."""
        seen = self._seen
        run = 0
        for key in keys:  # (a plain loop: takewhile's calls cost more for a short run)
            if key not in seen:
                break
            run += 1
        old = self._seen_old
        n = len(keys)
        while run < n and keys[run] in old:  # alternate between the two generations
            run += 1
            while run < n and keys[run] in seen:
                run += 1
        return run

    def _push(self) -> None:
        """The last answered store call (``_adm``) joins the FIFO of calls in flight."""
        n = self._adm
        self._adm = None
        self._flight.append((self._calls, n))
        self._flight_blocks += n

    def _observe_depth(self, pending: int) -> None:
        """The tier has ``pending`` blocks of stores in flight: drop the oldest store calls
        that must have completed (stores complete oldest first) and take the age of the
        oldest one left, in calls, as an observed in-flight depth. The depth used is a
        decaying maximum of these (a call that stored nothing shows no age, so one
        observation is only a lower bound); it falls by 1/256 per call."""
        flight = self._flight
        total = self._flight_blocks
        while flight and total - flight[0][1] >= pending:
            total -= flight.popleft()[1]
        self._flight_blocks = total
        depth = self._depth * (1 - _EMA_ALPHA)
        if flight:
            age = self._calls - flight[0][0]
            if age > depth:
                depth = age
        self._depth = depth
        if depth >= 1:
            self._inflight = True

    def _duel(self, sampled: list[int]) -> None:
        """Replay one lookup's sampled keys (their hashes, head to tail) through both
        shadows and move PSEL."""
        ma = self._mini_a
        mb = self._mini_b
        sa = ma.keys
        sb = mb.keys
        n = len(sampled)
        if n == 1 and not self._inflight:
            h = sampled[0]
            in_a = h in sa
            in_b = h in sb
            if in_a and in_b:
                # the usual sampled lookup (a shared head, one sampled key) that hits in both
                # shadows: the steps of the general path below, inlined (LRU 16,000
                # blocks: this path is about half of all sampled lookups)
                if self._lru_minis:
                    sa.move_to_end(h)
                    sb.move_to_end(h)
                elif self._arc_minis:
                    ma.hit1(h)
                    mb.hit1(h)
                elif ma.touch is not None:
                    ma.touch(sampled)
                    mb.touch(sampled)
                self._sseen.add(h)
                self.sampled_refs += 1
                self.shadow_hits_all += 1
                self.shadow_hits_second += 1
                self._ha += 1  # (a hit in both: no evidence, no decay, see _weigh)
                if self.selective:
                    self._decide()
                return
            if self._lru_minis:
                # one sampled key, LRU shadows, nothing in flight (most sampled lookups at LRU
                # 16,000 blocks): the general path's steps below and _LRUMini.access's for
                # one key, inlined (tested equal); a hit moves the key to the most recent
                # end, a stored key takes the least recent one's place
                self.sampled_refs += 1
                sseen = self._sseen
                if len(sseen) >= self.sample_window:
                    self._sseen_old = sseen
                    self._sseen = sseen = set()
                cap = self.shadow_capacity
                if in_a:
                    self.shadow_hits_all += 1
                    sa.move_to_end(h)
                else:
                    if len(sa) >= cap:
                        sa.popitem(False)
                    sa[h] = None
                if in_b:
                    self.shadow_hits_second += 1
                    sb.move_to_end(h)
                elif self._filling or h in sseen or h in self._sseen_old:
                    # (seen before, or the fill: every miss is stored then; whether it was seen
                    # only where second sight missed: call log 791 -> 789)
                    if len(sb) >= cap:
                        sb.popitem(False)
                    sb[h] = None
                    if self._settle:
                        self._settling(1)
                sseen.add(h)
                if self._filling and len(sb) >= cap:
                    self._end_fill()
                # _weigh(in_b - in_a, in_a, _keep1) inlined (no frame: call log 754 -> 744)
                d = in_b - in_a
                k1 = self._keep1
                self.psel = psel = self.psel * k1 + d
                self._s2 = s2 = self._s2 * k1 * k1 + d * d
                self._ha = ha = self._ha * k1 + in_a
                if ha < 1 or self._filling:
                    self._decide()
                elif psel < 0.0 if self.selective else psel > 0.0:
                    self._test_switch(psel, s2)
                return
            if self._arc_minis:
                # the same one-key path with ARC shadows (_ARCMini's one-key steps, tested
                # equal to the general path over ARCPolicy's hooks): ARC 16,000 blocks, most
                # sampled lookups (docs/performance.md, "Adaptive admission")
                self.sampled_refs += 1
                sseen = self._sseen
                if len(sseen) >= self.sample_window:
                    self._sseen_old = sseen
                    self._sseen = sseen = set()
                seen = h in sseen or h in self._sseen_old
                sseen.add(h)
                cap = self.shadow_capacity
                if in_a:
                    self.shadow_hits_all += 1
                    ma.hit1(h)
                else:
                    ma.miss1(h, cap, True)
                if in_b:
                    self.shadow_hits_second += 1
                    mb.hit1(h)
                else:  # (during the fill every miss is stored)
                    mb.miss1(h, cap, seen or self._filling)
                    if seen and self._settle:
                        self._settling(1)
                if self._filling and len(sb) >= cap:
                    self._end_fill()
                d = in_b - in_a  # (_weigh inlined, as above)
                keep = self._keep1
                self.psel = psel = self.psel * keep + d
                self._s2 = s2 = self._s2 * keep * keep + d * d
                self._ha = ha = self._ha * keep + in_a
                if ha < 1 or self._filling:
                    self._decide()
                elif psel < 0.0 if self.selective else psel > 0.0:
                    self._test_switch(psel, s2)
                return
        if self._lru_minis and not self._inflight:
            # several sampled keys, LRU shadows, nothing in flight: the steps of the general
            # path below, with the admit-all shadow's _LRUMini.access inlined as one
            # tail-first pass that also finds its leading hits (tested equal; call log
            # 774 -> 754, docs/policies.md "Cost")
            new = []  # shadow A's missing keys, tail first, each once (as _LRUMini.access)
            hits_a = n
            i = n
            for h in reversed(sampled):
                i -= 1
                if h in sa:
                    sa.move_to_end(h)
                else:
                    hits_a = i  # (the last one found is the first from the head)
                    if h in new:
                        new.remove(h)
                    new.append(h)
            hits_b = 0
            for h in sampled:
                if h not in sb:
                    break
                hits_b += 1
            self.sampled_refs += n
            self.shadow_hits_all += hits_a
            self.shadow_hits_second += hits_b
            sseen = self._sseen
            if hits_a == n and hits_b == n:  # (as below; shadow A is touched already)
                for h in reversed(sampled):
                    sb.move_to_end(h)
                sseen.update(sampled)
                self._ha += n
                if self.selective:
                    self._decide()
                return
            # (as below: decay by the keys not hit in both shadows)
            keep = 1 - (n - (hits_a if hits_a < hits_b else hits_b)) * self._decay
            if keep < 0.0:
                keep = 0.0
            if len(sseen) >= self.sample_window:
                self._sseen_old = sseen
                self._sseen = sseen = set()
            cap = self.shadow_capacity
            if self._filling:
                sseen.update(sampled)
                stored = mb.access(sampled, n, cap)
            else:
                sold = self._sseen_old
                run = 0
                for h in sampled:
                    if h in sseen or h in sold:
                        run += 1
                    else:
                        break
                sseen.update(sampled)
                if run:
                    stored = mb.access(sampled, run, cap)
                else:  # (the usual case: nothing to store, only the keys to touch)
                    stored = 0
                    for h in reversed(sampled):
                        if h in sb:
                            sb.move_to_end(h)
            if new:  # shadow A: room for the new keys, then the keys
                over = len(sa) + len(new) - cap
                if over > 0:
                    if over <= len(sa):
                        for _ in range(over):
                            sa.popitem(False)
                    else:
                        sa.clear()
                        new = new[len(new) - cap:]
                for h in new:
                    sa[h] = None
            if self._filling:
                if len(sb) >= cap:
                    self._end_fill()
            elif stored and self._settle:
                self._settling(stored)
            d = hits_b - hits_a  # (_weigh inlined, as above)
            self.psel = psel = self.psel * keep + d
            self._s2 = s2 = self._s2 * keep * keep + d * d
            self._ha = ha = self._ha * keep + hits_a
            if ha < 1 or self._filling:
                self._decide()
            elif psel < 0.0 if self.selective else psel > 0.0:
                self._test_switch(psel, s2)
            return
        # the leading hits: plain loops (takewhile and a list cost more for these few keys)
        hits_a = 0
        for h in sampled:
            if h not in sa:
                break
            hits_a += 1
        hits_b = 0
        for h in sampled:
            if h not in sb:
                break
            hits_b += 1
        depth = self._depth
        if self._inflight and not (depth >= 1 or ma.held or mb.held or ma.pins or mb.pins):
            self._inflight = False
        if self._inflight:
            # requests in flight: a key a shadow stored in the last `depth` calls is
            # pending (not evictable, and a lookup stops there: the tier's HIT_PENDING)
            oldest = self._calls - int(depth)
            if ma.held or ma.pins:
                ma.complete(oldest)
                if ma.held:
                    hits_a = _until_pending(sampled, hits_a, ma.held)
            if mb.held or mb.pins:
                mb.complete(oldest)
                if mb.held:
                    hits_b = _until_pending(sampled, hits_b, mb.held)
            if depth >= 1:
                # ... and the keys a lookup hits are loaded: pinned (readable, not
                # evictable) until its request completes, `depth` calls later, as the tier's
                # prepare_load. Without this the shadows evicted what the tier could not and
                # stored where its stores failed: at 1 % of distinct blocks with 32 requests
                # in flight, where pins hold 20-30 % of the tier, they read 4.8 / 8.6 % of
                # hits against the tier's 12.0 / 14.0 (docs/policies.md, "versions tried")
                call = self._calls
                if hits_a:
                    ma.pin(sampled[:hits_a], call)
                if hits_b:
                    mb.pin(sampled[:hits_b], call)
        self.sampled_refs += n
        self.shadow_hits_all += hits_a
        self.shadow_hits_second += hits_b
        sseen = self._sseen
        if hits_a == n and hits_b == n:
            # the usual sampled lookup (a shared head): every key hits in both shadows, no
            # store, no disagreement
            if ma.touch is not None:
                ma.touch(sampled)
                mb.touch(sampled)
            sseen.update(sampled)
            self._ha += n  # (no evidence, no decay: see _weigh)
            if self.selective:  # hits only: the choice can only turn to admit-all
                self._decide()
            return
        if len(sseen) >= self.sample_window:
            self._sseen_old = sseen
            self._sseen = sseen = set()
        sold = self._sseen_old
        run = 0
        for h in sampled:
            if h in sseen or h in sold:
                run += 1
            else:
                break
        sseen.update(sampled)
        call = self._calls if depth >= 1 else 0  # stores stay pending while calls are
        cap = self.shadow_capacity
        ma.access(sampled, n, cap, call)
        if self._filling:  # both shadows store every miss until full: the tier's fill
            mb.access(sampled, n, cap, call)
            if len(sb) >= cap:
                self._end_fill()
        else:
            stored = mb.access(sampled, run, cap, call)
            if stored and self._settle:
                self._settling(stored)
        # PSEL decays by the sampled keys not hit in both shadows (see _weigh)
        keep = 1 - (n - (hits_a if hits_a < hits_b else hits_b)) * self._decay
        if keep < 0.0:  # a lookup of more than HORIZON shadow sizes of such keys: forget
            keep = 0.0  # everything (PSEL stays a decayed sum, never flips sign)
        self._weigh(hits_b - hits_a, hits_a, keep)

    def _count_fill(self, new_keys: Sequence[Hashable], n: int) -> None:
        """During the fill: count a store call's new blocks, and those at the sampled
        depths (``depth % stride == 0``), when the call is the tail of the last lookup (the
        engine's protocol; other calls have no known depths and are not counted)."""
        self._fill_undo = None
        last = self._last
        offset = len(last) - n
        if self._last_run == -1 or offset < 0:
            return  # (the last lookup's keys were not kept: no depths)
        try:
            if list(last[offset:]) != list(new_keys):
                return
        except Exception:  # a key's == answered an array or raised (see _admit_selective)
            return
        s = self.stride
        sampled = (offset + n + s - 1) // s - (offset + s - 1) // s
        self._fill_new += n
        self._fill_sampled += sampled
        self._fill_undo = (n, sampled)

    def _end_fill(self) -> None:
        """The shadows are full: the fill ends, and second sight's settling starts (one
        shadow size of its own stores, see :meth:`_settling`).

        The depth sample (every ``stride``-th depth) is not an even thinning of the blocks
        stored: where the new blocks of the requests do not start evenly at every depth
        modulo ``stride`` (the conversation trace: 23.5 % of its distinct blocks at stride
        4, not 25 %), the shadows see a smaller share of the tier's stores than ``rate``
        says, and at ``rate * num_blocks`` blocks they model a larger tier (SIEVE 18,279
        blocks: the admit-all shadow read up to 2.9 points more hits than the tier on the
        same sampled blocks). So the shadows shrink to ``rate * num_blocks`` times the share
        of the fill's new blocks at the sampled depths over ``1 / stride`` (the thinning
        measured on the fill's stores, O(1) per call; applied where it is below 1 by more
        than :data:`SWITCH_Z` binomial standard errors, ``sqrt((stride - 1) / blocks)``; a
        share above 1 is not applied: the shadow policies were built at the first size). SHARDS-adj (Waldspurger et al., FAST
        2015) corrects the same error of a sample's size."""
        self._filling = False
        self._fill_undo = None
        new = self._fill_new
        if new:
            share = self.stride * self._fill_sampled / new
            # only a share off 1 by more than SWITCH_Z of its binomial standard errors (as
            # if each new block were at a sampled depth with odds 1 / stride): a share
            # measured on few blocks is noise (grid `multi-turn` 3 % W=32: 0.994 on 1,437
            # blocks, 0.24 standard errors, moved the cell -0.11)
            if share < 1.0 - self._z * ((self.stride - 1) / new) ** 0.5:
                cap = max(1, round(share * self._nominal))
                if cap < self.shadow_capacity:
                    self._size_shadows(cap)
                    self._mini_a.shrink(cap)
                    self._mini_b.shrink(cap)
        self._settle = self.shadow_capacity

    def _settling(self, stored: int) -> None:
        """The second-sight shadow stored ``stored`` keys while settling (called only while
        ``_settle`` > 0). When it has stored one shadow size of keys since the fill: what
        PSEL gathered until then compared admit-all with a second-sight shadow that still
        held the fill's unfiltered contents (admit-all's), a bias against second sight (a
        cold-start bias, as the fill's). So a lead for admit-all may be the bias's, and is
        dropped unless it is beyond the switch test's bar (a decided duel: admit-all ahead
        even so): the duel restarts, PSEL and its variance from 0 (the admit-all shadow's
        hit count, for the "no hits" rule, is kept). Evidence for second sight (PSEL > 0),
        gathered despite the bias, is kept whatever its size, as it is when the tier already
        follows second sight (before session 15 an undecided one was dropped too: the
        `one-hit-90` 1 % W=32 cells then waited for a new duel's evidence, docs/policies.md
        "versions tried")."""
        self._settle = settle = self._settle - stored if stored < self._settle else 0
        if settle or self.selective or self.psel > 0.0:
            return
        s2 = self._s2
        if s2:
            se = s2 ** 0.5
            if abs(self.psel) > self._z * se + self._tc / se:
                return  # one rule ahead beyond the test: decided, keep the evidence
        self.psel = 0.0
        self._s2 = 0.0

    def _weigh(self, d: int, hits_a: int, keep: float) -> None:
        """One sampled lookup's evidence: PSEL and the admit-all shadow's hits decay by
        ``keep`` (``1 - decay`` per sampled key not hit in both shadows; ``|d|`` is at most
        their number, so ``|PSEL|`` stays below ``1 / decay``) and take ``d`` (second-sight
        hits minus admit-all hits) and ``hits_a``,
        PSEL's variance decays by ``keep ** 2`` and takes ``d * d``; then the tier's rule
        (:meth:`_decide`'s usual last case inlined, the other cases through it)."""
        self.psel = psel = self.psel * keep + d
        self._s2 = s2 = self._s2 * keep * keep + d * d
        self._ha = ha = self._ha * keep + hits_a
        if ha < 1 or self._filling:
            self._decide()
        elif psel < 0.0 if self.selective else psel > 0.0:
            # the bar only where PSEL points away from the current rule (LRU 16,000
            # blocks: admit-all with PSEL < 0 throughout; call log 917 -> 905,
            # docs/performance.md "Adaptive admission", session 9)
            self._test_switch(psel, s2)

    def _test_switch(self, psel: float, s2: float) -> None:
        """:meth:`_decide`'s last case where PSEL points away from the current rule: switch
        when it is beyond the bar."""
        se = s2 ** 0.5
        if se and abs(psel) > self._z * se + self._tc / se:
            self.selective = not self.selective
            self.switches += 1

    def _decide(self) -> None:
        """The tier's rule from the duel: admit-all during the fill (a free slot costs
        nothing; the duel restarts once second sight has replaced the fill, see
        :meth:`_settling`); then second sight while the admit-all shadow had less than one
        hit in PSEL's horizon (storing first sights would gain nothing); then the current
        rule until PSEL shows the other one ahead by more than :data:`SWITCH_Z` standard
        errors, plus
        Student's small-sample term ``(z**3 + z) / 4 / se`` (the first-order expansion of
        the t-quantile in its degrees of freedom, here about ``s2``: the noise estimate
        rests on few disagreements early on)."""
        if self._filling:
            selective = False
        elif self._ha < 1:
            selective = True
        else:
            # PSEL's standard error when the rules are equal: sqrt(sum of d^2 w^2), kept
            # exactly (s2 decays by keep^2 where PSEL decays by keep)
            se = self._s2 ** 0.5
            bar = self._z * se + self._tc / se if se else 0.0
            psel = self.psel
            selective = self.selective
            if se:  # (no disagreement, or PSEL's variance decayed below the floats)
                if selective:
                    if psel < -bar:
                        selective = False
                elif psel > bar:
                    selective = True
        if selective is not self.selective:
            self.selective = selective
            self.switches += 1

    def admit(self, new_keys: Sequence[Hashable], room: int | None = None) -> int:
        """How many leading ``new_keys`` (a store call's keys not yet in the tier, head to
        tail) to store. Changes only the record of stores in flight (the admitted blocks
        are assumed stored; :meth:`undo_admit` takes that back when the store fails).

        Second sight answers the length of the leading run of keys looked up before the
        current request (within the doorkeeper's window); admit-all answers
        ``len(new_keys)``, unless that exceeds ``room`` (blocks the tier can take now: free
        plus evictable): then the tier is congested with blocks in flight and the whole
        store would fail, so admit-all falls back to the second-sight answer for this call.

        "Before the current request" holds when ``new_keys`` is the tail of the last lookup
        (one request at a time); for any other call (a resident or pending key between the
        lookup's misses; keys of a request looked up before the last one, as an engine that
        looks up a batch of requests before it stores their prefills; keys of no lookup), a
        key counts when the doorkeeper holds it and, under second sight, it was not a first
        sight (past the leading run seen before it) at the latest of the last
        :data:`RECENT_LOOKUPS` lookups that names it, the last lookup first (admit-all's
        fallback counts every key the doorkeeper holds).
        """
        n = len(new_keys)
        flight = self._flight
        if flight and self._flight_blocks - flight[0][1] >= self.num_blocks:
            self._drop_completed()  # stores without lookups: keep the FIFO bounded
        if not self.selective and (room is None or n <= room):
            if self._filling and self.stride > 1:
                self._count_fill(new_keys, n)
            if self._adm is not None:
                self._push()
            self._adm = n
            return n
        self._fill_undo = None  # (this call counted nothing for the fill)
        count = self._admit_selective(new_keys, n)
        if count:
            if self._adm is not None:
                self._push()
            self._adm = count
        return count

    def _drop_completed(self) -> None:
        """Drop the oldest store calls that later calls of ``num_blocks`` blocks or more
        follow: at most ``num_blocks`` blocks are pending and stores complete oldest first,
        so they have completed, and the next lookup's :meth:`_observe_depth` would drop them
        too (the FIFO is trimmed at lookups; without them it grew by one entry per store
        call). Leaves at most ``num_blocks`` + one call's blocks of entries."""
        flight = self._flight
        total = self._flight_blocks
        while flight and total - flight[0][1] >= self.num_blocks:
            total -= flight.popleft()[1]
        self._flight_blocks = total

    def undo_admit(self, answer: int = 1) -> None:
        """The store that the last :meth:`admit` answered ``answer`` for stored nothing
        (``prepare_store`` returned ``None``, or the policy raised): forget it, as if never
        asked. An answer > 0 is the call held in ``_adm`` (see :meth:`admit`); the call it
        displaced into the FIFO has the same call number there, so the state reads the same
        (:meth:`snapshot`). An answer of 0 changed nothing to take back (``_adm`` is still
        the call before). The fill's counts of the call's blocks (see :meth:`_end_fill`)
        are taken back too."""
        if answer:
            self._adm = None
            undo = self._fill_undo
            if undo is not None:
                self._fill_undo = None
                self._fill_new -= undo[0]
                self._fill_sampled -= undo[1]

    def _admit_selective(self, new_keys: Sequence[Hashable], n: int) -> int:
        if self._log:
            self._apply_log()
        last = self._last
        run = self._last_run
        offset = len(last) - n
        try:
            tail = run >= 0 and offset >= 0 and list(last[offset:]) == list(new_keys)
        except Exception:  # a key's == answered an array (np.float64(2.0) == (1, 2)) or
            tail = False  # raised (np.True_ == 2**70): other keys, as a dict holds them
        if tail:
            return 0 if run <= offset else run - offset
        seen = self._seen
        old = self._seen_old
        fresh: set | tuple = ()
        lead: set | tuple = ()
        older = False  # whether keys the last lookup does not name are judged by the ones before
        if self.selective and run >= 0:
            # not the lookup's tail (a resident or pending key between its misses, usual with
            # requests in flight; or a request looked up before the last one, usual in an
            # engine that looks up a batch before its prefills are stored): the doorkeeper
            # already holds those lookups, so their first sights are not seen before (as the
            # shadows and a tail call answer; counted as seen, the tier's second sight stored
            # first sights that its shadow refused: docs/policies.md, "versions tried",
            # session 13; and every first sight but the last request's of a batch, session
            # 17). Only for second sight: admit-all's fallback for a call that cannot fit
            # keeps the doorkeeper's answer (its shadow models a store that fails, not the
            # fallback; answered so, the tier's admit-all read 8 % more than its shadow,
            # test_shadows_model_the_pins_of_loads_in_flight)
            try:
                lead = set(last[:run])
                fresh = set(last[run:]).difference(lead)
                older = len(self._recent) > 1
            except Exception:  # (as above: keys whose == misbehaves are other keys)
                fresh = lead = ()
        count = 0
        verdict = None
        for key in new_keys:
            if (key in seen or key in old) and key not in fresh:
                if older and key not in lead:  # (a key the last lookup does not name: the
                    if verdict is None:  # latest lookup before it that names it, if any)
                        verdict = self._first_sights(last, run)
                    if verdict.get(key):
                        break
                count += 1
            else:
                break
        return count

    def _first_sights(self, last: Sequence[Hashable], run: int) -> dict:
        """For a store call that is not the last lookup's tail: key -> whether it was a first
        sight (past the leading run seen before it, and not within it) at the latest of the
        last lookups that names it (``_recent``, the last lookup ``last`` with its run ``run``
        among them; a request looked up before others, whose store comes after their
        lookups). Merged into the map kept from the call before (O(keys) per lookup merged),
        and built anew once :data:`RECENT_LOOKUPS` lookups were merged into it: it holds the
        keys of the last 64 to 128 lookups."""
        recent = self._recent
        verdict = self._verdict
        if verdict is not None and recent and recent[-1][0] == self._merged:
            return verdict  # (nothing looked up since: the same map)
        built = verdict is None or self._merges >= RECENT_LOOKUPS
        if built:  # (anew: the keys of lookups no longer remembered go)
            verdict = {}
            self._merged = -1
        merged = self._merged
        new = []
        for entry in reversed(recent):  # the lookups not merged yet, newest first
            if entry[0] <= merged:
                break
            new.append(entry)
        try:
            for call, keys, r in reversed(new):
                if r is None:  # (not known: seen, as the doorkeeper says)
                    verdict.update(dict.fromkeys(keys, False))
                else:
                    verdict.update(dict.fromkeys(keys[r:], True))
                    verdict.update(dict.fromkeys(keys[:r], False))
                merged = call
        except Exception:  # a key's == answered an array or raised (see _admit_selective):
            self._verdict = None  # the last lookup's first sights alone, as before session
            try:  # 17 (keys whose == misbehaves are other keys)
                return dict.fromkeys(set(last[run:]).difference(last[:run]), True)
            except Exception:
                return {}
        self._merges = 0 if built else self._merges + len(new)
        self._merged = merged
        self._verdict = verdict
        return verdict

    # -- introspection -------------------------------------------------------------------
    def state_size(self) -> int:
        """Keys held now (doorkeepers and shadows); bounded as the module docstring says."""
        return (len(self._seen) + self._logged + len(self._seen_old) + len(self._sseen)
                + len(self._sseen_old) + len(self._mini_a.keys) + len(self._mini_b.keys))

    def info(self) -> dict:
        """The current choice and the duel's counters, for ``stats``-style reporting."""
        return {
            "mode": "second-sight" if self.selective else "admit-all",
            "psel": self.psel,
            "psel_stderr": self._s2 ** 0.5,
            "filling": self._filling,
            "settling": self._settle > 0,
            "switches": self.switches,
            "sampled_refs": self.sampled_refs,
            "shadow_hits_all": self.shadow_hits_all,
            "shadow_hits_second": self.shadow_hits_second,
            "rate": self.rate,
            "stride": self.stride,
            "modulus": self.modulus,
            "shadow_capacity": self.shadow_capacity,
            "inflight_depth": self._depth,
            "window": self.window,
            "generations": self.generations,
            "state_keys": self.state_size(),
        }

    def _live_flight(self) -> tuple:
        """The FIFO of store calls, with the last answered one (``_adm``) at its end, less
        the ones :meth:`_drop_completed` would drop (they change nothing the admission
        does)."""
        flight = list(self._flight)
        total = self._flight_blocks
        if self._adm is not None:
            flight.append((self._calls, self._adm))
            total += self._adm
        while flight and total - flight[0][1] >= self.num_blocks:
            total -= flight.pop(0)[1]
        return tuple(flight)

    def snapshot(self) -> dict:
        """A comparable copy of the whole state (for tests); applies the doorkeeper's log."""
        if self._log:
            self._apply_log()
        return {
            "seen": set(self._seen),
            "seen_old": set(self._seen_old),
            "sseen": set(self._sseen),
            "sseen_old": set(self._sseen_old),
            "shadow_all": self._mini_a.policy.snapshot(),
            "shadow_second": self._mini_b.policy.snapshot(),
            "last": (list(self._last), self._last_run),
            "recent": [(list(keys), run) for _, keys, run in self._recent],
            "counters": (self.psel, self._s2, self._ha, self._filling, self._settle,
                         self.selective, self.switches, self.sampled_refs,
                         self.shadow_hits_all, self.shadow_hits_second, self.generations,
                         self._calls, self._depth, self._live_flight()),
            "fill": (self._fill_new, self._fill_sampled),
            "pending": (dict(self._mini_a.held), dict(self._mini_b.held)),
            "pinned": (dict(self._mini_a.pins), dict(self._mini_b.pins)),
        }


def make_admission(mode: str, num_blocks: int, policy: type | None = None):
    """The admission object for ``mode`` (one of :data:`ADMISSION_MODES`), or ``None`` for
    ``"all"`` (the manager then stores every new block without asking).

    Args:
        mode: ``"all"``, ``"adaptive"`` (:class:`DuelingAdmission`) or ``"tinylfu"``
            (:class:`kvtier.admission_tinylfu.TinyLFUAdmission`).
        num_blocks: the tier's size in blocks.
        policy: the tier's policy class: :class:`DuelingAdmission`'s shadows run it (LRU when
            ``None`` or an offline policy).

    Raises:
        ValueError: unknown mode.
    """
    if mode == "all":
        return None
    if mode == "adaptive":
        return DuelingAdmission(num_blocks, shadow_policy=policy)
    if mode == "tinylfu":
        from kvtier.admission_tinylfu import TinyLFUAdmission  # noqa: PLC0415

        return TinyLFUAdmission(num_blocks)
    raise ValueError(
        f"unknown admission {mode!r}; expected one of {', '.join(ADMISSION_MODES)}"
    )


class _Mini:
    """A miniature simulation of the tier's policy over the sampled keys (Waldspurger,
    Saemundsson, Ahmad, Park, "Cache Modeling and Optimization using Miniature Simulations",
    USENIX ATC 2017): the policy's own class at the shadow's size, driven by the manager's
    public hooks in the manager's order (touch the looked-up keys, evict for room, insert
    the admitted ones, on_store; mark them evictable when their store completes)."""

    __slots__ = ("fifo", "held", "insert", "keys", "on_store", "pin_fifo", "pin_refs", "pins",
                 "policy", "touch")

    def __init__(self, policy_cls: type, capacity: int) -> None:
        from kvtier.policies import CachePolicy  # noqa: PLC0415 (import cycle)

        self.policy = pol = policy_cls(capacity)
        self.keys: set[int] = set()  # the resident sampled keys
        self.held: dict[int, int] = {}  # pending keys (stores in flight) -> their call
        self.fifo: deque = deque()  # (call, keys) of the stores in flight, oldest first
        self.pins: dict[int, int] = {}  # pinned keys (loads in flight) -> their last call
        self.pin_fifo: deque = deque()  # (call, keys) of the loads in flight, oldest first
        self.pin_refs = 0  # keys in pin_fifo
        cls = type(pol)
        self.touch = pol.touch if cls.touch is not CachePolicy.touch else None
        self.insert = pol.insert if cls.insert is not CachePolicy.insert else None
        self.on_store = pol.on_store if cls.on_store is not CachePolicy.on_store else None

    def access(self, sampled: list[int], upto: int, cap: int, call: int = 0) -> int:
        """One lookup of ``sampled`` (head to tail) that stores the missing keys among the
        first ``upto``, at most ``cap`` keys resident; returns the keys stored. ``call`` > 0:
        the stored keys stay pending (not evictable) until :meth:`complete` passes ``call``,
        and when too few keys are evictable the store fails as a whole (the tier's atomic
        ``prepare_store``); else they are evictable at once."""
        keys = self.keys
        if self.touch is not None:
            self.touch(sampled)
        new = [h for h in sampled[:upto] if h not in keys]
        if len(new) > 1 and len(set(new)) < len(new):
            # each key once, as the manager passes them (the hooks' key-order rule)
            new = list(dict.fromkeys(new))
        over = len(keys) + len(new) - cap
        if over > 0:
            if call:
                victims = self.policy.evict(over)
                if victims is None:
                    return 0
                keys.difference_update(victims)
            else:
                over = min(over, len(keys))
                if over:
                    victims = self.policy.evict(over)
                    if victims:
                        keys.difference_update(victims)
                if len(keys) + len(new) > cap:
                    new = new[: max(0, cap - len(keys))]
        if new:
            if self.insert is not None:
                self.insert(new)
            keys.update(new)
            if call:
                self.fifo.append((call, new))
                held = self.held
                for h in new:
                    held[h] = call
            else:
                self.policy.mark_evictable(new)
            if self.on_store is not None:
                self.on_store(new)
        return len(new)

    def shrink(self, cap: int) -> None:
        """Evict (by the policy) down to ``cap`` resident keys, or as far as the evictable
        keys allow."""
        over = min(len(self.keys) - cap, self.policy.count_eligible())
        if over > 0:
            victims = self.policy.evict(over)
            if victims:
                self.keys.difference_update(victims)

    def pin(self, keys: list[int], call: int) -> None:
        """The lookup of call ``call`` loads ``keys`` (resident, not pending): pinned until
        :meth:`complete` passes ``call`` (a key pinned again stays pinned until its last load
        completes, as the tier's pin count; loads complete oldest first)."""
        pins = self.pins
        fresh = [h for h in dict.fromkeys(keys) if h not in pins]
        for h in keys:
            pins[h] = call
        pin_fifo = self.pin_fifo
        pin_fifo.append((call, keys))
        self.pin_refs += len(keys)
        if self.pin_refs > 2 * len(pins) + len(keys):
            # keys pinned again leave stale entries: rebuilt from the pins, so the FIFO
            # holds at most 2 * pinned + one lookup's keys (O(1) amortized per pin)
            by_call: dict[int, list[int]] = {}
            for h, c in pins.items():
                by_call.setdefault(c, []).append(h)
            pin_fifo.clear()
            pin_fifo.extend(sorted(by_call.items()))
            self.pin_refs = len(pins)
        if fresh:
            self.policy.mark_non_evictable(fresh)

    def _unpin(self, oldest: int) -> list[int]:
        """Release the loads of calls before ``oldest``; returns the keys no longer pinned."""
        pin_fifo = self.pin_fifo
        pins = self.pins
        freed = []
        while pin_fifo and pin_fifo[0][0] < oldest:
            call, done = pin_fifo.popleft()
            self.pin_refs -= len(done)
            for h in done:
                if pins.get(h) == call:  # (not pinned again by a later load)
                    del pins[h]
                    freed.append(h)
        return freed

    def complete(self, oldest: int) -> None:
        """The stores and loads of calls before ``oldest`` completed: their keys become
        evictable."""
        fifo = self.fifo
        held = self.held
        while fifo and fifo[0][0] < oldest:
            done = fifo.popleft()[1]
            for h in done:
                del held[h]
            self.policy.mark_evictable(done)
        if self.pin_fifo:
            freed = self._unpin(oldest)
            if freed:
                self.policy.mark_evictable(freed)


def _until_pending(sampled: list[int], hits: int, held: dict) -> int:
    """The leading hits of ``sampled`` up to its first pending key."""
    for i in range(hits):
        if sampled[i] in held:
            return i
    return hits


class _ARCMini(_Mini):
    """:class:`_Mini` of :class:`~kvtier.policies.arc.ARCPolicy`: while the shadow holds
    nothing (no store in flight, no block set aside by an eviction walk), the policy's steps
    for a lookup spelled out on its fields, without its hooks' checks for held blocks and
    without the ``evict`` recount (every resident block is evictable then); otherwise the
    hooks, as :class:`_Mini` (tested equal). Speed trick on the duel's hot path: ARC 16,000
    blocks, docs/performance.md "Adaptive admission"."""

    __slots__ = ()

    def access(self, sampled: list[int], upto: int, cap: int, call: int = 0) -> int:
        pol = self.policy
        if call or pol._held or pol._t1.aside or pol._t2.aside:
            return _Mini.access(self, sampled, upto, cap, call)
        pol.touch(sampled)
        keys = self.keys
        new = []
        for h in sampled[:upto] if upto < len(sampled) else sampled:
            if h not in keys and h not in new:  # each key once (see _LRUMini.access)
                new.append(h)
        over = len(keys) + len(new) - cap
        if over > 0:
            over = min(over, len(keys))
            if over:  # nothing held: every resident block is eligible, no recount
                keys.difference_update(pol._evict(over, ()))
            if len(keys) + len(new) > cap:
                new = new[: max(0, cap - len(keys))]
        if new:
            # ARCPolicy.insert then mark_evictable: held gains the keys and loses them again
            b1, b2 = pol._b1, pol._b2
            t1_live, t2_live = pol._t1.live, pol._t2.live
            for key in reversed(new):
                if key in b1:
                    del b1[key]
                    t2_live[key] = None
                elif key in b2:
                    del b2[key]
                    t2_live[key] = None
                else:
                    t1_live[key] = None
            keys.update(new)
        return len(new)

    def hit1(self, h: int) -> None:
        """``touch([h])`` of a resident key ``h``."""
        pol = self.policy
        if pol._held or pol._t1.aside or pol._t2.aside:
            pol.touch((h,))
            return
        t2_live = pol._t2.live  # nothing aside: T2's live order is all of T2
        if h in t2_live:
            t2_live.move_to_end(h)
        else:  # seen again: T1 -> T2's most recent end
            del pol._t1.live[h]
            pol._t2.live[h] = None

    def miss1(self, h: int, cap: int, store: bool) -> None:
        """``access([h], 1 if store else 0, cap)`` of a key ``h`` not resident, nothing in
        flight (``call`` 0)."""
        pol = self.policy
        if pol._held or pol._t1.aside or pol._t2.aside:
            _Mini.access(self, [h], 1 if store else 0, cap)
            return
        # ARCPolicy.touch of a missed key: a ghost hit adapts the target
        b1, b2 = pol._b1, pol._b2
        if h in b1:
            step = len(b2) / len(b1)
            target = pol.target + (step if step > 1.0 else 1.0)
            pol.target = target if target < pol.capacity else float(pol.capacity)
            b1.move_to_end(h)
        elif h in b2:
            step = len(b1) / len(b2)
            target = pol.target - (step if step > 1.0 else 1.0)
            pol.target = target if target > 0.0 else 0.0
            b2.move_to_end(h)
        if not store:
            return
        keys = self.keys
        if len(keys) >= cap:  # full: ARCPolicy._evict(1) with nothing held or aside
            if len(pol._t1.live) + 1 > pol.target:
                live, ghost = pol._t1.live, b1
            else:
                live, ghost = pol._t2.live, b2
            if live:
                victim = live.popitem(False)[0]  # (a shadow pins nothing: no _pinned)
                ghost[victim] = None
                if len(ghost) > pol.capacity:
                    ghost.popitem(False)
                pol.examined += 1
                keys.discard(victim)
            else:  # the preferred list is empty: the policy's phases
                keys.difference_update(pol._evict(1, ()))
        # ARCPolicy.insert then mark_evictable of one key
        if h in b1:
            del b1[h]
            pol._t2.live[h] = None
        elif h in b2:
            del b2[h]
            pol._t2.live[h] = None
        else:
            pol._t1.live[h] = None
        keys.add(h)


def _arc_class() -> type:
    from kvtier.policies.arc import ARCPolicy  # noqa: PLC0415 (import cycle)

    return ARCPolicy


def _lru_class() -> type:
    from kvtier.policies.lru import LRUPolicy  # noqa: PLC0415 (import cycle)

    return LRUPolicy


class _LRUMini:
    """:class:`_Mini` of :class:`~kvtier.policies.lru.LRUPolicy`, the same steps on one
    ``OrderedDict`` without the policy's method calls (tested equal). Speed trick on the
    duel's hot path: LRU 16,000 blocks, docs/performance.md "Adaptive admission"."""

    __slots__ = ("fifo", "held", "keys", "pin_fifo", "pin_refs", "pins", "policy")

    def __init__(self, policy_cls: type, capacity: int) -> None:
        self.keys: OrderedDict[int, None] = OrderedDict()  # least recent first
        self.held: dict[int, int] = {}
        self.fifo: deque = deque()
        self.pins: dict[int, int] = {}
        self.pin_fifo: deque = deque()
        self.pin_refs = 0
        self.policy = self  # snapshot() reads policy.snapshot()

    def snapshot(self) -> dict:
        return {"order": list(self.keys)}

    def shrink(self, cap: int) -> None:
        """Evict the least recent evictable keys down to ``cap`` (see :meth:`_Mini.shrink`)."""
        order = self.keys
        over = len(order) - cap
        if over > 0:
            held = self.held
            pins = self.pins
            victims = []
            for h in order:
                if len(victims) >= over:
                    break
                if h not in held and h not in pins:
                    victims.append(h)
            for h in victims:
                del order[h]

    def touch(self, sampled: list[int]) -> None:
        order = self.keys
        for h in reversed(sampled):
            if h in order:
                order.move_to_end(h)

    def access(self, sampled: list[int], upto: int, cap: int, call: int = 0) -> int:
        order = self.keys
        # one pass, tail first: a resident key moves to the most recent end (the head ends
        # most recent), a missing one among the first `upto` is to be stored; `new` holds
        # them tail first, the order they are inserted in, each once at its first place
        # from the head (a key named twice in one lookup is stored, and pending, once)
        # (one loop instead of a touch loop, a loop for the new keys and a reversed
        # insertion loop: LRU 16,000 blocks, call log 876 -> 856, docs/policies.md "Cost")
        new = []
        if upto >= len(sampled):
            for h in reversed(sampled):
                if h in order:
                    order.move_to_end(h)
                elif h in new:  # named again nearer the head: its place is there
                    new.remove(h)
                    new.append(h)
                else:
                    new.append(h)
        elif upto > 0:
            i = len(sampled)
            for h in reversed(sampled):
                i -= 1
                if h in order:
                    order.move_to_end(h)
                elif i < upto:
                    if h in new:
                        new.remove(h)
                    new.append(h)
        else:
            for h in reversed(sampled):
                if h in order:
                    order.move_to_end(h)
        over = len(order) + len(new) - cap
        if over > 0:
            held = self.held
            pins = self.pins
            if held or pins:  # (a pinned key is resident and ready: never pending too)
                if len(order) - len(held) - len(pins) < over:
                    return 0  # too few evictable keys: the store fails as a whole
                victims = []
                for h in order:  # least recent first, past the pending and pinned keys
                    if h not in held and h not in pins:
                        victims.append(h)
                        if len(victims) == over:
                            break
                for h in victims:
                    del order[h]
            elif over <= len(order):  # the usual case: then every new key fits (without
                for _ in range(over):  # min() and a second test: call log 789 -> 774)
                    order.popitem(False)
            elif call:
                return 0
            else:  # more new keys than the shadow holds: the first ones from the head,
                order.clear()  # new's last
                new = new[len(new) - cap:]
        for h in new:
            order[h] = None
        if call and new:
            self.fifo.append((call, new))
            held = self.held
            for h in new:
                held[h] = call
        return len(new)

    pin = _Mini.pin
    _unpin = _Mini._unpin

    def mark_non_evictable(self, keys: list[int]) -> None:
        """(:meth:`pin`'s hook call: the order keeps pinned keys in place, and
        :meth:`access` passes over them.)"""

    def complete(self, oldest: int) -> None:
        fifo = self.fifo
        held = self.held
        while fifo and fifo[0][0] < oldest:
            for h in fifo.popleft()[1]:
                del held[h]
        if self.pin_fifo:
            self._unpin(oldest)
