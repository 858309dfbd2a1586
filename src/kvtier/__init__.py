"""kvtier: the offloaded tier of an LLM inference engine's KV cache.

Block bookkeeping (:class:`OffloadingManager`), pluggable eviction policies
(:mod:`kvtier.policies`), trace replay and the data path around them.
"""

from kvtier.errors import BlockStateError, KVTierError, PolicyError, RequestStateError
from kvtier.manager import OffloadingManager
from kvtier.policies import CachePolicy, available_policies, get_policy, register_policy
from kvtier.types import LookupResult, ManagerStats, OffloadingEvent, PrepareStoreOutput

__version__ = "0.1.0"

__all__ = [
    "BlockStateError",
    "CachePolicy",
    "KVTierError",
    "PolicyError",
    "LookupResult",
    "ManagerStats",
    "OffloadingEvent",
    "OffloadingManager",
    "PrepareStoreOutput",
    "RequestStateError",
    "available_policies",
    "get_policy",
    "register_policy",
]
