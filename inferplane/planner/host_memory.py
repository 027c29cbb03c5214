"""Host RAM for sleep level 1: the plan's "host-ram:" warnings (docs/scaling.md).

vLLM's sleep level 1 offloads a replica's weights to (pinned) host RAM and discards its KV
cache; level 2 discards the weights too. So every replica that may sleep at level 1 on a
node needs its weights' worth of that node's RAM while it sleeps. The autoscaler can put
every replica of a scaled model to sleep, so the worst case counted here is `max_replicas`
replicas of each level-1 model asleep on each node it runs on at once, plus 10% for the
rest of the host (the same margin the runtime keeps; it then sleeps at level 2 instead).

Pure: the node's RAM comes from the fleet file (`host_memory_gib`) or, for `gpus:
discover`, from the discovery (`DiscoveredGpu.host_memory_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from inferplane.errors import InferplaneError
from inferplane.estimator.weights import (
    resolve_dtype,
    resolve_quantization,
    weight_bytes,
    weight_format,
)
from inferplane.gpus.discovery import DiscoveredGpu
from inferplane.gpus.spec import GIB
from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.planner.plan import Plan
from inferplane.spec import FleetSpec, ModelSpec

HOST_RESERVE = 1.1  # sleepers' weights + 10% for the OS and the engines' own host memory


@dataclass(frozen=True)
class Sleeper:
    model: str
    replicas: int  # max_replicas: all of them may be asleep at once
    weights_bytes: int  # one replica's weights (what level 1 moves to host RAM)

    @property
    def bytes(self) -> int:
        return self.replicas * self.weights_bytes


def level1_sleepers(
    fleet: FleetSpec, plan: Plan, profiles: Mapping[str, ModelProfile] | None = None
) -> dict[str, list[Sleeper]]:
    """Per node, the level-1 sleepers that may be asleep on it at once. A model with a
    planned replica counts on the nodes it is planned on; one with none yet (it starts at
    zero) on every node of the plan, since the autoscaler may place it on any."""
    nodes = sorted({g.node for g in plan.gpus})
    out: dict[str, list[Sleeper]] = {}
    for name, bounds in sorted(fleet.scaling.models.items()):
        spec = fleet.model(name)
        if bounds.sleep is None or bounds.sleep.level != 1 or spec is None:
            continue
        if spec.source is None:
            continue
        planned = plan.instances_of(name)
        weights = planned[0].weights_bytes if planned else _weights(spec, profiles)
        if weights is None:  # its config cannot be read here: placing it will say why
            continue
        sleeper = Sleeper(name, bounds.max_replicas, weights)
        for node in sorted({i.node for i in planned}) if planned else nodes:
            out.setdefault(node, []).append(sleeper)
    return out


def host_ram_warnings(
    fleet: FleetSpec,
    plan: Plan,
    *,
    discovered: list[DiscoveredGpu] | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
) -> list[str]:
    """One "host-ram:" warning per node whose level-1 sleepers would not fit in its RAM
    (with the models to move to level 2 that make them fit), or whose RAM is unknown."""
    warnings: list[str] = []
    for node, sleepers in level1_sleepers(fleet, plan, profiles).items():
        total = _host_bytes(fleet, node, discovered)
        need = sum(s.bytes for s in sleepers) * HOST_RESERVE
        listed = ", ".join(f"{s.model} ({s.replicas} x {s.weights_bytes / GIB:.1f} GiB)"
                           for s in sleepers)
        if total is None:
            warnings.append(
                f"host-ram: node {node}: replicas asleep at sleep level 1 keep their weights "
                f"in host RAM, {listed} need {need / GIB:.1f} GiB with 10% to spare, and "
                f"the node's RAM is unknown; set host_memory_gib on node {node} so the "
                "plan can check it (inferplane up checks at start)")
            continue
        if need <= total:
            continue
        warnings.append(
            f"host-ram: node {node}: replicas asleep at sleep level 1 keep their weights in "
            f"host RAM: {listed} need {need / GIB:.1f} GiB with 10% to spare, the node has "
            f"{total / GIB:.1f} GiB; the runtime sleeps those that do not fit at level 2 "
            f"(slower wake). Fix: {_fix(sleepers, total)}")
    return warnings


def _fix(sleepers: list[Sleeper], total: int) -> str:
    """The fewest models to move to level 2 (largest first) so the rest fit, else fewer
    replicas or more RAM."""
    keep = sorted(sleepers, key=lambda s: s.bytes)
    moved: list[str] = []
    while keep and sum(s.bytes for s in keep) * HOST_RESERVE > total:
        moved.append(keep.pop().model)
    lines = [f"sleep: {{level: 2}} for {', '.join(moved)}"]
    if len(moved) == 1:
        only = next(s for s in sleepers if s.model == moved[0])
        room = total / HOST_RESERVE - sum(s.bytes for s in keep)
        fits = int(room // only.weights_bytes) if only.weights_bytes else 0
        if 1 <= fits < only.replicas:
            lines.append(f"max_replicas: {fits} for {only.model}")
    lines.append(f"a node with at least "
                 f"{math.ceil(sum(s.bytes for s in sleepers) * HOST_RESERVE / GIB)} GiB of RAM")
    return "; or ".join(lines)


def _host_bytes(fleet: FleetSpec, node: str,
                discovered: list[DiscoveredGpu] | None) -> int | None:
    if fleet.gpus is not None:
        spec = fleet.gpus.node(node)
        if spec is None or spec.host_memory_gib is None:
            return None
        return int(spec.host_memory_gib * GIB)
    found = [g.host_memory_bytes for g in discovered or () if g.host_memory_bytes]
    return found[0] if found else None


def _weights(model: ModelSpec, profiles: Mapping[str, ModelProfile] | None) -> int | None:
    try:
        if profiles is not None and model.name in profiles:
            profile = profiles[model.name]
        else:
            assert model.source is not None
            profile = load_profile(model.source)
        dtype = resolve_dtype(profile, model.dtype)
        fmt = weight_format(profile, dtype, resolve_quantization(profile, model.quantization))
    except InferplaneError:
        return None
    return weight_bytes(profile, fmt, 1).total_bytes
