"""`gateway:` — the OpenAI-compatible entry point's own settings."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictStr, field_validator
from pydantic_core import PydanticCustomError

from inferplane.spec.base import SpecModel
from inferplane.spec.types import NonNegativeInt, PositiveFloat, PositiveInt

# The one place these defaults live: the gateway's own config (`inferplane.gateway.config`)
# takes them from here, so `inferplane gateway` with and without a fleet file agree.
DEFAULT_GATEWAY_PORT = 8000
DEFAULT_CONNECT_S = 10.0
DEFAULT_FIRST_BYTE_S = 600.0  # includes the engine's own queue and a long prefill
DEFAULT_IDLE_S = 120.0  # longest gap between streamed chunks
DEFAULT_TOTAL_S = 3600.0
_HTTP_URL = re.compile(r"^https?://(\[[0-9A-Fa-f:.]+\]|[^/\s:\[\]]+)(:\d+)?(/\S*)?$")


class GatewayTimeouts(SpecModel):
    """Default upstream timeouts for every model (P40): generous, since generations are long."""

    connect_s: PositiveFloat = DEFAULT_CONNECT_S
    first_byte_s: PositiveFloat = DEFAULT_FIRST_BYTE_S
    idle_s: PositiveFloat = DEFAULT_IDLE_S
    total_s: PositiveFloat = DEFAULT_TOTAL_S


class GatewayConnections(SpecModel):
    """Bounds on client connections (docs/gateway.md lists nginx's equivalent of each)."""

    header_timeout_s: PositiveFloat = 30.0  # the request head, from the first byte -> 408
    body_timeout_s: PositiveFloat = 30.0  # longest gap between two body reads -> 408
    # The whole body, from the end of the head: a body trickled a byte every few seconds
    # (each gap under body_timeout_s) is cut here (Envoy's request_timeout) -> 408.
    body_total_timeout_s: PositiveFloat = 300.0
    keepalive_timeout_s: PositiveFloat = 75.0  # an idle keep-alive connection is closed
    send_timeout_s: PositiveFloat = 60.0  # a client reading nothing of its answer is dropped
    max_header_bytes: PositiveInt = Field(default=64 * 1024, ge=1024)  # larger heads: 431
    max_connections: PositiveInt = 10_000  # beyond: 503 and closed
    fd_reserve: NonNegativeInt = 256  # descriptors never used for client connections


class GatewayTracing(SpecModel):
    """OpenTelemetry traces of the proxy path, exported over OTLP/HTTP (docs/monitoring.md).
    Present: on; absent: off unless the standard OTEL_EXPORTER_OTLP_* variables are set."""

    # The collector, e.g. http://localhost:4318 (/v1/traces is added when there is no
    # path). None: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT, else
    # the OTLP default http://localhost:4318/v1/traces.
    otlp_endpoint: StrictStr | None = None
    service_name: StrictStr = Field(default="inferplane-gateway", min_length=1)
    # The share of new traces kept; a client's traceparent decides for its own requests.
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not _HTTP_URL.match(value):
            raise PydanticCustomError(
                "otlp_endpoint",
                "not an http(s) URL of an OTLP/HTTP collector",
                {"fix": "e.g. http://localhost:4318 (the path /v1/traces is added)"},
            )
        return value


class GatewaySpec(SpecModel):
    """Where the gateway listens and what it accepts."""

    host: StrictStr = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=DEFAULT_GATEWAY_PORT, strict=True, ge=1, le=65535)
    max_body_mib: PositiveFloat = 32.0  # larger bodies get 413 naming the limit (P41)
    timeouts: GatewayTimeouts = Field(default_factory=GatewayTimeouts)
    connections: GatewayConnections = Field(default_factory=GatewayConnections)
    # API keys (docs/tenancy.md): "auto" turns auth on once the store holds any key.
    auth: Literal["auto", "on", "off"] = "auto"
    database_url: StrictStr | None = None  # default: sqlite in the state directory
    redis_url: StrictStr | None = None  # share limits across gateway replicas
    # With redis_url: each gateway decides from credit leased from Redis and settles every
    # redis_sync_s (bounded slack, docs/tenancy.md "Several gateways"); 0: one Redis round
    # trip per request, exact.
    redis_sync_s: float = Field(default=0.5, ge=0, le=10, strict=True)
    admin_token_env: StrictStr = "INFERPLANE_ADMIN_TOKEN"  # env var holding the admin token
    # Env var holding a token that GET /metrics then requires (unset: /metrics is open, as
    # scrapers on the cluster network expect; /v1/models needs an API key when auth is on).
    metrics_token_env: StrictStr | None = Field(default=None, min_length=1)
    # OpenAI's six x-ratelimit-* headers: on 429s only ("on_429"), or also on every admitted
    # response of a key with limits ("always", like OpenAI; ~9% fewer RPS, docs/tenancy.md).
    ratelimit_headers: Literal["always", "on_429"] = "on_429"
    # A request with this header set to "batch" queues behind interactive traffic.
    priority_header: StrictStr = Field(default="X-Priority", min_length=1)
    access_log_path: StrictStr | None = Field(default=None, min_length=1)  # None: stderr
    # The web console at /ui (docs/console.md), served by `inferplane up`'s gateway; it
    # needs the admin token whenever auth is on. `up --no-console` also turns it off.
    console: StrictBool = True
    # Host names the console answers to when it is open (no auth in force), besides the
    # loopback names (localhost, 127.0.0.1, ::1): a web page that rebinds its own DNS name
    # to this machine then cannot drive it (docs/console.md). "*" accepts any Host.
    console_allowed_hosts: list[Annotated[StrictStr, Field(min_length=1)]] = Field(
        default_factory=list
    )
    # x-inferplane-replica (the name of the replica that answered: chat-0, a pod) on every
    # response: off by default (it tells clients the fleet's layout); the console asks for
    # it on its own.
    expose_replica_header: StrictBool = False
    # The HTTP/1.1 server: the gateway's own protocol (measured 1.15x uvicorn's RPS with
    # tenancy, docs/gateway.md#performance) or uvicorn's; the same connection bounds.
    server: Literal["native", "uvicorn"] = "native"
    # The gateway's container image for `inferplane render` (--gateway-image overrides it);
    # default: what this checkout's Dockerfile builds (docs/deploy.md).
    image: StrictStr | None = Field(default=None, min_length=1)
    tracing: GatewayTracing | None = None  # OpenTelemetry spans (off by default)
