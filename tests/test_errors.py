"""kvtier.errors: the exceptions keep their fields across processes."""

from __future__ import annotations

import pickle

import pytest

from kvtier.errors import BlockStateError, PolicyError, RequestStateError


@pytest.mark.parametrize("err, fields", [
    (BlockStateError(("h", 3), "prepare_load: block is not stored in the tier"), ("key", "rule")),
    (RequestStateError("req-1", "on_request_finished: request is not open"),
     ("req_context", "rule")),
    (PolicyError("mine", "evict(3) returned 2 victims"), ("policy", "rule")),
])
def test_errors_survive_pickling(err, fields):
    """Found by a newcomer session: each error's constructor takes its fields, so unpickling
    (a sweep worker process sending its error to the parent) raised TypeError, and
    ProcessPoolExecutor reported "BrokenProcessPool: A process in the process pool was
    terminated abruptly" instead of, e.g., a plugin policy's PolicyError (TraceFormatError:
    tests/test_trace_errors.py)."""
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert [getattr(back, f) for f in fields] == [getattr(err, f) for f in fields]
