"""benchmarks/bench_admission.py's ``recheck``: the admission tables of docs/policies.md are
read back whole, and the adaptive figures recorded there are what the code replays now."""

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "policies.md"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_admission", REPO / "benchmarks" / "bench_admission.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_recorded_cell_is_read(bench):
    cells = bench.table_cells(DOC)
    text = DOC.read_text()
    tags = {c["tag"] for c in cells}
    assert {"grid", "seeds", "policies", "otherpolicies", "synthpolicies"} <= tags
    for tag in tags:
        body = text.split(f"<!-- admission-table:{tag}:begin -->")[1].split(
            f"<!-- admission-table:{tag}:end -->")[0]
        # the table's own summary line: "`adaptive`: N of M cells more than ..."
        summary = next(ln for ln in body.splitlines() if ln.startswith("`adaptive`:"))
        total = int(summary.split(" of ")[1].split()[0])
        assert sum(c["tag"] == tag for c in cells) == total, tag
    one = next(c for c in cells if bench.cell_name(c) == "seeds|reuse-heavy@3|arc|383|32")
    assert (one["all"], one["threshold-2"], one["recorded"]) == (27.93, 29.50, 29.22)
    assert one["recorded_margin"] == pytest.approx(29.22 - 29.50)


def test_an_unknown_tag_is_refused(bench):
    with pytest.raises(ValueError, match="no admission table tagged"):
        bench.table_cells(DOC, ["nosuchtable"])


@pytest.mark.parametrize("name", ["synthpolicies|multi-turn|lru|478|0",
                                  "seeds|reuse-heavy@3|arc|383|32"])
def test_recorded_adaptive_figures_are_replayed(bench, name):
    """Two small synthetic cells (one with 32 requests in flight, where the duel switches
    about ten times): a change to the adaptive admission that moves them must rewrite the
    tables (``bench_admission.py hits ... --markdown docs/policies.md``)."""
    cell = next(c for c in bench.table_cells(DOC) if bench.cell_name(c) == name)
    row = bench._recheck_cell(cell)
    assert row["adaptive"] == pytest.approx(cell["recorded"], abs=0.005)


def test_held_rules_replay_what_each_rule_reaches(bench):
    """``hold``: adaptive with its tier rule held. In this cell (S3-FIFO, 10 % of the
    distinct blocks, 32 requests in flight) second sight from the first request reads the
    threshold's recorded 18.39 and admit-all held admit-all's 17.65 (the duel's fallback for
    calls that cannot fit never fires here), while second sight after an admit-all fill
    reads less than either: the fill's blocks stay in S3-FIFO's main queue
    (docs/policies.md, "Where adaptive misses the bound")."""
    name = "synthpolicies|one-hit-90|s3fifo|4362|32"
    cell = next(c for c in bench.table_cells(DOC) if bench.cell_name(c) == name)
    rows = {rule: bench._hold_cell((cell, rule)) for rule in bench.HOLD_RULES}
    assert rows["second-sight"]["held"] == pytest.approx(cell["threshold-2"], abs=0.005)
    assert rows["admit-all"]["held"] == pytest.approx(cell["all"], abs=0.005)
    assert rows["second-sight-after-fill"]["held"] < cell["all"] - 0.1
    assert [rows[r]["switches"] for r in bench.HOLD_RULES] == [0, 1, 0]


def test_an_unknown_held_rule_is_refused(bench):
    with pytest.raises(ValueError, match="unknown rule 'second'"):
        bench.held_admission("second")


def test_readme_states_the_recorded_cells_below_the_bound(bench):
    """The README's count of recorded cells where adaptive is more than 0.2 points below the
    better static rule, and its worst margin, are the tables' (rewriting a table with
    ``hits`` must update the README too)."""
    text = " ".join((REPO / "README.md").read_text().split())
    found = re.search(r"In (\d+) of the (\d+) recorded cells .*? by ([\d.]+) to ([\d.]+) ",
                      text)
    assert found, "README: the adaptive admission paragraph's count is missing"
    cells = bench.table_cells(DOC)
    below = sorted(c["recorded_margin"] for c in cells if c["recorded_margin"] < -0.2)
    assert (int(found[1]), int(found[2])) == (len(below), len(cells))
    assert float(found[4]) == pytest.approx(-below[0], abs=0.005)
    assert float(found[3]) == pytest.approx(-below[-1], abs=0.005)
