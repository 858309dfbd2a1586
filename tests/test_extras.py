"""Importing a module whose optional extra is missing: the error names the install command.

Each case hides the extra's package in a fresh interpreter (``sys.modules[name] = None``),
so every case runs in every venv. Found by newcomer sessions: ``import kvtier.metrics``,
``kvtier.tiers.redis``, ``kvtier.integrations.vllm`` (and ``vllm_tiers``, ``vllm_replay``)
said only "No module named ...", where ``kvtier.dataplane`` named its extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")
VLLM_HINTS = ("pip install 'kvtier[vllm]'", "pip install --no-deps vllm==0.33.0")


def import_without(package: str, module: str) -> str:
    """``"<exc.name> | <message>"`` of ``import module`` with ``package`` hidden."""
    code = (f"import sys; sys.modules[{package!r}] = None\n"
            f"try:\n    import {module}\nexcept ModuleNotFoundError as e:\n"
            "    print(e.name, '|', e)\n")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False).stdout


@pytest.mark.parametrize("package, module, hints", [
    ("prometheus_client", "kvtier.metrics", ("pip install 'kvtier[metrics]'",)),
    ("redis", "kvtier.tiers.redis", ("pip install 'kvtier[redis]'",)),
    ("torch", "kvtier.dataplane", ("pip install 'kvtier[torch]'",)),
    ("vllm", "kvtier.integrations.vllm", VLLM_HINTS),
    ("vllm", "kvtier.integrations.vllm_tiers", VLLM_HINTS),
    ("vllm", "kvtier.integrations.vllm_replay", VLLM_HINTS),
])
def test_import_without_an_extra_names_the_install_command(package, module, hints):
    out = import_without(package, module)
    assert out.startswith(f"{package} |"), out
    for hint in hints:
        assert hint in out, out
    if package == "vllm":
        assert f"{module} needs vLLM 0.33" in out
