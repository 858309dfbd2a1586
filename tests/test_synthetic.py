"""The synthetic trace generator: deterministic, each knob moves the property it names."""

from __future__ import annotations

import pytest

from kvtier.replay import replay
from kvtier.synthetic import SyntheticSpec, generate, trace_profile


def test_same_arguments_same_trace_and_the_seed_matters():
    a = generate(sessions=200, seed=5)
    assert a == generate(SyntheticSpec(sessions=200, seed=5))
    assert a != generate(sessions=200, seed=6)
    assert [r.timestamp for r in a] == [float(i) for i in range(len(a))]


def test_dead_tails_are_never_named_again_and_live_tails_are():
    dead = trace_profile(generate(sessions=400, dead_tail=1.0, seed=1))
    live = trace_profile(generate(sessions=400, dead_tail=0.0, seed=1))
    assert dead["leaf_reuse"] == 0.0 and dead["inner_reuse"] > 0.5
    # a live tail is the next turn's parent: reused exactly when its parent is
    assert live["leaf_reuse"] == pytest.approx(live["inner_reuse"], abs=0.01)
    half = trace_profile(generate(sessions=400, dead_tail=0.5, seed=1))
    assert 0.3 * half["inner_reuse"] < half["leaf_reuse"] < 0.7 * half["inner_reuse"]


def test_partial_tails_count_half_a_block_of_tokens():
    reqs = generate(sessions=50, dead_tail=1.0, one_shot=0.0, seed=2, block_tokens=16)
    assert all(r.input_length == 16 * len(r.keys) - 8 for r in reqs)
    reqs = generate(sessions=50, dead_tail=0.0, seed=2, block_tokens=16)
    assert all(r.input_length == 16 * len(r.keys) for r in reqs)


@pytest.mark.parametrize("one_shot, low, high", [(0.0, 0.2, 0.55), (0.9, 0.75, 0.95)])
def test_one_shot_sessions_set_the_one_hit_wonder_share(one_shot, low, high):
    prof = trace_profile(generate(sessions=600, one_shot=one_shot, dead_tail=0.0, seed=3))
    assert low <= prof["one_hit"] <= high


def test_long_pauses_stretch_reuse_distance():
    # the same sessions, most gaps long: a small tier catches far less reuse
    near = generate(sessions=400, long_share=0.0, seed=4)
    far = generate(sessions=400, long_share=0.9, long_gap=3000, seed=4)
    assert trace_profile(near)["distinct"] == trace_profile(far)["distinct"]
    assert replay(far, "lru", 200).hit_blocks < 0.8 * replay(near, "lru", 200).hit_blocks


def test_system_prompts_are_shared_heads():
    reqs = generate(sessions=300, system_prompts=1, system_blocks=(3, 3), seed=5)
    heads = {tuple(r.keys[:3]) for r in reqs}
    assert len(heads) == 1


@pytest.mark.parametrize(
    "field, value",
    [("sessions", 0), ("turns", (3, 2)), ("turn_blocks", (0, 2)), ("dead_tail", 1.5),
     ("one_shot", -0.1), ("system_blocks", [1, 2, 3]), ("system_blocks", "12"),
     ("turns", {1, 2}), ("turns", (1.0, 2)), ("short_gap", True), ("seed", 1.0)],
)
def test_bad_fields_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        generate(**{field: value})


def test_a_range_field_takes_any_sequence_of_two_ints():
    """Found by a newcomer pass: generate(turns=[1, 2]) was refused (a tuple was required)."""
    np = pytest.importorskip("numpy")
    want = generate(sessions=40, turns=(1, 2), system_blocks=(0, 3), seed=3)
    assert generate(sessions=40, turns=[1, 2], system_blocks=range(0, 4, 3), seed=3) == want
    spec = SyntheticSpec(turns=np.array([1, 2]), one_shot_blocks=[2, 5])
    assert spec.turns == (1, 2) and spec.one_shot_blocks == (2, 5)
    assert type(spec.turns[0]) is int
    hash(spec)  # kept as tuples: the frozen spec stays hashable
    with pytest.raises(ValueError, match=r"^turns must be a \(low, high\) pair \(a sequence "
                                         r"of two ints\) with 1 <= low <= high, got \[1\]"):
        generate(turns=[1])


def test_numpy_numbers_are_taken_as_plain_numbers():
    # session 9 newcomer note: generate(sessions=np.int64(50)) was refused as "not an int"
    np = pytest.importorskip("numpy")
    spec = SyntheticSpec(sessions=np.int64(50), turns=(np.int32(1), np.int64(3)),
                         one_shot=np.float32(0.5), seed=np.int64(7))
    assert type(spec.sessions) is int and type(spec.turns[1]) is int
    assert type(spec.one_shot) is float and type(spec.seed) is int
    assert generate(spec, block_tokens=np.int64(16)) == generate(
        sessions=50, turns=(1, 3), one_shot=0.5, seed=7, block_tokens=16)
    with pytest.raises(ValueError, match="sessions"):
        SyntheticSpec(sessions=np.bool_(True))
    with pytest.raises(ValueError, match="dead_tail"):
        SyntheticSpec(dead_tail=np.bool_(True))


def test_unknown_field_and_bad_block_tokens():
    with pytest.raises(ValueError, match="unknown SyntheticSpec field"):
        generate(sesions=3)
    with pytest.raises(ValueError, match="block_tokens"):
        generate(sessions=3, block_tokens=1)


def test_a_spec_that_is_not_a_synthetic_spec_is_named():
    """Found by newcomer10: generate({"sessions": 2}) raised AttributeError "'dict' object
    has no attribute 'seed'"."""
    with pytest.raises(TypeError, match=r"spec must be a SyntheticSpec or None, got dict "
                                        r"\(pass fields as keywords: generate\(sessions=2\)\)"):
        generate({"sessions": 2})
