"""TinyLFU admission for the offloaded tier: a new block is stored only when it is more
frequent than the blocks the tier is evicting.

Source: Einziger, Friedman, Manes, "TinyLFU: A Highly Efficient Cache Admission Policy",
ACM Transactions on Storage 13(4), 2017. TinyLFU keeps an approximate access frequency of
every key seen recently and admits a candidate only if its frequency beats the would-be
victim's. Its parts, as here:

* **Count-min sketch** (Cormode and Muthukrishnan, 2005): ``DEPTH = 4`` rows of ``width``
  saturating 4-bit counters (``width`` the power of two >= ``WIDTH_FACTOR`` times the
  tier's size, at least 64 and at most ``MAX_WIDTH``; one byte per counter);
  a key's estimate is the minimum of its four counters.
* **Doorkeeper**: a key's first lookup in a sample goes to a set, not to the sketch, so
  one-hit wonders never touch the counters; the estimate adds 1 for a key in the doorkeeper.
* **Aging ("reset")**: after ``SAMPLE_FACTOR * num_blocks`` counted lookups every counter is
  halved and the doorkeeper is emptied, so old popularity fades.

**The would-be victim.** kvtier's policies do not expose their next victim without evicting
it (and the module must compose with every registered policy), so the victim's frequency is
taken from the tier's real evictions: the manager reports each call's victims
(:meth:`TinyLFUAdmission.evicted`), and the estimate of each victim at its eviction feeds a
running mean over about the last ``_VICTIM_WINDOW`` victims. A candidate is admitted when its
estimate is strictly above that mean (TinyLFU's "candidate beats victim", ties refused). While
the tier still has free slots (fewer blocks admitted than its size: a store then evicts
nothing) every candidate is admitted. Slots come back to that count when a store fails (the
manager calls :meth:`TinyLFUAdmission.released` from ``complete_store(keys,
success=False)``, which frees the slots) and when the tier is emptied (``reset_cache`` calls
:meth:`~TinyLFUAdmission.clear`); evictions give none back, since each victim's slot goes to
the block that evicted it.

**Prefix-closed**: :meth:`admit` answers the length of the leading run of admitted keys, so a
block is never stored after one refused in the same call.

State (independent of the trace's length): ``4 * width`` bytes of counters, a doorkeeper of
at most ``SAMPLE_FACTOR * num_blocks + L`` keys (``L`` the longest call), a few numbers.
Time: O(1) per key looked up (one hash, four counter reads or writes, one set operation),
O(width) per reset, that is O(1 / SAMPLE_FACTOR) amortized per key; :meth:`admit` is O(1)
per key of its call.

Deterministic for keys that hash deterministically (ints, tuples of ints; ``str`` and
``bytes`` keys only with a fixed ``PYTHONHASHSEED``). Not thread-safe: the manager calls it
under whatever lock guards the manager.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["DEPTH", "MAX_WIDTH", "SAMPLE_FACTOR", "WIDTH_FACTOR", "TinyLFUAdmission"]

DEPTH = 4
"""Rows of the count-min sketch (TinyLFU's and Caffeine's four)."""

WIDTH_FACTOR = 4
"""Counters per row per tier block (rounded up to a power of two): ``4 * 4 = 16`` counters
per block in all, as Caffeine's sketch (one 64-bit word of sixteen 4-bit counters per
block); with W = 10 x the tier's size, fewer would inflate every estimate by collisions."""

MAX_WIDTH = 1 << 24
"""Most counters per row: the sketch takes at most ``4 * 2**24`` bytes (64 MiB), reached at
4,194,304 tier blocks. Larger tiers share counters (a count-min sketch only over-estimates,
more so the more keys share a counter); without a cap the sketch was allocated up front at 16
bytes per block (a tier of ``MAX_BLOCKS`` blocks asked for 32 GiB before storing anything)."""

SAMPLE_FACTOR = 10
"""Sample size W per tier block: the sketch is halved after ``10 * num_blocks`` counted
lookups (TinyLFU's and Caffeine's choice of W = 10 x cache size)."""

_COUNTER_MAX = 15  # 4-bit counters
_VICTIM_WINDOW = 64  # victims averaged for the victim's frequency
# odd 64-bit multipliers, one per row (splitmix64's constants and two golden-ratio ones)
_SEEDS = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93)
_MASK64 = (1 << 64) - 1
_HALF = bytes(v >> 1 for v in range(256))  # the aging table: every counter halved


class TinyLFUAdmission:
    """TinyLFU admission (see the module docstring).

    The manager calls :meth:`record` with the keys of every lookup, :meth:`admit` with a
    store call's new keys (head to tail; the answer is how many leading keys to store),
    :meth:`evicted` with the victims of each store and :meth:`released` with the blocks of
    each failed store.

    Args:
        num_blocks: the tier's capacity in blocks (>= 1).
        sample_factor: lookups per tier block between two agings (>= 1).

    Raises:
        ValueError: an argument is not a positive int (named in the message).
    """

    name = "tinylfu"

    def __init__(self, num_blocks: int, *, sample_factor: int = SAMPLE_FACTOR) -> None:
        for arg, value in (("num_blocks", num_blocks), ("sample_factor", sample_factor)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        self.num_blocks = num_blocks
        self.sample = sample_factor * num_blocks
        width = 64
        while width < WIDTH_FACTOR * num_blocks and width < MAX_WIDTH:
            width *= 2
        self.width = width
        self._shift = 64 - width.bit_length() + 1  # the top log2(width) bits of a product
        self.clear()

    def clear(self) -> None:
        """Forget everything (the state of a new instance)."""
        self._rows = [bytearray(self.width) for _ in range(DEPTH)]
        self._door: set[Hashable] = set()
        self._counted = 0  # lookups counted since the last aging
        self.resets = 0
        self._victim_freq = 0.0  # running mean of the victims' estimates
        self._admitted = 0  # slots admitted blocks hold (<= num_blocks): the tier has at
        # least num_blocks - this free slots
        self.admitted = 0
        self.refused = 0
        # (keys offered, admitted, slots added to _admitted) by the last admit: undo_admit
        self._last_admit = (0, 0, 0)

    def _cells(self, key: Hashable) -> list[int]:
        h = hash(key) & _MASK64
        shift = self._shift
        return [((h * seed) & _MASK64) >> shift for seed in _SEEDS]

    def estimate(self, key: Hashable) -> int:
        """The key's estimated lookups in the current sample (doorkeeper included), 0-16."""
        rows = self._rows
        # one cell per row by construction; zip left without strict= (ruff B905): this is
        # the per-key path of every lookup
        est = min(row[i] for row, i in zip(rows, self._cells(key)))
        return est + 1 if key in self._door else est

    def record(self, keys: Sequence[Hashable], busy: int = 0, pending: int = 0) -> None:
        """Count one lookup of each of ``keys``. ``busy`` and ``pending`` are accepted for
        the manager's hook and unused.

        Raises:
            TypeError: a key is not hashable; nothing is counted then.
        """
        hash(tuple(keys))  # validate every key before counting any
        door = self._door
        rows = self._rows
        shift = self._shift
        r0, r1, r2, r3 = rows
        s0, s1, s2, s3 = _SEEDS
        for key in keys:
            if key not in door:
                door.add(key)
                continue
            h = hash(key) & _MASK64
            for row, i in ((r0, ((h * s0) & _MASK64) >> shift),
                           (r1, ((h * s1) & _MASK64) >> shift),
                           (r2, ((h * s2) & _MASK64) >> shift),
                           (r3, ((h * s3) & _MASK64) >> shift)):
                if row[i] < _COUNTER_MAX:
                    row[i] += 1
        self._counted += len(keys)
        if self._counted >= self.sample:  # aging: halve every counter, empty the doorkeeper
            self._counted = 0
            self._rows = [row.translate(_HALF) for row in rows]
            door.clear()
            self.resets += 1

    def evicted(self, keys: Sequence[Hashable]) -> None:
        """The tier evicted ``keys``: their estimates feed the victim frequency."""
        alpha = 1 / _VICTIM_WINDOW
        vf = self._victim_freq
        for key in keys:
            vf += (self.estimate(key) - vf) * alpha
        self._victim_freq = vf

    def admit(self, new_keys: Sequence[Hashable], room: int | None = None) -> int:
        """How many leading ``new_keys`` to store: all while the tier has free slots for
        them, else the leading run whose estimates are above the victims' mean. ``room`` is
        accepted for the manager's hook and unused."""
        n = len(new_keys)
        if self._admitted + n <= self.num_blocks:
            count = n
        else:
            vf = self._victim_freq
            count = 0
            for key in new_keys:
                if self.estimate(key) > vf:
                    count += 1
                else:
                    break
        # slots the admitted blocks hold: at most the tier's size (a block admitted into a
        # full tier takes its victim's slot), so a failed store's release frees real slots
        held = min(self._admitted + count, self.num_blocks)
        self._last_admit = (n, count, held - self._admitted)
        self._admitted = held
        self.admitted += count
        self.refused += n - count
        return count

    def undo_admit(self, answer: int = 1) -> None:
        """The store that the last :meth:`admit` answered stored nothing (``prepare_store``
        returned ``None``, or the policy raised): take its counts back, as if never asked.
        ``answer`` (what admit answered) is accepted for the manager's call and unused: the
        counts of the last answer, 0 included, are kept for this."""
        n, count, held = self._last_admit
        self._last_admit = (0, 0, 0)
        self._admitted -= held
        self.admitted -= count
        self.refused -= n - count

    def released(self, keys: Sequence[Hashable]) -> None:
        """The tier dropped ``keys`` without evicting them (their stores failed:
        ``complete_store(keys, success=False)`` frees their slots): count those slots free
        again, so blocks that fit them are admitted without a victim."""
        self._admitted = max(0, self._admitted - len(keys))

    def state_size(self) -> int:
        """Doorkeeper keys held now (the sketch is a fixed ``4 * width`` bytes)."""
        return len(self._door)

    def info(self) -> dict:
        return {"mode": "tinylfu", "width": self.width, "sample": self.sample,
                "resets": self.resets, "victim_freq": self._victim_freq,
                "doorkeeper_keys": len(self._door)}

    def snapshot(self) -> dict:
        """A comparable copy of the whole state (for tests)."""
        return {"rows": [bytes(r) for r in self._rows], "door": set(self._door),
                "counters": (self._counted, self.resets, self._victim_freq, self._admitted,
                             self.admitted, self.refused)}
