"""vLLM's metric names for the neutral vocabulary (engines/metrics.py), newest first.

`kv_cache_usage_perc` is the V1 name, `gpu_cache_usage_perc` the V0 one; the per-token
latency histogram was `time_per_output_token_seconds` before `inter_token_latency_seconds`
and `request_time_per_output_token_seconds` split it.
"""

from __future__ import annotations

from inferplane.engines import metrics as m

VLLM_METRICS: m.MetricNames = {
    m.REQUESTS_WAITING: ("vllm:num_requests_waiting",),
    m.REQUESTS_RUNNING: ("vllm:num_requests_running",),
    m.KV_CACHE_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    m.SLEEP_STATE: ("vllm:engine_sleep_state",),
    m.PROMPT_TOKENS: ("vllm:prompt_tokens",),
    m.GENERATION_TOKENS: ("vllm:generation_tokens",),
    m.REQUESTS_FINISHED: ("vllm:request_success",),
    m.PREEMPTIONS: ("vllm:num_preemptions",),
    m.PREFIX_CACHE_QUERIES: ("vllm:prefix_cache_queries",),
    m.PREFIX_CACHE_HITS: ("vllm:prefix_cache_hits",),
    m.TIME_TO_FIRST_TOKEN: ("vllm:time_to_first_token_seconds",),
    m.INTER_TOKEN_LATENCY: ("vllm:inter_token_latency_seconds",),
    m.TIME_PER_OUTPUT_TOKEN: (
        "vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
    ),
    m.QUEUE_TIME: ("vllm:request_queue_time_seconds",),
}
