"""The monitoring files for one host: Prometheus config, alert rules, Grafana dashboard.

The rules and the dashboard are the Kubernetes renderer's own (`inferplane.deploy.k8s.
monitoring`): the PrometheusRule's groups become a plain Prometheus rules file and the
dashboard JSON is the one its ConfigMap carries, so a threshold or a panel changes in one
place. They select `namespace="<namespace>"`; the scrape targets carry that label (see
`inferplane.monitoring.targets`), so the same expressions work on one host.

    DIR/prometheus.yml                              prometheus --config.file=DIR/prometheus.yml
    DIR/rules.yml                                   the P49 alerts (promtool check rules)
    DIR/targets/gateway.json, targets/engines.json  file_sd, rewritten as replicas change
    DIR/grafana/dashboards/inferplane.json          the dashboard
    DIR/grafana/provisioning/...                    datasource + dashboard provider
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplane.deploy.k8s.context import K8sContext
from inferplane.deploy.k8s.monitoring import dashboard, prometheus_rule
from inferplane.deploy.options import RenderOptions
from inferplane.deploy.yamlio import dump_docs, write_atomic
from inferplane.monitoring.targets import ENGINES_TARGETS, GATEWAY_TARGETS, Target, TargetsWriter
from inferplane.planner.plan import Plan
from inferplane.spec import FleetSpec

NAMESPACE = "inferplane"  # RenderOptions' default: what `render` would select on, too
RULES_FILE = "rules.yml"
PROMETHEUS_FILE = "prometheus.yml"
DASHBOARD_FILE = "grafana/dashboards/inferplane.json"
DATASOURCE_FILE = "grafana/provisioning/datasources/inferplane.yml"
PROVIDER_FILE = "grafana/provisioning/dashboards/inferplane.yml"
METRICS_TOKEN_FILE = "gateway-metrics-token"  # Prometheus reads it (credentials_file)
SCRAPE_INTERVAL = "15s"  # as the Kubernetes PodMonitors
PROMETHEUS_URL = "http://localhost:9090"


@dataclass(frozen=True)
class MonitoringFiles:
    """Text of every static file, by path relative to the output directory."""

    files: dict[str, str]

    def write(self, out: Path) -> list[Path]:
        written = []
        for rel, text in sorted(self.files.items()):
            write_atomic(out / rel, text)
            written.append(out / rel)
        return written


def context(fleet: FleetSpec, plan: Plan, namespace: str = NAMESPACE) -> K8sContext:
    return K8sContext(fleet, plan, RenderOptions(namespace=namespace))


def rules(ctx: K8sContext) -> dict[str, Any]:
    """The PrometheusRule's groups as a Prometheus rules file (a JSON round trip: the rule
    dicts share their label dicts, which YAML would write as anchors)."""
    groups = prometheus_rule(ctx)["spec"]["groups"]
    return {"groups": json.loads(json.dumps(groups))}


def prometheus_config(
    targets_dir: Path | None = None, metrics_token_file: str | None = None
) -> dict[str, Any]:
    """Scrape the gateway and every engine from the file_sd files; `targets_dir` None:
    `targets/` beside the config (Prometheus resolves relative paths from the config's
    directory), else that directory (a running fleet's live files)."""
    base = "" if targets_dir is None else str(targets_dir.resolve()) + "/"
    gateway_file = base + GATEWAY_TARGETS.removeprefix("targets/") if base else GATEWAY_TARGETS
    engines_file = base + ENGINES_TARGETS.removeprefix("targets/") if base else ENGINES_TARGETS
    gateway_job: dict[str, Any] = {
        "job_name": "inferplane-gateway",
        "metrics_path": "/metrics",
        "file_sd_configs": [{"files": [gateway_file]}],
    }
    if metrics_token_file is not None:  # gateway.metrics_token_env: /metrics needs it
        gateway_job["authorization"] = {"type": "Bearer", "credentials_file": metrics_token_file}
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [RULES_FILE],
        "scrape_configs": [
            gateway_job,
            {
                "job_name": "inferplane-engines",
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [engines_file]}],
            },
        ],
    }


def _grafana_provisioning(out: Path) -> dict[str, str]:
    datasource = {
        "apiVersion": 1,
        "datasources": [{
            "name": "Prometheus", "type": "prometheus", "access": "proxy",
            "url": PROMETHEUS_URL, "isDefault": True,
        }],
    }  # fmt: skip
    provider = {
        "apiVersion": 1,
        "providers": [{
            "name": "inferplane", "type": "file", "disableDeletion": False,
            "options": {"path": str((out / DASHBOARD_FILE).parent.resolve())},
        }],
    }  # fmt: skip
    return {DATASOURCE_FILE: dump_docs([datasource]), PROVIDER_FILE: dump_docs([provider])}


def monitoring_files(
    fleet: FleetSpec,
    plan: Plan,
    out: Path,
    *,
    namespace: str = NAMESPACE,
    targets_dir: Path | None = None,
    metrics_token_file: str | None = None,
) -> MonitoringFiles:
    ctx = context(fleet, plan, namespace)
    files = {
        PROMETHEUS_FILE: dump_docs([prometheus_config(targets_dir, metrics_token_file)]),
        RULES_FILE: dump_docs([rules(ctx)]),
        DASHBOARD_FILE: json.dumps(dashboard(ctx), indent=2, sort_keys=True) + "\n",
        **_grafana_provisioning(out),
    }
    return MonitoringFiles(files)


def write_monitoring(
    out: Path,
    fleet: FleetSpec,
    plan: Plan,
    gateway: Iterable[Target],
    engines: Iterable[Target],
    *,
    namespace: str = NAMESPACE,
    metrics_token: str | None = None,
) -> TargetsWriter:
    """Write every file into `out`; the returned writer keeps the targets current."""
    token_file = None
    if metrics_token:
        token_file = METRICS_TOKEN_FILE
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / METRICS_TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(metrics_token + "\n")
    monitoring_files(
        fleet, plan, out, namespace=namespace, metrics_token_file=token_file
    ).write(out)
    writer = TargetsWriter(out, namespace)
    writer.update(gateway, engines)
    return writer
