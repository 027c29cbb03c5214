"""Monitoring for one host (issue 16, item 3): the rules and dashboard are the Kubernetes
renderer's own; every alert fires and stays quiet where it should (`promtool test rules`
on synthetic series); the dashboard passes Grafana's schema types and names only metrics
that the gateway or the simulated vLLM export; `inferplane monitoring` writes the files."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_gateway_fakes import Harness, harness, http  # noqa: F401
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.deploy.k8s.monitoring import (
    KV_ALERT,
    RUNNING_ALERT_FRACTION,
    THROUGHPUT_ALERT_FRACTION,
    WAITING_ALERT,
    dashboard_configmap,
    prometheus_rule,
)
from inferplane.errors import InferplaneError
from inferplane.gateway import GatewayConfig, ModelRoute
from inferplane.monitoring.files import context, monitoring_files, write_monitoring
from inferplane.monitoring.targets import Target, TargetsWriter
from inferplane.planner import plan_fleet
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.host import start_engine
from inferplane.spec import load_fleet

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "examples" / "demo.yaml"  # three models, two co-located: several thresholds
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian: apt-get install prometheus)",
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = load_fleet(FLEET)
    plan = plan_fleet(spec, fleet_file=str(FLEET))
    out = tmp_path_factory.mktemp("monitoring")
    engines = [Target(f"127.0.0.1:{i.port}", i.id, "engine", i.model) for i in plan.instances]
    write_monitoring(out, spec, plan, [Target("127.0.0.1:8000", "gateway", "gateway")], engines)
    return out


def _rules(out: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load((out / "rules.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


# ---- one source ------------------------------------------------------------------------


def test_rules_and_dashboard_are_the_kubernetes_renderers(written: Path) -> None:
    spec = load_fleet(FLEET)
    ctx = context(spec, plan_fleet(spec, fleet_file=str(FLEET)))
    rule = prometheus_rule(ctx)
    assert yaml.safe_load((written / "rules.yml").read_text()) == {"groups": rule["spec"]["groups"]}
    shipped = json.loads(dashboard_configmap(ctx)["data"]["inferplane.json"])
    assert json.loads((written / "grafana/dashboards/inferplane.json").read_text()) == shipped


@needs_promtool
def test_promtool_accepts_the_config_and_rules(written: Path) -> None:
    assert PROMTOOL is not None
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "rules.yml"]):
        done = subprocess.run([PROMTOOL, *args], cwd=written, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_config_scrapes_the_file_sd_targets(written: Path) -> None:
    config = yaml.safe_load((written / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["inferplane-gateway"]["file_sd_configs"] == [{"files": ["targets/gateway.json"]}]
    assert jobs["inferplane-engines"]["file_sd_configs"] == [{"files": ["targets/engines.json"]}]
    assert config["rule_files"] == ["rules.yml"]
    groups = json.loads((written / "targets/engines.json").read_text())
    spec = load_fleet(FLEET)
    plan = plan_fleet(spec, fleet_file=str(FLEET))
    assert {g["labels"]["pod"] for g in groups} == {i.id for i in plan.instances}
    assert all(g["labels"]["namespace"] == "inferplane" for g in groups)


# ---- promtool test rules: every alert, firing and quiet ------------------------------


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def _expected(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    def fill(text: str) -> str:
        for key, value in labels.items():
            text = text.replace(f"{{{{ $labels.{key} }}}}", value)
        return text

    return {
        "exp_labels": {**rule["labels"], **labels},
        "exp_annotations": {k: fill(v) for k, v in rule["annotations"].items()},
    }


def _engine_case(rule: dict[str, Any], metric: str, above: float, at: float,
                 served: str) -> list[dict[str, Any]]:  # fmt: skip
    """Above the threshold for 10 minutes: fires; exactly at it, or above it for less
    than the rule's `for`: quiet."""
    pod = f"{rule['labels']['model']}-0"
    labels = {"namespace": "inferplane", "model_name": served, "pod": pod, "engine": "0"}
    name = rule["alert"]
    minutes = int(rule["for"].removesuffix("m"))
    return [
        {"interval": "1m", "input_series": [_series(metric, labels, f"{above:g}x15")],
         "alert_rule_test": [{"eval_time": "12m", "alertname": name,
                              "exp_alerts": [_expected(rule, {"pod": pod})]}]},
        {"interval": "1m", "input_series": [_series(metric, labels, f"{at:g}x15")],
         "alert_rule_test": [{"eval_time": "12m", "alertname": name, "exp_alerts": []}]},
        {"interval": "1m",  # above for less than `for`, then back at the threshold
         "input_series": [_series(metric, labels, f"{above:g}x{minutes - 2} {at:g}x15")],
         "alert_rule_test": [{"eval_time": f"{minutes}m", "alertname": name,
                              "exp_alerts": []}]},
    ]  # fmt: skip


def _throughput_case(rule: dict[str, Any], served: str) -> list[dict[str, Any]]:
    """Tokens/s today vs the same time yesterday: under half fires; 60% and a day with
    no traffic yesterday stay quiet."""
    labels = {"namespace": "inferplane", "model_name": served, "pod": "x-0", "engine": "0"}
    metric = "vllm:generation_tokens_total"
    day = 1440  # one-minute samples

    def run(yesterday_per_min: int, today_per_min: int) -> str:
        start = yesterday_per_min * day
        return f"0+{yesterday_per_min}x{day} {start}+{today_per_min}x60"

    base = 6000
    low = math.floor(base * THROUGHPUT_ALERT_FRACTION * 0.8)
    ok = math.ceil(base * THROUGHPUT_ALERT_FRACTION * 1.2)
    name = rule["alert"]
    check = "1d40m"
    return [
        {"interval": "1m", "input_series": [_series(metric, labels, run(base, low))],
         "alert_rule_test": [{"eval_time": check, "alertname": name,
                              "exp_alerts": [_expected(rule, {})]}]},
        {"interval": "1m", "input_series": [_series(metric, labels, run(base, ok))],
         "alert_rule_test": [{"eval_time": check, "alertname": name, "exp_alerts": []}]},
        {"interval": "1m", "input_series": [_series(metric, labels, run(0, low))],
         "alert_rule_test": [{"eval_time": check, "alertname": name, "exp_alerts": []}]},
    ]  # fmt: skip


def _queue_wait_case(rule: dict[str, Any]) -> list[dict[str, Any]]:
    """Gateway queue wait: every request waiting 5-10 s fires (p95 above 5 s); under a
    second stays quiet."""
    metric = "inferplane_queue_wait_seconds_bucket"
    base = {"namespace": "inferplane", "model": "m", "pod": "gateway"}

    def buckets(slow: bool) -> list[dict[str, str]]:
        out = []
        for le in ("1.0", "5.0", "10.0", "+Inf"):
            counted = le in ("10.0", "+Inf") if slow else True
            out.append(_series(metric, {**base, "le": le}, "0+10x20" if counted else "0x20"))
        return out

    name = rule["alert"]
    return [
        {"interval": "1m", "input_series": buckets(slow=True),
         "alert_rule_test": [{"eval_time": "15m", "alertname": name,
                              "exp_alerts": [_expected(rule, {"model": "m"})]}]},
        {"interval": "1m", "input_series": buckets(slow=False),
         "alert_rule_test": [{"eval_time": "15m", "alertname": name, "exp_alerts": []}]},
    ]  # fmt: skip


@needs_promtool
def test_promtool_every_alert_fires_and_stays_quiet(written: Path) -> None:
    assert PROMTOOL is not None
    spec = load_fleet(FLEET)
    plan = plan_fleet(spec, fleet_file=str(FLEET))
    served = {i.model: i.served_model_name for i in plan.instances}
    seqs = {i.model: i.max_num_seqs for i in plan.instances}
    cases: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
        "InferplaneEngineNearMaxNumSeqs": lambda r: _engine_case(
            r, "vllm:num_requests_running",
            math.floor(RUNNING_ALERT_FRACTION * seqs[r["labels"]["model"]]) + 1,
            RUNNING_ALERT_FRACTION * seqs[r["labels"]["model"]], served[r["labels"]["model"]],
        ),
        "InferplaneEngineQueueBacklog": lambda r: _engine_case(
            r, "vllm:num_requests_waiting", WAITING_ALERT + 1, WAITING_ALERT,
            served[r["labels"]["model"]],
        ),
        "InferplaneKvCacheFull": lambda r: _engine_case(
            r, "vllm:kv_cache_usage_perc", 0.97, KV_ALERT, served[r["labels"]["model"]]
        ),
        "InferplaneThroughputDropped": lambda r: _throughput_case(
            r, served[r["labels"]["model"]]
        ),
        "InferplaneGatewayQueueWait": _queue_wait_case,
    }  # fmt: skip
    rules = _rules(written)
    missing = {r["alert"] for r in rules} - set(cases)
    assert not missing, f"alerts without a promtool case: {missing}"
    tests: list[dict[str, Any]] = []
    throughput_done = False
    for rule in rules:
        if rule["alert"] == "InferplaneThroughputDropped":
            # A day of samples per case: one model's rule covers the expression (each
            # model's differs only in its model_name), and keeps promtool to seconds.
            if throughput_done:
                continue
            throughput_done = True
        tests += cases[rule["alert"]](rule)
    (written / "rules_test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    ))  # fmt: skip
    done = subprocess.run(
        [PROMTOOL, "test", "rules", "rules_test.yml"], cwd=written, capture_output=True,
        text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    assert len(tests) >= 2 * len({r["alert"] for r in rules})


@needs_promtool
def test_promtool_cases_can_fail(written: Path) -> None:
    """The harness has teeth: expecting the KV alert on a quiet series fails promtool."""
    assert PROMTOOL is not None
    rule = next(r for r in _rules(written) if r["alert"] == "InferplaneKvCacheFull")
    model = rule["labels"]["model"]
    case = _engine_case(rule, "vllm:kv_cache_usage_perc", 0.97, KV_ALERT, model)[1]
    case["alert_rule_test"][0]["exp_alerts"] = [_expected(rule, {"pod": f"{model}-0"})]
    (written / "wrong_test.yml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yml"], "tests": [case]})
    )
    done = subprocess.run([PROMTOOL, "test", "rules", "wrong_test.yml"], cwd=written,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0


# ---- the dashboard ---------------------------------------------------------------------


def _missing_in(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Paths of `ours` that `theirs` lacks or holds differently."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [path or "."]
        out: list[str] = []
        for key, value in ours.items():
            out += [f"{path}.{key}"] if key not in theirs else _missing_in(
                value, theirs[key], f"{path}.{key}"
            )
        return out
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [path]
        return [m for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                for m in _missing_in(a, b, f"{path}[{i}]")]  # fmt: skip
    return [] if ours == theirs else [path]


def _grafana_round_trip(board: dict[str, Any]) -> dict[str, Any]:
    """Decode with the types generated from Grafana's own dashboard schema (the CUE kinds,
    grafana-foundation-sdk) and encode again: what the schema does not know is dropped."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()  # panel and Prometheus query types
    decoded: dict[str, Any] = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    return decoded


def test_dashboard_passes_grafanas_schema(written: Path) -> None:
    board = json.loads((written / "grafana/dashboards/inferplane.json").read_text())
    assert _missing_in(board, _grafana_round_trip(board)) == []
    typo = json.loads(json.dumps(board))
    typo["panels"][0]["gridPoss"] = typo["panels"][0].pop("gridPos")
    assert _missing_in(typo, _grafana_round_trip(typo)) == [".panels[0].gridPoss"]
    # What Grafana needs beyond field names: a uid of at most 40 characters, unique panel
    # ids, panels inside the 24-column grid without overlap, queries with refIds, and the
    # datasource variable the panels name.
    assert 0 < len(board["uid"]) <= 40
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] >= 1 and pos["x"] + pos["w"] <= 24
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not mine & cells, panel["title"]
        cells |= mine
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"])
        assert panel["datasource"]["uid"] == "${datasource}"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"


_METRIC = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")


def _exported(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_query_names_a_metric_the_gateway_or_the_engine_exports(
    written: Path, harness: Harness,  # noqa: F811
) -> None:
    sim = harness.run(start_engine(SimEngineConfig(model="m", max_model_len=1024)))
    try:
        _, gateway = harness.gateway(
            GatewayConfig(models=(ModelRoute("m", endpoints=(sim.url,)),), access_log=False)
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert http.post(gateway + "/v1/chat/completions", json=body).status_code == 200
        with http.stream("POST", gateway + "/v1/chat/completions",
                         json={**body, "stream": True}) as r:  # fmt: skip
            r.read()
        exported = _exported(http.get(gateway + "/metrics").text)
        exported |= _exported(http.get(sim.url + "/metrics").text)
    finally:
        harness.run(sim.stop())
    board = json.loads((written / "grafana/dashboards/inferplane.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [r["expr"] for r in _rules(written)]
    for expr in exprs:
        names = _METRIC.findall(expr)
        assert names, expr
        unknown = [n for n in names if n not in exported]
        assert not unknown, f"{expr}: {unknown} not in the gateway's or the engine's /metrics"


# ---- the files and the CLI -------------------------------------------------------------


def test_targets_are_rewritten_only_when_they_change(tmp_path: Path) -> None:
    writer = TargetsWriter(tmp_path, "inferplane")
    gw = [Target("127.0.0.1:8000", "gateway", "gateway")]
    one = [Target("127.0.0.1:9001", "m-0", "engine", "m")]
    assert writer.update(gw, one)
    path = tmp_path / "targets/engines.json"
    inode = path.stat().st_ino
    assert not writer.update(gw, one) and path.stat().st_ino == inode
    two = [*one, Target("127.0.0.1:9002", "m-1", "engine", "m")]
    assert writer.update(gw, two) and path.stat().st_ino != inode  # a new file, renamed in
    labels = [g["labels"] for g in json.loads(path.read_text())]
    assert labels[1] == {"namespace": "inferplane", "pod": "m-1", "component": "engine",
                         "inferplane_model": "m"}  # fmt: skip
    assert Target.from_url("http://0.0.0.0:8000", "gateway", "gateway").address == (
        "127.0.0.1:8000"
    )


def _cli(*args: str) -> tuple[int, str]:
    _register_commands()
    result = CliRunner().invoke(app, ["monitoring", *args])
    if isinstance(result.exception, InferplaneError):
        return 2, result.exception.render()
    return result.exit_code, result.output


def test_monitoring_command_writes_everything_from_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no running fleet here
    vllm = ROOT / "examples" / "single-7b-a100.yaml"
    code, out = _cli(str(vllm), "--out", str(tmp_path / "mon"), "--json")
    assert code == 0, out
    doc = json.loads(out)
    plan = plan_fleet(load_fleet(vllm), fleet_file=str(vllm))
    engines = doc["targets"]["engines"]
    assert [g["targets"] for g in engines] == [[f"127.0.0.1:{i.port}"] for i in plan.instances]
    assert doc["targets"]["gateway"][0]["targets"] == ["127.0.0.1:8000"]
    for name in ("prometheus.yml", "rules.yml", "targets/engines.json",
                 "grafana/dashboards/inferplane.json",
                 "grafana/provisioning/datasources/inferplane.yml",
                 "grafana/provisioning/dashboards/inferplane.yml"):  # fmt: skip
        assert (tmp_path / "mon" / name).is_file(), name
    provider = yaml.safe_load(
        (tmp_path / "mon/grafana/provisioning/dashboards/inferplane.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == str(
        (tmp_path / "mon/grafana/dashboards").resolve()
    )
    code, out = _cli(str(FLEET), "--out", str(tmp_path / "sim"))
    assert code == 0 and "engine: sim picks engine ports at start" in out
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text('models:\n  - name: m\n    endpoints: ["http://127.0.0.1:9"]\n')
    code, out = _cli(str(endpoints), "--out", str(tmp_path / "none"))
    assert code == 2 and "gpus" in out and "--plan" in out
    code, out = _cli("--out", str(tmp_path / "none"))
    assert code == 2 and "no fleet running" in out


def test_monitoring_files_use_a_running_fleets_live_targets(tmp_path: Path) -> None:
    spec = load_fleet(FLEET)
    plan = plan_fleet(spec, fleet_file=str(FLEET))
    live = tmp_path / "state" / "monitoring" / "targets"
    files = monitoring_files(spec, plan, tmp_path / "out", targets_dir=live)
    config = yaml.safe_load(files.files["prometheus.yml"])
    found = [c["file_sd_configs"][0]["files"][0] for c in config["scrape_configs"]]
    assert found == [str(live.resolve() / "gateway.json"), str(live.resolve() / "engines.json")]
