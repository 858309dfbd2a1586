"""The README's manager example runs as written and leaves the state it describes."""

from __future__ import annotations

import re

from conftest import REPO_ROOT


def test_readme_manager_example_runs(capsys):
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "OffloadingManager(" in b)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    m = namespace["m"]
    assert namespace["hits"] == 3
    assert namespace["slots"] == [0, 1, 2]
    s = m.stats()
    assert (s.used, s.evictable, s.pinned, s.hits, s.misses) == (3, 3, 0, 4, 1)
    assert "ManagerStats(" in capsys.readouterr().out


def test_readme_replay_table_counts_match_the_code():
    """The README's `kvtier replay` table: every column but the two timings (they vary)."""
    from typer.testing import CliRunner

    from kvtier.cli import app

    text = (REPO_ROOT / "README.md").read_text()
    m = re.search(r"```console\n\$ kvtier replay\n(.*?)```", text, flags=re.S)
    assert m
    shown = m.group(1).rstrip("\n").splitlines()
    got = CliRunner().invoke(app, ["replay", "--no-progress"]).stdout.splitlines()
    # title and header words (the column widths follow the timings)
    assert [ln.split() for ln in shown[:3]] == [ln.split() for ln in got[:3]]
    rows = [ln.split()[:9] for ln in shown[4:-1]]
    assert len(rows) == 6 and rows == [ln.split()[:9] for ln in got[4:-1]]
    caption = shown[-1].split("; parsed in")[0]  # the parse time varies
    assert got[-1].startswith(caption)


def test_readme_full_trace_commands_work_from_any_checkout_location(tmp_path):
    """Found by a newcomer pass: the README's full-trace commands named
    ../shared/traces/..., which is only there when the checkout sits next to shared/. They
    name "$KVTIER_SHARED_TRACE" now, and the README's export line finds the trace from a
    checkout nested deeper (as a git worktree is), from any folder of it: the former
    ``python -c 'from kvtier.trace import ...'`` failed inside src/kvtier, whose types.py
    shadowed the standard library's (``-c`` puts the current folder on sys.path); the line
    is ``kvtier shared-trace`` now, a command, which does not."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    text = (REPO_ROOT / "README.md").read_text()
    assert "../shared/traces" not in text.replace("`../shared/traces/` (or any", "")
    commands = re.findall(r"kvtier (?:replay|sweep)\s+(\S+)", text)
    assert '"$KVTIER_SHARED_TRACE"' in commands
    export = re.search(r"`export KVTIER_SHARED_TRACE=\$\((.*?)\)`", text).group(1)
    trace = tmp_path / "shared" / "traces" / "mooncake_conversation.jsonl"
    trace.parent.mkdir(parents=True)
    trace.write_text("")
    checkout = tmp_path / "wt" / "mine"
    package = checkout / "src" / "kvtier"  # a folder whose types.py shadows the stdlib's
    package.mkdir(parents=True)
    (package / "types.py").write_text("raise ImportError('the checkout shadowed types')\n")
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_SHARED_TRACE"}
    env["PYTHONPATH"] = str(REPO_ROOT / "src")
    argv = shlex.split(export)
    assert argv[0] == "kvtier"
    script = Path(sys.executable).parent / "kvtier"  # the console script of this install
    assert script.is_file(), "kvtier is not installed in this environment (pip install -e .)"
    for cwd in (checkout, package):
        found = subprocess.run([str(script), *argv[1:]], cwd=cwd, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        assert found == str(trace.resolve()), cwd
    # no trace found: nothing on standard output, the reason on standard error, status 1
    trace.unlink()
    res = subprocess.run([str(script), *argv[1:]], cwd=checkout, env=env,
                         capture_output=True, text=True)
    assert (res.returncode, res.stdout) == (1, "")
    assert "KVTIER_SHARED_TRACE" in res.stderr and "shared/traces" in res.stderr
