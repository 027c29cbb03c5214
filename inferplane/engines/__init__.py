"""Engine adapters: reading what serving engines (vLLM) print and report."""
