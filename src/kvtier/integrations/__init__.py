"""Adapters that plug kvtier into inference engines.

* :mod:`kvtier.integrations.vllm` — vLLM 0.33's offloading connector: kvtier's policies inside
  vLLM's own ``CPUOffloadingManager``, or kvtier's whole manager as an offloading spec
  (optional extra ``kvtier[vllm]``; see ``docs/vllm.md``).
* :mod:`kvtier.integrations.vllm_tiers` — kvtier's disk and Redis tiers as secondary tiers of
  vLLM 0.33's ``TieringOffloadingSpec`` (see ``docs/tiers.md``, "vLLM secondary tiers").

Nothing here is imported by ``import kvtier``: each adapter imports its engine.
"""


def require_vllm(module: str) -> None:
    """Import vLLM, or raise ``ModuleNotFoundError`` (``name="vllm"``) naming ``module`` and
    the install commands (the adapters call it before their first vLLM import, as
    ``kvtier.metrics`` and the Redis tier name their extra)."""
    try:
        import vllm  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "vllm").split(".")[0] != "vllm":
            raise
        raise ModuleNotFoundError(
            f"{module} needs vLLM 0.33, which is not installed: pip install 'kvtier[vllm]' "
            "and vllm==0.33.0 (a GPU machine: pip install vllm==0.33.0; CPU, import-only: "
            "pip install --no-deps vllm==0.33.0; docs/vllm.md)", name="vllm") from None
