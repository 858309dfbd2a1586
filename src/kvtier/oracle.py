"""Next-use oracle: the future of a whole trace, for offline (clairvoyant) policies.

Belady's MIN policy (Belady, "A study of replacement algorithms for a virtual-storage
computer", IBM Systems Journal 5(2), 1966) evicts the block whose next use is furthest in the
future. That needs the whole trace up front: :class:`NextUseOracle` makes one backward pass
over it and stores, per block reference ``i`` (the trace's references numbered 0, 1, ... in
request order, each request's keys head first), the index of the next reference of the same
key (:attr:`NextUseOracle.next_ref`, ``NEVER`` when there is none).

The hand-off between replay, oracle and policy::

    oracle = NextUseOracle([r.keys for r in requests])   # one pass, O(references)
    manager.policy.bind(oracle)                          # the policy reads oracle.next_use
    for request in requests:
        oracle.advance(request.keys)   # the clock: these references happen now
        ...the manager calls of the request...

:meth:`NextUseOracle.advance` is the clock. It moves the position past the given references
(checking they are the trace's next ones) and sets, for each of their keys, ``next_use[key]``
= the index of that key's next reference (keys never referenced again are dropped from the
dict: their next use is ``NEVER``). A policy therefore reads a key's next use in O(1) at any
moment; it changes only when the key is referenced. Under the ``prefix`` replay protocol the
replay advances by a whole request before its calls (every key of the request is in use during
the request: pinned, stored or protected); under ``get`` by one reference before each
get-with-insert.

Not thread-safe: one oracle serves one replay at a time.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Hashable, Iterable, Sequence

__all__ = ["NEVER", "NextUseOracle"]

NEVER = (1 << 62) - 1
"""Next use of a key that is never referenced again (larger than any reference index)."""


class NextUseOracle:
    """The next-use table of a trace and a clock (the number of references replayed so far).

    Args:
        key_lists: each request's block keys, in trace order (e.g. ``[r.keys for r in
            requests]``). Read once; the keys are kept (one list of all references).

    Attributes:
        keys: every block reference's key, in trace order (``len`` = references).
        next_ref: ``array('q')``, per reference ``i`` the index of the next reference of
            ``keys[i]``, or :data:`NEVER`.
        position: references replayed so far (the clock), 0 .. ``len(keys)``.
        next_use: key -> index of its next reference, for the keys referenced so far that
            will be referenced again. Read-only for policies.

    Memory: O(references) (one key pointer and one int64 per reference) plus O(distinct
    blocks) during the build. Build time O(references).

    Raises:
        TypeError: a key is unhashable.
    """

    __slots__ = ("keys", "next_ref", "position", "next_use")

    def __init__(self, key_lists: Iterable[Sequence[Hashable]]) -> None:
        keys = list(itertools.chain.from_iterable(key_lists))
        n = len(keys)
        next_ref = array("q", [NEVER]) * n
        last: dict[Hashable, int] = {}
        get = last.get
        for i in range(n - 1, -1, -1):
            key = keys[i]
            next_ref[i] = get(key, NEVER)
            last[key] = i
        self.keys = keys
        self.next_ref = next_ref
        self.position = 0
        self.next_use: dict[Hashable, int] = {}

    def __len__(self) -> int:
        """Block references in the trace."""
        return len(self.keys)

    def advance(self, keys: Sequence[Hashable]) -> None:
        """The references ``keys`` happen now: move the clock past them and update their
        keys' next use. O(len(keys)).

        Raises:
            ValueError: ``keys`` are not the trace's next references (another trace, or a
                replay that skipped or repeated a request); nothing changed.
        """
        pos = self.position
        end = pos + len(keys)
        if end > len(self.keys) or self.keys[pos:end] != list(keys):
            raise ValueError(
                f"oracle: references {pos}..{end - 1} of the trace are not {list(keys)[:8]!r}"
                f"{'...' if len(keys) > 8 else ''}; advance() must follow the trace the "
                "oracle was built from, in order"
            )
        next_use = self.next_use
        next_ref = self.next_ref
        for i in range(pos, end):
            nxt = next_ref[i]
            if nxt == NEVER:
                next_use.pop(self.keys[i], None)
            else:
                next_use[self.keys[i]] = nxt
        self.position = end

    def next_use_of(self, key: Hashable) -> int:
        """Index of ``key``'s next reference after the clock, or :data:`NEVER`."""
        return self.next_use.get(key, NEVER)

    def reset(self) -> None:
        """Back to the start of the trace (position 0, no next uses known)."""
        self.position = 0
        self.next_use.clear()
