"""Host block pool: the bytes behind the slot ids an :class:`~kvtier.OffloadingManager` hands out.

One contiguous host tensor ``[num_blocks, *block_shape]``; slot ``i`` of the manager is
``pool.tensor[i]``. The memory is page-locked (pinned) when CUDA is available, so device<->host
copies can run asynchronously on a copy stream.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from kvtier.checks import check_bool, check_nonnegative_int, check_positive_int
from kvtier.errors import KVTierError

__all__ = ["HostBlockPool", "PoolAllocationError", "available_host_memory"]


class PoolAllocationError(KVTierError, MemoryError):
    """The pool asked for more host memory than the machine can give.

    Raised *before* anything is allocated.

    Attributes:
        requested_bytes: the size of the pool that was asked for, in bytes.
        available_bytes: host memory available at the time of the check, in bytes.
    """

    def __init__(self, requested_bytes: int, available_bytes: int, detail: str = "") -> None:
        self.requested_bytes = requested_bytes
        self.available_bytes = available_bytes
        msg = (
            f"host block pool of {requested_bytes} bytes ({requested_bytes / 2**30:.2f} GiB) "
            f"exceeds the {available_bytes} bytes ({available_bytes / 2**30:.2f} GiB) of host "
            "memory available"
        )
        super().__init__(msg + (f": {detail}" if detail else ""))


def available_host_memory() -> int:
    """Host memory available for a new allocation, in bytes.

    ``MemAvailable`` of ``/proc/meminfo`` on Linux; elsewhere free physical pages times the
    page size (``os.sysconf``). Returns 0 when neither can be read.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def _check_block_shape(block_shape: Sequence[int]) -> tuple[int, ...]:
    if isinstance(block_shape, (str, bytes)) or not isinstance(block_shape, Sequence):
        raise TypeError(f"block_shape must be a sequence of positive ints, got {block_shape!r}")
    if len(block_shape) == 0:
        raise ValueError("block_shape must have at least one dimension, got ()")
    dims = []
    for i, dim in enumerate(block_shape):
        try:
            dims.append(check_positive_int(f"block_shape[{i}]", dim))
        except ValueError as exc:
            raise ValueError(f"{exc} (block_shape {tuple(block_shape)!r})") from None
    return tuple(dims)


class HostBlockPool:
    """A host tensor of ``num_blocks`` KV blocks, one per slot of the offloaded tier.

    Args:
        num_blocks: number of slots (>= 1); use the manager's ``num_blocks``.
        block_shape: shape of one block, e.g.
            ``[num_layers, 2, block_tokens, num_kv_heads, head_dim]`` (positive ints).
        dtype: element type, a ``torch.dtype`` (default ``torch.float16``).
        pin_memory: page-lock the memory. ``None`` (default) pins when
            ``torch.cuda.is_available()``; ``True`` without CUDA raises ``ValueError``.
        max_bytes: refuse pools larger than this many bytes. ``None`` (default) uses the host
            memory available now (:func:`available_host_memory`).

    Attributes:
        tensor: the ``[num_blocks, *block_shape]`` host tensor (contiguous, zero-filled).
        num_blocks, block_shape, dtype, pinned.

    Raises:
        ValueError: non-positive ``num_blocks`` or a bad ``block_shape``; ``pin_memory``
            neither a bool nor None; ``pin_memory=True`` without CUDA.
        TypeError: ``dtype`` is not a ``torch.dtype``.
        PoolAllocationError: (a ``MemoryError``) the pool's size in bytes exceeds ``max_bytes``
            or the available host memory; raised before allocating anything.

    Thread safety: the pool holds no state besides its tensor; which slot may be written or
    read when is the manager's business (a slot is written only while its store is pending
    and read only while pinned), and the transfer engine's worker copies under that rule.
    """

    def __init__(
        self,
        num_blocks: int,
        block_shape: Sequence[int],
        dtype: torch.dtype = torch.float16,
        *,
        pin_memory: bool | None = None,
        max_bytes: int | None = None,
    ) -> None:
        num_blocks = check_positive_int("num_blocks", num_blocks, "slots")
        shape = _check_block_shape(block_shape)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        if pin_memory is not None:  # "no" would read as true
            pin_memory = check_bool("pin_memory", pin_memory)
        cuda = torch.cuda.is_available()
        if pin_memory is None:
            pin_memory = cuda
        elif pin_memory and not cuda:
            raise ValueError("pin_memory=True needs CUDA, but torch.cuda.is_available() is False")
        if max_bytes is not None:
            max_bytes = check_nonnegative_int("max_bytes (or None)", max_bytes, "bytes")

        itemsize = torch.empty((), dtype=dtype).element_size()
        block_nbytes = math.prod(shape) * itemsize
        nbytes = num_blocks * block_nbytes
        if max_bytes is not None:
            if nbytes > max_bytes:
                raise PoolAllocationError(nbytes, max_bytes, f"max_bytes={max_bytes}")
        else:
            available = available_host_memory()
            if nbytes > available:
                raise PoolAllocationError(nbytes, available)

        self.num_blocks = num_blocks
        self.block_shape = shape
        self.dtype = dtype
        self.pinned = bool(pin_memory)
        self.block_nbytes = block_nbytes
        with torch.inference_mode(False):  # a normal tensor even if built in inference mode
            self.tensor = torch.zeros((num_blocks, *shape), dtype=dtype, pin_memory=self.pinned)

    @property
    def nbytes(self) -> int:
        """Size of the pool, in bytes (``num_blocks * block_nbytes``)."""
        return self.num_blocks * self.block_nbytes

    def __getitem__(self, slot: int) -> torch.Tensor:
        """The block at ``slot``: a ``block_shape`` view of :attr:`tensor` (no copy).

        Raises:
            IndexError: ``slot`` is outside ``0..num_blocks-1``.
        """
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.num_blocks:
            raise IndexError(f"slot must be an int in 0..{self.num_blocks - 1}, got {slot!r}")
        return self.tensor[slot]

    def __len__(self) -> int:
        return self.num_blocks

    def __repr__(self) -> str:
        return (
            f"HostBlockPool(num_blocks={self.num_blocks}, block_shape={list(self.block_shape)}, "
            f"dtype={self.dtype}, pinned={self.pinned}, nbytes={self.nbytes})"
        )
