"""The example policy of docs/manager.md ("How to write a policy"), loaded from the document
itself, so the contract tests run the code a reader copies."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "manager.md"


def load_example_policy() -> type:
    text = DOC.read_text()
    section = text.split("## How to write a policy", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {"__name__": "kvtier_docs_example"}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace["FIFOPolicy"]


FIFOPolicy = load_example_policy()
