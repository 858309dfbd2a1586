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
