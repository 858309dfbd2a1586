"""Adapters that plug kvtier into inference engines.

* :mod:`kvtier.integrations.vllm` — vLLM 0.33's offloading connector: kvtier's policies inside
  vLLM's own ``CPUOffloadingManager``, or kvtier's whole manager as an offloading spec
  (optional extra ``kvtier[vllm]``; see ``docs/vllm.md``).
* :mod:`kvtier.integrations.vllm_tiers` — kvtier's disk and Redis tiers as secondary tiers of
  vLLM 0.33's ``TieringOffloadingSpec`` (see ``docs/tiers.md``, "vLLM secondary tiers").

Nothing here is imported by ``import kvtier``: each adapter imports its engine.
"""
