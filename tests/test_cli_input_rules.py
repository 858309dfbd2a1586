"""A newcomer pass (session 14): the command line's int options, counts in messages, traces
without blocks, tier stacks upside down and the working set's empty windows."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

import kvtier.cli
from kvtier.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line(text: str) -> str:
    """stderr without rich's line breaks and box borders."""
    return " ".join(part.strip(" │╭╮╰╯─") for part in text.splitlines())


# every int option of the three commands: (command, option, its minimum)
INT_OPTIONS = [
    ("replay", "--limit", 1), ("replay", "--block-tokens", 1), ("replay", "--inflight", 0),
    ("replay", "--store-threshold", 1), ("replay", "--kv-bytes-per-token", 1),
    ("replay", "--instances", 1),
    ("analyze", "--limit", 1), ("analyze", "--block-tokens", 1),
    ("analyze", "--window-requests", 1),
    ("sweep", "--limit", 1), ("sweep", "--points", 1), ("sweep", "--workers", 1),
    ("sweep", "--inflight", 0),
]


@pytest.mark.parametrize(("command", "option", "minimum"), INT_OPTIONS)
@pytest.mark.parametrize("text", ["\u0663", "\u0661\u0662", "\uff15", "1__0", "1_", "+3",
                                  "3.0", "1e3", "0x10"])
def test_int_options_take_only_ascii_counts_as_capacity_does(command, option, minimum, text):
    """Found by a newcomer pass: --capacity refuses "\u0663" (Arabic-Indic 3), "1__0" and
    "+3" (kvtier.replay.parse_count), but the other int options went through typer's int,
    which (depending on typer's version) took "\u0663", "+3", "3.0" or "1__0" as numbers.
    Every int option now uses parse_count's rule; the error names the option and the rule,
    with no traceback."""
    res = run(command, option, text)
    assert res.exit_code == 2, res.output
    err = one_line(res.stderr)
    assert f"Invalid value for '{option}'" in err
    assert f"must be a whole number >= {minimum}" in err and "ASCII digits" in err
    assert repr(text) in err
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("command", "option", "minimum"), [
    (c, o, m) for c, o, m in INT_OPTIONS if m == 1])
def test_int_options_below_their_minimum_name_it(command, option, minimum):
    res = run(command, option, "0")
    assert res.exit_code == 2, res.output
    assert "must be >= 1 (" in one_line(res.stderr) and "'0'" in one_line(res.stderr)


@pytest.mark.parametrize(("command", "option", "minimum"), INT_OPTIONS)
def test_a_negative_int_option_is_said_to_be_below_its_minimum(command, option, minimum):
    """'-W -1' was 'must be a whole number >= 0 ... in ASCII digits', as if '-1' were not
    a number; --capacity -5 says 'must be >= 1 block'."""
    res = run(command, f"{option}=-1")
    assert res.exit_code == 2, res.output
    assert f"must be >= {minimum} (" in one_line(res.stderr), res.stderr
    assert "'-1'" in one_line(res.stderr) and "ASCII" not in res.stderr


@pytest.mark.parametrize(("command", "option", "minimum"), INT_OPTIONS)
def test_a_sign_apart_from_its_digits_is_not_a_negative_count(command, option, minimum):
    """Review of session 14: '- 5' (a space after the sign) was said to be 'must be >= 1',
    as if it were the number -5; it is no number (int('- 5') raises), so the rule of counts
    is named, as for '+3'."""
    res = run(command, f"{option}=- 5")
    assert res.exit_code == 2, res.output
    err = one_line(res.stderr)
    assert f"must be a whole number >= {minimum}" in err and "ASCII digits" in err, err
    assert "'- 5'" in err


def test_int_options_take_grouped_digits_and_spaces_as_capacity_does(tmp_path):
    """"1_0" is ten, as --capacity 16_000 is 16,000 (the one rule of counts)."""
    out = tmp_path / "o.json"
    res = run("replay", "-p", "lru", "-c", "1_0", "--limit", " 1_0 ", "-W", "0_2",
              "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["trace"]["requests"] == 10
    assert data["results"][0]["capacity"] == 10
    assert data["results"][0]["inflight"] == 2



# every float option: (command, option, its minimum, its unit)
FLOAT_OPTIONS = [
    ("replay", "--prefill-tps", "0.001", "tokens/s"), ("replay", "--read-gbps", "0.001", "GB/s"),
    ("analyze", "--window-s", "0.001", "seconds"),
]


@pytest.mark.parametrize(("command", "option", "minimum", "unit"), FLOAT_OPTIONS)
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "Infinity", "1e400", "\u0663",
                                  "\u0661.5", "\uff15", "+3", "0x10", "1e", "1.2.3", "", "- 5",
                                  "1__0", "_1", "1_", "1._5", "1_.5", "_.5", "1e_5", "1e5_",
                                  "1_e5", ".5_"])
def test_float_options_take_only_finite_ascii_decimals(command, option, minimum, unit, text):
    """Found by a newcomer pass: the float options went through typer's float, which took,
    depending on typer's version, "nan", "inf" or "\u0663". Each float option now takes
    ASCII digits with an optional fraction and exponent, finite, "_" grouping as in a
    Python literal (a single "_" between digits; session 15: "1_0" was refused though the
    count options take it); the error names the option and the rule, with no traceback."""
    res = run(command, option, text)
    assert res.exit_code == 2, res.output
    err = one_line(res.stderr)
    assert f"Invalid value for '{option}'" in err, err
    assert f"must be a finite number >= {minimum} ({unit}) in ASCII digits" in err, err
    assert repr(text) in err
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("command", "option", "minimum", "unit"), FLOAT_OPTIONS)
@pytest.mark.parametrize("text", ["0", "0.0009", "1e-400", "-1", "-0.5"])
def test_float_options_below_their_minimum_name_it(command, option, minimum, unit, text):
    """1e-400 underflows to 0.0 and is below the minimum; a negative number is said to be
    below the minimum, not to be no number."""
    res = run(command, f"{option}={text}")
    assert res.exit_code == 2, res.output
    err = one_line(res.stderr)
    assert f"must be >= {minimum} ({unit}), got {text!r}" in err, err
    assert "ASCII" not in err


def test_float_options_take_grouped_digits_as_the_count_options_do(tmp_path):
    """Session 15: "--limit 1_0" was ten but "--prefill-tps 1_0" was refused: one rule of
    digits now, a single "_" between digits, in the mantissa, fraction and exponent."""
    out = tmp_path / "o.json"
    res = run("replay", "-p", "lru", "-c", "1_0%", "--limit", "1_0", "--prefill-tps",
              " 1_000.2_5e0_0 ", "--read-gbps", "2_5", "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    cost = data["cost_model"]
    assert cost["prefill_tokens_per_s"] == 1000.25 and cost["read_gb_per_s"] == 25.0
    res = run("analyze", "--window-s", "1_2.5", "--json", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["analysis"]["working_set"]["window"] == 12.5


def test_the_number_patterns_are_pythons_literal_rules():
    """The count and decimal patterns take exactly what Python's int() / float() take of
    the strings of these characters (no sign, no spaces): "_" only between digits."""
    import itertools

    from kvtier.replay import DECIMAL_PATTERN, parse_count

    decimal = re.compile(rf"{DECIMAL_PATTERN}\Z", re.ASCII)

    def takes(convert, text):
        try:
            convert(text)
        except ValueError:
            return False
        return True

    for n in range(1, 7):
        for chars in itertools.product("10_.e-", repeat=n):
            text = "".join(chars)
            if text[0] == "-":  # a sign: not a number of these patterns
                continue
            assert bool(decimal.match(text)) == takes(float, text), text
            assert (parse_count(text) is not None) == takes(int, text), text


def test_a_grouped_percentage_is_a_capacity_and_a_grouped_zero_is_not():
    from kvtier.replay import parse_capacity

    assert parse_capacity("1_0%", 1000) == parse_capacity("10%", 1000) == 100
    assert parse_capacity("0.0_5e2%", 1000) == 50
    for text in ("0_0%", "0_0.0_0e5%"):
        with pytest.raises(ValueError, match=re.escape(f"capacity {text!r} must be > 0%")):
            parse_capacity(text, 1000)
    with pytest.raises(ValueError, match="neither a block count nor a percentage"):
        parse_capacity("1__0%", 1000)


def test_float_options_take_fractions_and_exponents(tmp_path):
    out = tmp_path / "o.json"
    res = run("replay", "-p", "lru", "-c", "10", "--limit", "10", "--prefill-tps", " 2.5e3 ",
              "--read-gbps", ".5", "--json", out)
    assert res.exit_code == 0, res.output
    cost = json.loads(out.read_text())["cost_model"]
    assert cost["prefill_tokens_per_s"] == 2500.0 and cost["read_gb_per_s"] == 0.5
    res = run("analyze", "--limit", "20", "--window-s", "5.", "--json", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["analysis"]["working_set"]["window"] == 5.0


# -- counts in messages: "1 request", "1 of 5 requests has" ---------------------------------
def test_one_bad_line_and_one_short_request_are_singular(tmp_path):
    """Found by a newcomer pass: 'all 1 request lines are bad', 'none of its 1 requests has a
    full block of 512 tokens', and at --block-tokens 1 '... of 1 tokens'."""
    from kvtier.trace import TraceFormatError, TraceWarning, read_trace

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hash_ids": "x"}\n')
    with pytest.raises(TraceFormatError, match="no valid request: its one request line is bad"):
        list(read_trace(bad, skip_bad_lines=True))
    short = tmp_path / "short.jsonl"
    short.write_text('{"token_ids": [1, 2, 3]}\n')
    with pytest.warns(TraceWarning, match=r"short.jsonl: its one request has no full block "
                                          r"of 512 tokens \(the longest token_ids has 3\)"):
        list(read_trace(short))


def test_strict_length_error_counts_one_block_and_one_token(tmp_path):
    """'input_length 3 needs 1 blocks of 16 tokens', '... 3 blocks of 1 tokens'."""
    from kvtier.trace import TraceFormatError, read_trace

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"hash_ids": [1, 2], "input_length": 3}\n')
    with pytest.raises(TraceFormatError, match="'input_length' 3 needs 1 block of 16 tokens "
                                               "but 'hash_ids' has 2"):
        list(read_trace(trace, block_tokens=16, strict=True))
    with pytest.raises(TraceFormatError, match="'input_length' 3 needs 3 blocks of 1 token "
                                               "but 'hash_ids' has 2"):
        list(read_trace(trace, block_tokens=1, strict=True))


def test_one_mismatched_request_of_several_has_not_have(tmp_path):
    from kvtier.trace import TraceWarning, read_trace

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"hash_ids": [1], "input_length": 5}\n'
                     '{"hash_ids": [2], "input_length": 5000}\n')
    with pytest.warns(TraceWarning, match="1 of 2 requests has an input_length that needs "
                                          "another number of 512-token blocks than its "
                                          "hash_ids"):
        list(read_trace(trace))


def test_window_requests_of_one_and_one_worker_are_singular(tmp_path, monkeypatch):
    """'--window-requests 1 requests' in analyze's warning; sweep's bar 'sweep (1 processes)'."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"hash_ids": [1], "input_length": 5}\n{"hash_ids": [1], '
                     '"input_length": 5}\n')
    res = run("analyze", trace, "--window-s", "5", "--window-requests", "1")
    assert res.exit_code == 0, res.output
    err = one_line(res.stderr)
    assert "working set is per --window-requests 1 request" in err
    assert "1 requests" not in err
    labels = []
    real_progress = kvtier.cli._progress

    def recording(enabled, total_refs):  # the bar's label, which a test console never shows
        bar = real_progress(True, total_refs)
        add_task = bar.add_task
        bar.add_task = lambda description, **kw: labels.append(description) or add_task(
            description, **kw)
        return bar

    monkeypatch.setattr(kvtier.cli, "_progress", recording)
    res = run("sweep", trace, "-p", "lru", "-c", "1", "--workers", "1")
    assert res.exit_code == 0, res.output
    assert labels == ["sweep (1 process)"]


def test_analyze_and_cost_model_say_has_for_one_request():
    from kvtier.analyze import Analyzer
    from kvtier.costmodel import CostModel, evaluate

    an = Analyzer()
    an.add([1], 0.0)
    an.add([2], None)
    an.add([3], 5.0)
    with pytest.warns(UserWarning, match="1 of 3 requests has no timestamp"):
        an.result()
    model = CostModel.build(model="llama-3.1-8b", block_tokens=16)
    with pytest.warns(UserWarning, match="1 of 3 requests is out of arrival order"):
        evaluate(model, [16, 16, 16], [0, 0, 0], [0.0, 10.0, 5.0], 0)


# -- a trace whose requests all have an empty hash_ids ---------------------------------------
def test_a_trace_of_empty_hash_ids_says_so_not_block_tokens(tmp_path):
    """Found by a newcomer pass: every request with 'hash_ids': [] and an input_length > 0
    was warned about as '2 of 2 requests have an input_length that needs another number of
    512-token blocks than their hash_ids ...; no power-of-two block size up to 65,536 fits',
    which sends the user after --block-tokens; no block size fixes an empty hash_ids."""
    from kvtier.trace import TraceWarning, read_trace

    trace = tmp_path / "empty.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "hash_ids": []}\n'
                     '{"timestamp": 1, "input_length": 600, "hash_ids": []}\n')
    with pytest.warns(TraceWarning) as record:
        reqs = list(read_trace(trace))
    assert len(reqs) == 2 and len(record) == 1
    message = str(record[0].message)
    assert "every one of its 2 requests has an empty hash_ids (input_length up to 600 " \
           "tokens)" in message
    assert "nothing can be stored or hit" in message
    assert "block size" not in message and "--block-tokens" not in message
    for command in ("replay", "analyze"):
        res = run(command, trace, *(["-c", "1"] if command == "replay" else []))
        assert res.exit_code == 0, res.output
        err = one_line(res.stderr)
        assert "empty hash_ids" in err and "power-of-two" not in err, err
    one = tmp_path / "one.jsonl"
    one.write_text('{"input_length": 5, "hash_ids": []}\n')
    with pytest.warns(TraceWarning, match="its one request has an empty hash_ids "
                                          r"\(input_length up to 5 tokens\)"):
        list(read_trace(one))


# -- --tiers with a lower tier smaller than the one above --------------------------------------
@pytest.mark.parametrize(("tiers", "noted"), [
    ("host:10%,disk:5%", ("--tiers disk:5% (594 blocks) is smaller than host:10% "
                          "(1,188 blocks) above it")),
    ("host:2000,disk:1", ("--tiers disk:1 (1 block) is smaller than host:2000 "
                          "(2,000 blocks) above it")),
    ("host:10%,disk:10%", None),
    ("host:594,disk:20%", None),
])
def test_a_lower_tier_smaller_than_the_one_above_is_noted(tmp_path, tiers, noted):
    """Found by a newcomer pass: ``--tiers host:10%,disk:5%`` ran without a word, though a
    lower tier holds what the host tier evicts (write-back; the sample's disk tier hit 0.40 %)
    or a copy of what it stores (write-through: 0 hits). It runs, with a warning naming both
    items and their sizes in blocks."""
    out = tmp_path / "o.json"
    res = run("replay", "--tiers", tiers, "-p", "lru", "--json", out)
    assert res.exit_code == 0, res.output
    err = one_line(res.stderr)
    if noted is None:
        assert "smaller than" not in err
    else:
        assert noted in err and "running the stack as given" in err
    assert [t["name"] for t in json.loads(out.read_text())["results"][0]["tiers"]] == \
        ["host", "disk"]


# -- analyze: windows of time in which no request arrived -------------------------------------
def _analyze_arrivals(tmp_path, arrivals):
    """``kvtier analyze --json`` of a trace of one-block requests ``(timestamp, hash)``
    (a timestamp as written in the JSONL); returns (trace path, result, JSON path), the run
    checked to succeed."""
    trace = tmp_path / "arrivals.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t}, "input_length": 5, "hash_ids": [{h}]}}\n'
                             for t, h in arrivals))
    out = tmp_path / "a.json"
    res = run("analyze", trace, "--json", out)
    assert res.exit_code == 0, res.output
    return trace, res, out


def test_analyze_says_how_many_empty_windows_it_skipped(tmp_path):
    """Found by a newcomer pass: a gap in arrivals longer than a window was jumped over in
    silence: 'working set per 60s ... min 1, 2 windows' for a trace spanning 4 windows, 2 of
    them with no request. The count is in the table, the JSON and TraceAnalysis."""
    from kvtier.analyze import analyze

    trace, res, out = _analyze_arrivals(tmp_path, [(0, 1), (1000, 2), (200000, 1)])
    text = " ".join(res.stdout.split())
    assert "2 windows; 2 empty windows (no request arrived) skipped, not in these figures" \
        in text
    ws = json.loads(out.read_text())["analysis"]["working_set"]
    assert ws["windows"] == 2 and ws["empty_windows"] == 2
    assert [w["start"] for w in ws["series"]] == [0.0, 180.0]
    from kvtier.trace import read_trace

    assert analyze(read_trace(trace), window_s=100).empty_windows == 1  # [100, 200) s
    assert analyze(read_trace(trace), window_s=300).empty_windows == 0
    # no gap, or windows in requests: nothing said
    res = run("analyze")
    assert res.exit_code == 0 and "empty window" not in res.stdout


def test_analyze_of_requests_without_timestamps_has_no_empty_windows(tmp_path):
    from kvtier.analyze import Analyzer

    an = Analyzer(window_requests=2)
    for keys in ([1], [2], [3], [1], [2]):
        an.add(keys)
    result = an.result()
    assert result.empty_windows == 0 and len(result.windows) == 3


def test_analyze_prints_times_near_the_float_limit_readably(tmp_path):
    """Session 15: timestamps near 1e308 ms printed the reuse times and the empty-window
    count with 300 digits (most of them float noise), pushing the figures' names out of
    the table. Past 2**53 the table prints 6 significant digits; the JSON keeps the
    numbers."""
    import re

    _trace, res, out = _analyze_arrivals(tmp_path, [(0, 1), ("1e307", 1), ("1.7e308", 1)])
    assert not re.search(r"[0-9,]{25}", res.stdout), res.stdout
    text = " ".join(res.stdout.split())
    assert "time between reuses (s) p50 1e+304 p90 1.6e+305, p99 1.6e+305, max 1.6e+305" \
        in text
    assert "2.83333e+303 empty windows (no request arrived) skipped" in text
    d = json.loads(out.read_text())["analysis"]
    assert d["reuse_time_s"]["max"] == 1.6e305
    assert d["working_set"]["empty_windows"] > 2 ** 1000  # the int itself
    # below 2**53 the figures keep every digit, grouped
    assert kvtier.cli._fmt(2 ** 53 - 1) == "9,007,199,254,740,991"
    assert kvtier.cli._fmt(2.0 ** 53) == "9.0072e+15"


# -- Ctrl-C before any run finished --------------------------------------------------------------
@pytest.mark.parametrize("tiers", [False, True])
def test_ctrl_c_before_the_first_run_says_no_run_finished(tmp_path, monkeypatch, tiers):
    """Found by a newcomer pass (a real SIGINT 3.5 s into ``kvtier replay FULL_TRACE --tiers
    host:1%,disk:10% -p lru,arc``): '0 of 2 runs finished; their rows are above' under an
    empty table."""
    import kvtier.tiersim

    module = kvtier.tiersim if tiers else kvtier.cli
    name = "replay_tiers" if tiers else "replay"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, interrupted)
    args = ["--tiers", "host:100,disk:1000"] if tiers else ["-c", "100"]
    res = run("replay", "-p", "lru,arc", *args, "--json", tmp_path / "o.json")
    assert res.exit_code == 130
    err = one_line(res.stderr)
    assert "interrupted (Ctrl-C): none of the 2 runs finished; no row to show" in err, err
    assert "rows are above" not in err


def test_ctrl_c_after_one_run_says_its_row():
    from kvtier import cli

    assert cli._interrupted_note(1, 4, "run") == \
        "interrupted (Ctrl-C): 1 of 4 runs finished; its row is above"
    assert cli._interrupted_note(2, 1_000, "grid point") == \
        "interrupted (Ctrl-C): 2 of 1,000 grid points finished; their rows are above"


# -- the library: replay() and run_grid() name their own arguments ------------------------------
@pytest.mark.parametrize("capacity", [0, -1, "10", 10.0, True, None, 2**31])
def test_replay_names_its_capacity_argument(capacity):
    """Found by a newcomer pass: replay(reqs, "lru", 0) raised 'num_blocks must be a positive
    int', the manager's argument, which replay() does not have."""
    from kvtier.replay import replay
    from kvtier.trace import embedded_sample_path, read_trace

    reqs = list(read_trace(embedded_sample_path()))[:5]
    with pytest.raises(ValueError, match=r"^capacity must be an int from 1 to 2,147,483,647 "
                                         r"\(blocks\), got "):
        replay(reqs, "lru", capacity)


def test_replay_still_takes_numpy_capacities():
    np = pytest.importorskip("numpy")
    from kvtier.replay import replay
    from kvtier.trace import embedded_sample_path, read_trace

    reqs = list(read_trace(embedded_sample_path()))[:5]
    res = replay(reqs, "lru", np.int64(10))
    assert res.capacity == 10 and type(res.capacity) is int


def test_run_grid_checks_capacities_and_policies_before_any_worker(monkeypatch):
    """run_grid(path, ["lru"], [0]) and an unknown policy failed inside each worker process,
    after it had read the trace, with the manager's 'num_blocks ...'; now before the pool,
    naming the list item."""
    import kvtier.sweep
    from kvtier.sweep import run_grid
    from kvtier.trace import embedded_sample_path

    def no_read(*args, **kwargs):
        raise AssertionError("the trace was read before the arguments were checked")

    monkeypatch.setattr(kvtier.sweep, "_read", no_read)
    monkeypatch.setattr(kvtier.sweep, "ProcessPoolExecutor", no_read)
    with pytest.raises(ValueError, match=r"^capacities\[1\] must be an int from 1 to "
                                         r"2,147,483,647 \(blocks\), got 0$"):
        run_grid(embedded_sample_path(), ["lru"], [10, 0], workers=2)
    with pytest.raises(ValueError, match=r"capacities\[0\] must be .*got '10'"):
        run_grid(embedded_sample_path(), ["lru"], ["10"], workers=1)
    with pytest.raises(ValueError, match="unknown policy 'nosuch'"):
        run_grid(embedded_sample_path(), ["lru", "nosuch"], [10], workers=2)


def test_input_lengths_of_bare_lists_is_a_clear_type_error():
    """Found by a newcomer pass: costmodel.input_lengths([[1, 2]], 16) raised
    AttributeError: 'list' object has no attribute 'input_length'."""
    from kvtier.costmodel import input_lengths
    from kvtier.trace import Request

    with pytest.raises(TypeError, match=r"request 1 \(\[1, 2\]\) has no .input_length and "
                                        r".keys: input_lengths\(\) takes Request objects"):
        input_lengths([Request([1], 5, None, None), [1, 2]], 16)
    with pytest.raises(ValueError, match=r"block_tokens must be a positive int \(tokens\), "
                                         "got 0"):
        input_lengths([Request([1], None, None, None)], 0)
    assert input_lengths([Request([1, 2], None, None, None), Request([1], 7, None, None)],
                         16) == [32, 7]


# -- kvtier.synthetic ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["short_gap", "long_gap"])
def test_synthetic_gaps_too_large_for_a_float_are_refused_up_front(name):
    """Found by a newcomer pass: generate(short_gap=10**400, long_share=0) stopped half-way
    with 'OverflowError: int too large to convert to float'."""
    from kvtier.synthetic import SyntheticSpec, generate

    with pytest.raises(ValueError, match=rf"^{name} must be an int from 1 to 1e\+300 "
                                         r"\(requests\), got 1000000"):
        generate(sessions=5, long_share=0.5, **{name: 10**400})
    assert SyntheticSpec(**{name: 10**300}).__dict__[name] == 10**300


def test_trace_profile_of_a_generator_or_bare_lists():
    """trace_profile(iter(reqs)) read its argument twice: the second pass of a generator
    was empty, so leaf_reuse and inner_reuse were 0.0; trace_profile([[1, 2]]) raised
    AttributeError."""
    from kvtier.synthetic import generate, trace_profile

    reqs = generate(sessions=50, seed=1)
    want = trace_profile(reqs)
    assert want["leaf_reuse"] > 0 or want["inner_reuse"] > 0
    assert trace_profile(r for r in reqs) == want
    with pytest.raises(TypeError, match=r"request 0 \(\[1, 2\]\) has no .keys: "
                                        r"trace_profile\(\) takes Request objects"):
        trace_profile([[1, 2]])


# -- --plot - ------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["analyze"], ["sweep", "-p", "lru", "-c", "10"]])
def test_plot_to_standard_output_is_refused_before_the_run(command, tmp_path, monkeypatch):
    """Found by a newcomer pass: ``kvtier analyze --plot -`` exited 0 saying 'distributions
    written to -', but no image was written anywhere (stdout held the table only)."""
    monkeypatch.chdir(tmp_path)
    res = run(*command, "--plot", "-")
    assert res.exit_code == 1, res.output
    assert "--plot -: the image cannot go to standard output (only --json - does); give a " \
           "file name" in one_line(res.stderr)
    assert "written to" not in res.output and list(tmp_path.iterdir()) == []


# a count of more digits than Python converts from text to an int (its default limit is
# 4,300 digits; sys.get_int_max_str_digits)
HUGE_COUNT = "9" * 5000


@pytest.mark.parametrize(("command", "option", "minimum"), INT_OPTIONS)
def test_an_int_option_of_thousands_of_digits_names_the_rule(command, option, minimum):
    """Found by a review pass (session 15): a count of 5,000 digits made parse_count's int()
    raise Python's own "Exceeds the limit (4300 digits) for integer string conversion ...
    use sys.set_int_max_str_digits()", shown as the option's error. Now the error names the
    option and the rule (at most so many digits)."""
    res = run(command, option, HUGE_COUNT)
    assert res.exit_code == 2, res.output
    err = one_line(res.stderr)
    assert f"Invalid value for '{option}'" in err
    assert "has 5,000 digits" in err and "at most 4,300" in err
    assert "set_int_max_str_digits" not in err and "Traceback" not in res.output


@pytest.mark.parametrize("spec", [HUGE_COUNT, "1_" + HUGE_COUNT])
def test_a_capacity_of_thousands_of_digits_is_above_the_most_a_tier_holds(spec):
    """The same for --capacity (and sweep's --min / --max, by parse_capacity): a count of
    5,000 digits is above the most blocks a tier can hold, as one of 20 digits is, not
    Python's conversion limit."""
    from kvtier.replay import parse_count

    for args in (("replay", "--capacity", spec, "--limit", 3),
                 ("sweep", "--min", spec, "--limit", 3, "--points", 2, "-p", "lru")):
        res = run(*args)
        assert res.exit_code == 1, res.output
        err = one_line(res.stderr)
        assert "is above the most blocks a tier can hold" in err, err
        assert "set_int_max_str_digits" not in err and "Traceback" not in res.output
    assert parse_count("0" * 5000 + "7") == 7  # leading zeros are no size


@pytest.mark.parametrize("space", ["\u00a0", "\u2003", "\u3000"])
def test_replay_capacity_takes_only_ascii_spaces_as_every_count_does(space):
    """Found by a review pass (session 15): replay's --capacity list was split and each item
    stripped by str.strip, which strips Unicode spaces too, so --capacity "\\u00a05" ran at 5
    blocks while sweep's --min, --limit and parse_capacity refuse it (their spaces are
    ASCII, as the rule's digits are)."""
    spec = space + "5"
    res = run("replay", "--capacity", spec, "--limit", 3)
    assert res.exit_code == 1, res.output
    err = one_line(res.stderr)
    assert f"capacity {spec!r} is neither a block count nor a percentage" in err, err
    assert run("replay", "--capacity", " 5 ,\t6", "--limit", 3).exit_code == 0


# -- sweep's --min above --max: the error first, no warnings -------------------------------------
@pytest.mark.parametrize(("cap_min", "cap_max", "said"), [
    ("10", "5", "--min 10 (10 blocks) is above --max 5 (5 blocks)"),
    ("200%", "150%", "--min 200% (8 blocks) is above --max 150% (6 blocks)"),
    ("10", "1e-9%", "--min 10 (10 blocks) is above --max 1e-9% (1 block)"),
])
def test_sweep_range_error_comes_before_any_capacity_warning(tmp_path, cap_min, cap_max, said):
    """Noticed in session 16: `kvtier sweep --min 10 --max 5` on a trace of 4 distinct blocks
    warned that capacity 10 and capacity 5 exceed the trace ("every block fits, nothing is
    ever evicted", twice), then failed on the range: warnings about a run that never
    happened, above the error that says why. The range is checked first; the command fails
    with the error alone."""
    trace = tmp_path / "t.txt"
    trace.write_text("a b c\nb c d\n")
    res = run("sweep", trace, "-p", "lru", "--min", cap_min, "--max", cap_max,
              "--workers", 1)
    assert res.exit_code == 1, res.output
    err = one_line(res.stderr)
    assert f"error: {said}" in err, err
    assert "warning" not in res.stderr, res.stderr
    assert "Traceback" not in res.output


def test_sweep_range_of_counts_fails_before_the_trace_is_read(tmp_path, monkeypatch):
    """Two block counts need no trace to compare: --min 10 --max 5 fails at once, before
    the trace (which may take minutes to read) is opened."""
    trace = tmp_path / "t.txt"
    trace.write_text("a b c\nb c d\n")
    monkeypatch.setattr(kvtier.cli, "count_unique_blocks",
                        lambda it: pytest.fail("the trace was read"))
    res = run("sweep", trace, "-p", "lru", "--min", "10", "--max", "5")
    assert res.exit_code == 1, res.output
    assert "error: --min 10 (10 blocks) is above --max 5 (5 blocks)" in one_line(res.stderr)
    assert "warning" not in res.stderr


@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_a_bad_capacity_in_a_list_fails_before_the_others_are_warned_about(tmp_path, command):
    """The same rule for a --capacity list: `--capacity 10,abc` on a trace of 4 distinct
    blocks warned that 10 blocks exceed the trace, then failed on 'abc'. Every capacity is
    checked first; the command fails with the error alone."""
    trace = tmp_path / "t.txt"
    trace.write_text("a b c\nb c d\n")
    res = run(command, trace, "-p", "lru", "--capacity", "10,abc")
    assert res.exit_code == 1, res.output
    assert "error: capacity 'abc' is neither a block count nor a percentage" in one_line(
        res.stderr)
    assert "warning" not in res.stderr, res.stderr
    workers = ("--workers", 1) if command == "sweep" else ()
    res = run(command, trace, "-p", "lru", "--capacity", "10", *workers)
    assert res.exit_code == 0, res.output  # a valid list is still warned about
    assert "warning: capacity 10 = 10 blocks exceeds the trace's 4 distinct blocks" in \
        one_line(res.stderr)
