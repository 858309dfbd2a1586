"""Exceptions raised by kvtier. Every one names the offending key and the rule it broke."""

from __future__ import annotations

from collections.abc import Hashable


class KVTierError(Exception):
    """Base class of kvtier's own errors."""


class BlockStateError(KVTierError, ValueError):
    """A call named a block whose state does not allow it.

    The call changed nothing: the manager validates every key before mutating.

    Attributes:
        key: the offending block key.
        rule: a short statement of the rule that was broken.
    """

    def __init__(self, key: Hashable, rule: str) -> None:
        self.key = key
        self.rule = rule
        super().__init__(f"block {key!r}: {rule}")
