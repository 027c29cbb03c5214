"""systemd `--weights prewarm` (P35): copy each model's weights to local disk once.

`inferplane-prewarm-<model>.service` (Type=oneshot, RemainAfterExit) runs the same
idempotent copy as the Kubernetes DaemonSet, on the host's own paths: a local `source` into
`prewarm_dir/<model>`, a Hugging Face id by `snapshot_download` into that directory as
`HF_HOME`. Engine units require it and then read the copy: a local source through
`BindReadOnlyPaths=<copy>:<source>` (the argv keeps its path), a Hugging Face id through
`HF_HOME=<copy>` with `HF_HUB_OFFLINE=1`; their `TimeoutStartSec` counts local-disk reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.deploy.k8s.weights import copy_script, local_name
from inferplane.deploy.names import object_name
from inferplane.deploy.options import RenderOptions
from inferplane.deploy.systemd_syntax import HEADER, TARGET, shell_line
from inferplane.planner.plan import Plan
from inferplane.spec import FleetSpec


@dataclass(frozen=True)
class Prewarm:
    unit: str  # the oneshot unit engines require
    bind: str | None  # "<copy>:<source>" for a local source
    env: dict[str, str]  # HF_HOME / HF_HUB_OFFLINE for a Hugging Face id


def prewarm_unit_name(model: str) -> str:
    return f"inferplane-prewarm-{object_name(model, max_chars=200)}.service"


def prewarm_of(fleet: FleetSpec, model: str, options: RenderOptions) -> Prewarm | None:
    if options.weights != "prewarm":
        return None
    spec = fleet.model(model)
    if spec is None or not spec.source:
        return None
    local = f"{options.prewarm_dir.rstrip('/')}/{local_name(model)}"
    if spec.source.startswith("/"):
        return Prewarm(prewarm_unit_name(model), f"{local}:{spec.source}", {})
    return Prewarm(prewarm_unit_name(model), None, {"HF_HOME": local, "HF_HUB_OFFLINE": "1"})


def prewarm_unit(fleet: FleetSpec, plan: Plan, model: str, options: RenderOptions) -> str:
    from inferplane.deploy.k8s.context import K8sContext

    spec = fleet.model(model)
    assert spec is not None and spec.source
    script = copy_script(K8sContext(fleet, plan, options), model, root=options.prewarm_dir,
                         source_dir=spec.source)  # used for a local source only
    weights = max(i.weights_bytes for i in plan.instances_of(model))
    return "\n".join([
        HEADER.rstrip("\n"),
        "[Unit]",
        f"Description=inferplane: copy the weights of {model} to local disk (P35)",
        "After=network-online.target",
        "Wants=network-online.target",
        f"PartOf={TARGET}",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        f"ExecStart={shell_line(script)}",
        f"TimeoutStartSec={options.copy_budget_s(weights)}",
        "TimeoutStopSec=30",
        f"LimitNOFILE={options.nofile}",
        "",
        "[Install]",
        f"WantedBy={TARGET}",
        "",
    ])


__all__ = ["Prewarm", "prewarm_of", "prewarm_unit", "prewarm_unit_name"]
