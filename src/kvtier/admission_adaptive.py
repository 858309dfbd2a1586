"""Adaptive admission for the offloaded tier: store what will be reused, learned online.

Most blocks offered to an offloaded KV-cache tier are never read again, so storing every block
(*admit-all*) evicts useful blocks for one-hit wonders; storing a block only when it is seen
for the second time (*admit-on-second-sight*) protects the tier from them but loses the first
reuse of every block, which costs when most blocks *are* reused. Which of the two wins depends
on the traffic and the tier size (see docs/policies.md, "Admission"), and it can change during
a run. :class:`DuelingAdmission` runs both on a small sampled shadow of the key space and lets
the tier follow the one with fewer misses there.

**Set dueling** (Qureshi, Jaleel, Patt, Steely, Emer, "Adaptive insertion policies for high
performance caching", ISCA 2007): two leader groups, one per policy, feed a saturating
counter (PSEL) with their misses; the followers use the policy PSEL favours. A fully
associative tier has no sets, so the leaders here are two *shadow caches* (key -> nothing,
LRU order) over a sample of the key space: a key is sampled when a multiplicative hash of
``hash(key)`` falls below ``rate`` (spatial sampling as in SHARDS, Waldspurger et al., FAST'15),
and each shadow holds ``rate * num_blocks`` keys, so its hit ratio estimates that of a
``num_blocks`` cache over the whole key space. Shadow A admits every miss; shadow B admits a
missed key only when the key was looked up before *and* every key before it in the call was
too (prefix-closed, as the real tier does). A sampled key that hits in one shadow and misses in
the other moves PSEL by one towards the shadow that hit; PSEL is saturating, so after a
change in the traffic the tier follows the new winner after at most ``PSEL_MAX + 1`` such
differences. Ties go to second sight (PSEL starts at 0, second sight while PSEL >= 0): when
neither shadow hits, as on traffic that is never reused, storing is only wasted writes.

**Doorkeeper** ("seen before"): the keys looked up in the current generation and the one
before it, two Python sets; a generation ends after ``WINDOW_FACTOR * num_blocks`` distinct
keys (as TinyLFU's doorkeeper is reset every sample of W references, Einziger, Friedman and
Manes, ACM ToS 2017). A key counts as seen before when the previous lookup of it is at most
one to two generations old.

The shadows are LRU whatever the tier's policy: the module asks nothing of the policy, so it
composes with every registered one. They see hits per key (a sampled key hits when it and
the sampled keys before it in the call are in the shadow), not the tier's exact prefix hits.

State (independent of the trace's length): the doorkeeper holds at most ``3 * (G + L)`` keys
(two generations plus the keys seen twice in the current one; ``G = WINDOW_FACTOR *
num_blocks``, ``L`` the longest call), the shadows at most ``2 * ceil(rate * num_blocks)``
keys, plus a few counters. Time: O(1) per key looked up (three set operations, the sampling
hash, and for a sampled key two shadow updates); O(1) amortized per key for the end of a
generation (one set of ``G`` keys is dropped every ``G`` new keys); :meth:`admit` is O(keys
admitted + 1).

Deterministic for a given sequence of calls whose keys hash deterministically: ints (every
kvtier trace reader), tuples of ints, bools, None. ``str`` and ``bytes`` keys hash differently
in each process unless ``PYTHONHASHSEED`` is set, so the *sample* (not the correctness of
the bookkeeping) then varies from run to run.

Not thread-safe: the manager calls it under whatever lock guards the manager.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from itertools import compress, takewhile

__all__ = [
    "ADMISSION_MODES",
    "DuelingAdmission",
    "MIN_RATE",
    "PSEL_MAX",
    "SHADOW_BLOCKS",
    "WINDOW_FACTOR",
    "make_admission",
]

ADMISSION_MODES = ("all", "adaptive")
"""Accepted ``admission`` names: ``"all"`` stores every new block, ``"adaptive"`` is
:class:`DuelingAdmission`."""

WINDOW_FACTOR = 8
"""Doorkeeper generation, in distinct keys per tier block. 8 keeps a key's first sight for
8 to 16 tier sizes of new keys: a block reused within that is admitted on its second sight.
Caffeine (TinyLFU) resets its sketch every 10 tier sizes; the figure is generic, not fitted
to a trace."""

SHADOW_BLOCKS = 512
"""Wanted size of each shadow cache, in blocks: the sampling rate is
``SHADOW_BLOCKS / num_blocks`` (between :data:`MIN_RATE` and 1), so a tier of at most 512
blocks is shadowed in full."""

MIN_RATE = 1 / 64
"""Lowest sampling rate: in a huge tier, one key in 64 still feeds the shadows, so they see
enough references to decide quickly."""

PSEL_MAX = 512
"""PSEL saturates at +-512 (Qureshi et al.'s 10-bit counter): the tier follows a change of
winner after at most 513 sampled block hits where the shadows disagree."""

_EMA_CALLS = 256
_EMA_ALPHA = 1 / _EMA_CALLS  # weight of one call in the running means of blocks inserted
_P = 2**31 - 1  # Mersenne prime: sampled iff (hash(key) * _M) % _P < rate * _P
_M = 1_327_217_884  # round(_P * (sqrt(5) - 1) / 2): consecutive int keys spread evenly


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
        psel_max: PSEL saturation bound (>= 1).

    Raises:
        ValueError: an argument out of its range (named in the message).
    """

    name = "adaptive"

    def __init__(
        self,
        num_blocks: int,
        *,
        window_factor: int = WINDOW_FACTOR,
        shadow_blocks: int = SHADOW_BLOCKS,
        min_rate: float = MIN_RATE,
        psel_max: int = PSEL_MAX,
    ) -> None:
        for arg, value in (("num_blocks", num_blocks), ("window_factor", window_factor),
                           ("shadow_blocks", shadow_blocks), ("psel_max", psel_max)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        if isinstance(min_rate, bool) or not isinstance(min_rate, (int, float)) or not (
            0 < min_rate <= 1
        ):
            raise ValueError(f"min_rate must be a number in (0, 1], got {min_rate!r}")
        self.num_blocks = num_blocks
        self.window = window_factor * num_blocks
        self.rate = min(1.0, max(float(min_rate), shadow_blocks / num_blocks))
        self.shadow_capacity = max(1, round(self.rate * num_blocks))
        self.psel_max = psel_max
        self._cut = round(self.rate * _P)  # sampled iff (hash * _M) % _P < _cut
        self.clear()

    def clear(self) -> None:
        """Forget everything (the state of a new instance)."""
        self._seen: set[Hashable] = set()  # current generation
        self._seen_old: set[Hashable] = set()  # previous generation
        self._twice: set[Hashable] = set()  # looked up again in this generation
        self._shadow_all: OrderedDict[Hashable, None] = OrderedDict()
        self._shadow_second: OrderedDict[Hashable, None] = OrderedDict()
        # PSEL >= 0: second sight (a tie refuses: a block no shadow hits is a wasted write)
        self.psel = 0
        self.selective = True  # the tier's current choice: True second sight, False admit-all
        self.switches = 0
        self.sampled_refs = 0
        self.shadow_hits_all = 0
        self.shadow_hits_second = 0
        self.generations = 0
        self._busy = 0  # the tier's pending + pinned blocks at the last lookup
        self._cap_a = self._cap_b = self.shadow_capacity
        self._ins = [0.0, 0.0]  # running means of blocks inserted per call: shadow A, B

    # -- the manager's hooks -------------------------------------------------------------
    def record(self, keys: Sequence[Hashable], busy: int = 0) -> None:
        """Count one lookup of each of ``keys`` (head to tail, as the request names them).

        ``busy``: the tier's blocks that cannot hold a cached block now (pending stores and
        pinned loads). With requests in flight they squeeze the room left for cached blocks,
        and more so under the rule that stores more: each shadow's capacity is shrunk by its
        own estimate of them (``busy`` scaled by the shadow's own blocks inserted per call
        over those of the rule the tier follows, running means over about
        :data:`_EMA_CALLS` calls).

        Raises:
            TypeError: a key is not hashable; nothing changed then.
        """
        seen = self._seen
        if len(seen) >= self.window:  # a new generation: the oldest sights are forgotten
            self._seen_old = seen
            self._seen = seen = set()
            self._twice = set()
            self.generations += 1
        # intersection hashes every key first and builds new sets: a TypeError leaves no trace
        again = seen.intersection(keys)
        again_old = self._seen_old.intersection(keys)
        twice = self._twice
        twice |= again
        twice |= again_old
        seen.update(keys)
        # sampled positions, in C: (hash * _M) % _P < cut
        cut = self._cut
        if cut >= _P:
            positions: Sequence[int] = range(len(keys))
        else:
            positions = list(compress(range(len(keys)), map(
                cut.__gt__, map(_P.__rmod__, map(_M.__mul__, map(hash, keys))))))
            if not positions:
                ins = self._ins
                ins[0] -= ins[0] * _EMA_ALPHA
                ins[1] -= ins[1] * _EMA_ALPHA
                if busy != self._busy:
                    self._resize(busy)
                return
        self._duel(keys, positions)
        if busy != self._busy:
            self._resize(busy)

    def _resize(self, busy: int) -> None:
        """Shadow capacities for ``busy`` blocks in flight in the tier (see :meth:`record`)."""
        self._busy = busy
        ins_a, ins_b = self._ins
        current = ins_b if self.selective else ins_a
        free = self.num_blocks - busy
        if busy and current > 0:
            free_a = self.num_blocks - busy * ins_a / current
            free_b = self.num_blocks - busy * ins_b / current
        else:
            free_a = free_b = free
        self._cap_a = max(1, round(self.rate * free_a))
        self._cap_b = max(1, round(self.rate * free_b))

    def _duel(self, keys: Sequence[Hashable], positions: Sequence[int]) -> None:
        """Replay the sampled keys of one lookup through both shadows and move PSEL."""
        twice = self._twice
        # second sight admits the leading keys seen before (prefix-closed)
        run = len(list(takewhile(twice.__contains__, keys)))
        sa = self._shadow_all
        sb = self._shadow_second
        cap_a = self._cap_a
        cap_b = self._cap_b
        inserted_a = inserted_b = 0
        # hits per key, stopping at a sampled key's miss as the tier's prefix lookup would
        hits_a = hits_b = 0
        for i in positions:
            if keys[i] in sa:
                hits_a += 1
            else:
                break
        for i in positions:
            if keys[i] in sb:
                hits_b += 1
            else:
                break
        # update in reverse so the call's first key ends most recently used (as touch does)
        for i in reversed(positions):
            key = keys[i]
            if key in sa:
                sa.move_to_end(key)
            else:
                sa[key] = None
                inserted_a += 1
                while len(sa) > cap_a:  # more than once only after a capacity cut
                    sa.popitem(False)
            if key in sb:
                sb.move_to_end(key)
            elif i < run:
                sb[key] = None
                inserted_b += 1
                while len(sb) > cap_b:
                    sb.popitem(False)
        ins = self._ins
        ins[0] += (inserted_a - ins[0]) * _EMA_ALPHA
        ins[1] += (inserted_b - ins[1]) * _EMA_ALPHA
        self.sampled_refs += len(positions)
        if hits_a != hits_b:
            self.shadow_hits_all += hits_a
            self.shadow_hits_second += hits_b
            psel = self.psel + hits_b - hits_a
            lim = self.psel_max
            psel = lim if psel > lim else -lim if psel < -lim else psel
            self.psel = psel
            selective = psel >= 0
            if selective is not self.selective:
                self.selective = selective
                self.switches += 1
        else:
            self.shadow_hits_all += hits_a
            self.shadow_hits_second += hits_b

    def admit(self, new_keys: Sequence[Hashable], room: int | None = None) -> int:
        """How many leading ``new_keys`` (a store call's keys not yet in the tier, head to
        tail) to store. Changes nothing.

        Second sight answers the length of the leading run of keys looked up before the
        current lookup (within the doorkeeper's window); admit-all answers ``len(new_keys)``,
        unless that exceeds ``room`` (blocks the tier can take now: free plus evictable).
        Then the tier is congested with blocks in flight and the whole store would fail, so
        admit-all falls back to the second-sight answer for this call.
        """
        if not self.selective:
            if room is None or len(new_keys) <= room:
                return len(new_keys)
        return len(list(takewhile(self._twice.__contains__, new_keys)))

    # -- introspection -------------------------------------------------------------------
    def state_size(self) -> int:
        """Keys held now (doorkeeper and shadows); bounded as the module docstring says."""
        return (len(self._seen) + len(self._seen_old) + len(self._twice)
                + len(self._shadow_all) + len(self._shadow_second))

    def info(self) -> dict:
        """The current choice and the duel's counters, for ``stats``-style reporting."""
        return {
            "mode": "second-sight" if self.selective else "admit-all",
            "psel": self.psel,
            "switches": self.switches,
            "sampled_refs": self.sampled_refs,
            "shadow_hits_all": self.shadow_hits_all,
            "shadow_hits_second": self.shadow_hits_second,
            "rate": self.rate,
            "shadow_capacity": self.shadow_capacity,
            "shadow_capacity_now": (self._cap_a, self._cap_b),
            "window": self.window,
            "generations": self.generations,
            "state_keys": self.state_size(),
        }

    def snapshot(self) -> dict:
        """A comparable copy of the whole state (for tests)."""
        return {
            "seen": set(self._seen),
            "seen_old": set(self._seen_old),
            "twice": set(self._twice),
            "shadow_all": list(self._shadow_all),
            "shadow_second": list(self._shadow_second),
            "counters": (self.psel, self.selective, self.switches, self.sampled_refs,
                         self.shadow_hits_all, self.shadow_hits_second, self.generations,
                         self._busy, self._cap_a, self._cap_b, tuple(self._ins)),
        }


def make_admission(mode: str, num_blocks: int) -> DuelingAdmission | None:
    """The admission object for ``mode`` (one of :data:`ADMISSION_MODES`), or ``None`` for
    ``"all"`` (the manager then stores every new block without asking).

    Raises:
        ValueError: unknown mode.
    """
    if mode == "all":
        return None
    if mode == "adaptive":
        return DuelingAdmission(num_blocks)
    raise ValueError(
        f"unknown admission {mode!r}; expected one of {', '.join(ADMISSION_MODES)}"
    )
