"""inferplane: plan, run, route and deploy fleets of LLMs served with vLLM."""

__version__ = "0.1.0"
