"""kvtier.analyze: known answers on hand-made traces, and agreement with the replay."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kvtier.analyze import Analyzer, analyze, percentile, plot_analysis
from kvtier.replay import replay
from kvtier.trace import Request, embedded_sample_path, read_trace


def _reqs(key_lists, stamps=None):
    stamps = stamps or [None] * len(key_lists)
    return [Request(list(k), None, None, t) for k, t in zip(key_lists, stamps)]


def naive_reuse_distances(refs):
    out, last = [], {}
    for i, k in enumerate(refs):
        if k in last:
            out.append(len(set(refs[last[k] + 1:i])))
        last[k] = i
    return sorted(out)


def test_hand_made_trace_without_timestamps():
    # refs a b c | a b d | e | a
    r = analyze(_reqs([["a", "b", "c"], ["a", "b", "d"], ["e"], ["a"]]), window_requests=2)
    assert (r.requests, r.block_refs, r.distinct_blocks) == (4, 8, 5)
    assert list(r.reuse_distances) == [2, 2, 3]  # a: {b,c}; b: {c,a}; a: {b,d,e}
    assert r.one_hit_blocks == 3 and r.one_hit_share == pytest.approx(0.6)  # c, d, e
    assert list(r.sharing_depths) == [0, 2, 0, 1]
    assert r.shared_blocks == 3
    assert [r.lru_hits(c) for c in (1, 2, 3, 4)] == [0, 0, 2, 3]
    assert not r.has_timestamps and len(r.reuse_times_s) == 0
    assert r.window_unit == "requests"
    assert [(w["start"], w["requests"], w["distinct"], w["new"], w["footprint"])
            for w in r.windows] == [(0, 2, 4, 4, 4), (2, 2, 2, 1, 5)]
    d = r.to_dict()
    assert d["reuse_time_s"] is None
    assert d["sharing_depth_blocks"]["requests_sharing"] == 2
    assert d["reuse_distance_blocks"]["p50"] == 2 and d["reuse_distance_blocks"]["max"] == 3


def test_hand_made_trace_with_timestamps():
    # refs 1 2 | 1 3 | 1 | 2 at 0 s, 1 s, 61 s, 125 s
    r = analyze(_reqs([[1, 2], [1, 3], [1], [2]], [0, 1000, 61000, 125000]), window_s=60)
    assert list(r.reuse_times_s) == [1.0, 60.0, 125.0]
    assert list(r.reuse_distances) == [1, 1, 2]
    assert r.window_unit == "s"
    assert [(w["start"], w["requests"], w["distinct"]) for w in r.windows] == [
        (0, 2, 3), (60, 1, 1), (120, 1, 1)]
    d = r.to_dict()
    assert d["reuse_time_s"]["p50"] == 60.0 and d["reuse_time_s"]["max"] == 125.0
    json.dumps(d)  # JSON-ready


def test_reuse_distances_match_a_naive_count():
    rng = random.Random(3)
    for _ in range(30):
        lists = [[rng.randrange(12) for _ in range(rng.randint(1, 5))]
                 for _ in range(rng.randint(1, 300))]
        r = analyze(_reqs(lists))
        refs = [k for keys in lists for k in keys]
        assert list(r.reuse_distances) == naive_reuse_distances(refs)
        assert r.distinct_blocks == len(set(refs))


def test_lru_curve_and_sharing_equal_the_replay_on_the_sample():
    reqs = list(read_trace(embedded_sample_path()))
    r = analyze(reqs)  # 14,162 refs: the Fenwick tree grows several times
    for cap in (1, 50, 600, 3000, 11879):
        assert r.lru_hits(cap) == replay(reqs, "lru", cap, protocol="get").hit_blocks
    # an unbounded tier under the prefix protocol hits exactly the shared prefixes
    assert r.shared_blocks == replay(reqs, "lru", r.distinct_blocks).hit_blocks == 2283


def test_percentile_is_nearest_rank():
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile([1, 2, 3, 4], 99) == 4
    assert percentile([5], 1) == 5
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="percentile"):
        percentile([1], 0)


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="window_s"):
        Analyzer(window_s=0)
    # newcomer finding: inf was taken (kvtier analyze --window-s inf printed "working set per
    # infs", one window), and True as a 1 s window
    for bad in (float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="window_s must be a finite number"):
            Analyzer(window_s=bad)
    with pytest.raises(ValueError, match="window_requests"):
        Analyzer(window_requests=0)
    # newcomer session 17: an int too large for a float raised OverflowError (float())
    with pytest.raises(ValueError, match="window_s must be a finite number"):
        Analyzer(window_s=10**400)


def test_plot_writes_an_image(tmp_path):
    r = analyze(list(read_trace(embedded_sample_path()))[:200])
    out = plot_analysis(r, tmp_path / "a.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r2 = analyze(_reqs([["a"], ["a"]]))  # no timestamps, tiny
    assert plot_analysis(r2, tmp_path / "b.png").stat().st_size > 0


def test_the_reuse_time_panel_does_not_call_sub_second_reuses_zeros(tmp_path):
    """Found by newcomer10: the histograms' first bar, [0, 1), was labelled "zeros" on every
    panel, but reuse times are seconds: on a synthetic trace (stamps 1 ms apart) every reuse
    (0.001-0.9 s) fell in that bar, drawn as reuses at zero seconds."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvtier.analyze import _draw_analysis

    r = analyze([Request([1, 2], None, None, 0.0), Request([1, 2], None, None, 300.0),
                 Request([1, 1], None, None, 400.0)])
    assert list(r.reuse_times_s) == [0.0, 0.1, 0.3, 0.3] and 0 in r.reuse_distances
    fig, axes = plt.subplots(2, 2)
    try:
        _draw_analysis(fig, axes, r, tmp_path / "a.png", "")
        assert axes[1][0].get_xlabel().endswith("(bar at 0.5-1: under 1 s, zeros included)")
        assert axes[0][0].get_xlabel().endswith("(bar at 0.5-1: zeros)")  # integer data
    finally:
        plt.close(fig)


# -- the command ---------------------------------------------------------------------------
def test_a_failed_plot_closes_its_figure(tmp_path):
    """Found by a newcomer session: plot_analysis to a folder that does not exist or to an
    unknown suffix raised and left its figure open in pyplot, one more per call (matplotlib
    warns past 20 in a notebook); a lone TraceAnalysis is the only accepted result."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    r = analyze(_reqs([["a", "b"], ["a", "c"]]))
    before = len(plt.get_fignums())
    for out in (tmp_path / "no" / "a.png", tmp_path / "a.xyz"):
        with pytest.raises((OSError, ValueError)):
            plot_analysis(r, out)
    assert len(plt.get_fignums()) == before
    with pytest.raises(TypeError, match=r"result must be a TraceAnalysis \(from analyze\(\) "
                                        r"or Analyzer\.result\(\)\), got list"):
        plot_analysis([r], tmp_path / "a.png")
    assert len(plt.get_fignums()) == before


def test_a_window_option_that_does_not_fit_the_trace_is_warned_about(tmp_path):
    """Found by newcomer10: ``kvtier analyze --window-requests 100`` on a trace with
    timestamps (the embedded sample), or ``--window-s 10`` on one without, was ignored in
    silence (the table's 'working set per 60s' was the only hint)."""
    from typer.testing import CliRunner

    from kvtier.cli import app

    res = CliRunner().invoke(app, ["analyze", "--window-requests", "100", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert ("warning: --window-requests 100 is for traces without timestamps; this one has "
            "them, so the working set is per --window-s 60 s") in res.output
    assert "working set per 60s" in res.output
    text = tmp_path / "t.txt"
    text.write_text("1 2 3\n1 2 4\n")
    res = CliRunner().invoke(app, ["analyze", str(text), "--window-s", "10"])
    assert res.exit_code == 0, res.output
    assert ("warning: --window-s 10 is for traces with timestamps; this one is read without "
            "(its first request has none), so the working set is per --window-requests 1000 "
            "requests") in res.output
    for args in (["--window-s", "10"], []):  # the window that fits: no warning
        res = CliRunner().invoke(app, ["analyze", "--no-progress", *args])
        assert res.exit_code == 0 and "warning" not in res.output, res.output


def test_analyze_command_json_and_plot(tmp_path):
    from typer.testing import CliRunner

    from kvtier.cli import app

    png = tmp_path / "a.png"
    res = CliRunner().invoke(app, ["analyze", "--json", "-", "--plot", str(png),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    expect = analyze(read_trace(embedded_sample_path())).to_dict()
    got = data["analysis"]
    for key in ("requests", "block_refs", "distinct_blocks", "one_hit_blocks"):
        assert got[key] == expect[key]
    assert got["reuse_distance_blocks"]["p90"] == expect["reuse_distance_blocks"]["p90"]
    assert got["sharing_depth_blocks"]["shared_blocks"] == 2283
    assert png.stat().st_size > 0
    res = CliRunner().invoke(app, ["analyze", "--window-s", "0"])
    assert res.exit_code == 2  # typer's range check
    res = CliRunner().invoke(app, ["analyze", "--plot", str(tmp_path / "x.nope")])
    assert res.exit_code == 1 and "cannot write .nope" in res.output


def test_analyze_command_with_progress_bar_and_limit(tmp_path):
    from typer.testing import CliRunner

    from kvtier.cli import app

    res = CliRunner().invoke(app, ["analyze", "--progress", "--limit", "50", "--json", "-"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["analysis"]["requests"] == 50
    expect = analyze(list(read_trace(embedded_sample_path()))[:50]).to_dict()
    assert data["analysis"]["block_refs"] == expect["block_refs"]


def test_readme_capacity_examples_match_the_code():
    import re

    from typer.testing import CliRunner

    from kvtier.cli import app

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()

    def block(command):
        m = re.search(r"```console\n\$ " + re.escape(command) + r"\n(.*?)```", text, re.S)
        assert m, command
        return m.group(1).rstrip("\n").splitlines()

    def clean(lines):
        return [ln.rstrip() for ln in lines]

    shown = block("kvtier analyze")
    got = CliRunner().invoke(app, ["analyze", "--no-progress"]).stdout.splitlines()
    assert clean(shown[:-1]) == clean(got[:-1])  # the last line is the elapsed time
    shown = block("kvtier replay -p lru,belady -c 5%,50% --cost")
    got = CliRunner().invoke(app, ["replay", "-p", "lru,belady", "-c", "5%,50%", "--cost",
                                   "--no-progress"]).stdout.splitlines()
    start = next(i for i, ln in enumerate(shown) if ln.startswith("cost model —"))
    assert clean(shown[start:]) == clean(got[got.index(next(
        ln for ln in got if ln.startswith("cost model —"))):])
    # hit columns of the replay table (timings differ from run to run)
    assert [ln.split()[:9] for ln in shown[4:8]] == [ln.split()[:9] for ln in got[4:8]]


def test_timestamps_out_of_order_are_reported_not_turned_into_negative_times():
    # newcomer finding: request 2 arrives 4 ms before request 1 (same blocks); the time
    # between reuses was reported as -0.004 s with no word. Now a warning names the first
    # request whose timestamp goes backwards, and such a reuse gets no time (none is negative).
    with pytest.warns(UserWarning, match=r"timestamps go backwards.* request 2 \(stamped 1 ms, "
                                         r"after a request stamped 5 ms\).*1 of 2 requests"):
        r = analyze(_reqs([[1, 2], [1, 2]], [5, 1]))
    assert list(r.reuse_times_s) == []  # a reuse stamped before its use: no time between


def test_the_backwards_warning_counts_requests_not_steps_back():
    """Found by a newcomer session: stamps 5, 1, 3, 3 go back once (5 -> 1), and the
    warning said "timestamps go backwards 3 time(s)": the count is of requests stamped
    before an earlier request (1, 3 and 3 are all before 5)."""
    with pytest.warns(UserWarning) as caught:
        analyze(_reqs([[1], [2], [3], [4]], [5, 1, 3, 3]))
    (message,) = [str(w.message) for w in caught]
    assert "3 time(s)" not in message
    assert message.startswith("timestamps go backwards, first at request 2 (stamped 1 ms, "
                              "after a request stamped 5 ms); 3 of 4 requests are stamped "
                              "before an earlier request")


def test_a_trace_whose_first_request_has_no_timestamp_says_so():
    """Found by a newcomer session: the first request decides whether the analysis uses
    timestamps; a trace whose first request had none and every later one a timestamp was
    reported as "no timestamps in this trace" (TraceAnalysis.has_timestamps said "whether
    any request had a timestamp") with no word. Now a warning counts the requests whose
    timestamp is ignored, or missing."""
    with pytest.warns(UserWarning, match=r"2 of 3 requests have a timestamp.*first request "
                                         r"has none.*ignored"):
        r = analyze(_reqs([[1, 2], [1, 2, 3], [1, 2, 3]], [None, 0, 70_000]))
    assert not r.has_timestamps and list(r.reuse_times_s) == []
    with pytest.warns(UserWarning, match=r"1 of 3 requests has no timestamp"):
        r = analyze(_reqs([[1, 2], [1, 2, 3], [1, 2, 3]], [0, None, 70_000]))
    assert r.has_timestamps


def test_a_bare_key_list_is_named_as_replay_names_it():
    """Found by a newcomer session: analyze([[1, 2], [2, 3]]) raised "AttributeError: 'list'
    object has no attribute 'keys'" where replay() says what it takes."""
    with pytest.raises(TypeError, match=r"request 0 \(\[1, 2\]\) has no .keys: analyze\(\) "
                                        "takes Request objects"):
        analyze([[1, 2], [2, 3]])


@pytest.mark.parametrize("stamp, error, match", [
    (float("nan"), ValueError, r"request 2: timestamp must be a finite number of ms or None, "
                               r"got nan"),
    (float("inf"), ValueError, "got inf"),
    ("3", ValueError, "got '3'"),
    (True, ValueError, "got True"),
    # newcomer session 17: an int too large for a float raised OverflowError (at the
    # working-set window's float arithmetic), after the request's checks
    pytest.param(10**400, ValueError,
                 r"request 2: timestamp must be a finite number of ms .*, got 1000",
                 id="int-too-large-for-a-float"),
])
def test_a_bad_timestamp_is_refused_naming_the_request(stamp, error, match):
    """Found by a newcomer session: the trace reader refuses a NaN / infinite / non-number
    timestamp, analyze() on hand-made Requests did not: a NaN arrival silently dropped the
    request's reuse times, an inf one was warned as 'stamped inf ms', a str one raised a bare
    "'<' not supported between instances of 'str' and 'float'". Refused now, nothing
    counted (Analyzer.add checks before it changes anything)."""
    an = Analyzer()
    an.add([1, 2], 0.0)
    with pytest.raises(error, match=match):
        an.add([1, 2, 3], stamp)
    an.add([1, 2, 3], 1000.0)
    r = an.result()
    assert r.requests == 2 and r.block_refs == 5 and list(r.reuse_times_s) == [1.0, 1.0]


def test_a_first_timestamp_too_large_for_a_float_is_refused_by_name():
    """Found by a newcomer session (17): Analyzer.add([1], 10**400) raised "OverflowError:
    int too large to convert to float" (the first timestamp is kept as a float), and
    ``kvtier analyze`` printed that traceback for a JSON trace with such a timestamp."""
    an = Analyzer()
    with pytest.raises(ValueError, match=r"request 1: timestamp must be a finite number"):
        an.add([1], 10**400)
    an.add([1], 10**300)  # an int a float holds is taken
    assert an.result().has_timestamps


def test_an_unhashable_key_is_named_and_nothing_is_counted():
    """Found by a newcomer session: analyze() of a request with an unhashable key raised a
    bare "unhashable type: 'list'" half-way through the request (its first keys counted)."""
    an = Analyzer()
    with pytest.raises(TypeError, match=r"analyze: request 1: block key \[3\] is not hashable"):
        an.add([1, 2, [3]], None)
    an.add([1, 2], None)
    r = an.result()
    assert r.requests == 1 and r.block_refs == 2 and r.distinct_blocks == 2


def test_analyzer_add_and_lru_hits_name_bad_arguments():
    """Found by a newcomer session: Analyzer.add("abc") counted three blocks 'a', 'b', 'c'
    (a str where a key list belongs), add(None) raised a bare "'NoneType' object is not
    iterable", add(<generator>) "object of type 'generator' has no len()"; lru_hits(1.5)
    was answered and lru_hits("3") raised "'<' not supported between 'str' and 'int'"."""
    a = Analyzer()
    a.add([1, 2])
    for wrong, match in (("abc", r"analyze: request 2: keys must be a list of block keys, "
                                 r"not a single str 'abc' \(wrap it in a list\)"),
                         (b"ab", r"not a single bytes"),
                         (None, r"analyze: request 2: keys must be an iterable of block "
                                r"keys, got None")):
        with pytest.raises(TypeError, match=match):
            a.add(wrong)
    a.add(k for k in (1, 3))  # any iterable, read once
    r = a.result()
    assert (r.requests, r.block_refs, r.distinct_blocks) == (2, 4, 3)
    for bad in (1.5, "3", True, 0):
        with pytest.raises(ValueError, match=r"capacity must be an int >= 1 \(blocks\), "
                                             r"got "):
            r.lru_hits(bad)
    assert r.lru_hits(2) == 1


def test_numpy_windows_are_taken_as_plain_numbers():
    # a finite number of seconds and an int of requests, numpy's included (as the manager,
    # CostModel and SyntheticSpec take them); they were refused as "not a finite number"
    import numpy as np

    reqs = _reqs([[1, 2], [1, 3], [1], [2]], [0, 1000, 61000, 125000])
    for window_s in (np.int64(60), np.float32(60.0)):
        an = Analyzer(window_s=window_s)
        assert type(an.window_s) is float and an.window_s == 60.0
        r = analyze(reqs, window_s=window_s)
        assert [w["requests"] for w in r.windows] == [
            w["requests"] for w in analyze(reqs, window_s=60).windows]
    an = Analyzer(window_requests=np.int64(2))
    assert type(an.window_requests) is int and an.window_requests == 2
    for bad in (np.bool_(True), np.float64("nan"), np.int64(0)):
        with pytest.raises(ValueError, match="window"):
            Analyzer(window_s=bad)
    for bad in (np.bool_(True), np.float64(2.0), np.int64(0)):
        with pytest.raises(ValueError, match="window_requests"):
            Analyzer(window_requests=bad)


def _visible(line) -> bool:
    """A line draws something: two points or more, or a marker."""
    return len(line.get_xdata()) >= 2 or line.get_marker() not in (None, "None", "", " ")


@pytest.mark.parametrize("requests", [2, 2500])
def test_the_working_set_panel_shows_a_trace_of_one_window(tmp_path, monkeypatch, requests):
    """A trace that fits one window gives one point per series: drawn as a line alone it was
    invisible (an empty panel); each series shows its points."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure to look at it
    r = analyze(_reqs([[i % 7, i] for i in range(requests)]))
    plot_analysis(r, tmp_path / "a.png")
    panel = kept[0].axes[3]
    assert panel.get_title().startswith("working set over time")
    lines = panel.get_lines()
    assert len(lines) == 3 and all(_visible(line) for line in lines)
    assert [len(line.get_xdata()) for line in lines] == [len(r.windows)] * 3


@pytest.mark.parametrize("window_s", [0.1, 0.2, 0.3, 0.7, 60.0])
def test_arrivals_one_window_apart_make_one_window_each_and_no_empty_one(window_s):
    """Found by a newcomer session (17): the working-set windows' start was a running float
    sum (``start += window_s * steps``), which drifted below the true boundary: requests
    every 200 ms over 0.2 s windows made 997 windows, some of 2 requests, and "3 empty
    windows (no request arrived) skipped" where every window had its request."""
    step_ms = round(window_s * 1000)
    an = Analyzer(window_s=window_s)
    for i in range(1000):
        an.add([i % 7], i * step_ms)
    r = an.result()
    assert r.empty_windows == 0
    assert len(r.windows) == 1000 and {w["requests"] for w in r.windows} == {1}
    assert r.windows[999]["start"] == pytest.approx(999 * window_s)
    # a gap of exactly two windows is one empty window, whatever the window
    an = Analyzer(window_s=window_s)
    for ms in (0, step_ms, 3 * step_ms):
        an.add([1], ms)
    assert an.result().empty_windows == 1
