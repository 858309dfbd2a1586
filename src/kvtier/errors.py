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

    def __reduce__(self):  # rebuilt from its fields (e.g. sent by a sweep worker)
        return (type(self), (self.key, self.rule))


class PolicyError(KVTierError, RuntimeError):
    """A policy broke its contract (e.g. :meth:`~kvtier.policies.CachePolicy.evict` returned
    the wrong number of victims, a repeated key, or a block that was not evictable).

    The manager's own state (slots, ref counts, counters, events) is left exactly as it was
    before the call; the policy's own state may not be, so the manager should be reset or
    discarded.

    Attributes:
        policy: the policy's registry name (or class name).
        rule: what the policy did wrong.
    """

    def __init__(self, policy: str, rule: str) -> None:
        self.policy = policy
        self.rule = rule
        super().__init__(f"policy {policy!r}: {rule}")

    def __reduce__(self):  # rebuilt from its fields (e.g. sent by a sweep worker)
        return (type(self), (self.policy, self.rule))


class RequestStateError(KVTierError, ValueError):
    """A request-mode call named a request context whose state does not allow it: finishing
    a request that is not open (never opened, or already finished), or opening one that is
    already open.

    The call changed nothing.

    Attributes:
        req_context: the offending request context.
        rule: a short statement of the rule that was broken.
    """

    def __init__(self, req_context: Hashable, rule: str) -> None:
        self.req_context = req_context
        self.rule = rule
        super().__init__(f"request {req_context!r}: {rule}")

    def __reduce__(self):  # rebuilt from its fields (e.g. sent by a sweep worker)
        return (type(self), (self.req_context, self.rule))
