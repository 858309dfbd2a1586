"""TierStack: the host tier's manager composed with block tiers below it (disk, Redis, ...).

The host tier is an :class:`~kvtier.OffloadingManager` whose slots hold bytes somewhere (a
:class:`~kvtier.dataplane.HostBlockPool` in :class:`kvtier.dataplane.tiered.TieredOffloader`,
nothing in the trace simulation :mod:`kvtier.tiersim`); the stack reaches those bytes only
through two callbacks, ``read_slot(slot) -> bytes`` and ``write_slot(slot, data)``, so the
same tiering logic drives the real data plane and the simulation.

* **Tiered lookup** (:meth:`TierStack.lookup`): the leading blocks of a request, run by run:
  the host's run (``lookup_prefix``), then at the first host miss the first lower tier (top
  down) whose ``lookup_prefix`` of the rest is non-zero (its run cut at the next block the
  host holds), then the host again, and so on, until no tier holds the next block. A block whose host store is still in flight (HIT_PENDING)
  ends the lookup (it cannot be loaded, and must not be stored twice).
* **Promotion** (:meth:`TierStack.promote`): the blocks found below the host are read
  (verified by their tier), then entered into the host through the normal
  ``prepare_store`` / ``write_slot`` / ``complete_store`` path, in one ``prepare_store`` of
  the whole found prefix (so the host blocks of that prefix are protected from the eviction
  it may cause). A block that fails to read ends the prefix there.
* **Demotion**: ``"write-back"`` — a block the host evicts is copied out of its slot *inside*
  the policy's ``evict`` (before ``prepare_store`` returns, so before anyone can reuse the
  slot) and written to every lower tier by :meth:`TierStack.flush_demotions` (unless every
  lower tier already holds it, e.g. a block promoted from the disk; a victim whose slot
  ``read_slot`` cannot read is dropped, and ``flush_demotions`` raises naming it);
  ``"write-through"`` — a block is written to every lower tier as soon as its host store
  completes (:meth:`TierStack.stored`), and eviction copies nothing. The hierarchy is
  inclusive: a block promoted from a lower tier is a host store too, so
  :meth:`TierStack.flush_demotions` writes it to the lower tiers that do not hold it yet
  (e.g. the disk, for a block promoted from Redis below it; the tier it came from, and any
  tier that answers ``in`` that it holds the block, are not written again).
* **Events** (:meth:`TierStack.take_events`): :class:`TierEvent` s (tier name, keys,
  removed) from the host manager and from every lower tier that has ``take_events()``.
* **Stats** (:meth:`TierStack.stats`): one :class:`~kvtier.tiers.base.TierStats` per tier,
  by name, top down; :attr:`TierStack.promoted` / :attr:`TierStack.demoted` count the moves.

Not thread-safe: call it from the engine's thread (the thread that owns the host manager).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvtier.checks import check_positive_int, check_timeout
from kvtier.manager import OffloadingManager
from kvtier.tiers.base import BlockTier, TierStats

__all__ = ["DEMOTION_MODES", "TierEvent", "TierStack", "TieredLookup"]

DEMOTION_MODES = ("write-back", "write-through")
"""Accepted values of ``TierStack(demotion=...)``."""


class TierEvent(NamedTuple):
    """Blocks that became readable (``removed=False``) or left (``removed=True``) a tier."""

    tier: str
    keys: tuple[Hashable, ...]  # immutable, as the manager's events
    removed: bool


@dataclass
class TieredLookup:
    """Answer of :meth:`TierStack.lookup` for one request.

    Attributes:
        hits: leading blocks available in some tier (``sum`` of the runs' counts).
        runs: ``(tier name, count)`` in key order: ``keys[0:c0]`` are in tier ``runs[0][0]``,
            the next ``c1`` in ``runs[1][0]``, ...
    """

    hits: int
    runs: list[tuple[str, int]] = field(default_factory=list)

    def by_tier(self) -> dict[str, int]:
        """Blocks per tier name (tiers with none are left out)."""
        out: dict[str, int] = {}
        for name, count in self.runs:
            out[name] = out.get(name, 0) + count
        return out


class TierStack:
    """A host manager plus block tiers below it.

    Args:
        host: the host tier's manager. The stack wraps its policy's ``_evict`` (an instance
            attribute) to see victims, until :meth:`close`; build it with ``enable_events=True`` for host events.
        lower: the tiers below, top down (e.g. ``[disk, redis]``); names must be distinct and
            differ from ``host_name``; every tier's ``block_bytes`` must be ``block_bytes``.
        block_bytes: bytes of one block.
        read_slot: ``read_slot(slot) -> bytes``: a copy of host slot ``slot``'s bytes.
        write_slot: ``write_slot(slot, data)``: put ``data`` into host slot ``slot``.
        demotion: ``"write-back"`` (default) or ``"write-through"`` (see the module doc).
        host_name: the host tier's name in events and stats.

    Raises:
        ValueError: an unknown demotion mode, repeated tier names, a tier of another
            block size, or ``block_bytes`` not a positive int.
        TypeError: ``host`` is not an OffloadingManager, ``lower`` is one tier (or None)
            rather than a list, or a tier is not a BlockTier.

    Thread safety: none: one thread (the engine's) calls the stack and, through it, the host
    manager, which is not thread-safe either; the lower tiers may run threads of their own.
    """

    def __init__(
        self,
        host: OffloadingManager,
        lower: Sequence[BlockTier],
        block_bytes: int,
        read_slot: Callable[[int], bytes],
        write_slot: Callable[[int, Any], None],
        *,
        demotion: str = "write-back",
        host_name: str = "host",
    ) -> None:
        if not isinstance(host, OffloadingManager):
            raise TypeError(f"host must be an OffloadingManager, got {type(host).__name__}")
        # checked here too: without lower tiers nothing compares it ("8" made host_stats'
        # bytes a str)
        block_bytes = check_positive_int("block_bytes", block_bytes, "bytes")
        if demotion not in DEMOTION_MODES:
            raise ValueError(
                f"demotion must be one of {', '.join(DEMOTION_MODES)}, got {demotion!r}"
            )
        if lower is None or isinstance(lower, (BlockTier, str, bytes)) or not isinstance(
                lower, Iterable):
            raise TypeError(f"lower must be a list of tiers (e.g. [disk]), got "
                            f"{type(lower).__name__}")
        lower = list(lower)
        names = [host_name]
        for tier in lower:
            if not isinstance(tier, BlockTier):
                raise TypeError(f"lower tiers must be BlockTiers, got {type(tier).__name__}")
            if tier.name in names:
                raise ValueError(f"tier name {tier.name!r} is used twice; names must differ")
            if tier.block_bytes != block_bytes:
                raise ValueError(f"tier {tier.name!r} stores blocks of {tier.block_bytes} bytes, "
                                 f"the host's are {block_bytes}")
            names.append(tier.name)
        self.host = host
        self.lower = lower
        self.block_bytes = block_bytes
        self.host_name = host_name
        self.names = names
        self.demotion = demotion
        self._read_slot = read_slot
        self._write_slot = write_slot
        self._victims: list[tuple[Hashable, bytes]] = []
        # write-through: promoted blocks for the lower tiers that lack them (key, bytes,
        # the tier they came from), written by flush_demotions
        self._through: list[tuple[Hashable, Any, str]] = []
        # victims whose host slot read_slot could not read: (key, error), for flush_demotions
        self._unread: list[tuple[Hashable, BaseException]] = []
        #: blocks promoted into the host, per tier they came from
        self.promoted: dict[str, int] = {name: 0 for name in names[1:]}
        #: blocks written down from the host (evicted under write-back, stored under
        #: write-through), counted once per block whatever the number of lower tiers: taken
        #: by at least one lower tier, as its ``write``'s return value says (a tier skips
        #: what it holds already, or cannot take now: Redis with its breaker open or its
        #: queue full, a disk without an evictable slot; its ``writes_skipped`` counts
        #: those). Exact when at most one tier took only part of a batch (always with one
        #: lower tier); when several did, ``write``'s count does not say which blocks, and
        #: the least number consistent with the counts is added (see :meth:`_taken`)
        self.demoted = 0
        #: promotions refused because the host could not make room (pinned/pending blocks)
        self.promote_failures = 0
        # every eviction, the manager's and CachePolicy.evict's, goes through the policy's
        # _evict: the victims still have their host slots while it returns
        policy = host.policy
        inner = policy._evict
        slot_of = host.slot_of
        self._hooked = True  # False once closed: the wrapper passes the victims through

        def _evict(n: int, protected: Any) -> Any:
            victims = inner(n, protected)
            if victims and self._hooked and self.demotion == "write-back" and self.lower:
                read = self._read_slot
                held = self._held_below
                # copied now: the slot is handed to a new block when prepare_store returns
                for key in victims:
                    if held(key):  # never raises (a closed lower tier counts as not holding)
                        continue
                    try:
                        data = read(slot_of(key))
                    except Exception as exc:  # noqa: BLE001 (any read error: dropped, reported)
                        # the policy has let the victims go, so the manager must take them
                        # all (raising here put the two out of step): the block is dropped
                        # and flush_demotions reports it
                        self._unread.append((key, exc))
                        continue
                    self._victims.append((key, data))
            return victims

        # what was there: the policy's own _evict (None: the class's) or another stack's
        self._evict_hook = (policy, _evict, policy.__dict__.get("_evict"))
        _evict.stack = self  # type: ignore[attr-defined]
        policy._evict = _evict  # type: ignore[method-assign]

    def _held_below(self, key: Hashable) -> bool:
        """Every lower tier already holds ``key`` readable (asked only of tiers that answer
        ``in`` without I/O, i.e. define ``__contains__``; any other tier counts as not
        holding it). Saves the copy of a victim that was promoted from below. Never raises:
        it runs inside the policy's eviction, after the policy let the victims go (a disk
        closed by its owner raised here, and the host kept a block its policy no longer
        knew); a tier whose ``in`` raises counts as not holding it (its write says why)."""
        for tier in self.lower:
            contains = getattr(type(tier), "__contains__", None)
            if contains is None:
                return False
            try:
                if not contains(tier, key):
                    return False
            except Exception:  # noqa: BLE001 (e.g. a closed tier: not holding)
                return False
        return True

    # -- lookup and promotion ----------------------------------------------------------------
    def lookup(self, keys: Sequence[Hashable]) -> TieredLookup:
        """Leading blocks of ``keys`` available in some tier, and where (see the module doc).

        Each tier counts the lookups it answers in its own stats.

        Raises:
            TypeError: a key is not hashable (or, for a lower tier, has no stable encoding).
        """
        keys = list(keys)
        n = len(keys)
        pos = 0
        runs: list[tuple[str, int]] = []
        host = self.host
        while pos < n:
            h = host.lookup_prefix(keys[pos:] if pos else keys)
            if h:
                runs.append((self.host_name, h))
                pos += h
                if pos == n:
                    break
            if host.ref_count(keys[pos]) == -1:  # host store in flight: stop here
                break
            for tier in self.lower:
                c = tier.lookup_prefix(keys[pos:])
                if c:
                    for i in range(pos + 1, pos + c):  # the run ends where the host has
                        if keys[i] in host:            # the block (it is served from there)
                            c = i - pos
                            break
                    runs.append((tier.name, c))
                    pos += c
                    break
            else:
                break
        return TieredLookup(pos, runs)

    def promote(self, keys: Sequence[Hashable], found: TieredLookup) -> int:
        """Bring the blocks ``found`` below the host into host slots.

        Args:
            keys: the request's keys, as passed to :meth:`lookup`.
            found: :meth:`lookup`'s answer for them (nothing may have changed in between).

        Returns:
            ``n``: ``keys[:n]`` are now readable in the host (``n <= found.hits``): shorter
            when a lower tier's read failed verification, or when the host cannot hold the
            whole prefix at once (too small, or too many pinned/pending blocks; counted in
            :attr:`promote_failures`): then ``n`` is the longest head of the prefix that it
            can hold, promoted even when that evicts host blocks further on in the prefix
            (a prefix is only usable from its first block), or the host's own leading run
            when that is longer.

        Raises:
            what ``write_slot`` raises (e.g. a lower tier returned a block of the wrong
            size): the promotion's host store is dropped first (no block left pending);
            host blocks it evicted stay evicted (and are demoted as usual).
        """
        keys = list(keys)
        n = found.hits
        if all(name == self.host_name for name, _ in found.runs):
            return n
        data: dict[Hashable, Any] = {}
        pos = 0
        tiers = {t.name: t for t in self.lower}
        source: dict[Hashable, str] = {}
        for name, count in found.runs:
            if name != self.host_name:
                run = keys[pos : pos + count]
                got = tiers[name].read(run)
                for j, (key, block) in enumerate(zip(run, got, strict=True)):
                    if block is None:  # torn/corrupt/vanished: the prefix ends here
                        n = pos + j
                        break
                    data[key] = block
                    source[key] = name
            pos += count
            if pos >= n:
                break
        first_host = found.runs[0][1] if found.runs[0][0] == self.host_name else 0
        if n <= first_host:
            return n
        out = self.host.prepare_store(keys[:n])
        if out is None:
            # the host cannot hold the whole prefix at once: promote the longest head it can
            # hold (host blocks after that head are no longer protected and may be evicted)
            self.promote_failures += 1
            n = self._head_that_fits(keys, n)
            if n <= first_host:
                return first_host
            out = self.host.prepare_store(keys[:n])
            if out is None:  # the policy refused after all (cannot happen with exact counts)
                return first_host
        write = self._write_slot
        try:
            for key, slot in zip(out.keys_to_store, out.block_ids, strict=True):
                write(slot, data[key])
        except BaseException:
            # the blocks are pending in the host: drop them, or their slots leak and they
            # answer HIT_PENDING for ever (found by a newcomer session)
            self.host.complete_store(out.keys_to_store, success=False)
            raise
        self.host.complete_store(out.keys_to_store)
        for key in out.keys_to_store:
            self.promoted[source[key]] += 1
        if self.demotion == "write-through":  # inclusive: down to the tiers that lack them
            self._through.extend((key, data[key], source[key]) for key in out.keys_to_store)
        ref_count = self.host.ref_count
        for i in range(n):  # admission (store_threshold) may have refused some
            r = ref_count(keys[i])
            if r is None or r < 0:
                return i
        return n

    def _head_that_fits(self, keys: list[Hashable], n: int) -> int:
        """The largest ``m <= n`` such that ``host.prepare_store(keys[:m])`` finds room: the
        blocks of ``keys[:m]`` not in the host must not outnumber the free slots plus the
        evictable blocks outside ``keys[:m]`` (those inside are protected by the call)."""
        host = self.host
        ms = host.stats()
        room = ms.free + ms.evictable
        ref_count = host.ref_count
        new: set[Hashable] = set()
        seen: set[Hashable] = set()
        for i in range(n):
            key = keys[i]
            if key in seen:
                continue
            seen.add(key)
            r = ref_count(key)
            if r is None:
                new.add(key)
            elif r == 0:
                room -= 1  # an evictable host block of the prefix: protected
            if len(new) > room:
                return i
        return n

    # -- demotion ------------------------------------------------------------------------
    def stored(self, keys: Sequence[Hashable]) -> None:
        """Host stores of ``keys`` completed: under write-through, write them to every lower
        tier now (keys no longer in the host are skipped). No-op under write-back.

        A tier that refuses the blocks (its ``write`` raises, e.g. a tier its owner closed)
        does not keep the other tiers from getting them (before, the first refusal stopped
        the tiers below it).

        Raises:
            RuntimeError: after every tier was written: names each tier that refused the
                blocks (how many, and its error), chained from the first error.
        """
        if self.demotion != "write-through" or not self.lower:
            return
        get = self.host.slot_of
        read = self._read_slot
        pairs = [(k, read(s)) for k in keys if (s := get(k)) is not None]
        if pairs:
            self._write_down(pairs)

    def flush_demotions(self) -> int:
        """Write the blocks the host evicted since the last call to every lower tier
        (write-back), or the blocks promoted since the last call to the lower tiers that do
        not hold them (write-through); returns how many blocks went down (taken by at least
        one tier, as counted in :attr:`demoted`). Call after every host ``prepare_store``
        and every :meth:`promote`.

        A tier that refuses the blocks (its ``write`` raises, e.g. a disk its owner closed)
        does not keep the other tiers from getting them; the blocks are not kept for a
        later call.

        Raises:
            RuntimeError: after every tier was written: names each tier that refused the
                blocks (how many, and its error), and each evicted block whose slot
                ``read_slot`` could not read (with its error; dropped, not demoted).
        """
        if not (self._victims or self._through or self._unread):
            return 0  # the usual call: nothing evicted or promoted since the last one
        done, problems, first = self._demote_pending()
        if problems:
            raise RuntimeError("; ".join(problems)) from first
        return done

    def _demote_pending(self) -> tuple[int, list[str], BaseException | None]:
        """Write the pending demotions tier by tier (see :meth:`flush_demotions`), each
        tier's error caught; returns (blocks written to at least one tier, what went wrong,
        the first error). Nothing stays pending."""
        unread, self._unread = self._unread, []
        victims, self._victims = self._victims, []
        through, self._through = self._through, []
        problems: list[str] = []
        first: BaseException | None = None
        if not self.lower:
            victims, through = [], []
        done = 0
        if victims:  # write-back: every tier gets every victim
            done, problems, first = self._write_every(victims)
        results: list[tuple[list[Hashable], Any]] = []  # write-through: (keys, count) per tier
        for tier in self.lower if through else ():
            # write-through: the tiers that lack a promoted block (not the one it came from)
            contains = getattr(type(tier), "__contains__", None)
            todo = []
            for i, (key, _, src) in enumerate(through):
                if src == tier.name:
                    continue
                try:
                    if contains is not None and contains(tier, key):
                        continue
                except Exception:  # noqa: BLE001, S110 (e.g. a closed tier: the write below
                    pass  # raises too, and that error is reported with the tier's name)
                todo.append(i)
            if not todo:
                continue
            keys = [through[i][0] for i in todo]
            try:
                results.append((keys, tier.write(keys, [through[i][1] for i in todo])))
            except Exception as exc:  # noqa: BLE001 (any tier error: reported)
                first = first or exc
                problems.append(self._refused(tier, len(todo), exc))
        done += self._taken(results)
        self.demoted += done
        if unread:
            key, exc = unread[0]
            first = first or exc
            more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
            problems.append(
                f"write-back: block {key!r} was evicted from {self.host_name} but its slot "
                f"could not be read ({type(exc).__name__}: {exc}){more}; it was dropped, "
                "not demoted")
        return done, problems, first

    @staticmethod
    def _refused(tier: BlockTier, n: int, exc: BaseException) -> str:
        return (f"{n} block{'s were' if n != 1 else ' was'} not demoted to {tier.name!r} "
                f"({type(exc).__name__}: {exc})")

    def _write_every(
        self, pairs: list[tuple[Hashable, Any]]
    ) -> tuple[int, list[str], BaseException | None]:
        """Write ``pairs`` (key, bytes) to every lower tier, each tier's error caught; returns
        (blocks at least one tier took, see :meth:`_taken`; what each refusing tier said;
        the first error)."""
        keys = [k for k, _ in pairs]
        blocks = [b for _, b in pairs]
        problems: list[str] = []
        first: BaseException | None = None
        results: list[tuple[list[Hashable], Any]] = []
        for tier in self.lower:
            try:
                results.append((keys, tier.write(keys, blocks)))
            except Exception as exc:  # noqa: BLE001 (any tier error: reported with the others)
                first = first or exc
                problems.append(self._refused(tier, len(keys), exc))
        return self._taken(results), problems, first

    @staticmethod
    def _taken(results: list[tuple[list[Hashable], Any]]) -> int:
        """Distinct keys taken by at least one tier, from each tier's ``(keys handed to its
        write, what write returned)``: a count of at least the distinct keys handed means
        all taken, 0 none (a return that is not an int, from a tier outside kvtier, counts
        as all, the count before session 17). A tier that took part of its keys says how
        many, not which: the keys of the tiers that took all are counted, plus the largest
        ``count - (its keys among those)`` of the tiers that took part. Exact when at most
        one tier took part and its keys are all or none among those taken whole (write-back
        and :meth:`stored` hand every tier the same keys: exact whenever at most one tier
        took part); otherwise the least number the counts allow."""
        covered: set[Hashable] = set()
        partial: list[tuple[set[Hashable], int]] = []
        for keys, count in results:
            distinct = set(keys)
            if not isinstance(count, int) or isinstance(count, bool):
                count = len(distinct)
            if count >= len(distinct):
                covered |= distinct
            elif count > 0:
                partial.append((distinct, count))
        extra = max((count - len(distinct & covered) for distinct, count in partial),
                    default=0)
        return len(covered) + max(extra, 0)

    def _write_down(self, pairs: list[tuple[Hashable, Any]]) -> None:
        """Write ``pairs`` (key, bytes) to every lower tier (see :meth:`stored`); counted in
        :attr:`demoted` as far as the tiers took them (:meth:`_taken`)."""
        taken, problems, first = self._write_every(pairs)
        self.demoted += taken
        if problems:
            raise RuntimeError("TierStack.stored: " + "; ".join(problems)) from first

    # -- events and stats ----------------------------------------------------------------
    def take_events(self) -> list[TierEvent]:
        """Events since the last call: the host's first, then each lower tier's (tiers
        without ``take_events()`` have none)."""
        out = [TierEvent(self.host_name, e.keys, e.removed) for e in self.host.take_events()]
        for tier in self.lower:
            take = getattr(tier, "take_events", None)
            if take is not None:
                out.extend(TierEvent(tier.name, e.keys, e.removed) for e in take())
        return out

    def host_stats(self) -> TierStats:
        """The host manager's counters as a :class:`TierStats` (reads = load pins taken,
        writes = blocks allocated by prepare_store, promotions included)."""
        ms = self.host.stats()
        return TierStats(
            name=self.host_name, lookups=ms.lookups, lookup_hits=ms.hits, reads=ms.loads,
            read_hits=ms.loads, writes=ms.stores, writes_completed=ms.completed_stores,
            writes_failed=ms.failed_stores, writes_skipped=ms.skipped_stores,
            evictions=ms.evictions, bytes_read=ms.loads * self.block_bytes,
            bytes_written=ms.completed_stores * self.block_bytes, used_blocks=ms.used,
            capacity_blocks=ms.num_blocks,
        )

    def stats(self) -> dict[str, TierStats]:
        """Per tier, top down: ``{"host": ..., "disk": ..., ...}``."""
        out = {self.host_name: self.host_stats()}
        for tier in self.lower:
            out[tier.name] = tier.stats()
        return out

    def flush(self, timeout: float | None = None) -> bool:
        """Write pending demotions, then wait for every lower tier's writes; ``False`` when
        ``timeout`` seconds (for the whole call: each tier gets what is left of it; ``None``
        or ``inf``: no limit) passed first.

        Raises:
            ValueError: ``timeout`` is negative, NaN, a bool or not a number.
        """
        timeout = check_timeout(timeout, "flush")
        self.flush_demotions()
        if timeout is None:
            done = [tier.flush(None) for tier in self.lower]
        else:
            deadline = time.monotonic() + timeout
            done = [tier.flush(max(deadline - time.monotonic(), 0.0)) for tier in self.lower]
        # a list, then all(): every tier is flushed, also after one timed out (all() of a
        # generator would stop at the first False; test_flush_timeout_bounds_the_whole_call)
        return all(done)

    def close(self) -> None:
        """Write pending demotions to every lower tier that can take them, then close every
        lower tier, and stop seeing the host's evictions (:meth:`_unhook`). Idempotent.

        A tier that refuses the pending blocks (e.g. one its owner closed already) does not
        keep the others from getting theirs, and a tier whose ``close`` raises does not keep
        the others open.

        Raises:
            RuntimeError: after all of that, when something could not be done: names each
                tier that did not take the pending blocks (how many, and its error), each
                tier whose ``close`` failed, and the evicted blocks whose host slot could not
                be read (dropped, not demoted). Closing again raises nothing.
        """
        self._unhook()
        _, problems, first = self._demote_pending()
        for tier in self.lower:
            try:
                tier.close()
            except Exception as exc:  # noqa: BLE001 (any tier error: reported)
                first = first or exc
                problems.append(f"tier {tier.name!r} failed to close "
                                f"({type(exc).__name__}: {exc})")
        if problems:
            raise RuntimeError("TierStack.close: " + "; ".join(problems)) from first

    def _unhook(self) -> None:
        """Stop copying the host's victims: put back the ``_evict`` this stack wrapped when
        its wrapper is still the outermost, else (a later stack wrapped it) leave the
        wrapper in place passing the victims through. Before, a closed stack's wrapper
        stayed on the host policy: a new stack on the same host manager then failed every
        eviction with "disk tier <the old one> is closed", raised from inside ``evict``."""
        self._hooked = False
        policy, wrapper, before = self._evict_hook
        if policy.__dict__.get("_evict") is wrapper:
            # past the wrappers of stacks closed meanwhile (inert since)
            while getattr(before, "stack", None) is not None and not before.stack._hooked:
                before = before.stack._evict_hook[2]
            if before is None:
                del policy._evict  # the class's method again
            else:
                policy._evict = before  # type: ignore[method-assign]
