"""The one import-or-skip of vLLM for the tests in tests/integrations.

The vLLM tests need the real vLLM 0.33 wheel's modules. Where they cannot be imported the test
module is skipped, except under ``KVTIER_REQUIRE_VLLM=1`` (which .ci/run sets): there a broken
vLLM install is an error instead of a silent skip.
"""

from __future__ import annotations

import importlib
import os

import pytest

INSTALL_HINT = "`pip install --no-deps vllm==0.33.0 && pip install -e '.[vllm]'`"


def require_vllm(*modules: str, what: str) -> None:
    """Import ``modules`` (dotted names) or skip the calling test module.

    Args:
        modules: the vLLM modules the test module needs.
        what: what they are, for the skip message (e.g. ``"kv_offload modules"``).

    Raises:
        ImportError: a module cannot be imported and ``KVTIER_REQUIRE_VLLM=1``.
    """
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get("KVTIER_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM 0.33's {what} are not importable ({exc!r}); install them with "
                    f"{INSTALL_HINT}", allow_module_level=True)
