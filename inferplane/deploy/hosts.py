"""compose and systemd render for hosts, not a cluster: node order, host names, and the
options that only mean something to Kubernetes.

Nothing is ignored silently. `--gang` (a Kubernetes scheduler feature), `--weights pvc` (a
PersistentVolumeClaim), `--ingress-host` (an Ingress), `--inference-pool` (GIE objects) and
nodes whose GPUs are MIG slices (the plan's whole-card indices do not address a MIG
instance) are refused with the option, the target and the fix. HAMi is a Kubernetes device
plugin: on a host, co-located engines share a whole card by their planned
`--gpu-memory-utilization` fractions (P01), which is what compose and systemd render
anyway, so `sharing: hami` needs nothing more there.
"""

from __future__ import annotations

from inferplane.deploy.options import RenderOptions
from inferplane.errors import InferplaneError
from inferplane.planner.plan import Plan
from inferplane.spec import FleetSpec

GATEWAY_ONLY_NODE = "gateway"  # the host of a fleet that places nothing (endpoints only)


def nodes_in_order(plan: Plan) -> list[str]:
    """Every node the plan uses: instances' (leaders') nodes in plan order, then the other
    ranks' nodes of replicas that span nodes; a plan that places nothing (only
    `endpoints:` models) has one host for the gateway."""
    if not plan.instances:
        return [GATEWAY_ONLY_NODE]
    nodes: list[str] = []
    for inst in plan.instances:
        if inst.node not in nodes:
            nodes.append(inst.node)
    for inst in plan.instances:
        for rank in inst.ranks:
            if rank.node not in nodes:
                nodes.append(rank.node)
    return nodes


def host_of(fleet: FleetSpec, node: str) -> str:
    """How other hosts reach `node`: its `address` in the fleet's inventory when the spec
    has one, else the node name (the host name, as the inventory asks)."""
    inventory = fleet.gpus
    spec = inventory.node(node) if inventory is not None else None
    address = getattr(spec, "address", None) if spec is not None else None
    return address if isinstance(address, str) and address else node


def refuse_cluster_options(fleet: FleetSpec, plan: Plan, options: RenderOptions,
                           target: str) -> None:
    """Raise for an option or a fleet setting `target` cannot honour (see the module doc)."""
    if options.gang != "none":
        raise InferplaneError(
            f"--gang {options.gang} is gang scheduling by a Kubernetes scheduler; --target "
            f"{target} starts exactly what the plan places on each host, so there is nothing "
            "to gang", field="--gang", value=options.gang,
            fix=f"drop --gang for --target {target}, or render --target k8s")
    if options.weights == "pvc":
        raise InferplaneError(
            f"--weights pvc mounts a Kubernetes PersistentVolumeClaim; --target {target} reads "
            "each model's source from the host (a local path as is, a Hugging Face id through "
            "the host's cache)", field="--weights", value=options.weights,
            fix="mount the model store at each model's source path on the hosts and drop "
                "--weights, use --weights prewarm to copy it to local disk first, or render "
                "--target k8s")
    if options.ingress_host is not None:
        raise InferplaneError(
            f"--ingress-host renders a Kubernetes Ingress; with --target {target} the gateway "
            "listens on the first host's gateway port", field="--ingress-host",
            value=options.ingress_host,
            fix=f"drop --ingress-host for --target {target} and put your own proxy in front")
    if options.inference_pool:
        raise InferplaneError(
            f"--inference-pool renders Gateway API InferencePools for a Kubernetes Gateway; "
            f"--target {target} has the inferplane gateway only", field="--inference-pool",
            value="true", fix=f"drop --inference-pool for --target {target}, or render "
                              "--target k8s")
    inventory = fleet.gpus
    if inventory is None:
        return
    for node in nodes_in_order(plan):
        spec = inventory.node(node)
        if spec is not None and spec.sharing == "mig":
            raise InferplaneError(
                f"node {node} shares its GPUs as MIG {spec.mig_profile} slices; --target "
                f"{target} hands engines whole GPUs by index or UUID, which do not address a "
                "MIG instance", field="gpus.nodes.sharing", value=f"{node}: mig",
                fix="render --target k8s (MIG slices through the device plugin), or disable "
                    "MIG on the host and set sharing: none")


def refuse_spanning(plan: Plan, target: str) -> None:
    """compose: one project is one host; a replica over several hosts cannot be one."""
    for inst in plan.instances:
        if inst.spans_nodes:
            nodes = [r.node for r in inst.ranks] or [inst.node]
            raise InferplaneError(
                f"{inst.model} replica {inst.replica} spans {len(nodes)} nodes "
                f"({', '.join(nodes)}); a docker compose project runs on one host and cannot "
                "start one replica across hosts", field=f"plan.instances[{inst.id}].ranks",
                value=", ".join(nodes),
                fix="render --target k8s (a LeaderWorkerSet per model) or --target systemd "
                    "(one unit per node and rank)")


__all__ = ["host_of", "nodes_in_order", "refuse_cluster_options", "refuse_spanning"]
