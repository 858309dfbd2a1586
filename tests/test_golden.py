"""Golden replay values: hit, store and eviction counts of every registered policy must not move.

The values in ``tests/golden/*.json`` were recorded by ``scripts/regen_golden.py`` before the
policy-contract refactor (issue #10). A change that moves one must regenerate them and say why
in its commit. The full-trace rows run only where ``../shared`` (or ``KVTIER_SHARED_TRACE``)
holds the conversation trace: 60 replays, about 60-70 s of CPU on the development machine.
"""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict

import pytest

from conftest import REPO_ROOT, SHARED_TRACE
from kvtier.policies import available_policies
from kvtier.trace import embedded_sample_path, read_trace

_spec = importlib.util.spec_from_file_location("regen_golden", REPO_ROOT / "scripts" / "regen_golden.py")
regen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regen)


def _golden(name: str) -> dict:
    return json.loads((REPO_ROOT / "tests" / "golden" / f"{name}.json").read_text())


def _by_policy(name: str) -> dict[str, list]:
    rows = defaultdict(list)
    for case in regen.cases(name):
        rows[case[0]].append(case)
    return rows


@pytest.fixture(scope="module")
def sample() -> list:
    return list(read_trace(embedded_sample_path()))


@pytest.fixture(scope="module")
def conversation() -> list:
    if not SHARED_TRACE.is_file():
        pytest.skip(f"{SHARED_TRACE} not present")
    return list(read_trace(SHARED_TRACE))


def test_golden_files_cover_every_registered_policy():
    for name in ("sample", "conversation"):
        golden = _golden(name)
        expected = {regen.row_key(*case) for case in regen.cases(name)}
        assert set(golden) == expected, name
    assert {key.split("/")[0] for key in _golden("sample")} == set(available_policies())


@pytest.mark.parametrize("policy", available_policies())
def test_sample_replay_matches_golden(policy, sample):
    golden = _golden("sample")
    for case in _by_policy("sample")[policy]:
        assert regen.compute(sample, *case) == golden[regen.row_key(*case)], case


@pytest.mark.parametrize("policy", available_policies())
def test_conversation_replay_matches_golden(policy, conversation):
    golden = _golden("conversation")
    for case in _by_policy("conversation")[policy]:
        assert regen.compute(conversation, *case) == golden[regen.row_key(*case)], case
