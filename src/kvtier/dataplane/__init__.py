"""kvtier's data plane: the bytes behind the manager's slot ids (needs ``kvtier[torch]``).

* :class:`HostBlockPool` — one host tensor ``[num_blocks, *block_shape]``, pinned when CUDA
  is available; slot ``i`` of the :class:`~kvtier.OffloadingManager` is ``pool.tensor[i]``.
* :class:`TransferEngine` — batched asynchronous copies between an engine's paged KV cache
  tensors and the pool (CPU worker thread, or CUDA copy streams with events).
* :class:`KVOffloader` — the per-step glue an engine calls: offload blocks, restore a cached
  prefix; it keeps the manager's pins and pending stores balanced on every path.

Importing :mod:`kvtier` does not import torch; importing this package does.
"""

from kvtier.dataplane.offloader import KVOffloader, OffloadResult
from kvtier.dataplane.pool import HostBlockPool, PoolAllocationError, available_host_memory
from kvtier.dataplane.transfer import TransferEngine, TransferResult

__all__ = [
    "HostBlockPool",
    "KVOffloader",
    "OffloadResult",
    "PoolAllocationError",
    "TransferEngine",
    "TransferResult",
    "available_host_memory",
]
