"""Eviction policies for the offloaded KV-cache tier, one file per policy.

Use a policy by name (``OffloadingManager(n, policy="arc")``) or by class. See
:mod:`kvtier.policies.base` for the contract and :mod:`kvtier.policies.registry` for adding
your own.

==================  ==================================================================
name                policy (source in each module's docstring)
==================  ==================================================================
``lru``             least recently used
``arc``             Adaptive Replacement Cache (Megiddo & Modha, FAST'03)
``s3fifo``          S3-FIFO (Yang et al., SOSP'23)
``sieve``           SIEVE (Zhang et al., NSDI'24)
``lfu``             LFU with dynamic aging, O(1) frequency buckets
``prefix-<name>``   any of the above, evicting prefix orphans first, then leaves while
                    they are measured dead, each only while a safeguard finds it costs
                    no hits against the inner policy's choice (:mod:`.prefix`)
``belady``          Belady's MIN, offline: furthest next use first (needs the whole trace;
                    :mod:`.belady`, :mod:`kvtier.oracle`)
==================  ==================================================================
"""

from kvtier.policies.arc import ARCPolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.belady import BeladyPolicy
from kvtier.policies.lfu import LFUPolicy
from kvtier.policies.lru import LRUPolicy
from kvtier.policies.order import LogicalOrder
from kvtier.policies.prefix import (
    PrefixARCPolicy,
    PrefixAwarePolicy,
    PrefixLFUPolicy,
    PrefixLRUPolicy,
    PrefixS3FIFOPolicy,
    PrefixSievePolicy,
    prefix_aware,
)
from kvtier.policies.registry import (
    ENTRY_POINT_GROUP,
    PolicyPluginError,
    PolicyPluginWarning,
    available_policies,
    get_policy,
    register_policy,
)
from kvtier.policies.s3fifo import S3FIFOPolicy
from kvtier.policies.sieve import SievePolicy

for _cls in (
    LRUPolicy,
    ARCPolicy,
    S3FIFOPolicy,
    SievePolicy,
    LFUPolicy,
    PrefixLRUPolicy,
    PrefixARCPolicy,
    PrefixS3FIFOPolicy,
    PrefixSievePolicy,
    PrefixLFUPolicy,
    BeladyPolicy,
):
    register_policy(_cls.name, _cls)
del _cls

__all__ = [
    "ENTRY_POINT_GROUP",
    "ARCPolicy",
    "BeladyPolicy",
    "CachePolicy",
    "LFUPolicy",
    "LRUPolicy",
    "LogicalOrder",
    "PolicyPluginError",
    "PolicyPluginWarning",
    "PrefixAwarePolicy",
    "S3FIFOPolicy",
    "SievePolicy",
    "available_policies",
    "get_policy",
    "prefix_aware",
    "register_policy",
]
