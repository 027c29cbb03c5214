"""The gateway's own configuration types.

The gateway does not read the fleet file itself: `inferplane.gateway.fleet` turns a fleet
spec into a `GatewayConfig`, and the runtime may build one directly. Keeping these types
small and frozen means the hot path reads plain attributes, never pydantic models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from inferplane.errors import InferplaneError
from inferplane.gateway.lora import AdapterRoute
from inferplane.gateway.tracing import TracingConfig
from inferplane.spec.gateway import (
    DEFAULT_CONNECT_S,
    DEFAULT_FIRST_BYTE_S,
    DEFAULT_GATEWAY_PORT,
    DEFAULT_IDLE_S,
    DEFAULT_TOTAL_S,
    GatewayConnections,
)
from inferplane.spec.model import RoutingSpec

# The fleet file's defaults are the only ones (issue 18.10): read once from its models.
_CONNECTIONS = GatewayConnections()
_ROUTING = RoutingSpec()

# Names of the scorers a model's routing chain may use (see `scorers.py`).
SCORER_NAMES = ("least_outstanding", "engine_metrics", "prefix_affinity", "session_affinity")

MaxTokensMode = Literal["clamp", "reject"]
# What the model serves (the fleet file's `task`): the console picks the playground's
# request kind by it; the proxy path does not read it.
ModelTask = Literal["generate", "embed"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Upstream timeouts for one model. Generous by default: long generations are healthy (P40).

    `first_token_s` bounds the wait for the first body byte of a *streaming* response;
    non-streaming responses only arrive when generation ends, so `total_s` bounds them.
    """

    connect_s: float = DEFAULT_CONNECT_S
    first_token_s: float = DEFAULT_FIRST_BYTE_S
    idle_s: float = DEFAULT_IDLE_S
    total_s: float = DEFAULT_TOTAL_S

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_token_s", "idle_s", "total_s"):
            value = getattr(self, name)
            if not value > 0:
                raise InferplaneError(
                    "timeout must be a positive number of seconds",
                    field=f"timeouts.{name}",
                    value=value,
                    fix="use a value > 0",
                )


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Per-connection bounds; the fleet file's `gateway.connections`."""

    header_timeout_s: float = _CONNECTIONS.header_timeout_s  # nginx client_header_timeout
    body_timeout_s: float = _CONNECTIONS.body_timeout_s  # nginx client_body_timeout
    body_total_timeout_s: float = _CONNECTIONS.body_total_timeout_s  # Envoy request_timeout
    keepalive_timeout_s: float = _CONNECTIONS.keepalive_timeout_s  # nginx keepalive_timeout
    send_timeout_s: float = _CONNECTIONS.send_timeout_s  # nginx send_timeout
    max_header_bytes: int = _CONNECTIONS.max_header_bytes  # large_client_header_buffers
    max_connections: int = _CONNECTIONS.max_connections  # nginx worker_connections
    fd_reserve: int = _CONNECTIONS.fd_reserve  # kept free for upstreams, logs, the database

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "body_total_timeout_s",
                     "keepalive_timeout_s", "send_timeout_s"):  # fmt: skip
            if not getattr(self, name) > 0:
                raise InferplaneError(
                    "connection timeout must be positive",
                    field=f"gateway.connections.{name}",
                    value=getattr(self, name),
                    fix="use a number of seconds > 0",
                )
        for name, least in (("max_header_bytes", 1024), ("max_connections", 1),
                            ("fd_reserve", 0)):  # fmt: skip
            if getattr(self, name) < least:
                raise InferplaneError(
                    f"{name} is too small",
                    field=f"gateway.connections.{name}",
                    value=getattr(self, name),
                    fix=f"use at least {least}",
                )


@dataclass(frozen=True, slots=True)
class Admission:
    """Bounded per-model queue used when every ready replica is at its concurrency cap (P37)."""

    max_queue_depth: int = 512
    max_queue_wait_s: float = 30.0
    # Head start an interactive request gets over a batch one; a batch request that has
    # waited longer than this overtakes new interactive arrivals, so batch never starves.
    interactive_head_start_s: float = 2.0
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.max_queue_depth < 0:
            raise InferplaneError(
                "queue depth cannot be negative",
                field="admission.max_queue_depth",
                value=self.max_queue_depth,
                fix="use 0 (reject when full) or a positive number",
            )
        if not self.max_queue_wait_s > 0:
            raise InferplaneError(
                "queue wait must be positive",
                field="admission.max_queue_wait_s",
                value=self.max_queue_wait_s,
                fix="use a value > 0 seconds",
            )


@dataclass(frozen=True, slots=True)
class LongPromptLane:
    """Send prompts estimated above `threshold_tokens` to another model's pool (P39)."""

    threshold_tokens: int
    model: str


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """One client-facing model and how to reach and balance its replicas."""

    name: str
    endpoints: tuple[str, ...] = ()
    served_name: str | None = None  # the engine's --served-model-name when it differs
    aliases: tuple[str, ...] = ()
    task: ModelTask = "generate"
    scorers: tuple[str, ...] = ("least_outstanding",)
    max_concurrency_per_replica: int = 256  # vLLM's default max_num_seqs
    max_tokens_cap: int | None = None
    max_tokens_mode: MaxTokensMode = "clamp"
    long_prompt_lane: LongPromptLane | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    admission: Admission = field(default_factory=Admission)
    retries: int = 2
    # Outlier detection (Envoy's consecutive_gateway_failure / consecutive_5xx): eject after
    # this many of the replica's own failures (connect, reset, mid-stream death, timeouts)...
    eject_after_failures: int = 3
    # ... or this many 5xx answers in a row that another replica did not share.
    eject_after_5xx: int = _ROUTING.eject_after_5xx
    # At most this share of a model's ready replicas is ejected at once (at least one may be
    # for the replica's own failures; the last routable one never is for 5xx answers). When
    # every ready replica is ejected, requests go to them anyway (panic routing).
    max_ejection_percent: float = _ROUTING.max_ejection_percent
    session_header: str = "x-session-id"  # read by session affinity
    prefix_chars: int = 256  # leading prompt characters hashed by prefix affinity
    prefix_load_factor: float = 1.25  # bounded-load factor for prefix affinity
    # LoRA adapters served on this model's replicas (gateway/lora.py); with affinity off a
    # request goes wherever the other scorers send it (benchmarks/lora_affinity.py).
    adapters: tuple[AdapterRoute, ...] = ()
    adapter_affinity: bool = True
    adapter_cache_slots: int = 1  # adapters an engine keeps in host memory (max_cpu_loras)

    def __post_init__(self) -> None:
        for scorer in self.scorers:
            if scorer not in SCORER_NAMES:
                raise InferplaneError(
                    "unknown routing scorer",
                    field=f"models.{self.name}.routing.scorers",
                    value=scorer,
                    fix=f"use some of {', '.join(SCORER_NAMES)}",
                )
        if self.max_concurrency_per_replica < 1:
            raise InferplaneError(
                "concurrency cap must be at least 1",
                field=f"models.{self.name}.max_concurrency_per_replica",
                value=self.max_concurrency_per_replica,
                fix="use the engine's max_num_seqs",
            )
        if self.max_tokens_mode not in ("clamp", "reject"):
            raise InferplaneError(
                "unknown max_tokens mode",
                field=f"models.{self.name}.max_tokens_mode",
                value=self.max_tokens_mode,
                fix="use 'clamp' or 'reject'",
            )
        if self.eject_after_failures < 1 or self.eject_after_5xx < 1:
            raise InferplaneError(
                "ejection thresholds must be at least 1",
                field=f"models.{self.name}.routing.eject_after_failures",
                value=(self.eject_after_failures, self.eject_after_5xx),
                fix="use a positive number of consecutive failures",
            )
        if not 0.0 <= self.max_ejection_percent <= 100.0:
            raise InferplaneError(
                "max ejection percent must be within 0..100",
                field=f"models.{self.name}.max_ejection_percent",
                value=self.max_ejection_percent,
                fix="use e.g. 50",
            )
        if self.prefix_load_factor <= 1.0:
            raise InferplaneError(
                "prefix load factor must exceed 1.0",
                field=f"models.{self.name}.prefix_load_factor",
                value=self.prefix_load_factor,
                fix="use e.g. 1.25 (a replica takes at most 25% more than the average load)",
            )

    @property
    def upstream_name(self) -> str:
        return self.served_name or self.name


@dataclass(frozen=True, slots=True)
class WeightedTarget:
    model: str
    weight: float


@dataclass(frozen=True, slots=True)
class WeightedRoute:
    """A client-facing name split over versions (ModelRoutes) by weight (canary, P43).
    The name may be one of the models' own names; the route then takes precedence."""

    name: str
    targets: tuple[WeightedTarget, ...]

    def __post_init__(self) -> None:
        if not self.targets or any(t.weight < 0 for t in self.targets):
            raise InferplaneError(
                "a weighted route needs targets with non-negative weights",
                field=f"routes.{self.name}",
                value=[(t.model, t.weight) for t in self.targets],
                fix="list at least one target model with weight >= 0",
            )
        if sum(t.weight for t in self.targets) <= 0:
            raise InferplaneError(
                "weights of a route sum to zero",
                field=f"routes.{self.name}",
                value=[t.weight for t in self.targets],
                fix="give at least one target a positive weight",
            )


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything `build_app` needs. Backends may be static (`ModelRoute.endpoints`) or set
    at run time with `GatewayState.set_backends`."""

    models: tuple[ModelRoute, ...] = ()
    routes: tuple[WeightedRoute, ...] = ()
    host: str = "127.0.0.1"
    port: int = DEFAULT_GATEWAY_PORT
    max_body_bytes: int = 32 * 1024 * 1024
    access_log: bool = True
    access_log_path: str | None = None  # None: stderr
    priority_header: str = "x-priority"  # "batch" queues behind interactive traffic
    engine_metrics_interval_s: float = 1.0
    engine_metrics_stale_after_s: float = 5.0
    health_interval_s: float = 2.0
    # When set, GET /metrics needs 'Authorization: Bearer <token>' (a scraper's own token).
    metrics_token: str | None = None
    # Client connections: timeouts, head size, how many (inferplane.gateway.connections).
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # OpenTelemetry spans (inferplane.gateway.tracing); None: the OTEL_* variables, else off.
    tracing: TracingConfig | None = None
    # Host names the open console answers to besides loopback ("*": any), and whether
    # every response carries x-inferplane-replica (docs/gateway.md).
    console_allowed_hosts: tuple[str, ...] = ()
    expose_replica_header: bool = False
    # The HTTP/1.1 server: the gateway's own protocol (gateway/h1.py, measured faster) or
    # uvicorn's httptools protocol; both with the same connection bounds.
    server: Literal["native", "uvicorn"] = "native"

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for route in self.models:
            for name in (route.name, *route.aliases):
                if name in seen:
                    raise InferplaneError(
                        "model name or alias is used twice",
                        field="models",
                        value=name,
                        fix=f"rename it; it already names model {seen[name]!r}",
                    )
                seen[name] = route.name
        for route in self.models:
            for adapter in route.adapters:
                for name in adapter.client_names:
                    if name in seen:
                        raise InferplaneError(
                            "adapter name or alias is used twice",
                            field=f"models.{route.name}.lora.adapters",
                            value=name,
                            fix=f"rename it; it already names {seen[name]!r}",
                        )
                    seen[name] = f"an adapter of {route.name}"
        adapter_names = {a.name for m in self.models for a in m.adapters}
        route_names: set[str] = set()
        for wroute in self.routes:
            # A route may reuse a model's name: it then splits that name's traffic.
            if wroute.name in route_names:
                raise InferplaneError(
                    "two weighted routes share a name",
                    field=f"routes.{wroute.name}",
                    value=wroute.name,
                    fix="merge them into one route",
                )
            route_names.add(wroute.name)
            for target in wroute.targets:
                if target.model not in {m.name for m in self.models} | adapter_names:
                    raise InferplaneError(
                        "weighted route points at an unknown model",
                        field=f"routes.{wroute.name}",
                        value=target.model,
                        fix="name a model defined under models: (or one of its adapters)",
                    )
        for route in self.models:
            lane = route.long_prompt_lane
            if lane is not None and lane.model not in {m.name for m in self.models}:
                raise InferplaneError(
                    "long-prompt lane points at an unknown model",
                    field=f"models.{route.name}.long_prompt_lane.model",
                    value=lane.model,
                    fix="name a model defined under models:",
                )
        if self.max_body_bytes < 1024:
            raise InferplaneError(
                "body limit is too small",
                field="gateway.max_body_bytes",
                value=self.max_body_bytes,
                fix="use at least 1024 bytes (default 32 MiB)",
            )
