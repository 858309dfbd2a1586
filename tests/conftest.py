"""Shared fixtures: paths to the real trace (when ../shared is present) and the repo root."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACE = REPO_ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"


@pytest.fixture
def shared_trace() -> Path:
    """The full Mooncake conversation trace; skips the test when ../shared is absent."""
    if not SHARED_TRACE.exists():
        pytest.skip(f"{SHARED_TRACE} not present")
    return SHARED_TRACE
