"""The memory estimator: what one vLLM instance needs per GPU, the way vLLM counts it.

`estimate_memory(profile, EngineSettings(...), gpu=...)` -> `MemoryEstimate` (weights, KV
cache per attention kind, activations, CUDA graphs, contexts; eras of vLLM's accounting).
Pure: no fleets, no placement (that is `inferplane.planner`), no I/O.
"""
