"""kvtier's data plane: the bytes behind the manager's slot ids (needs ``kvtier[torch]``).

* :class:`HostBlockPool` — one host tensor ``[num_blocks, *block_shape]``, pinned when CUDA
  is available; slot ``i`` of the :class:`~kvtier.OffloadingManager` is ``pool.tensor[i]``.
* :class:`TransferEngine` — batched asynchronous copies between an engine's paged KV cache
  tensors and the pool (CPU worker thread, or CUDA copy streams with events).
* :class:`KVOffloader` — the per-step glue an engine calls: offload blocks, restore a cached
  prefix; it keeps the manager's pins and pending stores balanced on every path.

Importing :mod:`kvtier` does not import torch; importing this package does (without torch
it raises ``ModuleNotFoundError`` naming the install command).
"""

try:
    import torch  # noqa: F401
except ModuleNotFoundError as _exc:
    if _exc.name != "torch":
        raise
    raise ModuleNotFoundError(
        "kvtier.dataplane needs torch, which is not installed: pip install 'kvtier[torch]' "
        "(CPU build: pip install torch==2.13.0 -e '.[torch]' in a kvtier checkout)",
        name="torch",
    ) from None

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
