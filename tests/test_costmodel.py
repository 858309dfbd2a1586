"""kvtier.costmodel: the formulas on hand-computed cases."""

from __future__ import annotations

import json

import pytest

from kvtier.costmodel import PROFILES, CostModel, evaluate, input_lengths
from kvtier.trace import Request


def test_profiles_kv_bytes_per_token():
    # 2 (K, V) x layers x kv_heads x head_dim x 2 bytes (bf16)
    assert PROFILES["llama-3.1-8b"].kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert PROFILES["llama-3.1-70b"].kv_bytes_per_token == 327_680
    assert PROFILES["qwen2.5-7b"].kv_bytes_per_token == 57_344
    assert all(p.source.startswith("https://huggingface.co/") for p in PROFILES.values())


M = CostModel(kv_bytes_per_token=1000, prefill_tokens_per_s=1000, read_gb_per_s=1.0,
              instances=1, block_tokens=512)


def test_no_timestamps_no_queue():
    # L = 1000, 2000 tokens; hits 0 and 2 blocks (1,024 tokens); 3 blocks stored
    c = evaluate(M, [1000, 2000], [0, 2], None, stored_blocks=3)
    assert c["hit_tokens"] == 1024 and c["input_tokens"] == 3000
    assert c["read_bytes"] == 1024 * 1000
    assert c["write_bytes"] == 3 * 512 * 1000
    assert c["bytes_moved"] == c["read_bytes"] + c["write_bytes"]
    assert c["prefill_s_no_tier"] == pytest.approx(3.0)
    # request 2: 976 tokens computed (0.976 s) + 1,024 tokens loaded at 1 us each
    assert c["prefill_s_with_tier"] == pytest.approx(1 + 0.976 + 0.001024)
    assert c["load_s"] == pytest.approx(0.001024)
    assert c["prefill_s_saved"] == pytest.approx(1.024 - 0.001024)
    assert c["queue"] == "none" and c["utilization_no_tier"] is None
    assert c["ttft_no_tier_s"]["median"] == 1.0 and c["ttft_no_tier_s"]["p99"] == 2.0
    assert c["ttft_with_tier_s"]["median"] == pytest.approx(0.977024)
    assert c["ttft_with_tier_s"]["p99"] == 1.0


def test_fifo_queue_over_arrivals():
    # arrivals 0 and 0.5 s: without the tier request 2 waits until 1 s and ends at 3 s
    c = evaluate(M, [1000, 2000], [0, 2], [0, 500], stored_blocks=3)
    assert c["queue"] == "fifo" and c["instances"] == 1
    assert c["ttft_no_tier_s"]["p99"] == pytest.approx(2.5)
    assert c["ttft_with_tier_s"]["p99"] == pytest.approx(1.477024)
    assert c["utilization_no_tier"] == pytest.approx(3.0 / 0.5)
    two = CostModel(1000, 1000, 1.0, instances=2)
    c2 = evaluate(two, [1000, 2000], [0, 2], [0, 500], stored_blocks=3)
    assert c2["ttft_no_tier_s"]["p99"] == pytest.approx(2.0)  # no wait with two instances
    auto = CostModel(1000, 1000, 1.0, instances=None)
    c3 = evaluate(auto, [1000, 2000], [0, 2], [0, 500], stored_blocks=3)
    assert c3["instances"] == 8 and c3["instances_auto"]  # ceil(3 s / (0.8 * 0.5 s))
    # a missing timestamp: treated as a trace without timestamps (and said so)
    with pytest.warns(UserWarning, match="1 of 2 requests has no timestamp"):
        assert evaluate(M, [1000, 2000], [0, 2], [0, None], 3)["queue"] == "none"


def test_hit_tokens_capped_at_input_and_lengths_from_requests():
    c = evaluate(M, [1000], [3], None, stored_blocks=0)  # 3 blocks = 1,536 > 1,000 tokens
    assert c["hit_tokens"] == 1000
    reqs = [Request([1, 2], 700, None, None), Request([1, 2, 3], None, None, None)]
    assert input_lengths(reqs, 512) == [700, 1536]


def test_bad_parameters():
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        CostModel(kv_bytes_per_token=0)
    with pytest.raises(ValueError, match="read_gb_per_s"):
        CostModel(1000, read_gb_per_s=float("nan"))
    with pytest.raises(ValueError, match="instances"):
        CostModel(1000, instances=0)
    with pytest.raises(ValueError, match="known: llama-3.1-70b"):
        CostModel.build(model="gpt-x")
    with pytest.raises(ValueError, match="not both"):
        CostModel.build(model="llama-3.1-8b", kv_bytes_per_token=5)
    with pytest.raises(ValueError, match="differ in length"):
        evaluate(M, [1, 2], [0], None, 0)
    built = CostModel.build()
    assert built.model == "llama-3.1-8b" and built.kv_bytes_per_token == 131_072
    assert "10,000 tokens/s" in built.describe() and "25 GB/s" in built.describe()
    assert built.to_dict()["source"].endswith("Llama-3.1-8B/blob/main/config.json")


def test_numpy_numbers_are_taken_as_plain_numbers():
    """Found by a newcomer session: a KV size computed with numpy (layers * heads * dim *
    2 * dtype bytes of numpy ints) was refused with 'kv_bytes_per_token must be a positive
    number, got np.int64(131072)', while OffloadingManager and DiskTier take numpy sizes.
    They are taken now, kept as plain Python numbers; bools (numpy's too) stay refused."""
    np = pytest.importorskip("numpy")
    m = CostModel(np.int64(131_072), prefill_tokens_per_s=np.float64(1e4),
                  read_gb_per_s=np.float32(25), instances=np.int64(2), block_tokens=np.int32(16))
    assert (m.kv_bytes_per_token, m.instances, m.block_tokens) == (131_072, 2, 16)
    assert type(m.kv_bytes_per_token) is int and type(m.block_tokens) is int
    assert type(m.prefill_tokens_per_s) is float and type(m.read_gb_per_s) is float
    assert m == CostModel(131_072, prefill_tokens_per_s=1e4, read_gb_per_s=25.0, instances=2,
                          block_tokens=16)
    with pytest.raises(ValueError, match="kv_bytes_per_token must be a positive number"):
        CostModel(np.bool_(True))
    with pytest.raises(ValueError, match="block_tokens must be an int >= 1, got np.True_"):
        CostModel(1000, block_tokens=np.bool_(True))
    with pytest.raises(ValueError, match=r"instances must be an int >= 1, got np.float64\(2.0\)"):
        CostModel(1000, instances=np.float64(2.0))


def test_more_instances_than_requests_queue_no_request():
    """Found by a newcomer session: kvtier replay --cost --instances 100000000000000000000
    ended in a traceback ("OverflowError: cannot fit 'int' into an index-sized integer": one
    heap entry per instance), and 10**9 instances allocated 8 GB. No more servers than
    requests can ever be busy, so the extra ones change no TTFT."""
    lengths, hits, stamps = [5000, 5000, 5000], [0, 1, 0], [0.0, 10.0, 20.0]
    few = evaluate(CostModel(131_072, instances=3), lengths, hits, stamps, 0)
    many = evaluate(CostModel(131_072, instances=10**20), lengths, hits, stamps, 0)
    assert many["ttft_no_tier_s"] == few["ttft_no_tier_s"]
    assert many["ttft_with_tier_s"] == few["ttft_with_tier_s"]
    assert many["instances"] == 10**20 and many["utilization_no_tier"] < 1e-15


@pytest.mark.parametrize("field", ["kv_bytes_per_token", "instances", "block_tokens"])
def test_an_int_too_large_for_a_float_is_refused_by_name(field):
    """Found by newcomer10: ``kvtier replay --cost --kv-bytes-per-token 1e400`` (the int),
    ``--instances`` and ``--block-tokens`` of that size ended in a traceback
    ("OverflowError: int too large to convert to float": math.isfinite of the int, then the
    utilization's and the table's float arithmetic)."""
    args = {"kv_bytes_per_token": 1000, field: 10**400}
    with pytest.raises(ValueError, match=rf"^{field} must be .*, got 1000000"):
        CostModel(**args)
    from typer.testing import CliRunner

    from kvtier.cli import app

    option = "--" + {"kv_bytes_per_token": "kv-bytes-per-token"}.get(field, field.replace("_", "-"))
    res = CliRunner().invoke(app, ["replay", "-p", "lru", "-c", "10", "--cost", option,
                                   str(10**400)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)  # no OverflowError
    assert f"error: {option} must be" in res.output


@pytest.mark.parametrize("lengths, hits, stamps, stored, match", [
    ([1000, 1000], [-5, 2], None, 3, r"hit_blocks\[0\] is -5"),
    ([-1000, 1000], [1, 2], None, 3, r"input_lengths\[0\] is -1000"),
    ([1000, 1000], [1, 2], None, -3, "stored_blocks"),
    ([1000, 1000], [1.5, 2], None, 3, r"hit_blocks\[0\] is 1.5"),
    ([1000, 1000.0], [1, 2], None, 3, r"input_lengths\[1\] is 1000.0"),
    ([1000, 1000], [1, True], None, 3, r"hit_blocks\[1\] is True"),
    ([1000, 1000], [1, 2], None, 3.0, "stored_blocks must be an int"),
    ([1000, 1000], [1, 2], [float("nan"), 1000], 3, r"timestamps_ms\[0\] is nan"),
    # not numbers: a str failed with a bare TypeError from the ms -> s division, and a bool
    # was taken as 1 ms
    ([1000, 1000], [1, 2], [0, "1000"], 3, r"timestamps_ms\[1\] is '1000'"),
    ([1000, 1000], [1, 2], [0, True], 3, r"timestamps_ms\[1\] is True"),
])
def test_evaluate_refuses_negative_or_nonfinite_inputs(lengths, hits, stamps, stored, match):
    """Found by a newcomer session: evaluate() took negative hit counts, lengths and stored
    blocks and a NaN arrival, and answered with negative seconds saved (-0.148 s for a hit
    count of -5), a zero-input trace or a queue over NaN. Float and bool counts were taken
    too (1.5 hit blocks), against the docstring's ints."""
    with pytest.raises(ValueError, match=match):
        evaluate(M, lengths, hits, stamps, stored)


# -- kvtier replay --cost ------------------------------------------------------------------
def test_replay_cost_table_and_json():
    import json

    from typer.testing import CliRunner

    from kvtier.cli import app
    from kvtier.replay import replay
    from kvtier.trace import embedded_sample_path, read_trace

    res = CliRunner().invoke(app, ["replay", "-p", "lru,belady", "-c", "600", "--cost",
                                   "--prefill-tps", "5000", "--json", "-", "--no-progress"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["cost_model"]["prefill_tokens_per_s"] == 5000
    assert data["cost_model"]["read_gb_per_s"] == 25.0  # default, carried in the JSON
    assert data["cost_model"]["model"] == "llama-3.1-8b"
    reqs = list(read_trace(embedded_sample_path()))
    model = CostModel.build(prefill_tokens_per_s=5000)
    for row in data["results"]:
        hits: list = []
        r = replay(reqs, row["policy"], 600, hits_out=hits)
        assert len(hits) == 500 and sum(hits) == r.hit_blocks
        expect = evaluate(model, input_lengths(reqs), hits, [q.timestamp for q in reqs],
                          r.stored_blocks)
        assert row["cost"] == expect  # same floats: the same computation
    lru, bel = data["results"]
    assert bel["cost"]["prefill_s_saved"] > lru["cost"]["prefill_s_saved"] > 0
    assert "cost model: model llama-3.1-8b" in res.output  # the assumptions are printed


def test_replay_cost_and_belady_errors():
    from typer.testing import CliRunner

    from kvtier.cli import app

    res = CliRunner().invoke(app, ["replay", "--model", "gpt-x"])
    assert res.exit_code == 1 and "unknown model profile 'gpt-x'" in res.output
    res = CliRunner().invoke(app, ["replay", "--model", "qwen2.5-7b", "--kv-bytes-per-token",
                                   "10"])
    assert res.exit_code == 1 and "not both" in res.output
    res = CliRunner().invoke(app, ["replay", "-p", "belady", "--stream"])
    assert res.exit_code == 1 and "whole trace up front" in res.output


@pytest.mark.parametrize(("option", "value"), [("--prefill-tps", "inf"), ("--read-gbps", "inf"),
                                               ("--read-gbps", "1e400")])
def test_replay_cost_errors_name_the_option_typed(option, value):
    """Found by a newcomer session: ``kvtier replay --prefill-tps inf`` (typer's min=0.001
    lets inf through) failed with 'prefill_tokens_per_s must be a positive number', naming
    CostModel's argument, not the option the user typed. Since session 14 the option's
    parser refuses it (exit 2), still naming the option."""
    from typer.testing import CliRunner

    from kvtier.cli import app

    res = CliRunner().invoke(app, ["replay", "-p", "lru", "-c", "10", option, value])
    assert res.exit_code == 2
    assert f"Invalid value for '{option}'" in res.output
    assert "must be a finite number >= 0.001" in " ".join(res.output.split())
    assert "_per_s" not in res.output


def test_a_trace_with_some_requests_unstamped_says_why_there_is_no_queue():
    """Found by a newcomer session: with one request of three missing its timestamp,
    ``kvtier replay --cost`` printed 'no queue (no timestamps)' with no word of the two
    stamped requests (kvtier analyze warns for the same trace); evaluate now warns."""
    import warnings

    model = CostModel(1000, 1000, 1.0, instances=1)
    with pytest.warns(UserWarning, match=r"cost model: 1 of 3 requests has no timestamp "
                                         r"\(first: request 2\); no queue is modeled"):
        c = evaluate(model, [1000, 1000, 1000], [0, 0, 0], [0.0, None, 500.0], 0)
    assert c["queue"] == "none"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none stamped, or all: no warning
        assert evaluate(model, [1000], [0], [None], 0)["queue"] == "none"
        assert evaluate(model, [1000], [0], None, 0)["queue"] == "none"
        assert evaluate(model, [1000], [0], [0.0], 0)["queue"] == "fifo"


def test_arrivals_out_of_trace_order_are_reported():
    # newcomer finding: the FIFO queue takes requests in trace order; arrivals that go
    # backwards made the span (last - first arrival) negative, so utilization was None and
    # auto instances fell to 1 with no word. Now a warning names the request, and the span
    # is the arrivals' range.
    auto = CostModel(1000, 1000, 1.0, instances=None)
    with pytest.warns(UserWarning, match=r"request 2 arrives at 0 ms, before request 1 "
                                         r"\(500 ms\)"):
        c = evaluate(auto, [1000, 2000], [0, 2], [500, 0], stored_blocks=3)
    assert c["instances"] == 8  # ceil(3 s / (0.8 * 0.5 s)), as with arrivals [0, 500]
    assert c["utilization_no_tier"] == pytest.approx(3.0 / (8 * 0.5))


def test_describe_shows_a_prefill_rate_below_one_token_per_second():
    """Found by a newcomer session: --prefill-tps 0.001 (the CLI's minimum) was described as
    'prefill 0 tokens/s per instance' (rounded to an integer), 0.4 too; the line is the
    printed record of the model's assumptions."""
    assert "prefill 0.001 tokens/s per instance" in CostModel(1000, 0.001).describe()
    assert "prefill 12.5 tokens/s" in CostModel(1000, 12.5).describe()
    assert "prefill 10,000 tokens/s" in CostModel(1000, 10_000.0).describe()
    assert "prefill 1,234,568 tokens/s" in CostModel(1000, 1_234_567.8).describe()


def test_evaluate_takes_numpy_integers_as_plain_ints():
    import numpy as np

    plain = evaluate(M, [1000, 2000], [1, 2], None, 3)
    numpy = evaluate(M, [np.int64(1000), np.int32(2000)], [np.int64(1), np.uint8(2)], None,
                     np.int64(3))
    assert numpy == plain
    assert type(numpy["hit_tokens"]) is int and type(numpy["write_bytes"]) is int


@pytest.mark.parametrize("model", [None, {"kv_bytes_per_token": 1000}, "llama-3.1-8b"])
def test_evaluate_names_a_model_that_is_not_a_cost_model(model):
    """Found by newcomer10: evaluate(None, ...) raised AttributeError "'NoneType' object has
    no attribute 'kv_bytes_per_token'"."""
    with pytest.raises(TypeError, match=rf"^model must be a CostModel \(e.g. CostModel.build\(\)\), "
                                        rf"got {type(model).__name__}$"):
        evaluate(model, [1000], [1], None, 0)


@pytest.mark.parametrize(("option", "value", "limit"), [
    ("--prefill-tps", "1e308", "1e+09"), ("--read-gbps", "1e7", "1e+06"),
    ("--kv-bytes-per-token", str(10**10), "1e+09")])
def test_an_absurd_size_or_rate_is_refused_by_name(option, value, limit):
    """Found by a newcomer pass: ``kvtier replay --cost --prefill-tps 1e308`` printed a
    300-digit rate and saved-% figures of 80 digits. Values above MAX_VALUES are refused."""
    from typer.testing import CliRunner

    from kvtier.cli import app

    res = CliRunner().invoke(app, ["replay", "-p", "lru", "-c", "10", option, value])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert f"error: {option} must be at most {limit} (" in res.output
    # the bounds themselves are taken
    CostModel(10**9, prefill_tokens_per_s=1e9, read_gb_per_s=1e6)


def test_a_burst_at_one_timestamp_says_why_the_automatic_count_is_one_instance():
    """Found by a newcomer session: `kvtier replay -p lru -c 100 --limit 10 --cost` (the
    embedded sample's first 10 requests, all at 0 ms) showed 1 instance, TTFT p99 11.3 s and
    utilization "-" with no word: the span of 0 gives no arrival rate, so the automatic count
    fell to 1 silently. It stays 1 (there is no rate to size for) but a warning names the
    reason and the option (seen failing before: no warning)."""
    import warnings

    auto = CostModel(1000, 1000, 1.0, instances=None)
    with pytest.warns(UserWarning, match=r"cost model: all 3 requests arrive at the same time "
                                         r"\(250 ms\), so the trace gives no arrival rate.*"
                                         r"automatic count is 1.*set the instance count "
                                         r"\(--instances"):
        c = evaluate(auto, [1000, 1000, 1000], [0, 0, 0], [250, 250, 250], 0)
    assert c["instances"] == 1 and c["utilization_no_tier"] is None
    assert c["ttft_no_tier_s"]["p99"] == pytest.approx(3.0)  # the third waits for two
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a set count, one request, or a span: no warning
        evaluate(CostModel(1000, 1000, 1.0, instances=3), [1000] * 3, [0] * 3, [250] * 3, 0)
        evaluate(auto, [1000], [0], [250], 0)
        evaluate(auto, [1000, 1000], [0, 0], [0, 1], 0)
    from typer.testing import CliRunner

    from kvtier.cli import app

    res = CliRunner().invoke(app, ["replay", "-p", "lru", "-c", "100", "--limit", "10",
                                   "--cost", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "warning: cost model: all 10 requests arrive at the same time (0 ms)" in res.stderr


def test_the_fifo_queue_refuses_arrivals_and_service_times_of_other_lengths():
    """ruff B905 pass (session 14): _ttft zipped arrivals with service times and dropped the
    extra ones of the longer list in silence; evaluate() checks its lists' lengths first,
    so only a direct call could get there, and now fails loudly."""
    from kvtier.costmodel import _ttft

    assert _ttft([1.0, 2.0], [0.0, 0.0], 2)[0] == [1.0, 2.0]
    with pytest.raises(ValueError, match="zip"):
        _ttft([1.0, 2.0, 3.0], [0.0, 0.0], 2)
    with pytest.raises(ValueError, match="zip"):
        _ttft([1.0], [0.0, 0.0], 2)


def test_arrivals_before_time_zero_queue_as_the_same_arrivals_after_it():
    """Found by a newcomer session (17): the FIFO queue's instances started free at time 0,
    so arrivals stamped before 0 (evaluate() takes any finite number of ms) waited until 0:
    one instance, two 1,000-token requests at -5 s and -4 s had a TTFT p50 of 4.2 s and a
    p99 of 5.1 s instead of 0.1 s each."""
    model = CostModel(131_072, instances=1)
    before = evaluate(model, [1000, 1000], [0, 0], [-5000, -4000], 0)
    after = evaluate(model, [1000, 1000], [0, 0], [0, 1000], 0)
    for key in ("ttft_no_tier_s", "ttft_with_tier_s"):
        for stat in ("median", "p99", "mean"):
            assert before[key][stat] == pytest.approx(0.1)
            assert after[key][stat] == pytest.approx(0.1)
    assert before["utilization_no_tier"] == after["utilization_no_tier"] == pytest.approx(0.2)


def test_evaluate_refuses_an_int_too_large_for_a_float_by_name():
    """Found by a newcomer session (17): an input length or a timestamp of 400 digits (a
    JSON trace's integer) ended in "OverflowError: int too large to convert to float" from
    evaluate() (math.isfinite of the timestamp; the prefill time of the length), so
    ``kvtier replay --cost`` printed a traceback."""
    with pytest.raises(ValueError, match=r"^input_lengths\[1\] is 1000000"):
        evaluate(M, [1000, 10**400], [0, 0], None, 0)
    with pytest.raises(ValueError, match=r"^timestamps_ms\[1\] is 1000000"):
        evaluate(M, [1000, 1000], [0, 0], [0, 10**400], 0)


def test_cost_under_the_get_protocol_says_its_hits_are_not_a_prefix(tmp_path):
    """Found by a newcomer session (17): --cost takes each request's hit blocks as the
    prefix an engine reads, but under --protocol get a hit may follow a miss (request
    [3, 2] after [1, 2] hits block 2), which an engine recomputes: the figures count it as
    prefill saved, and nothing said so."""
    from typer.testing import CliRunner

    from kvtier.cli import app

    trace = tmp_path / "t.txt"
    trace.write_text("1 2\n3 2\n")
    res = CliRunner().invoke(app, ["replay", str(trace), "-p", "lru", "-c", "10", "--cost",
                                   "--protocol", "get", "--json", str(tmp_path / "g.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "g.json").read_text())["results"][0]["cost"][
        "hit_tokens"] == 512  # block 2 of [3, 2], after the miss
    text = " ".join(res.stderr.split())
    assert ("warning: --cost under --protocol get counts every hit block as read, also one "
            "after a request's first miss") in text
    res = CliRunner().invoke(app, ["replay", str(trace), "-p", "lru", "-c", "10", "--cost"])
    assert res.exit_code == 0 and "--protocol get" not in res.stderr
