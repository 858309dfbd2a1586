"""Issue #10 goal 5: the typed options the CLI builds and replay / sweep take."""

from __future__ import annotations

import pytest

from kvtier.cli import OutputOptions, ReplayCommand, TraceSource, run_replay
from kvtier.replay import ReplayOptions, replay
from kvtier.sweep import run_grid
from kvtier.trace import TraceFormatError, TraceOptions, embedded_sample_path, read_trace


@pytest.fixture(scope="module")
def trace():
    return list(read_trace(embedded_sample_path()))


def test_options_object_and_keywords_give_the_same_replay(trace):
    opts = ReplayOptions(inflight=8, store_threshold=2)
    by_object = replay(trace, "arc", 1000, opts)
    by_keywords = replay(trace, "arc", 1000, inflight=8, store_threshold=2)
    assert by_object.hit_blocks == by_keywords.hit_blocks
    assert (by_object.inflight, by_object.store_threshold) == (8, 2)
    # a keyword overrides one field of the object
    assert replay(trace, "arc", 1000, opts, inflight=0).inflight == 0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"protocol": "put"}, "unknown protocol 'put'"),
    ({"inflight": -1}, "inflight must be an int >= 0"),
    ({"inflight": 2, "protocol": "get"}, "needs protocol 'prefix'"),
    ({"block_tokens": 0}, "block_tokens must be an int >= 1"),
    ({"store_threshold": True}, "store_threshold must be an int >= 1"),
])
def test_replay_options_are_checked_when_made(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReplayOptions(**kwargs)


def test_replay_options_take_numpy_ints_as_the_manager_does(trace):
    """Found by a newcomer session: replay(trace, "lru", np.int64(4000)) took the numpy
    capacity, but inflight=np.int64(2), block_tokens or store_threshold as numpy ints were
    refused ("inflight must be an int >= 0 (requests), got np.int64(2)") although the
    manager takes them; they are kept as plain ints (the options go to worker processes)."""
    np = pytest.importorskip("numpy")
    opts = ReplayOptions(inflight=np.int64(2), block_tokens=np.int32(16),
                         store_threshold=np.int64(2))
    assert opts == ReplayOptions(inflight=2, block_tokens=16, store_threshold=2)
    assert {type(v) for v in (opts.inflight, opts.block_tokens, opts.store_threshold)} == {int}
    assert replay(trace, "lru", 1000, inflight=np.int64(2)).hit_blocks == replay(
        trace, "lru", 1000, inflight=2).hit_blocks
    with pytest.raises(ValueError, match="inflight must be an int >= 0"):
        ReplayOptions(inflight=np.bool_(True))


def test_a_numpy_capacity_gives_a_json_ready_result(trace):
    """Found by a newcomer session: replay(trace, "lru", np.int64(1000)) (and run_grid with
    numpy capacities) kept the numpy integer as ReplayResult.capacity, so
    json.dumps(result.to_dict()), whose docstring says JSON-ready, raised 'Object of type
    int64 is not JSON serializable'."""
    import json

    np = pytest.importorskip("numpy")
    result = replay(trace, "lru", np.int64(1000))
    assert result.capacity == 1000 and type(result.capacity) is int
    json.dumps(result.to_dict())


def test_trace_options_are_checked_when_made():
    with pytest.raises(TraceFormatError, match="unknown format 'xml'"):
        TraceOptions(fmt="xml")
    with pytest.raises(ValueError, match="block_tokens"):
        TraceOptions(block_tokens=0)
    with pytest.raises(TypeError, match="options must be a ReplayOptions"):
        replay([], "lru", 4, {"inflight": 1})  # type: ignore[arg-type]


def test_run_grid_and_run_replay_take_the_options(trace, tmp_path):
    opts = ReplayOptions(inflight=4)
    rows = run_grid(embedded_sample_path(), ["lru"], [500, 1000], trace=TraceOptions(),
                    options=opts, workers=1)
    assert [r.hit_blocks for r in rows] == [replay(trace, "lru", c, opts).hit_blocks
                                            for c in (500, 1000)]
    cmd = ReplayCommand(TraceSource(embedded_sample_path(), TraceOptions(), limit=100),
                        policies=("lru",), capacities=("1%",), replay=opts,
                        output=OutputOptions(json=tmp_path / "r.json"))
    (res,) = run_replay(cmd)
    # 1% of the 2,935 distinct blocks of the first 100 requests
    assert res.requests == 100 and res.capacity == 29 and res.inflight == 4
    assert replay(trace[:100], "lru", 29, opts).hit_blocks == res.hit_blocks
