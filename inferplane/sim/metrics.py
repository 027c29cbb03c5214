"""vLLM's Prometheus metrics (names, types, buckets and labels of vllm/v1/metrics/loggers.py).

Each engine has its own registry so many engines can live in one process. Labels are
`model_name` (the served name) and `engine` ("0"), as vLLM exports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inferplane.sim.scheduler import ScheduledStep, Scheduler, SimRequest, TokenEvent

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
_REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
FINISH_REASONS = ("stop", "length", "abort")
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_DOCS = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:prompt_tokens_cached": "Number of cached prompt tokens (local prefix cache).",
    "vllm:request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:request_time_per_output_token_seconds":
        "Histogram of time_per_output_token_seconds per request.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:request_inference_time_seconds":
        "Histogram of time spent in RUNNING phase for request.",
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
}


def _one_two_five(max_value: int) -> list[float]:
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(float(value))
        exponent += 1


class EngineMetrics:
    """The metric families a vLLM engine exports, fed from scheduler steps."""

    def __init__(self, model_name: str, max_model_len: int, max_loras: int | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = (model_name, "0")
        r = self.registry

        def gauge(name: str) -> Any:
            return Gauge(name, _DOCS[name], labels, registry=r).labels(*values)

        def counter(name: str) -> Any:
            # prometheus_client appends `_total` when exposing, as vLLM's names have it.
            return Counter(name, _DOCS[name], labels, registry=r).labels(*values)

        def histogram(name: str, buckets: Sequence[float]) -> Any:
            return Histogram(name, _DOCS[name], labels, buckets=buckets, registry=r).labels(
                *values
            )

        self.running = gauge("vllm:num_requests_running")
        self.waiting = gauge("vllm:num_requests_waiting")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc")
        self.prefix_queries = counter("vllm:prefix_cache_queries")
        self.prefix_hits = counter("vllm:prefix_cache_hits")
        self.preemptions = counter("vllm:num_preemptions")
        self.prompt_tokens = counter("vllm:prompt_tokens")
        self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached")
        self.generation_tokens = counter("vllm:generation_tokens")
        success = Counter(
            "vllm:request_success", _DOCS["vllm:request_success"],
            [*labels, "finished_reason"], registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        token_buckets = _one_two_five(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", token_buckets)
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", token_buckets
        )
        self.request_max_tokens = histogram("vllm:request_params_max_tokens", token_buckets)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", _ITERATION_BUCKETS)
        self.ttft = histogram("vllm:time_to_first_token_seconds", _TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", _ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds", _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", _REQUEST_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", _REQUEST_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds", _REQUEST_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds", _REQUEST_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds", _REQUEST_BUCKETS)
        # vLLM's LoRA gauge (only with --enable-lora): the adapters running and waiting, as
        # comma-joined label values; the value is when that combination was last seen.
        self.lora_info: Any = None
        self.max_loras = max_loras
        if max_loras is not None:
            self.lora_info = Gauge(
                "vllm:lora_requests_info", "Running stats on lora requests.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=r,
            )
        self._last_queries = 0
        self._last_hits = 0
        self._last_preemptions = 0

    def record_step(
        self, scheduler: Scheduler, step: ScheduledStep, events: list[TokenEvent]
    ) -> None:
        """Update gauges and counters after one step, like vLLM's PrometheusStatLogger."""
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        self.kv_usage.set(scheduler.pool.usage)
        self.prefix_queries.inc(scheduler.prefix.queries - self._last_queries)
        self.prefix_hits.inc(scheduler.prefix.hits - self._last_hits)
        self.preemptions.inc(scheduler.num_preemptions - self._last_preemptions)
        self._last_queries = scheduler.prefix.queries
        self._last_hits = scheduler.prefix.hits
        self._last_preemptions = scheduler.num_preemptions
        # As vLLM's IterationStats: a request's whole prompt counts when its prefill ends,
        # i.e. with its first output token (a one-step prefill included; preemption never
        # counts it twice).
        self.prompt_tokens.inc(
            sum(event.request.num_prompt_tokens for event in events if event.index == 0)
        )
        self.prompt_tokens_cached.inc(  # the prefix-cache part of those prompts
            sum(event.request.cached_tokens for event in events if event.index == 0)
        )
        self.generation_tokens.inc(len(events))
        if self.lora_info is not None:
            self._record_loras(scheduler)
        if step.work:
            self.iteration_tokens.observe(sum(count for _, count in step.work))
        for event in events:
            self._record_token(event)

    def _record_loras(self, scheduler: Scheduler) -> None:
        running = dict.fromkeys(r.lora for r in scheduler.running if r.lora is not None)
        waiting = dict.fromkeys(r.lora for r in scheduler.waiting if r.lora is not None)
        self.lora_info.labels(
            str(self.max_loras), ",".join(waiting), ",".join(running)
        ).set_to_current_time()

    def record_idle(self, scheduler: Scheduler) -> None:
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        self.kv_usage.set(scheduler.pool.usage)

    def record_abort(self) -> None:
        self.success["abort"].inc()

    def _record_token(self, event: TokenEvent) -> None:
        request = event.request
        if event.index == 0:
            self.ttft.observe(event.time_s - request.arrival_s)
        else:
            previous = request.prev_token_s
            self.itl.observe(event.time_s - (previous if previous is not None else event.time_s))
        if event.finished:
            self._record_finished(request)

    def _record_finished(self, request: SimRequest) -> None:
        assert request.finished_s is not None and request.first_token_s is not None
        scheduled = request.first_scheduled_s or request.arrival_s
        self.success[request.finish_reason].inc()
        self.e2e.observe(request.finished_s - request.arrival_s)
        self.queue.observe(scheduled - request.arrival_s)
        self.inference.observe(request.finished_s - scheduled)
        self.prefill.observe(request.first_token_s - scheduled)
        self.decode.observe(request.finished_s - request.first_token_s)
        self.request_prompt_tokens.observe(request.num_prompt_tokens)
        self.request_generation_tokens.observe(request.num_output)
        if request.max_tokens_param:  # generation requests (a pooling request has none)
            self.request_max_tokens.observe(request.max_tokens_param)
        if request.num_output > 1:
            self.tpot.observe(
                (request.finished_s - request.first_token_s) / (request.num_output - 1)
            )

    def render(self) -> bytes:
        return generate_latest(self.registry)

