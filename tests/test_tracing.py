"""Tracing (issue 16, item 2): W3C trace context in and out, and the gateway's spans for a
streamed request to a simulated engine, read back from an in-memory OTLP exporter."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_gateway_fakes import FakeEngine, Harness, harness, http  # noqa: F401

from inferplane.errors import InferplaneError
from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.gateway.tracing import TracingConfig, config_from_env, traces_url, tracing_for
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import EngineHandle, start_engine
from inferplane.spec import load_fleet

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
STREAM = {
    "model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8,
    "stream": True, "stream_options": {"include_usage": True},
}  # fmt: skip


@pytest.fixture()
def sim(harness: Harness) -> Iterator[EngineHandle]:  # noqa: F811
    handle = harness.run(start_engine(SimEngineConfig(model="m", max_model_len=1024)))
    yield handle
    harness.run(handle.stop())


def _traced(harness: Harness, url: str) -> tuple[InMemorySpanExporter, str]:  # noqa: F811
    exporter = InMemorySpanExporter()
    config = GatewayConfig(
        models=(ModelRoute("m", endpoints=(url,)),), access_log=False,
        tracing=TracingConfig(exporter=exporter),
    )
    _, gateway = harness.gateway(config)
    return exporter, gateway


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def _finished(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The spans by name once the SERVER span ended: it ends just after the response's
    last message, which the client may see first."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        spans = _by_name(tuple(exporter.get_finished_spans()))
        if any(s.kind == SpanKind.SERVER for s in spans.values()):
            return spans
        time.sleep(0.01)
    raise AssertionError("the request's SERVER span never ended")


def test_streamed_request_spans_and_their_links(harness: Harness, sim: EngineHandle) -> None:  # noqa: F811
    exporter, gateway = _traced(harness, sim.url)
    with http.stream(
        "POST", gateway + "/v1/chat/completions", json=STREAM,
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1", "X-Request-ID": "t-1"},
    ) as r:
        body = r.read()
    assert r.status_code == 200 and body.endswith(b"data: [DONE]\n\n")
    spans = _finished(exporter)
    assert set(spans) == {
        "POST /v1/chat/completions", "gateway.admission", "gateway.route",
        "gateway.upstream", "upstream.first_token", "upstream.stream",
    }  # no queue_wait: a replica was free
    root = spans["POST /v1/chat/completions"]
    # One trace, the client's; the root is the child of the client's span.
    assert {format(s.context.trace_id, "032x") for s in spans.values()} == {CLIENT_TRACE}
    assert root.kind == SpanKind.SERVER
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN
    for name in ("gateway.admission", "gateway.route", "gateway.upstream"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == root.context.span_id, name
    upstream = spans["gateway.upstream"]
    assert upstream.kind == SpanKind.CLIENT
    for name in ("upstream.first_token", "upstream.stream"):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == upstream.context.span_id, name
    # Phases in order, inside the root span.
    adm, route = spans["gateway.admission"], spans["gateway.route"]
    first, rest = spans["upstream.first_token"], spans["upstream.stream"]
    assert root.start_time <= adm.start_time <= adm.end_time <= route.start_time
    assert route.end_time <= upstream.start_time == first.start_time
    assert first.end_time == rest.start_time <= rest.end_time <= upstream.end_time
    assert upstream.end_time <= root.end_time
    attrs = root.attributes
    assert attrs["inferplane.request_id"] == "t-1" and attrs["gen_ai.request.model"] == "m"
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.usage.output_tokens"] == 8 and attrs["gen_ai.usage.input_tokens"] > 0
    assert root.resource.attributes["service.name"] == "inferplane-gateway"


def test_forwarded_traceparent_names_the_upstream_span(harness: Harness) -> None:  # noqa: F811
    engine: FakeEngine = harness.engine("m")
    exporter, gateway = _traced(harness, engine.url)
    r = http.post(
        gateway + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
    )
    assert r.status_code == 200
    sent = engine.headers[-1]
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
    assert span_id != CLIENT_SPAN  # a new child span id: the gateway's upstream span
    upstream = _finished(exporter)["gateway.upstream"]
    assert span_id == format(upstream.context.span_id, "016x")
    assert sent["tracestate"] == "vendor=1"


def test_without_a_client_traceparent_the_gateway_starts_the_trace(harness: Harness) -> None:  # noqa: F811
    engine: FakeEngine = harness.engine("m")
    exporter, gateway = _traced(harness, engine.url)
    http.post(gateway + "/v1/completions", json={"model": "m", "prompt": "x"})
    spans = _finished(exporter)
    root = spans["POST /v1/completions"]
    assert root.parent is None
    _, trace_id, _, _ = engine.headers[-1]["traceparent"].split("-")
    assert trace_id == format(root.context.trace_id, "032x")


def test_a_refused_request_still_gets_its_server_span(harness: Harness) -> None:  # noqa: F811
    engine: FakeEngine = harness.engine("m")
    exporter, gateway = _traced(harness, engine.url)
    r = http.post(gateway + "/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    spans = _finished(exporter)
    assert set(spans) == {"POST /v1/completions", "gateway.admission"}
    assert spans["POST /v1/completions"].attributes["http.response.status_code"] == 404


def test_tracing_off_passes_the_client_context_through_unchanged(harness: Harness) -> None:  # noqa: F811
    engine: FakeEngine = harness.engine("m")
    app, gateway = harness.gateway(
        GatewayConfig(models=(ModelRoute("m", endpoints=(engine.url,)),), access_log=False)
    )
    assert app.tracing is None  # no tracer, no span objects on the hot path
    http.post(
        gateway + "/v1/completions", json={"model": "m", "prompt": "x"},
        headers={"traceparent": TRACEPARENT, "tracestate": "a=b"},
    )
    assert engine.headers[-1]["traceparent"] == TRACEPARENT
    assert engine.headers[-1]["tracestate"] == "a=b"
    http.post(gateway + "/v1/completions", json={"model": "m", "prompt": "x"})
    assert "traceparent" not in engine.headers[-1]


def test_otel_environment_turns_tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME",
                 "OTEL_TRACES_SAMPLER_ARG"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    assert config_from_env() is None and tracing_for(None) is None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SERVICE_NAME": "gw",
           "OTEL_TRACES_SAMPLER_ARG": "0.25"}  # fmt: skip
    config = config_from_env(env)
    assert config is not None and (config.service_name, config.sample_ratio) == ("gw", 0.25)
    assert config_from_env({**env, "OTEL_SDK_DISABLED": "true"}) is None
    assert config_from_env({**env, "OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(InferplaneError, match="OTEL_TRACES_SAMPLER_ARG"):
        config_from_env({**env, "OTEL_TRACES_SAMPLER_ARG": "half"})
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/custom/path") == "http://c:4318/custom/path"


def test_fleet_file_tracing_settings(tmp_path: Path) -> None:
    from inferplane.gateway.fleet import gateway_config_from_fleet

    base = tmp_path
    ok = base / "ok.yaml"
    ok.write_text(
        'models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n'
        "gateway:\n  tracing:\n    otlp_endpoint: http://localhost:4318\n"
        "    service_name: edge\n    sample_ratio: 0.5\n"
    )
    tracing = gateway_config_from_fleet(load_fleet(ok)).tracing
    assert tracing == TracingConfig("http://localhost:4318", "edge", 0.5)
    cases = (("otlp_endpoint: localhost:4318", "otlp_endpoint"),
             ("sample_ratio: 2", "sample_ratio"), ("exporter: jaeger", "exporter"))
    for bad, field in cases:
        path = base / "bad.yaml"
        path.write_text(
            'models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n'
            f"gateway:\n  tracing:\n    {bad}\n"
        )
        with pytest.raises(InferplaneError) as info:
            load_fleet(path)
        assert field in info.value.render()
    with pytest.raises(InferplaneError, match="sample_ratio"):
        TracingConfig(sample_ratio=1.5)


def test_an_unsampled_request_makes_no_spans_and_says_so_downstream(harness: Harness) -> None:  # noqa: F811
    engine: FakeEngine = harness.engine("m")
    exporter = InMemorySpanExporter()
    _, gateway = harness.gateway(GatewayConfig(
        models=(ModelRoute("m", endpoints=(engine.url,)),), access_log=False,
        tracing=TracingConfig(exporter=exporter, sample_ratio=0.0),
    ))  # fmt: skip
    assert http.post(gateway + "/v1/completions", json={"model": "m", "prompt": "x"}).is_success
    version, trace_id, _, flags = engine.headers[-1]["traceparent"].split("-")
    assert version == "00" and len(trace_id) == 32
    assert int(flags, 16) & 1 == 0  # the sampled bit is off (0x02: W3C's random-id flag)
    unsampled_parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"
    http.post(gateway + "/v1/completions", json={"model": "m", "prompt": "x"},
              headers={"traceparent": unsampled_parent})  # fmt: skip
    assert engine.headers[-1]["traceparent"].split("-")[1] == CLIENT_TRACE
    time.sleep(0.1)
    assert exporter.get_finished_spans() == ()


def test_unsampled_contexts_are_fresh_w3c_ids_across_draws() -> None:
    import re

    from inferplane.gateway.tracing import _UnsampledContexts

    contexts = _UnsampledContexts()
    seen = [contexts.next() for _ in range(3 * _UnsampledContexts.PER_DRAW + 1)]
    assert len(set(seen)) == len(seen)  # three refills: no id repeats across draws
    assert len({c.split(b"-")[1] for c in seen}) == len(seen)
    assert all(re.fullmatch(rb"00-[0-9a-f]{32}-[0-9a-f]{16}-00", c) for c in seen)


def test_tracing_refuses_clearly_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from inferplane.gateway.tracing import Tracing

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.resources", None)  # ImportError
    with pytest.raises(InferplaneError, match=r"pip install 'inferplane\[tracing\]'"):
        Tracing(TracingConfig())


def test_opentelemetry_is_imported_only_when_tracing_is_on() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from inferplane.cli.main import _register_commands\n"
        "_register_commands()\n"
        "import inferplane.gateway.app, inferplane.runtime.runner\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_fleet_file_tracing_exports_over_otlp_http(harness: Harness, tmp_path: Path) -> None:  # noqa: F811
    """gateway.tracing in the fleet file: spans reach an OTLP/HTTP receiver as protobuf
    ExportTraceServiceRequests on /v1/traces (a bare endpoint gets the path added)."""
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from inferplane.gateway.fleet import gateway_config_from_fleet

    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received.append(message)
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def start() -> tuple[web.AppRunner, int]:
        receiver = web.Application()
        receiver.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(receiver, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    runner, port = harness.run(start())
    engine: FakeEngine = harness.engine("m")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        f'models:\n  - name: m\n    endpoints: ["{engine.url}"]\n'
        f"gateway:\n  tracing:\n    otlp_endpoint: http://127.0.0.1:{port}\n"
        "    service_name: edge-gw\n"
    )
    config = gateway_config_from_fleet(load_fleet(fleet))
    app, gateway = harness.gateway(dataclasses.replace(config, access_log=False))
    try:
        r = http.post(gateway + "/v1/completions", json={"model": "m", "prompt": "x"},
                      headers={"X-Request-ID": "otlp-1"})  # fmt: skip
        assert r.status_code == 200
        assert app.tracing is not None
        deadline = time.monotonic() + 30  # a loaded box: the exporter may retry a batch
        names: set[str] = set()
        expected = {"POST /v1/completions", "gateway.admission", "gateway.route",
                    "gateway.upstream", "upstream.first_token"}  # fmt: skip
        # spans may reach the receiver in more than one export batch: wait for all of them
        while not expected <= names and time.monotonic() < deadline:
            app.tracing.provider.force_flush()
            names = {s.name for m in received for rs in m.resource_spans
                     for ss in rs.scope_spans for s in ss.spans}  # fmt: skip
            time.sleep(0.05)
        assert expected <= names
        services = {a.value.string_value for m in received for rs in m.resource_spans
                    for a in rs.resource.attributes if a.key == "service.name"}  # fmt: skip
        assert services == {"edge-gw"}
    finally:
        harness.run(runner.cleanup())
