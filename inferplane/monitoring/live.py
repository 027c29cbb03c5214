"""The running fleet's monitoring files (`inferplane up`): written at start into
`--monitoring DIR` (default STATE/monitoring), targets rewritten on every state change."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplane.errors import InferplaneError
from inferplane.monitoring.targets import Target, TargetsWriter, engine_targets

if TYPE_CHECKING:
    from inferplane.planner.plan import Plan
    from inferplane.spec import FleetSpec

MONITORING_SUBDIR = "monitoring"
_log = logging.getLogger("inferplane.monitoring")


def start_monitoring(
    out: Path,
    fleet: FleetSpec,
    plan: Plan | None,
    status: dict[str, Any],
    metrics_token: str | None = None,
) -> TargetsWriter:
    """Every file for the fleet `status` describes (`Runtime.status()`). Without a plan
    (`gpus: discover`, endpoint-only fleets) there are no per-model thresholds: only the
    targets and the scrape config are written."""
    try:
        return _start(out, fleet, plan, status, metrics_token)
    except OSError as exc:
        raise InferplaneError(
            f"cannot write the monitoring files: {exc}", field="--monitoring", value=str(out),
            fix="pass a writable directory with --monitoring DIR",
        ) from exc


def _start(
    out: Path, fleet: FleetSpec, plan: Plan | None, status: dict[str, Any],
    metrics_token: str | None,
) -> TargetsWriter:  # fmt: skip
    # The renderer's rules and dashboard: imported only here (runtime import stays light).
    from inferplane.monitoring.files import NAMESPACE, prometheus_config, write_monitoring

    gateway, engines = targets_of(status)
    if plan is not None:
        writer = write_monitoring(
            out, fleet, plan, gateway, engines, namespace=NAMESPACE, metrics_token=metrics_token
        )
    else:
        from inferplane.deploy.yamlio import dump_docs, write_atomic

        config = prometheus_config()
        config.pop("rule_files")
        write_atomic(out / "prometheus.yml", dump_docs([config]))
        writer = TargetsWriter(out, NAMESPACE)
        writer.update(gateway, engines)
        _log.info("monitoring: no plan, so no alert rules or dashboard (list the fleet's gpus)")
    _log.info("monitoring: prometheus --config.file=%s", out / "prometheus.yml")
    return writer


def targets_of(status: dict[str, Any]) -> tuple[list[Target], list[Target]]:
    gateway_url = (status.get("gateway") or {}).get("url")
    gateway = [Target.from_url(gateway_url, "gateway", "gateway")] if gateway_url else []
    return gateway, engine_targets(status.get("instances") or [])


def refresh_targets(writer: TargetsWriter, status: dict[str, Any]) -> None:
    """Rewrite the file_sd files if the instances changed; never fails the runtime."""
    try:
        writer.update(*targets_of(status))
    except OSError as exc:
        _log.warning("monitoring: cannot rewrite the scrape targets: %s", exc)
