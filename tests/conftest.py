"""Shared fixtures: paths to the real trace (when ../shared is present) and the repo root."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kvtier.trace import embedded_sample_path, find_shared_trace, read_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
# $KVTIER_SHARED_TRACE, else ../shared (or ../../shared from a git worktree)
SHARED_TRACE = find_shared_trace(REPO_ROOT)


@pytest.fixture
def shared_trace() -> Path:
    """The full Mooncake conversation trace; skips the test when ../shared is absent."""
    if not SHARED_TRACE.exists():
        pytest.skip(f"{SHARED_TRACE} not present")
    return SHARED_TRACE


TRACE_SLICE_REQUESTS = 2000


@pytest.fixture(scope="session")
def trace_slice() -> list:
    """The first 2,000 requests of the shared trace, or the embedded 500-request sample when
    ../shared is absent (both are real Mooncake requests)."""
    if SHARED_TRACE.is_file():
        return list(itertools.islice(read_trace(SHARED_TRACE), TRACE_SLICE_REQUESTS))
    return list(read_trace(embedded_sample_path()))


def _libcachesim_hits(cache, requests) -> int:
    import libcachesim as lcs

    req = lcs.Request()
    req.obj_size = 1
    get = cache.get
    hits = 0
    for r in requests:
        for key in r.keys:
            req.obj_id = key
            if get(req):
                hits += 1
    return hits


@pytest.fixture
def libcachesim_hits():
    """``hits(cache, requests)``: hits of a libCacheSim cache (object size 1, one get per
    block reference), the reference our ``--protocol get`` replays are compared with."""
    pytest.importorskip("libcachesim")
    return _libcachesim_hits
