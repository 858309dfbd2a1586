"""HostBlockPool: layout, size accounting, and refusal of impossible sizes before allocating."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvtier.dataplane import HostBlockPool, PoolAllocationError, available_host_memory  # noqa: E402
from kvtier.errors import KVTierError  # noqa: E402


def test_layout_size_and_zero_fill():
    pool = HostBlockPool(7, [3, 2, 4, 2, 8], torch.float16, pin_memory=False)
    assert pool.tensor.shape == (7, 3, 2, 4, 2, 8)
    assert pool.tensor.dtype == torch.float16
    assert pool.tensor.is_contiguous()
    assert pool.tensor.device.type == "cpu"
    assert pool.block_nbytes == 3 * 2 * 4 * 2 * 8 * 2
    assert pool.nbytes == 7 * pool.block_nbytes == pool.tensor.nbytes
    assert len(pool) == 7
    assert int(pool.tensor.count_nonzero()) == 0
    # a slot is a view of the pool: writing it writes the pool
    pool[3].fill_(1.5)
    assert float(pool.tensor[3].sum()) == 1.5 * pool.tensor[3].numel()
    assert int(pool.tensor[:3].count_nonzero()) == 0 and int(pool.tensor[4:].count_nonzero()) == 0


def test_pinning_follows_cuda_availability():
    pool = HostBlockPool(2, [4], torch.float32)
    assert pool.pinned == torch.cuda.is_available()
    assert pool.tensor.is_pinned() == pool.pinned
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
            HostBlockPool(2, [4], torch.float32, pin_memory=True)


def test_refuses_more_than_available_before_allocating():
    avail = available_host_memory()
    assert avail > 0
    block = [1024, 1024]  # 4 MiB per block in float32
    num_blocks = avail // (4 * 2**20) + 10
    with pytest.raises(PoolAllocationError) as info:
        HostBlockPool(num_blocks, block, torch.float32)
    err = info.value
    assert isinstance(err, MemoryError) and isinstance(err, KVTierError)
    assert err.requested_bytes == num_blocks * 4 * 2**20
    assert str(err.requested_bytes) in str(err)
    # absurd sizes are refused without trying (would take petabytes)
    with pytest.raises(PoolAllocationError, match="bytes"):
        HostBlockPool(10**9, [1024, 1024], torch.float32)


def test_max_bytes_limit():
    pool = HostBlockPool(4, [8], torch.float32, max_bytes=128)
    assert pool.nbytes == 128
    with pytest.raises(PoolAllocationError, match="max_bytes=127") as info:
        HostBlockPool(4, [8], torch.float32, max_bytes=127)
    assert info.value.requested_bytes == 128 and info.value.available_bytes == 127


@pytest.mark.parametrize(
    "num_blocks, shape, dtype, exc, match",
    [
        (0, [4], torch.float32, ValueError, r"num_blocks must be a positive int \(slots\), got 0"),
        (True, [4], torch.float32, ValueError, "num_blocks"),
        (2, [], torch.float32, ValueError, "at least one dimension"),
        (2, [4, 0], torch.float32, ValueError,
         r"block_shape\[1\] must be a positive int, got 0 \(block_shape \(4, 0\)\)"),
        (2, [4, 2.0], torch.float32, ValueError,
         r"block_shape\[1\] must be a positive int, got 2.0"),
        (2, "44", torch.float32, TypeError, "block_shape"),
        (2, [4], "float32", TypeError, "dtype must be a torch.dtype"),
    ],
)
def test_bad_arguments(num_blocks, shape, dtype, exc, match):
    with pytest.raises(exc, match=match):
        HostBlockPool(num_blocks, shape, dtype)


def test_slot_index_checked():
    pool = HostBlockPool(3, [2], torch.float32)
    with pytest.raises(IndexError, match=r"0\.\.2, got 3"):
        pool[3]
    with pytest.raises(IndexError):
        pool[-1]


@pytest.mark.parametrize("max_bytes", [-1, True, 1.5])
def test_bad_max_bytes_is_named(max_bytes):
    with pytest.raises(ValueError, match=r"max_bytes \(or None\) must be an int >= 0 \(bytes\)"):
        HostBlockPool(4, [8], torch.float32, max_bytes=max_bytes)


@pytest.mark.parametrize("bad", ["no", "false", 0])
def test_pin_memory_must_be_a_bool_or_none(bad):
    """Found by newcomer10: pin_memory="no" (a flag from a config file) was read as true: on a
    CPU machine the error said "pin_memory=True needs CUDA", on a CUDA one it pinned."""
    with pytest.raises(ValueError, match=rf"^pin_memory must be a bool, got {bad!r}$"):
        HostBlockPool(2, [4], torch.float32, pin_memory=bad)
