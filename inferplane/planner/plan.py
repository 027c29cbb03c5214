"""The Plan: where every replica of every model runs, with what memory and what command.

Produced by `inferplane plan` (the planner), consumed by `inferplane up` (one host) and
`inferplane render` (Kubernetes, compose, systemd). A versioned, serialisable pydantic
object; `Plan.model_json_schema()` is its documented JSON schema (docs/plan.md).
Every number carries its unit in the name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from inferplane.engines.base import LEADER_ADDRESS_TOKEN

PLAN_SCHEMA_VERSION = 1

PlacementPolicy = Literal["binpack", "spread"]
PlanObjective = Literal["utilize", "min_gpus"]  # inferplane.spec.planning.Objective
PlanDevice = Literal["gpu", "cpu"]


class _PlanModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InstanceMemory(_PlanModel):
    """The estimator's per-GPU breakdown for one instance (see MemoryEstimate)."""

    weights_gib: float
    kv_cache_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    cuda_context_gib: float  # outside the utilization budget (P01)
    kv_cache_tokens: int
    max_concurrency: float  # requests of max_model_len that fit at once
    kv_bytes_per_token: int
    lora_gib: float = 0.0  # LoRA adapter slots, per GPU (CPU: in host memory)


# LEADER_ADDRESS_TOKEN stands in for the leader's address inside a multi-node replica's
# argv/env: only the deployment target knows it (the engine writes it, engines/base.py).
__all__ = ["LEADER_ADDRESS_TOKEN"]


class PlanRank(_PlanModel):
    """One node's share of a replica that spans nodes (pipeline parallel, P13/P15).

    Rank 0 is the leader: it serves the HTTP API; the other ranks run headless workers.
    Every rank holds `tensor_parallel_size` GPUs of the same type on its own node.
    """

    rank: int
    node: str
    gpu_indices: list[int]
    gpu_uuids: list[str] | None = None
    argv: list[str]  # the exact command on this node; may contain LEADER_ADDRESS_TOKEN
    env: dict[str, str]
    layers: list[int] | None = None  # [start, end) of the decoder layers this stage holds
    memory: InstanceMemory | None = None  # per GPU of this node (KV tokens: the replica's)


class PlanInstance(_PlanModel):
    """One replica of one model: one engine process on a TP group of GPUs on one node, or,
    when `pipeline_parallel_size` > 1, one process per node listed in `ranks`.

    For a multi-node replica the top-level node/gpu_indices/argv/env describe rank 0 (the
    leader), so single-host consumers that ignore `ranks` still see the API server.
    """

    id: str  # "<model>-<replica>", stable across re-plans of the same fleet
    model: str  # client-facing name from the fleet file
    served_model_name: str  # what vLLM is told (--served-model-name, P36)
    replica: int
    node: str
    gpu_type: str  # catalog name; never mixed inside one TP group (P12)
    gpu_indices: list[int]  # NVML indices on the node (P20)
    gpu_uuids: list[str] | None = None  # when known from discovery
    tensor_parallel_size: int
    gpu_memory_utilization: float  # fraction of each whole card (P01)
    kv_cache_memory_bytes: int | None = None  # explicit KV pool when co-located (vLLM #10643)
    shares_gpu_with: list[str] = Field(default_factory=list)  # other instance ids on these GPUs
    start_after: list[str] = Field(default_factory=list)  # ids that must be ready first
    port: int  # engine HTTP port on the node
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    weights_bytes: int  # whole model on disk/in memory, for startup-time budgets (P24, P35)
    memory: InstanceMemory
    argv: list[str]  # the exact `vllm serve ...` invocation
    env: dict[str, str]  # CUDA_VISIBLE_DEVICES (integer indices), NCCL settings (P34), ...
    pipeline_parallel_size: int = 1  # nodes per replica; 1 = the whole replica on `node`
    ranks: list[PlanRank] = Field(default_factory=list)  # one per node when PP > 1, rank 0 first
    # engine device cpu (planner/cpu.py): the host cores the engine binds
    # (VLLM_CPU_OMP_THREADS_BIND) and the host RAM it takes (weights + KV + runtime).
    cpu_cores: list[int] = Field(default_factory=list)
    host_memory_bytes: int | None = None

    @property
    def spans_nodes(self) -> bool:
        return self.pipeline_parallel_size > 1


class PlanGpu(_PlanModel):
    """One physical GPU and what the plan puts on it."""

    node: str
    index: int
    uuid: str | None = None
    type: str
    memory_gib: float  # total as CUDA reports it
    budget_gib: float  # the card budget the planner keeps under (default 0.95 x total)
    used_gib: float  # sum of instance shares (utilization x total) + CUDA contexts
    free_gib: float
    instances: list[str]  # instance ids


class PlanCpuNode(_PlanModel):
    """One CPU host of a CPU plan: its cores and RAM and what the plan puts on them."""

    node: str
    cores: list[int]  # core ids the engines may bind
    memory_gib: float  # host RAM
    budget_gib: float  # the share of it the planner keeps under
    used_gib: float  # sum of the instances' weights + KV cache + runtime
    free_gib: float
    instances: list[str]  # instance ids


class PlanEndpoint(_PlanModel):
    """A model served elsewhere: routed to, never placed."""

    model: str
    urls: list[str]


class PlanTotals(_PlanModel):
    gpus_total: int
    gpus_used: int
    gpus_idle: int
    gpus_needed_at_peak: int  # every replica of every model at once (P08)
    fragmentation: float  # 0 = free memory concentrated on idle cards, 1 = scattered
    memory_efficiency: float  # used / total memory of the GPUs in use
    solver: str  # "greedy" or the exact solver that produced the placement
    solver_optimal: bool


class Plan(_PlanModel):
    schema_version: int = PLAN_SCHEMA_VERSION
    fleet_file: str
    engine: Literal["vllm", "sim"]
    engine_version: str
    device: PlanDevice = "gpu"  # cpu: `gpus` is empty and `cpus` lists the hosts
    policy: PlacementPolicy
    # What the planner optimised once every replica was placed (docs/plan.md); plans
    # written before the field existed were planned for the fewest GPUs.
    objective: PlanObjective = "min_gpus"
    card_budget_fraction: float
    instances: list[PlanInstance]
    gpus: list[PlanGpu]
    cpus: list[PlanCpuNode] = Field(default_factory=list)
    endpoints: list[PlanEndpoint] = Field(default_factory=list)
    totals: PlanTotals
    warnings: list[str] = Field(default_factory=list)

    def instance(self, instance_id: str) -> PlanInstance:
        for inst in self.instances:
            if inst.id == instance_id:
                return inst
        raise KeyError(instance_id)

    def instances_of(self, model: str) -> list[PlanInstance]:
        return [inst for inst in self.instances if inst.model == model]
