"""The planner for CPU fleets (`engine: {kind: vllm, device: cpu}`): cores and host RAM.

    plan = plan_cpu_fleet(fleet)                   # gpus: discover reads this host (psutil)
    plan.instances[0].cpu_cores, plan.instances[0].env["VLLM_CPU_OMP_THREADS_BIND"]

Each node's cores are its slots. A replica binds its own cores (`cpu_cores`, else the
node's cores split evenly between the replicas that need their own); a model with
`placement.colocate_with` binds the cores of that model's replica instead (a small
embedding model next to a chat model on a 2-core box). Replicas the autoscaler may add
(`scaling.models.M.max_replicas`) are reserved cores and RAM up front, so scaling up never
has to move anything.

Host RAM holds everything: per replica its weights, its KV cache (always explicit, so
engines on one host never take more than planned) and the engine's runtime
(`vllm_cpu.ENGINE_RUNTIME_BYTES`); the sum stays under `budget_fraction` of the node's
RAM. The KV cache gets room for `max_num_seqs` sequences of `max_model_len`, or less when
RAM is short (at least one sequence; `max_model_len: auto` shrinks to what fits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferplane.engines.vllm import VllmArgs
from inferplane.engines.vllm import cpu as vllm_cpu
from inferplane.engines.vllm.lora import lora_env
from inferplane.errors import InferplaneError
from inferplane.estimator.kv_cache import KvLayout, kv_dtype_bytes, kv_layout
from inferplane.estimator.kv_cache import max_model_len_that_fits as longest_that_fits
from inferplane.estimator.weights import (
    DTYPE_BYTES,
    resolve_dtype,
    weight_bytes,
    weight_format,
)
from inferplane.gpus.cpu_host import CpuHost, discover_cpu_host
from inferplane.gpus.spec import GIB
from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.planner.lora import host_lora_bytes, lora_args
from inferplane.planner.plan import (
    InstanceMemory,
    Plan,
    PlanCpuNode,
    PlanEndpoint,
    PlanInstance,
    PlanTotals,
)
from inferplane.spec import FleetSpec, ModelSpec

BASE_PORT = 8100
DISCOVERED_NODE = "local"
HOST_RAM_BUDGET = 0.85  # of a node's RAM: the OS, the gateway and page cache keep the rest
KV_FLOOR_BYTES = 64 * 2**20  # the smallest KV cache a replica gets (64 MiB)
SOLVER = "cpu (cores and host RAM)"


@dataclass(frozen=True)
class CpuNode:
    name: str
    cores: tuple[int, ...]
    memory_bytes: int
    field: str  # what to name in errors about its RAM

    @property
    def budget_bytes(self) -> int:
        return int(self.memory_bytes * HOST_RAM_BUDGET)


@dataclass(frozen=True)
class Sizing:
    """One model's numbers on CPU (every replica alike)."""

    model: ModelSpec
    profile: ModelProfile
    dtype: str
    weights_bytes: int
    layout: KvLayout
    max_num_seqs: int
    max_num_batched_tokens: int
    lora_bytes: int = 0  # LoRA adapter slots (planner/lora.py), in host memory

    @property
    def resident_bytes(self) -> int:
        """Host memory besides the KV cache and the runtime: weights and LoRA slots."""
        return self.weights_bytes + self.lora_bytes

    def one_sequence(self, max_model_len: int) -> int:
        return self.layout.bytes_per_request(max_model_len, self.max_num_batched_tokens)


@dataclass
class Unit:
    """One replica being placed; `reserved` ones (up to max_replicas) are not started."""

    model: str
    replica: int
    reserved: bool
    node: str = ""
    cores: tuple[int, ...] = ()
    kv_bytes: int = 0
    mates: list[str] = field(default_factory=list)  # units it shares cores with

    @property
    def id(self) -> str:
        return f"{self.model}-{self.replica}"


def cpu_nodes(fleet: FleetSpec, host: CpuHost | None = None) -> list[CpuNode]:
    """The fleet's CPU nodes, or this host (read now unless `host` is given)."""
    if fleet.gpus is not None:
        return [
            CpuNode(node.name, tuple(range(node.cpu_cores or node.count)),
                    int((node.host_memory_gib or 0) * GIB),
                    f"gpus.nodes.{index}.host_memory_gib")
            for index, node in enumerate(fleet.gpus.nodes)
        ]
    found = host or discover_cpu_host()
    return [CpuNode(DISCOVERED_NODE, found.cores, found.memory_bytes, "gpus")]


def size_model(model: ModelSpec, profile: ModelProfile) -> Sizing:
    dtype = resolve_dtype(profile, model.dtype)
    fmt = weight_format(profile, dtype, model.quantization)
    weights = weight_bytes(profile, fmt, 1).total_bytes
    kv_bytes = kv_dtype_bytes(model.kv_cache_dtype, DTYPE_BYTES[dtype])
    layout = kv_layout(profile, 1, kv_bytes, vllm_cpu.BLOCK_SIZE)
    seqs = model.max_num_seqs or vllm_cpu.DEFAULT_MAX_NUM_SEQS
    batched = model.max_num_batched_tokens or vllm_cpu.DEFAULT_MAX_NUM_BATCHED_TOKENS
    return Sizing(model, profile, dtype, weights, layout, seqs, batched,
                  host_lora_bytes(model, profile, dtype))


@dataclass(frozen=True)
class Layout:
    """Every replica (and reserved replica) of a CPU fleet with its node, cores and KV."""

    nodes: list[CpuNode]
    sizings: dict[str, Sizing]
    units: list[Unit]
    lengths: dict[str, int]


def layout(
    fleet: FleetSpec,
    *,
    host: CpuHost | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
) -> Layout:
    nodes = cpu_nodes(fleet, host)
    models = [m for m in fleet.placed_models if m.replicas > 0]
    sizings = {m.name: size_model(m, _profile(m, profiles)) for m in models}
    units = _units(fleet, models)
    _assign_nodes(units, nodes, fleet)
    _bind_cores(units, nodes, fleet)
    lengths = _lengths(units, nodes, sizings)
    for node in nodes:
        _size_kv([u for u in units if u.node == node.name], node, sizings, lengths)
    return Layout(nodes, sizings, units, lengths)


def plan_cpu_fleet(
    fleet: FleetSpec,
    *,
    host: CpuHost | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
    fleet_file: str = "",
) -> Plan:
    """Place every replica of a CPU fleet on its nodes' cores and RAM (see module doc)."""
    lay = layout(fleet, host=host, profiles=profiles)
    units = lay.units
    real = [u for u in units if not u.reserved]
    instances = [
        cpu_instance(fleet, lay.sizings[u.model], u, lay.lengths[u.model], BASE_PORT + n)
        for n, u in enumerate(real)
    ]
    warnings = vllm_cpu.plan_notes(m for m in fleet.scaling.models if m in lay.sizings)
    warnings += _shared_core_notes(real)
    reserved = [u.id for u in units if u.reserved]
    if reserved:
        warnings.append(f"reserved for the autoscaler (max_replicas): {', '.join(reserved)} "
                        "(cores and RAM kept free)")
    if not units:
        routed = ", ".join(m.name for m in fleet.endpoint_models) or "none"
        warnings.append("nothing to place: no model has a source and replicas >= 1; the "
                        f"plan holds only the gateway's routes to endpoints ({routed})")
    cpus = cpu_table(lay.nodes, instances)
    return Plan(
        fleet_file=fleet_file, engine="vllm", engine_version=fleet.engine.version,
        device="cpu", policy="binpack", card_budget_fraction=HOST_RAM_BUDGET,
        instances=instances, gpus=[], cpus=cpus,
        endpoints=[PlanEndpoint(model=m.name, urls=list(m.endpoints or []))
                   for m in fleet.endpoint_models],
        totals=cpu_totals(cpus), warnings=warnings,
    )


def add_cpu_replicas(
    fleet: FleetSpec,
    plan: Plan,
    model: str,
    count: int,
    *,
    host: CpuHost | None = None,
    profiles: Mapping[str, ModelProfile] | None = None,
) -> Plan:
    """`plan` with `count` more replicas of `model` on the cores and RAM the plan reserved
    for them (up to `scaling.models.M.max_replicas`); running instances are unchanged."""
    lay = layout(fleet, host=host, profiles=profiles)
    have = {i.id for i in plan.instances}
    free = [u for u in lay.units if u.model == model and u.id not in have]
    if len(free) < count:
        bounds = fleet.scaling.models.get(model)
        raise InferplaneError(
            f"{model}: {count} more replica(s) do not fit: the plan keeps cores and RAM for "
            f"{len([u for u in lay.units if u.model == model])} replica(s)",
            field=f"scaling.models.{model}.max_replicas",
            value=bounds.max_replicas if bounds else None,
            fix="raise max_replicas and plan again (each replica needs its own cores)",
        )
    port = max([i.port for i in plan.instances], default=BASE_PORT - 1) + 1
    added = [
        cpu_instance(fleet, lay.sizings[u.model], u, lay.lengths[u.model], port + n)
        for n, u in enumerate(free[:count])
    ]
    order = {m.name: n for n, m in enumerate(fleet.models)}
    instances = sorted([*plan.instances, *added],
                       key=lambda i: (order.get(i.model, len(order)), i.replica))
    cpus = cpu_table(lay.nodes, instances)
    return plan.model_copy(update={"instances": instances, "cpus": cpus,
                                   "totals": cpu_totals(cpus)})


def remove_cpu_replicas(plan: Plan, instance_ids: list[str]) -> Plan:
    """`plan` without the given instances; their cores and RAM are free again."""
    gone = set(instance_ids)
    instances = [i for i in plan.instances if i.id not in gone]
    cpus = [c.model_copy(update={
        "instances": [i for i in c.instances if i not in gone],
        "used_gib": round(sum((i.host_memory_bytes or 0) for i in instances
                              if i.node == c.node) / GIB, 2),
    }) for c in plan.cpus]
    cpus = [c.model_copy(update={"free_gib": round(c.memory_gib - c.used_gib, 2)})
            for c in cpus]
    return plan.model_copy(update={"instances": instances, "cpus": cpus,
                                   "totals": cpu_totals(cpus)})


def _profile(model: ModelSpec, profiles: Mapping[str, ModelProfile] | None) -> ModelProfile:
    if profiles is not None and model.name in profiles:
        return profiles[model.name]
    assert model.source is not None
    return load_profile(model.source)


def _units(fleet: FleetSpec, models: list[ModelSpec]) -> list[Unit]:
    units: list[Unit] = []
    for model in models:
        bounds = fleet.scaling.models.get(model.name)
        count = max(model.replicas, bounds.max_replicas if bounds else 0)
        units += [Unit(model.name, r, r >= model.replicas) for r in range(count)]
    return units


def _shares_cores(fleet: FleetSpec, model: str) -> str | None:
    spec = fleet.model(model)
    targets = [t for t in (spec.placement.colocate_with if spec else [])
               if (m := fleet.model(t)) is not None and not m.is_endpoint and m.replicas > 0]
    return targets[0] if targets else None


def _own(fleet: FleetSpec, units: list[Unit]) -> list[Unit]:
    return [u for u in units if _shares_cores(fleet, u.model) is None]


def _assign_nodes(units: list[Unit], nodes: list[CpuNode], fleet: FleetSpec) -> None:
    """Replicas with their own cores go to the allowed node with the most cores per
    replica; replicas that share cores go to their partner's node."""
    count = {n.name: 0 for n in nodes}
    by_name = {n.name: n for n in nodes}
    for unit in _own(fleet, units):
        spec = fleet.model(unit.model)
        assert spec is not None
        allowed = [n for n in nodes if spec.placement.node in (None, n.name)]
        best = max(allowed, key=lambda n: (len(n.cores) / (count[n.name] + 1), -nodes.index(n)))
        unit.node = best.name
        count[best.name] += 1
    for unit in units:
        partner = _shares_cores(fleet, unit.model)
        if partner is None:
            continue
        theirs = [u for u in units if u.model == partner and not u.reserved] or \
            [u for u in units if u.model == partner]
        unit.node = theirs[unit.replica % len(theirs)].node
        if unit.node not in by_name:  # pragma: no cover - partners always have a node
            raise AssertionError(unit.node)


def _bind_cores(units: list[Unit], nodes: list[CpuNode], fleet: FleetSpec) -> None:
    own = _own(fleet, units)
    for node in nodes:
        here = [u for u in own if u.node == node.name]
        if not here:
            continue
        explicit = {u.id: _cpu_cores(fleet, u.model) for u in here}
        fixed = sum(n for n in explicit.values() if n is not None)
        auto = [u for u in here if explicit[u.id] is None]
        free = len(node.cores) - fixed
        if free < len(auto) or (not auto and free < 0):
            _too_many(fleet, node, here, explicit)
        each = free // len(auto) if auto else 0
        start = 0
        for unit in here:
            width = explicit[unit.id] or each
            unit.cores = node.cores[start:start + width]
            start += width
    for unit in units:
        partner = _shares_cores(fleet, unit.model)
        if partner is None:
            continue
        theirs = [u for u in units if u.model == partner and u.node == unit.node]
        mate = theirs[unit.replica % len(theirs)]
        unit.cores = mate.cores
        unit.mates.append(mate.id)


def _cpu_cores(fleet: FleetSpec, model: str) -> int | None:
    spec = fleet.model(model)
    return spec.cpu_cores if spec else None


def _too_many(fleet: FleetSpec, node: CpuNode, here: list[Unit],
              explicit: Mapping[str, int | None]) -> None:
    wanted = sum(n or 1 for n in explicit.values())
    first = here[-1].model
    spec = fleet.model(first)
    others = sorted({u.model for u in here} - {first})
    share = (f"share cores with placement.colocate_with: [{others[0]}] on {first}, "
             if others else "")
    reserved = sum(1 for u in here if u.reserved)
    raise InferplaneError(
        f"{len(here)} replicas need their own cores ({wanted} at least) but node "
        f"{node.name} has {len(node.cores)}"
        + (f" ({reserved} of them reserved for the autoscaler's max_replicas)"
           if reserved else ""),
        field=f"models.{first}.replicas", value=spec.replicas if spec else None,
        fix=f"lower replicas (or max_replicas), {share}lower cpu_cores, or run on a node "
        "with more cores",
    )


def _lengths(units: list[Unit], nodes: list[CpuNode], sizings: Mapping[str, Sizing]
             ) -> dict[str, int]:
    """Each model's max_model_len: the fleet file's, or for `auto` the model's own context
    unless one sequence of it does not fit its share of a node's RAM (then the longest
    that does)."""
    out: dict[str, int] = {}
    for name, sizing in sizings.items():
        wanted = sizing.model.max_model_len
        if isinstance(wanted, int):
            out[name] = wanted
            continue
        upper = sizing.profile.max_position_embeddings
        for node in nodes:
            here = [u for u in units if u.node == node.name]
            if not any(u.model == name for u in here):
                continue
            room = _kv_room(node, here, sizings) // len(here)
            if sizing.one_sequence(upper) > room:
                upper = longest_that_fits(sizing.layout, room, upper,
                                          sizing.max_num_batched_tokens) or upper
        out[name] = upper
    return out


def _kv_room(node: CpuNode, here: list[Unit], sizings: Mapping[str, Sizing]) -> int:
    """The node's RAM budget left for KV caches once weights and runtimes are counted."""
    fixed = sum(sizings[u.model].resident_bytes + vllm_cpu.ENGINE_RUNTIME_BYTES for u in here)
    return node.budget_bytes - fixed


def _size_kv(here: list[Unit], node: CpuNode, sizings: Mapping[str, Sizing],
             lengths: Mapping[str, int]) -> None:
    """Every replica on `node` gets at least one sequence's KV (and KV_FLOOR_BYTES), then
    an equal share of the rest of the RAM budget, up to `max_num_seqs` sequences."""
    if not here:
        return
    lows: dict[str, int] = {}
    highs: dict[str, int] = {}
    for unit in here:
        sizing = sizings[unit.model]
        explicit = sizing.model.kv_cache_memory_gib
        if explicit is not None:
            lows[unit.id] = highs[unit.id] = int(explicit * GIB)
            continue
        one = sizing.one_sequence(lengths[unit.model])
        lows[unit.id] = max(one, KV_FLOOR_BYTES)
        highs[unit.id] = max(lows[unit.id], one * sizing.max_num_seqs)
    room = _kv_room(node, here, sizings)
    need = sum(lows.values())
    if need > room:
        _ram_too_small(node, here, sizings, lows)
    # Water-filling: an equal share of what is left, capped at what each replica wants.
    left = room - need
    waiting = sorted(here, key=lambda u: highs[u.id] - lows[u.id])
    for n, unit in enumerate(waiting):
        extra = min(highs[unit.id] - lows[unit.id], left // (len(waiting) - n))
        unit.kv_bytes = lows[unit.id] + extra
        left -= extra


def _ram_too_small(node: CpuNode, here: list[Unit], sizings: Mapping[str, Sizing],
                   lows: Mapping[str, int]) -> None:
    parts = [
        f"{u.id} {(sizings[u.model].resident_bytes + lows[u.id]) / GIB:.2f} GiB"
        for u in here
    ]
    total = sum(sizings[u.model].resident_bytes + lows[u.id] + vllm_cpu.ENGINE_RUNTIME_BYTES
                for u in here)
    raise InferplaneError(
        f"node {node.name}'s RAM ({node.memory_bytes / GIB:.1f} GiB, {HOST_RAM_BUDGET:.0%} "
        f"usable: {node.budget_bytes / GIB:.1f} GiB) is too small for its replicas' weights "
        f"+ KV cache ({', '.join(parts)}) + {vllm_cpu.ENGINE_RUNTIME_BYTES / GIB:.0f} GiB "
        f"runtime each: {total / GIB:.1f} GiB",
        field=node.field,
        value=f"{node.memory_bytes / GIB:.1f} GiB" if node.field == "gpus" else
        round(node.memory_bytes / GIB, 2),
        fix="run fewer replicas (or a lower max_replicas), a shorter max_model_len or "
        "kv_cache_memory_gib, a smaller model, or a node with more RAM",
    )


def cpu_instance(fleet: FleetSpec, sizing: Sizing, unit: Unit, max_model_len: int,
                 port: int) -> PlanInstance:
    """One planned CPU engine: argv (explicit KV size) and env (its cores bound)."""
    model = sizing.model
    # Eager unless the fleet asks for torch.compile (vllm_cpu: slow first start on CPU).
    eager = model.enforce_eager if "enforce_eager" in model.model_fields_set else True
    args = VllmArgs(
        source=model.source or "", served_model_name=model.engine_model_name, port=port,
        max_model_len=max_model_len, tensor_parallel_size=1,
        gpu_memory_utilization=None,  # unused on CPU once the KV size is explicit
        max_num_seqs=sizing.max_num_seqs, max_num_batched_tokens=sizing.max_num_batched_tokens,
        dtype=model.dtype, quantization=model.quantization,
        kv_cache_dtype=model.kv_cache_dtype, kv_cache_memory_bytes=unit.kv_bytes,
        enforce_eager=eager, task=model.task, lora=lora_args(model),
        extra_args=model.extra_args,
    )
    argv = vllm_cpu.serve_argv(args, version=fleet.engine.version)
    env = vllm_cpu.engine_env(
        unit.cores, {**lora_env(args.lora), **fleet.engine.extra_env, **model.env})
    one = sizing.one_sequence(max_model_len)
    page = sizing.layout.page_bytes * sizing.layout.group_size
    blocks = unit.kv_bytes // page if page else 0
    memory = InstanceMemory(
        weights_gib=round(sizing.weights_bytes / GIB, 6),
        kv_cache_gib=round(unit.kv_bytes / GIB, 4),
        activation_gib=0.0,
        non_torch_gib=round(vllm_cpu.ENGINE_RUNTIME_BYTES / GIB, 4),
        cuda_graph_gib=0.0,
        cuda_context_gib=0.0,
        kv_cache_tokens=blocks * sizing.layout.block_size,
        max_concurrency=round(unit.kv_bytes / one, 2) if one else float(sizing.max_num_seqs),
        kv_bytes_per_token=sizing.layout.bytes_per_token_per_gpu,
        lora_gib=round(sizing.lora_bytes / GIB, 6),
    )
    return PlanInstance(
        id=unit.id, model=model.name, served_model_name=model.engine_model_name,
        replica=unit.replica, node=unit.node, gpu_type="cpu", gpu_indices=[],
        tensor_parallel_size=1, gpu_memory_utilization=0.0,
        kv_cache_memory_bytes=unit.kv_bytes, shares_gpu_with=sorted(unit.mates),
        port=port, max_model_len=max_model_len, max_num_seqs=sizing.max_num_seqs,
        max_num_batched_tokens=sizing.max_num_batched_tokens,
        weights_bytes=sizing.weights_bytes, memory=memory, argv=argv, env=env,
        cpu_cores=list(unit.cores),
        host_memory_bytes=sizing.resident_bytes + unit.kv_bytes + vllm_cpu.ENGINE_RUNTIME_BYTES,
    )


def _shared_core_notes(real: list[Unit]) -> list[str]:
    return [
        f"{u.id} shares core(s) {vllm_cpu.threads_bind(u.cores)} with {', '.join(u.mates)} "
        "(placement.colocate_with): each slows down while the other computes"
        for u in real if u.mates and any(m in {r.id for r in real} for m in u.mates)
    ]


def cpu_table(nodes: list[CpuNode], instances: list[PlanInstance]) -> list[PlanCpuNode]:
    """Per node: the host RAM its instances take."""
    out: list[PlanCpuNode] = []
    for node in nodes:
        here = [i for i in instances if i.node == node.name]
        used = sum(i.host_memory_bytes or 0 for i in here)
        out.append(PlanCpuNode(
            node=node.name, cores=list(node.cores),
            memory_gib=round(node.memory_bytes / GIB, 2),
            budget_gib=round(node.budget_bytes / GIB, 2),
            used_gib=round(used / GIB, 2),
            free_gib=round((node.memory_bytes - used) / GIB, 2),
            instances=[i.id for i in here],
        ))
    return out


def cpu_totals(cpus: list[PlanCpuNode]) -> PlanTotals:
    used = [c for c in cpus if c.instances]
    memory = sum(c.memory_gib for c in used)
    return PlanTotals(
        gpus_total=0, gpus_used=0, gpus_idle=0, gpus_needed_at_peak=0, fragmentation=0.0,
        memory_efficiency=round(sum(c.used_gib for c in used) / memory, 4) if memory else 0.0,
        solver=SOLVER, solver_optimal=False,
    )
