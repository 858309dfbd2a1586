"""S3-FIFO and SIEVE against libCacheSim's implementations under the ``get`` protocol.

Every block reference is one libCacheSim request (object id = block key, size 1, cache size in
objects = our capacity in blocks); ours runs through the real manager (``replay(...,
protocol="get")``). The issue allows 0.5 percentage points of hit ratio; both policies agree
**exactly** (same hit count). Three details had to follow libCacheSim's ``S3FIFO.c`` rather than
the paper's pseudo-code to get there (see ``kvtier.policies.s3fifo``): the warm-up rule (before
the first eviction a block that finds S full enters M), the promotion resetting the frequency,
and the ghost check happening before the eviction that makes room (we trim G after the whole
``prepare_store``, which gives the same ghost contents).

Capacities stay >= 20: libCacheSim's S3-FIFO refuses every insert into an S of one object
(``obj_size >= small size``), which ours does not copy.

Uses a slice of the shared Mooncake conversation trace when ``../shared/traces`` exists next to
the repository, else the embedded 500-request sample.
"""

from __future__ import annotations

import pytest

from kvtier.replay import replay

lcs = pytest.importorskip("libcachesim")


@pytest.mark.parametrize(
    ("policy", "make"),
    [("s3fifo", lambda c: lcs.S3FIFO(c)), ("sieve", lambda c: lcs.Sieve(c))],
)
@pytest.mark.parametrize("capacity", [20, 500, 3000])
def test_agrees_exactly_with_libcachesim(trace_slice, libcachesim_hits, policy, make, capacity):
    ours = replay(trace_slice, policy, capacity, protocol="get")
    theirs = libcachesim_hits(make(capacity), trace_slice)
    assert ours.block_refs > 10_000
    assert ours.hit_blocks == theirs
