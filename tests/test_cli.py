"""The kvtier command line (typer's CliRunner): replay and sweep, outputs and errors."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from kvtier.cli import app
from kvtier.replay import replay
from kvtier.trace import embedded_sample_path, read_trace

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_replay_default_runs_on_the_embedded_sample(tmp_path):
    out = tmp_path / "r.json"
    res = run("replay", "--json", out)
    assert res.exit_code == 0, res.output
    assert "lru" in res.stdout and "arc" in res.stdout and "14,162" in res.stdout
    data = json.loads(out.read_text())
    assert data["trace"]["requests"] == 500
    assert data["trace"]["block_refs"] == 14162
    assert data["trace"]["unique_blocks"] == 11879
    assert data["trace"]["parse_refs_per_s"] > 0
    rows = data["results"]
    # default: lru, arc x 5%, 20%, 50% of 11,879 distinct blocks
    assert [(r["policy"], r["capacity"]) for r in rows] == [
        ("lru", 594), ("lru", 2376), ("lru", 5940), ("arc", 594), ("arc", 2376), ("arc", 5940)
    ]
    trace = list(read_trace(embedded_sample_path()))
    for row in rows:
        expect = replay(trace, row["policy"], row["capacity"])
        assert row["hit_blocks"] == expect.hit_blocks
        assert row["hit_tokens"] == expect.hit_tokens
        assert row["evictions"] == expect.evictions
        assert row["block_hit_ratio"] == pytest.approx(expect.block_hit_ratio)


def test_replay_options_and_json_to_stdout():
    res = run("replay", "-p", "lru", "-c", "1000,10%", "--inflight", "8", "--json", "-",
              "--no-progress")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)  # the table went to stderr
    assert [(r["capacity"], r["inflight"]) for r in data["results"]] == [(1000, 8), (1188, 8)]
    trace = list(read_trace(embedded_sample_path()))
    assert data["results"][0]["hit_blocks"] == replay(trace, "lru", 1000, inflight=8).hit_blocks


def test_replay_request_protocol():
    res = run("replay", "-p", "arc", "-c", "1000", "--protocol", "request", "-W", "4",
              "--json", "-", "--no-progress")
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["results"][0]
    assert (row["protocol"], row["inflight"]) == ("request", 4)
    trace = list(read_trace(embedded_sample_path()))
    expect = replay(trace, "arc", 1000, protocol="request", inflight=4)
    assert (row["hit_blocks"], row["evictions"]) == (expect.hit_blocks, expect.evictions)


def test_replay_stream_and_limit_match_in_memory(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run("replay", "-p", "arc", "-c", "800", "--limit", "200", "--json", a).exit_code == 0
    assert run("replay", "-p", "arc", "-c", "800", "--limit", "200", "--stream",
               "--json", b).exit_code == 0
    ra, rb = (json.loads(p.read_text())["results"][0] for p in (a, b))
    assert ra["requests"] == rb["requests"] == 200
    assert ra["hit_blocks"] == rb["hit_blocks"] and ra["evictions"] == rb["evictions"]
    assert rb["parse_ns"] is not None


def test_replay_text_trace_get_protocol(tmp_path):
    trace = tmp_path / "keys.csv"
    trace.write_text("1,2\n1,3\n2,1,3\n")
    out = tmp_path / "o.json"
    res = run("replay", trace, "-p", "lru", "-c", "2", "--protocol", "get",
              "--block-tokens", "1", "--json", out)
    assert res.exit_code == 0, res.output
    row = json.loads(out.read_text())["results"][0]
    assert (row["block_refs"], row["hit_blocks"], row["evictions"]) == (7, 1, 4)


def test_replay_gzip_token_trace(tmp_path):
    trace = tmp_path / "tok.jsonl.gz"
    lines = [{"token_ids": list(range(40))}, {"token_ids": list(range(30)) + [7] * 10}]
    trace.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    out = tmp_path / "o.json"
    res = run("replay", trace, "-p", "lru", "-c", "100", "--block-tokens", "16", "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    row = data["results"][0]
    # 2 full blocks each; the second request shares the first block (tokens 0..15)
    assert (row["block_refs"], row["hit_blocks"], row["input_tokens"], row["hit_tokens"]) == (
        4, 1, 80, 16
    )
    assert data["trace"]["format"] == "jsonl"


def test_bad_line_exits_nonzero_naming_file_and_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"hash_ids": [1], "input_length": 5}\n{"hash_ids": [2]}\n')
    res = run("replay", trace)
    assert res.exit_code == 1
    assert f"{trace}, line 2: missing field 'input_length'" in res.stderr.replace("\n", "")
    out = tmp_path / "o.json"
    res = run("replay", trace, "--skip-bad-lines", "-c", "10", "--json", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["trace"]["bad_lines"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "nosuch"], "unknown policy 'nosuch'"),
        (["-c", "ten"], "neither a block count"),
        # a newcomer pass: -c -5 was "neither a block count nor a percentage", --tiers host:0
        # did not say which tier item was wrong
        (["-c", "-5"], "capacity must be >= 1 block, got '-5'"),
        (["-c", "-5%"], "capacity '-5%' must be > 0%"),
        (["--tiers", "host:0"], "--tiers item 'host:0': capacity must be >= 1 block, got '0'"),
        (["--tiers", "host:10,disk:-3"],
         "--tiers item 'disk:-3': capacity must be >= 1 block, got '-3'"),
        (["--format", "xml"], "unknown format 'xml'"),
        (["--protocol", "put"], "unknown protocol 'put'"),
        (["--protocol", "get", "-W", "2"], "--inflight needs --protocol prefix"),
        (["-p", ""], "--policy was given but names nothing"),
        (["-p", ",", "--json", "-"], "--policy was given but names nothing"),
        (["-c", ""], "--capacity was given but names nothing"),
        (["--json", "/nonexistent-dir/o.json"], "cannot write there"),
        # --demotion only means something with --tiers: without it, it was silently ignored
        (["--demotion", "write-through"], "--demotion write-through needs --tiers"),
        (["--demotion", "write-back"], "--demotion write-back needs --tiers"),
    ],
)
def test_bad_arguments_exit_1(args, message):
    res = run("replay", *args)
    assert res.exit_code == 1
    assert message in res.stderr


def test_analyze_window_error_names_the_option_typed():
    """Found by a newcomer session: ``kvtier analyze --window-s inf`` failed with
    'window_s must be a finite number > 0', naming analyze()'s argument, not the option.
    Since session 14 the option's parser refuses it (exit 2), still naming the option."""
    res = run("analyze", "--window-s", "inf")
    assert res.exit_code == 2
    assert "Invalid value for '--window-s'" in res.stderr
    assert "must be a finite number >= 0.001 (seconds)" in " ".join(res.stderr.split())
    assert "window_s" not in res.stderr


def test_paths_and_values_with_brackets_are_printed_as_they_are(tmp_path):
    """Found by a newcomer session: errors and captions went through rich markup unescaped,
    so a trace under a folder named '[red]x' was reported as '.../x/t.jsonl', an
    input_length of {"a[b]": 1} as {'a': 1}, and kvtier.tiers.redis's install hint
    "pip install 'kvtier[redis]'" as "pip install 'kvtier'"."""
    folder = tmp_path / "[red]x"
    folder.mkdir()
    empty = folder / "t.jsonl"
    empty.write_text("")
    res = run("replay", empty)
    assert res.exit_code == 1 and f"{empty}: empty trace" in res.stderr
    bad = folder / "b.jsonl"
    bad.write_text('{"hash_ids": [1], "input_length": {"a[b]": 1}}\n')
    res = run("analyze", bad)
    assert res.exit_code == 1 and "got {'a[b]': 1}" in res.stderr
    good = folder / "g.jsonl"
    good.write_text('{"hash_ids": [1, 2], "input_length": 1024}\n' * 3)
    for args in (["replay", good, "-c", "2", "--cost"], ["analyze", good],
                 ["sweep", good, "-c", "2", "-j", "1", "--plot", folder / "m.png"]):
        res = run(*args)
        assert res.exit_code == 0, res.output
        assert f"{good} (jsonl)" in res.stdout  # the caption names the file as it is
    assert f"curves written to {folder / 'm.png'}" in res.stdout


def test_sweep_checks_outputs_before_running(tmp_path):
    res = run("sweep", "--json", "/nonexistent-dir/x.json", "--plot", tmp_path / "m.png")
    assert res.exit_code == 1
    assert "cannot write there" in res.stderr
    assert not (tmp_path / "m.png").exists()
    res = run("sweep", "-c", "", "--plot", tmp_path / "m.png")
    assert res.exit_code == 1 and "names nothing" in res.stderr
    res = run("sweep", "-c", "10", "--plot", "/nonexistent-dir/m.png")
    assert res.exit_code == 1 and "--plot /nonexistent-dir/m.png: cannot write there" in res.stderr
    assert "Miss ratio" not in res.stdout and "requests" not in res.stdout  # nothing ran


def test_sweep_keeps_the_results_when_the_plot_fails(tmp_path, monkeypatch):
    import kvtier.sweep

    def failing_plot(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(kvtier.sweep, "plot_mrc", failing_plot)
    out = tmp_path / "s.json"
    res = run("sweep", "-p", "lru", "-c", "100", "--plot", tmp_path / "m.png", "--json", out,
              "--workers", "1")
    assert res.exit_code == 1 and "cannot write plot" in res.stderr and "disk full" in res.stderr
    assert json.loads(out.read_text())["results"][0]["capacity"] == 100


def test_empty_and_missing_files_exit_1(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = run("replay", empty)
    assert res.exit_code == 1 and "empty trace" in res.stderr
    res = run("replay", tmp_path / "missing.jsonl")
    assert res.exit_code == 1 and "no such file" in res.stderr


def test_sweep_on_embedded_sample(tmp_path):
    png, out = tmp_path / "mrc.png", tmp_path / "s.json"
    res = run("sweep", "-p", "lru,arc", "--points", "3", "--min", "100", "--max", "10000",
              "--plot", png, "--json", out, "--workers", "2")
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())
    assert data["capacities"] == [100, 1000, 10000]
    rows = data["results"]
    assert [(r["policy"], r["capacity"]) for r in rows] == [
        ("lru", 100), ("lru", 1000), ("lru", 10000), ("arc", 100), ("arc", 1000), ("arc", 10000)
    ]
    trace = list(read_trace(embedded_sample_path()))
    for row in rows:  # the worker processes give the same counts as an in-process replay
        assert row["hit_blocks"] == replay(trace, row["policy"], row["capacity"]).hit_blocks
    lru = [r["miss_ratio"] for r in rows[:3]]
    assert lru == sorted(lru, reverse=True)


def test_sweep_request_protocol(tmp_path):
    out = tmp_path / "s.json"
    res = run("sweep", "-p", "arc", "-c", "300,3000", "--protocol", "request", "-W", "8",
              "--workers", "1", "--json", out)
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["results"]
    trace = list(read_trace(embedded_sample_path()))
    for row in rows:
        assert row["protocol"] == "request"
        expect = replay(trace, "arc", row["capacity"], protocol="request", inflight=8)
        assert row["hit_blocks"] == expect.hit_blocks


def test_sweep_default_grid_in_process(tmp_path):
    out = tmp_path / "s.json"
    res = run("sweep", "-p", "lru", "--points", "12", "--workers", "1",
              "--plot", tmp_path / "m.png", "--json", out)
    assert res.exit_code == 0, res.output
    caps = json.loads(out.read_text())["capacities"]
    # 12 log-spaced points from 0.5% (59 blocks) to 100% (11,879) of the distinct blocks
    assert len(caps) == 12 and caps[0] == 59 and caps[-1] == 11879


def test_sweep_says_when_the_range_holds_fewer_sizes_than_points(tmp_path):
    out = tmp_path / "s.json"
    res = run("sweep", "-p", "lru", "--points", "5", "--min", "1", "--max", "3",
              "--workers", "1", "--json", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["capacities"] == [1, 2, 3]
    assert "--points 5: 1..3 blocks hold only 3 distinct sizes" in res.stderr


def test_sweep_bad_range(tmp_path):
    res = run("sweep", "--min", "50%", "--max", "10%", "--plot", tmp_path / "m.png")
    assert res.exit_code == 1 and "is above --max" in res.stderr
    # "(1 blocks)": grammar found by a newcomer session (seen failing)
    trace = tmp_path / "t.txt"
    trace.write_text("a b c\nb c d\n")
    res = run("sweep", trace, "--min", "50%", "--max", "10%")
    assert "error: --min 50% (2 blocks) is above --max 10% (1 block)" in res.stderr, res.stderr


def test_sweep_rejects_grid_options_with_explicit_capacities(tmp_path):
    res = run("sweep", "-p", "lru", "--capacity", "100,200", "--points", "3",
              "--plot", tmp_path / "m.png")
    assert res.exit_code == 1 and "--points sets the log-spaced grid" in res.stderr
    res = run("sweep", "-p", "lru", "--capacity", "100", "--min", "1%", "--max", "5%",
              "--plot", tmp_path / "m.png")
    assert res.exit_code == 1 and "--min, --max set the log-spaced grid" in res.stderr
    assert not (tmp_path / "m.png").exists()


def test_sweep_rejects_an_image_format_matplotlib_cannot_write_before_any_work(tmp_path):
    res = run("sweep", "-p", "lru", "--plot", tmp_path / "m.xyz", "--json", tmp_path / "r.json")
    assert res.exit_code == 1
    assert "matplotlib cannot write .xyz files" in res.stderr and ".svg" in res.stderr
    assert not (tmp_path / "r.json").exists()  # failed before the sweep ran


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sweep_limit_replays_only_the_first_requests(tmp_path, workers):
    """--limit N (as replay's and analyze's): the grid's percentages, the caption and every
    point count only the first N requests, in this process and in the worker processes
    (which re-read the trace file themselves)."""
    out = tmp_path / "s.json"
    res = run("sweep", "-p", "lru,arc", "--points", "3", "--limit", "100", "--workers", workers,
              "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    trace = list(read_trace(embedded_sample_path()))[:100]
    unique = len({k for r in trace for k in r.keys})
    assert data["trace"]["requests"] == 100 and data["trace"]["unique_blocks"] == unique
    assert data["capacities"][0] == round(unique * 0.005) and data["capacities"][-1] == unique
    for row in data["results"]:
        assert row["requests"] == 100
        expect = replay(trace, row["policy"], row["capacity"])
        assert (row["hit_blocks"], row["evictions"]) == (expect.hit_blocks, expect.evictions)
    # a sweep of the whole sample at the same size counts more hits: the limit mattered
    whole = replay(list(read_trace(embedded_sample_path())), "lru", unique).hit_blocks
    assert whole > data["results"][2]["hit_blocks"]


def test_run_grid_rejects_a_bad_limit():
    from kvtier.sweep import run_grid

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="limit must be an int >= 1"):
            run_grid(embedded_sample_path(), ["lru"], [100], workers=1, limit=bad)


@pytest.mark.parametrize("command", ["replay", "analyze", "sweep"])
def test_a_limit_beyond_any_trace_reads_the_whole_trace(command, tmp_path):
    """Found by a newcomer session: --limit 100000000000000000000 (more than sys.maxsize)
    failed with "error: Stop argument for islice() must be None or an integer: 0 <= x <=
    sys.maxsize.", naming neither --limit nor the rule. A limit beyond the trace is no
    limit."""
    out = tmp_path / "out.json"
    args = {"replay": ["-p", "lru", "-c", "100"], "analyze": [],
            "sweep": ["-p", "lru", "--points", "1", "--workers", "1"]}[command]
    res = run(command, *args, "--limit", str(10**20), "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    requests = (data["analysis"] if command == "analyze" else data["trace"])["requests"]
    assert requests == 500


def test_run_grid_takes_a_limit_beyond_any_trace():
    from kvtier.sweep import run_grid

    (result,) = run_grid(embedded_sample_path(), ["lru"], [100], workers=1, limit=10**20)
    assert result.requests == 500


def test_an_interrupted_sweep_ends_its_running_points_at_once(monkeypatch):
    """Ctrl-C in a sweep (here: KeyboardInterrupt from on_result after the first finished
    point) ends the worker processes instead of waiting for the points they are running or
    were already handed: before, run_grid raised only once the 60 s point below had run."""
    import multiprocessing
    import time

    import kvtier.sweep

    real = kvtier.sweep.replay

    def replay_slow_at_1000(trace, policy, capacity, options):  # runs in the workers (fork)
        if capacity >= 1000:
            time.sleep(60)
        return real(trace, policy, capacity, options)

    monkeypatch.setattr(kvtier.sweep, "replay", replay_slow_at_1000)
    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the slow replay reaches the workers only through fork")

    def interrupt(result):
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        kvtier.sweep.run_grid(embedded_sample_path(), ["lru"], [1, 2, 3, 1000], workers=2,
                              on_result=interrupt)
    assert time.monotonic() - t0 < 30
    # the workers are ended (terminate, then kill after 5 s); active_children() also reaps
    # them, which on a loaded host may take a moment after run_grid returned
    deadline = time.monotonic() + 15
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not multiprocessing.active_children()


def test_table_title_lines_have_no_trailing_spaces():
    """Found by a newcomer pass: the tables' title lines were padded to the table width
    with spaces (title_justify="left")."""
    res = run("replay", "-p", "lru", "-c", "10", "--cost")
    assert res.exit_code == 0, res.output
    titles = [line for line in res.stdout.splitlines()
              if line.startswith(("cost model —", "kvtier replay"))]
    assert len(titles) == 2, res.stdout
    assert all(t == t.rstrip() for t in titles), titles
    res = run("analyze")
    assert res.exit_code == 0, res.output
    title = next(line for line in res.stdout.splitlines() if line.startswith("kvtier analyze"))
    assert title == title.rstrip()
