"""Checks across sections: names are unique and every reference names something that exists.

Pure function over a validated fleet; locs are from the fleet's root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferplane.spec.problems import Issue
from inferplane.spec.suggest import did_you_mean

if TYPE_CHECKING:
    from inferplane.spec.fleet import FleetSpec
    from inferplane.spec.model import ModelSpec


def reference_issues(fleet: FleetSpec) -> list[Issue]:
    issues: list[Issue] = []
    issues += _unique_names(fleet)
    issues += _aliases(fleet)
    issues += _lora_names(fleet)
    issues += _placement(fleet)
    issues += _pipeline(fleet)
    issues += _routes(fleet)
    issues += _scaling(fleet)
    return issues


def _unique_names(fleet: FleetSpec) -> list[Issue]:
    first: dict[str, int] = {}
    issues = []
    for index, model in enumerate(fleet.models):
        if model.name in first:
            issues.append(
                Issue(
                    ("models", index, "name"),
                    f"model name is already used by models[{first[model.name]}]",
                    model.name,
                    "give every model a unique name; to serve more copies, raise replicas",
                )
            )
        first.setdefault(model.name, index)
    return issues


def _aliases(fleet: FleetSpec) -> list[Issue]:
    names = {model.name for model in fleet.models}
    owner: dict[str, str] = {}
    issues = []
    for index, model in enumerate(fleet.models):
        for position, alias in enumerate(model.aliases):
            loc = ("models", index, "aliases", position)
            if alias in names:
                issues.append(
                    Issue(loc, f"alias is the name of model {alias!r}", alias, "remove the alias")
                )
            elif alias in owner:
                issues.append(
                    Issue(
                        loc,
                        f"alias is already used by model {owner[alias]!r}",
                        alias,
                        "every alias must point at exactly one model; remove one of them",
                    )
                )
            else:
                owner[alias] = model.name
    return issues


def _lora_names(fleet: FleetSpec) -> list[Issue]:
    """A request's `model` picks a model or an adapter: every name means one thing."""
    models = {n: m.name for m in fleet.models for n in (m.name, *m.aliases)}
    owner: dict[str, str] = {}
    issues: list[Issue] = []
    for index, model in enumerate(fleet.models):
        if model.lora is None:
            continue
        for position, adapter in enumerate(model.lora.adapters):
            names = [("name", adapter.name)] + [
                (("aliases", i), alias) for i, alias in enumerate(adapter.aliases)]
            for where, name in names:
                loc = ("models", index, "lora", "adapters", position,
                       *(where if isinstance(where, tuple) else (where,)))
                if name in models:
                    issues.append(Issue(
                        loc, f"adapter name is a name of model {models[name]!r}", name,
                        "give the adapter its own name: clients pick an adapter or a model "
                        "by it",
                    ))
                elif name in owner and owner[name] != model.name:
                    issues.append(Issue(
                        loc, f"adapter name is already used by an adapter of model "
                        f"{owner[name]!r}", name, "give every adapter a unique name",
                    ))
                else:
                    owner.setdefault(name, model.name)
    return issues


def _placement(fleet: FleetSpec) -> list[Issue]:
    by_name = {model.name: model for model in fleet.models}
    issues: list[Issue] = []
    for index, model in enumerate(fleet.models):
        base = ("models", index, "placement")
        for position, other in enumerate(model.placement.colocate_with):
            loc = (*base, "colocate_with", position)
            target = by_name.get(other)
            if target is None:
                fix = did_you_mean(other, by_name, noun="model name")
                issues.append(Issue(loc, "colocate_with names an unknown model", other, fix))
            elif target is model:
                issues.append(
                    Issue(loc, "a model cannot be co-located with itself", other, "remove it")
                )
            elif target.is_endpoint:
                issues.append(
                    Issue(
                        loc,
                        f"model {other!r} is served elsewhere (endpoints): no GPU to share",
                        other,
                        "remove it from colocate_with",
                    )
                )
            elif target.spans_nodes:
                issues.append(
                    Issue(
                        loc,
                        f"model {other!r} spans nodes (pipeline_parallel_size "
                        f"{target.pipeline_parallel_size}) and shares no GPU",
                        other,
                        f"remove it from colocate_with or set pipeline_parallel_size: 1 on "
                        f"{other!r}",
                    )
                )
            elif target.placement.exclusive:
                issues.append(
                    Issue(
                        loc,
                        f"model {other!r} is placement.exclusive and shares no GPU",
                        other,
                        f"remove it from colocate_with or drop exclusive on {other!r}",
                    )
                )
        issues += _node_and_type(fleet, model, base)
    return issues


def _node_and_type(fleet: FleetSpec, model: ModelSpec, base: tuple[str | int, ...]) -> list[Issue]:
    inventory = fleet.gpus
    placement = model.placement
    if inventory is None:
        return []  # discovered at run time: nothing to check against yet
    issues = []
    node = None
    if placement.node is not None:
        node = inventory.node(placement.node)
        if node is None:
            fix = did_you_mean(placement.node, (n.name for n in inventory.nodes), noun="node")
            issues.append(
                Issue((*base, "node"), "placement.node names an unknown node", placement.node, fix)
            )
    if placement.gpu_type is not None:
        types = sorted({n.gpu_type for n in inventory.nodes})
        if node is not None and node.gpu_type != placement.gpu_type:
            issues.append(
                Issue(
                    (*base, "gpu_type"),
                    f"node {node.name!r} has {node.gpu_type} GPUs",
                    placement.gpu_type,
                    f"use gpu_type: {node.gpu_type} or pick another node",
                )
            )
        elif placement.gpu_type not in types:
            issues.append(
                Issue(
                    (*base, "gpu_type"),
                    "no node in gpus.nodes has this GPU type",
                    placement.gpu_type,
                    f"use one of: {', '.join(types)}",
                )
            )
    return issues


def _pipeline(fleet: FleetSpec) -> list[Issue]:
    """A replica that spans N nodes needs N nodes of one GPU type, each with its TP GPUs."""
    issues: list[Issue] = []
    for index, model in enumerate(fleet.models):
        if model.is_endpoint or not model.spans_nodes:
            continue
        pp = model.pipeline_parallel_size
        assert isinstance(pp, int)
        loc: tuple[str | int, ...] = ("models", index, "pipeline_parallel_size")
        if fleet.engine.kind == "sim":
            issues.append(Issue(
                loc,
                f"engine: sim runs every replica as one simulated process on this host; "
                f"pipeline_parallel_size {pp} spans {pp} nodes",
                pp,
                "use pipeline_parallel_size: 1 (or auto) with engine: sim; a real multi-node "
                "replica runs with engine: vllm through `inferplane render --target k8s|systemd`",
            ))
            continue
        if fleet.gpus is None:
            issues.append(Issue(
                loc,
                f"gpus: discover reads the GPUs of one host; a replica with "
                f"pipeline_parallel_size {pp} spans {pp} nodes",
                pp,
                "list the nodes under gpus: nodes: (one GPU type, enough GPUs on each), or use "
                "pipeline_parallel_size: 1",
            ))
            continue
        tp = model.tensor_parallel_size if isinstance(model.tensor_parallel_size, int) else 1
        types = sorted({n.gpu_type for n in fleet.gpus.nodes})
        if model.placement.gpu_type is not None:
            types = [t for t in types if t == model.placement.gpu_type]
        hosts = {t: [n for n in fleet.gpus.nodes if n.gpu_type == t and n.count >= tp]
                 for t in types}
        if any(len(nodes) >= pp for nodes in hosts.values()):
            continue
        best = max(types, key=lambda t: (len(hosts[t]), t)) if types else None
        have = len(hosts[best]) if best is not None else 0
        if isinstance(model.tensor_parallel_size, int):
            need = f"{pp} nodes with {tp} {best or ''} GPU{'s' if tp > 1 else ''} each".replace(
                "  ", " ")
        else:
            need = f"{pp} nodes of one GPU type"
        listing = ", ".join(f"{n.name}: {n.count} x {n.gpu_type}" for n in fleet.gpus.nodes)
        issues.append(Issue(
            loc,
            f"pipeline_parallel_size {pp} needs {need} (one node per pipeline stage); the "
            f"inventory has {have} ({listing})",
            pp,
            "add nodes of that GPU type to gpus.nodes, or lower pipeline_parallel_size"
            + (f" to {have}" if have > 1 else " to 1"),
        ))
    return issues


def _routes(fleet: FleetSpec) -> list[Issue]:
    by_name = {model.name: model for model in fleet.models}
    # A route may split an adapter's traffic over adapters (canary between fine-tunes);
    # an adapter serves its base model's task.
    by_name.update({adapter.name: model for model in fleet.models if model.lora is not None
                    for adapter in model.lora.adapters})
    alias_owner = {alias: m.name for m in fleet.models for alias in m.aliases}
    issues: list[Issue] = []
    routed: dict[str, int] = {}
    for index, route in enumerate(fleet.routes):
        loc = ("routes", index, "model")
        source = by_name.get(route.model)
        if source is None:
            if route.model in alias_owner:
                fix = f"route the model's name: model: {alias_owner[route.model]}"
            else:
                fix = did_you_mean(route.model, by_name, noun="model name")
            issues.append(Issue(loc, "route names an unknown model", route.model, fix))
        elif route.model in routed:
            issues.append(
                Issue(
                    loc,
                    f"model already has a route (routes[{routed[route.model]}])",
                    route.model,
                    "merge the backends into one route",
                )
            )
        routed.setdefault(route.model, index)
        for position, backend in enumerate(route.backends):
            target_loc = ("routes", index, "backends", position, "target")
            target = by_name.get(backend.target)
            if target is None:
                fix = did_you_mean(backend.target, by_name, noun="model name")
                issues.append(
                    Issue(target_loc, "route target names an unknown model", backend.target, fix)
                )
            elif source is not None and target.task != source.task:
                issues.append(
                    Issue(
                        target_loc,
                        f"target is {_a(target.task)} model but {route.model!r} is "
                        f"{_a(source.task)} model",
                        backend.target,
                        "route only between models of the same task",
                    )
                )
    return issues


def _scaling(fleet: FleetSpec) -> list[Issue]:
    by_name = {model.name: (index, model) for index, model in enumerate(fleet.models)}
    issues: list[Issue] = []
    for name, bounds in fleet.scaling.models.items():
        loc: tuple[str | int, ...] = ("scaling", "models", name)
        if name not in by_name:
            fix = did_you_mean(name, by_name, noun="model name")
            issues.append(Issue(loc, "scaling names an unknown model", name, fix))
            continue
        index, model = by_name[name]
        if model.is_endpoint:
            issues.append(
                Issue(
                    loc,
                    "a model served elsewhere (endpoints) cannot be scaled by inferplane",
                    name,
                    "remove it from scaling.models",
                )
            )
        elif not bounds.min_replicas <= model.replicas <= bounds.max_replicas:
            issues.append(
                Issue(
                    ("models", index, "replicas"),
                    f"replicas is outside scaling bounds [{bounds.min_replicas}, "
                    f"{bounds.max_replicas}]",
                    model.replicas,
                    "set replicas (the starting count) between min_replicas and max_replicas",
                )
            )
    return issues


def _a(word: str) -> str:
    """The article before a task name: an embed model, a generate model."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"
