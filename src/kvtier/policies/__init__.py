"""Eviction policies for the offloaded KV-cache tier, one file per policy.

Use a policy by name (``OffloadingManager(n, policy="arc")``) or by class. See
:mod:`kvtier.policies.base` for the contract and :mod:`kvtier.policies.registry` for adding
your own.
"""

from kvtier.policies.base import CachePolicy
from kvtier.policies.registry import (
    ENTRY_POINT_GROUP,
    available_policies,
    get_policy,
    register_policy,
)
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.arc import ARCPolicy

register_policy("lru", LRUPolicy)
register_policy("arc", ARCPolicy)

from kvtier.policies.s3fifo import S3FIFOPolicy  # noqa: E402
from kvtier.policies.sieve import SievePolicy  # noqa: E402

register_policy("s3fifo", S3FIFOPolicy)
register_policy("sieve", SievePolicy)

from kvtier.policies.lfu import LFUPolicy  # noqa: E402

register_policy("lfu", LFUPolicy)

from kvtier.policies.prefix import (  # noqa: E402
    PrefixARCPolicy,
    PrefixAwarePolicy,
    PrefixLFUPolicy,
    PrefixLRUPolicy,
    PrefixS3FIFOPolicy,
    PrefixSievePolicy,
    prefix_aware,
)

for _cls in (PrefixLRUPolicy, PrefixARCPolicy, PrefixS3FIFOPolicy, PrefixSievePolicy,
             PrefixLFUPolicy):
    register_policy(_cls.name, _cls)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ARCPolicy",
    "CachePolicy",
    "LRUPolicy",
    "available_policies",
    "get_policy",
    "register_policy",
]
