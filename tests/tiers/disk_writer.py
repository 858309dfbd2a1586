"""Subprocess for the disk tier's crash tests (run by tests/tiers/test_disk.py, killed -9).

    python disk_writer.py DIR NUM_BLOCKS BLOCK_BYTES FIRST_KEY [--torn KEY]

Writes block ``k`` = ``expected_block(k)`` for k = FIRST_KEY, FIRST_KEY+1, ... forever, in
batches of 1-4 blocks, printing ``done K`` after each batch is flushed (readable). With
``--torn KEY`` the write of block KEY stops half-way (half its bytes written), prints
``torn KEY`` and waits to be killed.
"""

from __future__ import annotations

import random
import sys
import time


def expected_block(key: int, nbytes: int) -> bytes:
    """The bytes block ``key`` must hold: a deterministic function of the key."""
    return random.Random(key).randbytes(nbytes)


def main(argv: list[str]) -> None:
    from kvtier.tiers import disk

    path, num_blocks, block_bytes, first = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    torn = int(argv[5]) if len(argv) > 5 and argv[4] == "--torn" else None
    if torn is not None:
        real = disk._pwrite_all

        def tearing(fd, data, offset):
            if fd == tier._data_fd and bytes(data[:64]) == expected_block(torn, block_bytes)[:64]:
                real(fd, memoryview(data)[: len(data) // 2], offset)
                print(f"torn {torn}", flush=True)
                time.sleep(3600)
            real(fd, data, offset)

        disk._pwrite_all = tearing
    tier = disk.DiskTier(path, num_blocks, block_bytes, workers=2)
    rng = random.Random(first)
    key = first
    while True:
        n = rng.randint(1, 4)
        keys = list(range(key, key + n))
        tier.write(keys, [expected_block(k, block_bytes) for k in keys])
        tier.flush()
        key += n
        print(f"done {key - 1}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
