"""A newcomer pass (session 14): the command line's int options, counts in messages, traces
without blocks, tier stacks upside down and the working set's empty windows."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

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
    assert f"must be >= 1" in one_line(res.stderr) and "'0'" in one_line(res.stderr)


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
