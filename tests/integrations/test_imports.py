"""Importing kvtier's engine adapters without the engine: the error names the install command.

Runs without vLLM (each case hides it in a fresh interpreter), so it runs in every venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _import_without_vllm(module: str) -> str:
    code = ("import sys; sys.modules['vllm'] = None\n"
            f"try:\n    import {module}\nexcept ModuleNotFoundError as e:\n"
            "    print(e.name, '|', e)\n")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False).stdout


@pytest.mark.parametrize("module", ["kvtier.integrations.vllm_tiers",
                                    "kvtier.integrations.vllm_replay"])
def test_import_without_vllm_names_the_install_command(module):
    """Found by a newcomer session: `import kvtier.integrations.vllm_tiers` (docs/tiers.md)
    without vLLM said only "No module named 'vllm'", where kvtier.metrics, the Redis tier and
    kvtier.dataplane name their extra."""
    out = _import_without_vllm(module)
    assert out.startswith("vllm |"), out
    assert f"{module} needs vLLM 0.33" in out
    assert "pip install 'kvtier[vllm]'" in out and "pip install --no-deps vllm==0.33.0" in out


def test_import_of_the_vllm_adapter_without_vllm_names_the_install_command():
    out = _import_without_vllm("kvtier.integrations.vllm")
    assert "pip install 'kvtier[vllm]'" in out
