"""Adapters that plug kvtier into inference engines.

* :mod:`kvtier.integrations.vllm` — vLLM 0.33's offloading connector: kvtier's policies inside
  vLLM's own ``CPUOffloadingManager``, or kvtier's whole manager as an offloading spec
  (optional extra ``kvtier[vllm]``; see ``docs/vllm.md``).

Nothing here is imported by ``import kvtier``: each adapter imports its engine.
"""
