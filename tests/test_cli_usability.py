"""Issue #12 fault 7: the small things a user trips on, each with its small input."""

from __future__ import annotations

import dataclasses
import io
import json
from array import array

import pytest
from rich.console import Console
from typer.testing import CliRunner

import kvtier.cli
import kvtier.sweep
from kvtier.cli import _cost_table, _results_table, app
from kvtier.costmodel import CostModel, evaluate, input_lengths
from kvtier.replay import replay
from kvtier.trace import embedded_sample_path, read_trace

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def interrupt_on_call(module, n):
    """Replace ``module.replay`` by one that raises KeyboardInterrupt on call ``n``."""
    real = module.replay
    calls = []

    def fake(*args, **kwargs):
        calls.append(args[1:3])
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return fake


def test_ctrl_c_during_replay_prints_and_writes_the_finished_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(kvtier.cli, "replay", interrupt_on_call(kvtier.cli, 3))
    out = tmp_path / "r.json"
    res = run("replay", "-p", "lru,arc", "-c", "100,200", "--json", out)
    assert res.exit_code == 130
    assert "interrupted (Ctrl-C): 2 of 4 runs finished" in res.stderr
    data = json.loads(out.read_text())
    assert data["interrupted"] is True
    assert [(r["policy"], r["capacity"]) for r in data["results"]] == [("lru", 100), ("lru", 200)]
    table_rows = [line for line in res.stdout.splitlines() if line.startswith("lru ")]
    assert len(table_rows) == 2


def test_ctrl_c_during_a_tiers_replay_prints_and_writes_the_finished_rows(tmp_path,
                                                                         monkeypatch):
    # `kvtier replay --tiers` ended silently with status 130 on Ctrl-C: no row of the
    # policies that had finished, no JSON, no message
    import kvtier.tiersim

    real, calls = kvtier.tiersim.replay_tiers, []

    def fake(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(kvtier.tiersim, "replay_tiers", fake)
    out = tmp_path / "t.json"
    res = run("replay", "--tiers", "host:100,disk:400", "-p", "lru,arc", "--limit", "100",
              "--json", out)
    assert res.exit_code == 130
    assert "interrupted (Ctrl-C): 1 of 2 runs finished" in res.stderr
    data = json.loads(out.read_text())
    assert data["interrupted"] is True
    assert [r["policy"] for r in data["results"]] == ["lru"]
    rows = [line.split()[:2] for line in res.stdout.splitlines() if line.startswith("lru ")]
    assert rows == [["lru", "host"], ["lru", "disk"], ["lru", "all"]]


def test_ctrl_c_during_analyze_says_so(tmp_path, monkeypatch):
    # `kvtier analyze` exited 130 on Ctrl-C without a word
    import kvtier.analyze

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(kvtier.analyze, "analyze", interrupted)
    out = tmp_path / "a.json"
    res = run("analyze", "--json", out)
    assert res.exit_code == 130
    assert "interrupted (Ctrl-C): nothing analyzed, nothing written" in res.stderr
    assert not out.exists()


def test_ctrl_c_during_sweep_prints_the_finished_points(tmp_path, monkeypatch):
    monkeypatch.setattr(kvtier.sweep, "replay", interrupt_on_call(kvtier.sweep, 2))
    out = tmp_path / "s.json"
    res = run("sweep", "-p", "lru", "-c", "100,200,300", "--workers", "1", "--json", out,
              "--plot", tmp_path / "m.png")
    assert res.exit_code == 130
    assert "1 of 3 grid points finished" in res.stderr
    assert [r["capacity"] for r in json.loads(out.read_text())["results"]] == [100]
    assert not (tmp_path / "m.png").exists()


def test_a_capacity_above_the_distinct_blocks_warns():
    res = run("replay", "-p", "lru", "-c", "150%", "--json", "-")
    assert res.exit_code == 0
    assert "capacity 150% = 17,818 blocks exceeds the trace's 11,879 distinct blocks" in res.stderr
    assert json.loads(res.stdout)["results"][0]["evictions"] == 0


def test_the_capacity_warning_counts_one_block_in_the_singular(tmp_path):
    """Found by a newcomer session: a one-line trace with empty hash_ids warned "capacity 5%
    = 1 blocks exceeds the trace's 0 distinct blocks" (seen failing)."""
    trace = tmp_path / "z.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}\n')
    res = run("replay", trace, "-p", "lru", "-c", "5%,2")
    assert res.exit_code == 0, res.output
    assert "capacity 5% = 1 block exceeds the trace's 0 distinct blocks" in res.stderr
    assert "capacity 2 = 2 blocks exceeds the trace's 0 distinct blocks" in res.stderr


def test_a_percentage_under_one_block_says_so_and_runs_one_block():
    """`-c 1e-9%` said "neither a block count nor a percentage" (the exponent was not read);
    a percentage is a number, and one that gives under one block runs the documented
    smallest tier, 1 block, with a warning naming what the percentage gives."""
    res = run("replay", "-p", "lru", "-c", "1e-9%", "--json", "-")
    assert res.exit_code == 0, res.stderr
    assert ("capacity 1e-9% gives 0 blocks of the trace's 11,879 distinct blocks "
            "(1.2e-07 blocks): run at 1 block") in " ".join(res.stderr.split())
    assert json.loads(res.stdout)["results"][0]["capacity"] == 1
    res = run("replay", "-p", "lru", "-c", "1e2%", "--json", "-")  # no warning: 11,879 blocks
    assert res.exit_code == 0 and "warning" not in res.stderr
    assert json.loads(res.stdout)["results"][0]["capacity"] == 11879


def test_a_percentage_that_underflows_a_float_runs_one_block_with_a_true_warning():
    """`-c 1e-400%` was refused as "must be > 0%" (the float is 0.0) though it is a positive
    percentage like 1e-9%, which runs at 1 block: it now runs the same, and the warning
    gives what the percentage itself gives, not 0."""
    res = run("replay", "-p", "lru", "-c", "1e-400%", "--json", "-")
    assert res.exit_code == 0, res.stderr
    assert ("capacity 1e-400% gives 0 blocks of the trace's 11,879 distinct blocks "
            "(1.2e-398 blocks): run at 1 block") in " ".join(res.stderr.split())
    assert json.loads(res.stdout)["results"][0]["capacity"] == 1


def test_a_policy_or_capacity_named_twice_is_refused():
    # newcomer finding: -p lru,lru replayed lru twice and printed two identical rows
    for args in (("replay", "-p", "lru,arc", "-p", "lru", "-c", "100"),
                 ("sweep", "-p", "lru,lru", "-c", "100"),
                 ("replay", "-p", "lru", "-c", "100,200,100")):
        res = run(*args)
        assert res.exit_code == 1, args
        assert "more than once" in res.stderr and ("lru" in res.stderr or "100" in res.stderr)


def test_json_to_a_directory_or_an_unwritable_path_fails_before_the_run(tmp_path):
    res = run("replay", "--json", tmp_path)
    assert res.exit_code == 1 and f"--json {tmp_path}: is a directory" in res.stderr
    # /proc refuses new files even to root: found before anything runs
    res = run("replay", "--json", "/proc/kvtier-results.json")
    assert res.exit_code == 1 and "cannot write there" in res.stderr
    assert "lru" not in res.stdout
    res = run("sweep", "-p", "lru", "-c", "100", "--plot", tmp_path)
    assert res.exit_code == 1 and "is a directory" in res.stderr
    existing = tmp_path / "keep.json"
    existing.write_text("old")
    assert run("replay", "-p", "lru", "-c", "100", "--limit", "5", "--json",
               existing).exit_code == 0
    assert json.loads(existing.read_text())["trace"]["requests"] == 5


@pytest.mark.parametrize("command", [
    ("replay", "-p", "lru", "-c", "100"),
    ("replay", "--stream", "-p", "lru", "-c", "100"),
    ("replay", "--tiers", "host:50,disk:100", "-p", "lru"),
    ("analyze",),
    ("sweep", "-p", "lru", "-c", "100", "--workers", "1"),
])
def test_json_onto_the_trace_itself_is_refused_and_the_trace_kept(tmp_path, monkeypatch,
                                                                   command):
    # `kvtier replay trace.jsonl --json trace.jsonl` (a slip of tab completion) replaced the
    # user's trace by the results, in every command that writes JSON
    raw = embedded_sample_path().read_bytes()
    trace = tmp_path / "trace.jsonl.gz"
    trace.write_bytes(raw)
    monkeypatch.chdir(tmp_path)
    for same in (trace, "trace.jsonl.gz", "./sub/../trace.jsonl.gz"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        res = run(command[0], trace, *command[1:], "--json", same)
        assert res.exit_code == 1, res.output
        assert "is the trace file itself" in res.stderr
        assert trace.read_bytes() == raw
    (tmp_path / "link.gz").symlink_to(trace)  # the same file by another name
    res = run(command[0], tmp_path / "link.gz", *command[1:], "--json", trace)
    assert res.exit_code == 1 and trace.read_bytes() == raw
    res = run(command[0], trace, *command[1:], "--json", tmp_path / "out.json")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "out.json").read_text())["trace"]


def test_plot_onto_the_trace_itself_is_refused(tmp_path):
    trace = tmp_path / "keys.png"  # a text trace, oddly named: read by its first line
    trace.write_text("1 2 3\n1 2 4\n")
    for command in (("sweep", trace, "-p", "lru", "-c", "2", "--workers", "1"),
                    ("analyze", trace)):
        res = run(*command, "--plot", trace)
        assert res.exit_code == 1 and "is the trace file itself" in res.stderr
        assert trace.read_text() == "1 2 3\n1 2 4\n"


def test_json_and_plot_onto_one_file_are_refused(tmp_path, monkeypatch):
    # `kvtier analyze --json a.png --plot a.png` wrote the JSON, then the image over it
    monkeypatch.chdir(tmp_path)
    for command in (("analyze",), ("sweep", "-p", "lru", "-c", "100", "--workers", "1")):
        for json_out, plot in (("a.png", "a.png"), ("a.png", "./a.png"),
                               (tmp_path / "a.png", "a.png")):
            res = run(*command, "--json", json_out, "--plot", plot)
            assert res.exit_code == 1, res.output
            assert "name one file: the image would replace the JSON" in res.stderr
            assert not (tmp_path / "a.png").exists()
    res = run("analyze", "--json", "a.json", "--plot", "a.png")
    assert res.exit_code == 0 and json.loads((tmp_path / "a.json").read_text())["analysis"]


def test_an_80_column_table_keeps_every_column():
    trace = list(read_trace(embedded_sample_path()))
    rows = [replay(trace, p, c) for p in ("prefix-s3fifo", "arc") for c in (100, 11879)]
    # figures as large as the full conversation trace's (12,031 requests, 288,500 refs)
    rows = [dataclasses.replace(r, requests=12031, block_refs=288500,
                                bookkeeping_ns=288500 * 1400) for r in rows]
    console = Console(width=80, file=io.StringIO())
    console.print(_results_table(rows, "kvtier replay", console))
    text = console.file.getvalue()
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "…" not in text
    for header in ("policy", "reqs", "refs", "hit %", "fails", "tions", "ms", "ref"):
        assert header in text
    first = next(line for line in lines if line.startswith("prefix-s3fifo"))
    assert len(first.split()) == 11 and "12,031" in first and "288,500" in first


def _cost_rows(policies, capacities, **model):
    """Replay results and their cost figures on the embedded sample, as `--cost` has them."""
    trace = list(read_trace(embedded_sample_path()))
    cm = CostModel(kv_bytes_per_token=131072, **model)
    lengths = input_lengths(trace, 512)
    stamps = [r.timestamp for r in trace]
    rows, costs = [], []
    for p in policies:
        for c in capacities:
            hits = array("l")
            rows.append(replay(trace, p, c, hits_out=hits))
            costs.append(evaluate(cm, lengths, hits, stamps, rows[-1].stored_blocks))
    return rows, costs


def test_the_cost_table_fits_an_80_column_terminal_uncut():
    # the README's `kvtier replay -p lru,belady -c 5%,50% --cost` on an 80-column terminal
    # cut every wide column ("bela…", "10.105→9.8…"), and the figures with them; the
    # longest policy name too
    rows, costs = _cost_rows(("lru", "belady", "prefix-s3fifo"), (594, 5940))
    console = Console(width=80, file=io.StringIO())
    console.print(_cost_table(rows, costs, console))
    text = console.file.getvalue()
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    belady = next(line for line in text.splitlines() if line.startswith("belady"))
    assert "10.105→8.938" in belady and len(belady.split()) == 9
    # a wide console keeps the long headers
    wide = Console(width=120, file=io.StringIO())
    wide.print(_cost_table(rows, costs, wide))
    assert "no tier→tier" in wide.file.getvalue()


def test_the_cost_table_keeps_large_figures_whole_in_a_pipe():
    # a slow tier (reads slower than prefill) gives TTFTs of thousands of seconds: the table
    # was wider than the 96 columns of a pipe and its cells were cut ("no ti…")
    res = run("replay", "-p", "lru", "-c", "5%", "--read-gbps", "0.001")
    assert res.exit_code == 0, res.output
    assert "…" not in res.stdout
    row = [line for line in res.stdout.splitlines() if line.startswith("lru")][-1]
    assert "-4,696.5" in row and "1.585→2,792.8" in row


def test_the_cost_table_keeps_figures_whole_when_even_its_compact_form_is_too_wide():
    """Found by a newcomer session (17): one overloaded instance at 1 token/s gives TTFTs of
    millions of seconds; the compact table was still wider than a pipe's 96 columns (or an
    80-column terminal) and its cells were cut ("3…" for 33.5 GB read, "255,…" for 255,487
    s saved, "3,406,462.…"). A table that does not fit now comes out whole, wider than the
    console (a terminal wraps its lines), never with a figure cut."""
    res = run("replay", "-p", "lru", "-c", "5%", "--cost", "--prefill-tps", "1",
              "--instances", "1")
    assert res.exit_code == 0, res.output
    assert "…" not in res.stdout
    row = [line for line in res.stdout.splitlines() if line.startswith("lru")][-1]
    assert row.split()[2:5] == ["33.5", "917", "255,487"]
    assert "3,533,950.001→3,406,462.669" in row
    rows, costs = _cost_rows(("lru",), (594,), prefill_tokens_per_s=1, instances=1)
    console = Console(width=80, file=io.StringIO())
    console.print(_cost_table(rows, costs, console))
    assert "…" not in console.file.getvalue()
    assert "3,533,950.001→3,406,462.669" in console.file.getvalue()
    # large counts are grouped as every other figure (newcomer session 17: "43180.94")
    assert "43,180.94→41,632.54" in row
    res = run("replay", "-p", "lru", "-c", "5%", "--cost", "--prefill-tps", "1")
    assert "cost model — FIFO over 53,977 prefill instance(s)" in res.stdout
    # the results table alike, past its narrowest layout (a 40-column console)
    result = replay(list(read_trace(embedded_sample_path())), "prefix-s3fifo", 594)
    console = Console(width=40, file=io.StringIO())
    console.print(_results_table([result], "kvtier replay", console))
    row = next(line for line in console.file.getvalue().splitlines()
               if line.startswith("prefix-s3fifo"))
    assert "…" not in row and f"{result.hit_blocks:,}" in row.split()

def test_sweep_of_one_point_warns_only_about_what_it_runs(tmp_path):
    # --points 1 runs --max alone, but warned that --min "gives 0 blocks ...: run at 1
    # block", a run that never happened
    trace = tmp_path / "t.txt"
    trace.write_text("a b c\nb c d\n1,2,3\n")
    res = run("sweep", trace, "-p", "lru", "--points", "1", "--workers", "1")
    assert res.exit_code == 0, res.output
    assert "warning" not in res.stderr
    assert [line.split()[1] for line in res.stdout.splitlines()
            if line.startswith("lru")] == ["7"]
    res = run("sweep", trace, "-p", "lru", "--points", "1", "--min", "50%", "--max", "10%")
    assert res.exit_code == 1 and "is above --max" in res.stderr
    res = run("sweep", trace, "-p", "lru", "--points", "2", "--workers", "1")
    assert "capacity 0.5% gives 0 blocks" in res.stderr  # run at 1 block: said


def test_sweep_without_plot_leaves_mrc_png_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mrc.png").write_bytes(b"mine")
    res = run("sweep", "-p", "lru", "-c", "100", "--workers", "1")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "mrc.png").read_bytes() == b"mine"
    assert "no image written" in res.stdout


def test_one_request_is_singular_in_the_caption_and_the_plot_title(tmp_path, monkeypatch):
    trace = tmp_path / "one.txt"
    trace.write_text("1 2 3\n")
    titles = []
    monkeypatch.setattr(kvtier.sweep, "plot_mrc",
                        lambda results, out, **kw: titles.append(kw["title"]))
    res = run("sweep", trace, "-p", "lru", "-c", "2", "--workers", "1", "--plot",
              tmp_path / "m.png")
    assert res.exit_code == 0, res.output
    assert titles[0].startswith("one.txt: 1 request, 3 block refs, 3 distinct blocks")
    assert "1 request, 3 block refs" in res.stdout


def test_the_hint_for_a_json_trace_read_as_text_names_the_cli_flag(tmp_path):
    trace = tmp_path / "t.txt"
    trace.write_text('{"hash_ids": [1], "input_length": 5}\n')
    res = run("replay", trace, "--format", "text")
    assert res.exit_code == 1 and "--format jsonl" in res.stderr.replace("\n", "")


def test_replay_of_bare_key_lists_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"request 0 \(\[1, 2\]\) has no \.keys.*Request"):
        replay([[1, 2]], "lru", 4)


@pytest.mark.parametrize("limit", [[], ["--limit", "100"]])
def test_analyze_warns_when_block_tokens_disagree_with_the_trace(limit):
    """The embedded sample's hash_ids are 512-token blocks: --block-tokens 16 is a warning
    line (also when --limit stops the pass early), --strict an error (found by a newcomer
    session: analyze gave no such warning)."""
    res = run("analyze", "--block-tokens", "16", *limit, "--json", "-")
    assert res.exit_code == 0
    n = 100 if limit else 500
    assert "warning: " in res.stderr
    assert f"{n} of {n} requests have an input_length" in res.stderr.replace("\n", " ")
    assert "--block-tokens 512" in res.stderr
    assert json.loads(res.stdout)["trace"]["length_mismatches"] == n
    res = run("analyze", "--block-tokens", "512", *limit)
    assert res.exit_code == 0 and "warning" not in res.stderr
    res = run("analyze", "--block-tokens", "16", "--strict", *limit)
    assert res.exit_code == 1 and "needs 423 blocks of 16 tokens" in res.stderr


def test_replay_with_limit_still_warns_about_block_tokens():
    res = run("replay", "--block-tokens", "16", "--limit", "50", "-p", "lru", "-c", "100",
              "--json", "-")
    assert res.exit_code == 0
    assert "50 of 50 requests have an input_length" in res.stderr.replace("\n", " ")
    assert json.loads(res.stdout)["trace"]["length_mismatches"] == 50


def test_length_mismatch_warns_on_the_cli_and_strict_makes_it_an_error(tmp_path):
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"hash_ids": [1, 2, 3], "input_length": 1}\n'
                     '{"hash_ids": [1, 2], "input_length": 600}\n')
    res = run("replay", trace, "-p", "lru", "-c", "4", "--json", "-")
    assert res.exit_code == 0
    assert "warning:" in res.stderr and "1 of 2 requests has an input_length" in res.stderr
    assert json.loads(res.stdout)["trace"]["length_mismatches"] == 1
    res = run("replay", trace, "-p", "lru", "-c", "4", "--strict")
    assert res.exit_code == 1 and "line 1: 'input_length' 1 needs 1 block of" in res.stderr


def test_a_real_sigint_during_replay_keeps_the_finished_rows(tmp_path):
    """The same with a real SIGINT to a real process (timing-dependent only in how many rows
    finished, which the test does not fix)."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    rng = random.Random(1)
    trace = tmp_path / "big.txt"
    with trace.open("w") as fh:
        for _ in range(20_000):
            root = rng.randrange(2_000)
            fh.write(" ".join(f"{root}-{i}" for i in range(rng.randrange(10, 50))) + "\n")
    out = tmp_path / "r.json"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtier.cli", "replay", str(trace), "-p", "lru,arc",
         "-c", "1%,2%,5%,10%,20%,40%,60%,80%", "--json", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(6)
    assert proc.poll() is None, "the replay finished before the interrupt; make it longer"
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    if "interrupted while reading the trace" in stderr:
        return  # a very slow machine: nothing had run yet
    data = json.loads(out.read_text())
    assert data["interrupted"] is True and len(data["results"]) < 16
    rows = [line for line in stdout.splitlines() if line.startswith(("lru ", "arc "))]
    assert len(rows) == len(data["results"])
    assert (f"{len(rows)} of 16 runs finished" if rows else
            "none of the 16 runs finished; no row to show") in stderr


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", ["replay", "sweep", "analyze"])
def test_help_text_is_wrapped_once(command, width):
    """Docstring paragraphs kept their hard line breaks and rich wrapped them again ("... is
    the offline reference" split as "is" / "the" / "offline ..."), and "[default: ...]" in
    option help was eaten as rich markup (found by a newcomer session)."""
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": str(width)}, terminal_width=width)
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    body = lines[[i for i, ln in enumerate(lines) if "Usage:" in ln][0] + 1:
                 [i for i, ln in enumerate(lines) if "─ Arguments" in ln][0]]
    paragraphs = "\n".join(ln.rstrip() for ln in body).strip("\n").split("\n\n")
    assert len(paragraphs) >= 2
    for paragraph in paragraphs:
        for line in paragraph.split("\n")[:-1]:  # every line but a paragraph's last is full
            assert len(line) >= width - 16, (line, paragraph)
    text = " ".join(res.stdout.split())
    if command == "replay":
        assert "[default: 10,000, an assumption]" in text.replace("│ ", "")
    if command == "sweep":
        assert "[default: 12]" in text


def test_analyze_counts_are_pluralised():
    res = run("analyze", "--limit", "3", "--window-s", "100000")
    assert res.exit_code == 0
    assert "1 window" in res.stdout and "1 windows" not in res.stdout
