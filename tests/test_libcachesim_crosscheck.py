"""Cross-check against libCacheSim (PyPI ``libcachesim``) under the ``get`` protocol.

Every block reference of the trace becomes one libCacheSim request (object id = block key,
object size 1, cache size in objects = our capacity in blocks). LRU must agree exactly; ARC is
compared loosely (ours follows the core issue's eviction rule and ghost bounds, libCacheSim's
the paper's, see docs/replay.md).

Uses a slice of the shared Mooncake conversation trace when ``../shared/traces`` exists next to
the repository, else the embedded sample.
"""

from __future__ import annotations

import pytest

from kvtier.replay import replay

lcs = pytest.importorskip("libcachesim")


def test_trace_slice_is_real(trace_slice):
    refs = sum(len(r.keys) for r in trace_slice)
    assert len(trace_slice) in (2000, 500)
    assert refs > 14000


@pytest.mark.parametrize("capacity", [1, 64, 1000, 4000, 16000])
def test_lru_equals_libcachesim_exactly(trace_slice, libcachesim_hits, capacity):
    ours = replay(trace_slice, "lru", capacity, protocol="get")
    theirs = libcachesim_hits(lcs.LRU(capacity), trace_slice)
    assert ours.hit_blocks == theirs
    misses = ours.block_refs - ours.hit_blocks
    assert ours.stored_blocks == misses
    assert ours.evictions == max(0, misses - capacity)


@pytest.mark.parametrize("capacity", [1000, 4000])
def test_arc_close_to_libcachesim(trace_slice, libcachesim_hits, capacity):
    ours = replay(trace_slice, "arc", capacity, protocol="get")
    theirs = libcachesim_hits(lcs.ARC(capacity), trace_slice)
    # not equal by design (ghost bounds, tie rule); a gross break would show here
    assert abs(ours.hit_blocks - theirs) <= 0.05 * ours.block_refs
    # both beat LRU on this trace at these sizes
    assert ours.hit_blocks >= libcachesim_hits(lcs.LRU(capacity), trace_slice)
