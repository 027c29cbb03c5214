"""OpenTelemetry spans for the proxy path, and W3C trace context passed on to the engine.

Off by default. With tracing off the gateway creates no span objects at all: it forwards
the client's `traceparent`/`tracestate` unchanged (a proxy that does not take part in a
trace passes it through, as W3C Trace Context allows), so an engine run with vLLM's
`--otlp-traces-endpoint` still joins the client's trace.

With tracing on (`gateway.tracing` in the fleet file, or the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables), every
model request gets one SERVER span, child of the client's `traceparent` when it sent one,
with a child per phase:

    POST /v1/chat/completions           (SERVER; request id, model, replica, tokens, status)
    ├── gateway.admission               body read, keys and limits, model resolution
    ├── gateway.route                   picking a replica
    ├── gateway.queue_wait              only when the request waited for a free replica
    └── gateway.upstream                (CLIENT; its id is the engine's parent span)
        ├── upstream.first_token        request sent -> first byte back (TTFT, P48)
        └── upstream.stream             first byte -> last byte (streams only)

Phase spans are created when the request ends, from the times the proxy recorded, so the
hot path pays a clock read per phase, not a span object. OpenTelemetry is imported only
here and only when tracing is on (`pip install 'inferplane[tracing]'`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from inferplane.errors import InferplaneError
from inferplane.gateway.asgi import Message, Receive, Scope, Send

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

Handler = Callable[[Scope, Receive, Send, str, "RequestTrace | None"], Awaitable[None]]

DEFAULT_SERVICE_NAME = "inferplane-gateway"
OTLP_TRACES_PATH = "/v1/traces"
_MISSING = (
    "tracing needs OpenTelemetry, which is not installed: pip install -e '.[tracing]' in a "
    "source checkout (as scripts/demo.sh installed it), else pip install "
    "'inferplane[tracing]' (opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)"
)


@dataclass(frozen=True)
class TracingConfig:
    """Where spans go. `otlp_endpoint` None: the OTEL_* variables, else the OTLP/HTTP
    default (http://localhost:4318/v1/traces). `exporter` replaces OTLP (tests pass an
    in-memory exporter; spans are then exported synchronously)."""

    otlp_endpoint: str | None = None
    service_name: str = DEFAULT_SERVICE_NAME
    sample_ratio: float = 1.0
    exporter: SpanExporter | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise InferplaneError(
                "sample ratio must be between 0 and 1", field="gateway.tracing.sample_ratio",
                value=self.sample_ratio, fix="use e.g. 0.1 to keep one trace in ten, 1 for all",
            )
        if self.otlp_endpoint is not None:
            check_endpoint(self.otlp_endpoint)


def check_endpoint(url: str, field: str = "gateway.tracing.otlp_endpoint") -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InferplaneError(
            "not an http(s) URL of an OTLP/HTTP collector", field=field, value=url,
            fix="e.g. http://localhost:4318 (the path /v1/traces is added when missing)",
        )
    return url


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: a bare collector address gets `/v1/traces`, as the
    OTEL_EXPORTER_OTLP_ENDPOINT convention does; a URL with a path is used as given."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + OTLP_TRACES_PATH
    return endpoint


def config_from_env(environ: MutableMapping[str, str] | None = None) -> TracingConfig | None:
    """Tracing turned on by the standard variables alone (no `gateway.tracing`): an OTLP
    endpoint is set and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "").lower() == "none":
        return None
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        return None
    return TracingConfig(
        service_name=env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME,
        sample_ratio=_env_ratio(env),
    )


def _env_ratio(env: MutableMapping[str, str]) -> float:
    raw = env.get("OTEL_TRACES_SAMPLER_ARG")
    if not raw:
        return 1.0
    try:
        return float(raw)
    except ValueError:
        raise InferplaneError(
            "not a number", field="OTEL_TRACES_SAMPLER_ARG", value=raw,
            fix="a sampling ratio between 0 and 1",
        ) from None


def tracing_for(config: TracingConfig | None) -> Tracing | None:
    """The gateway's tracing: from its config, else from the OTEL_* variables, else off."""
    if config is None:
        config = config_from_env()
    return Tracing(config) if config is not None else None


class Tracing:
    """The tracer provider of one gateway; `serve` wraps one request in its SERVER span."""

    def __init__(self, config: TracingConfig) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise InferplaneError(_MISSING, field="gateway.tracing") from None
        self.config = config
        self.never_samples = config.sample_ratio == 0.0  # roots are never sampled
        self._unsampled = _UnsampledContexts()
        # ParentBased: a client's sampled traceparent is kept, an unsampled one dropped.
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        resource = Resource.create({"service.name": config.service_name})
        self.provider: TracerProvider = TracerProvider(sampler=sampler, resource=resource)
        if config.exporter is not None:
            self.provider.add_span_processor(SimpleSpanProcessor(config.exporter))
        else:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                raise InferplaneError(_MISSING, field="gateway.tracing") from None
            endpoint = traces_url(config.otlp_endpoint) if config.otlp_endpoint else None
            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint)))
        self.tracer: Tracer = self.provider.get_tracer("inferplane.gateway")
        self.propagator = TraceContextTextMapPropagator()
        # Bound once: an import statement per span would cost on every request.
        self.in_context = set_span_in_context
        self.server_kind = SpanKind.SERVER
        self.client_kind = SpanKind.CLIENT
        self.error_status = lambda why: Status(StatusCode.ERROR, why)

    def serve(
        self, handler: Handler, scope: Scope, receive: Receive, send: Send, path: str
    ) -> Awaitable[None]:
        """Run `handler` (the proxy) inside the request's SERVER span; the span takes the
        response status from what is sent."""
        if self.never_samples:
            headers = scope["headers"]
            for name, _ in headers:
                if name == b"traceparent":
                    break
            else:
                # sample_ratio 0 and no client context: the sampler could only say no.
                # Skip the SDK and hand the engine a fresh unsampled context, as the SDK
                # would; the proxy's own coroutine is returned, no wrapper around it.
                headers.append((b"traceparent", self._unsampled.next()))
                return handler(scope, receive, send, path, None)
        return self._traced(handler, scope, receive, send, path)

    async def _traced(
        self, handler: Handler, scope: Scope, receive: Receive, send: Send, path: str
    ) -> None:
        trace = RequestTrace(self, scope, path)

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                trace.status = message["status"]
            await send(message)

        try:
            await handler(scope, receive, traced_send, path, trace)
        except BaseException as exc:
            trace.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise
        finally:
            trace.end()

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes the batch processor


class _UnsampledContexts:
    """Fresh W3C contexts with the sampled flag off, rendered 256 at a time from one
    `os.urandom` draw, so a request takes one slice: a `getrandbits` pair and its `%x`
    format per request cost more than the rest of the ratio-0 path. Random as the SDK's
    ids are; an all-zero span id (W3C: invalid) has odds of 2**-64 and is not checked."""

    PER_DRAW = 256
    TEMPLATE = b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-00"
    WIDTH = len(TEMPLATE)  # 55 bytes
    ID_AT = ((3, 32), (36, 16))  # (offset, hex digits) of the trace id and the span id

    def __init__(self) -> None:
        self._buf = b""
        self._at = 0

    def _draw(self) -> bytes:
        count, width = self.PER_DRAW, self.WIDTH
        digits = os.urandom(count * 24).hex().encode()  # 48 hex digits a context
        out = bytearray(self.TEMPLATE * count)
        src = 0
        for offset, n in self.ID_AT:  # one strided copy per digit position (C loops)
            for j in range(n):
                out[offset + j :: width] = digits[src + j :: 48]
            src += n
        return bytes(out)

    def next(self) -> bytes:
        at = self._at
        if at >= len(self._buf):
            self._buf = self._draw()
            at = 0
        self._at = at + self.WIDTH
        return self._buf[at : at + self.WIDTH]


def _trace_headers(span: Span) -> bytes:
    """W3C `traceparent` (version 00) naming `span`, and `tracestate` when there is one:
    formatted directly, the propagator's generic carrier costs more per request."""
    ctx = span.get_span_context()
    head = b"traceparent: 00-%032x-%016x-%02x\r\n" % (ctx.trace_id, ctx.span_id, ctx.trace_flags)
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return head + (b"tracestate: " + state.encode("latin-1") + b"\r\n" if state else b"")


def _ns(loop_time: float, offset_ns: int) -> int:
    return offset_ns + int(loop_time * 1e9)


class RequestTrace:
    """One request's spans. The proxy calls `admitted`, `queued`, `routed`, `upstream` and
    `finish` with its event-loop clock readings; spans are built from them at the end."""

    __slots__ = (
        "_offset",
        "_recording",
        "_root",
        "_start_ns",
        "_t0",
        "_t_admitted",
        "_t_queued",
        "_t_routed",
        "_t_sent",
        "_tracing",
        "_upstream",
        "error",
        "status",
    )

    def __init__(self, tracing: Tracing, scope: Scope, path: str) -> None:
        self._tracing = tracing
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name == b"traceparent" or name == b"tracestate":
                carrier[name.decode()] = value.decode("latin-1")
        parent = tracing.propagator.extract(carrier) if carrier else None
        now_ns = time.time_ns()
        self._t0 = asyncio.get_running_loop().time()
        # The proxy reads the event loop's monotonic clock; map it onto wall-clock ns.
        self._offset = now_ns - int(self._t0 * 1e9)
        self._start_ns = now_ns
        self._root: Span = tracing.tracer.start_span(
            f"{scope['method']} {path}", context=parent, kind=tracing.server_kind,
            start_time=now_ns,
            attributes={"http.request.method": scope["method"], "url.path": path},
        )
        self._t_admitted: float | None = None
        self._t_queued: float | None = None
        self._t_routed: float | None = None
        self._t_sent: float | None = None
        self._upstream: Span | None = None
        # Not sampled: no phase spans at all, and the engine gets the root's context
        # (sampled flag off) instead of an upstream span's.
        self._recording = self._root.is_recording()
        self.status = 0
        self.error: str | None = None

    def _child(self, name: str, start: float, end: float, parent: Span | None = None,
               **attributes: Any) -> None:  # fmt: skip
        ctx = self._tracing.in_context(parent or self._root)
        span = self._tracing.tracer.start_span(
            name, context=ctx, start_time=_ns(start, self._offset), attributes=attributes
        )
        span.end(end_time=_ns(end, self._offset))

    # ---- what the proxy reports --------------------------------------------------------

    def admitted(self, t: float, model: str) -> None:
        self._t_admitted = t
        self._root.set_attribute("gen_ai.request.model", model)

    def queued(self, t: float) -> None:
        self._t_queued = t

    def routed(self, t: float) -> None:
        self._t_routed = t

    def upstream(self, t_sent: float, replica: str, url: str) -> bytes:
        """Start the CLIENT span of the call to the engine; the header lines that carry it
        (`traceparent` with this span's id, and the client's `tracestate`)."""
        tracing = self._tracing
        if not self._recording:
            return _trace_headers(self._root)
        if self._upstream is None:
            self._t_sent = t_sent
            self._upstream = tracing.tracer.start_span(
                "gateway.upstream", context=tracing.in_context(self._root),
                kind=tracing.client_kind, start_time=_ns(t_sent, self._offset),
            )
        self._upstream.set_attribute("inferplane.replica", replica)
        self._upstream.set_attribute("server.address", url)
        return _trace_headers(self._upstream)

    def finish(self, t_end: float, request_id: str, replica: str, status: int, ttft_s: float,
               stream: bool, retries: int, prompt_tokens: int,
               completion_tokens: int) -> None:  # fmt: skip
        """The request is done: build the phase spans and end the upstream span."""
        if not self._recording:
            return
        root = self._root
        root.set_attribute("inferplane.request_id", request_id)
        root.set_attribute("inferplane.replica", replica)
        root.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        root.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
        admitted = self._t_admitted
        if admitted is not None:
            self._child("gateway.admission", min(self._t0, admitted), admitted)
            routed = self._t_routed if self._t_routed is not None else t_end
            first = self._t_queued if self._t_queued is not None else routed
            self._child("gateway.route", admitted, first, replica=replica)
            if self._t_queued is not None:
                self._child("gateway.queue_wait", self._t_queued, routed)
        up = self._upstream
        if up is not None and self._t_sent is not None:
            sent = self._t_sent
            up.set_attribute("http.response.status_code", status)
            up.set_attribute("inferplane.retries", retries)
            if ttft_s > 0:
                first_byte = sent + ttft_s
                self._child("upstream.first_token", sent, first_byte, up, ttft_s=ttft_s)
                if stream:
                    self._child("upstream.stream", first_byte, max(first_byte, t_end), up)
            if status >= 500:
                up.set_status(self._tracing.error_status(f"HTTP {status}"))
            up.end(end_time=_ns(t_end, self._offset))
            self._upstream = None

    def end(self) -> None:
        """End the SERVER span (also for requests refused before routing)."""
        root = self._root
        if not self._recording:
            root.end()
            return
        error = self._tracing.error_status
        # Ends on the same mapped loop clock as the phase spans: the wall clock drifts from
        # it, and a child would then end after its parent.
        t_now = asyncio.get_running_loop().time()
        if self._t_admitted is None:  # refused before routing (bad body, key, model)
            self._child("gateway.admission", self._t0, t_now)
        if self._upstream is not None:  # cancelled before `finish`
            self._upstream.end(end_time=_ns(t_now, self._offset))
            self._upstream = None
        if self.status:
            root.set_attribute("http.response.status_code", self.status)
        if self.error is not None:
            root.set_status(error(self.error))
        elif self.status >= 500:
            root.set_status(error(f"HTTP {self.status}"))
        root.end(end_time=max(_ns(t_now, self._offset), self._start_ns))
