"""GPU slices instead of the UUID hand-off (S0, P18): MIG profiles and HAMi virtual GPUs.

When the fleet file says a node's GPUs are MIG-partitioned (`sharing: mig`,
`mig_profile: 3g.40gb`), every engine container on it requests one
`nvidia.com/mig-<profile>` (the device plugin's mixed strategy); with `sharing: hami`, each
container of a co-located pod requests `nvidia.com/gpu` with HAMi's `nvidia.com/gpumem`
(MiB) and `nvidia.com/gpucores` (percent of the card). Either way the process sees only its
slice, so vLLM's `--gpu-memory-utilization` (a fraction of the visible memory, P01) is
rescaled to keep the plan's bytes: `util x card / slice`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferplane.deploy.k8s.context import K8sContext, Workload
from inferplane.engines import engine_for
from inferplane.errors import InferplaneError
from inferplane.planner.plan import PlanInstance

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class Slice:
    """What one engine container asks the device plugin for, and the argv fix that goes with it."""

    resources: dict[str, str]  # requests = limits
    gpu_memory_utilization: float  # of the slice


def sharing_mode(ctx: K8sContext, workload: Workload) -> str:
    """`none`, `mig` or `hami` for the node the workload's first replica is planned on."""
    inventory = ctx.fleet.gpus
    node = inventory.node(workload.members[0].node) if inventory is not None else None
    return node.sharing if node is not None else "none"


def _card_gib(ctx: K8sContext, inst: PlanInstance) -> float:
    for gpu in ctx.plan.gpus:
        if gpu.node == inst.node and gpu.index == inst.gpu_indices[0]:
            return gpu.memory_gib
    raise InferplaneError(
        "the plan lists no GPU for this instance", field="plan.gpus",
        value=f"{inst.node}:{inst.gpu_indices[0]}", fix="re-create the plan with the planner",
    )


def _need_gib(ctx: K8sContext, inst: PlanInstance) -> tuple[float, float]:
    """(the plan's share of the card, the share plus the CUDA context outside it, P01)."""
    share = inst.gpu_memory_utilization * _card_gib(ctx, inst)
    return share, share + inst.memory.cuda_context_gib


def _util(share_gib: float, slice_gib: float) -> float:
    return math.floor(share_gib / slice_gib * 1000) / 1000


def slices(ctx: K8sContext, workload: Workload) -> list[Slice] | None:
    """One Slice per member, or None when the workload uses whole GPUs (and the hand-off)."""
    mode = sharing_mode(ctx, workload)
    inventory = ctx.fleet.gpus
    if mode == "none" or inventory is None:
        return None
    node = inventory.node(workload.members[0].node)
    assert node is not None
    if mode == "hami" and not workload.colocated:
        return None  # a whole card (or TP group): HAMi hands it out like the device plugin
    out: list[Slice] = []
    total_util = sum(m.gpu_memory_utilization for m in workload.members)
    for inst in workload.members:
        share, need = _need_gib(ctx, inst)
        if mode == "mig":
            if inst.tensor_parallel_size != 1:
                raise InferplaneError(
                    "a tensor-parallel group cannot span MIG slices (NCCL has no P2P "
                    "between them)", field="gpus.nodes.sharing", value=inst.id,
                    fix="plan this model on a node without MIG, or use tensor_parallel_size 1",
                )
            slice_gib = node.mig_memory_gib
            assert slice_gib is not None
            if need > slice_gib:
                raise InferplaneError(
                    f"{inst.id} needs {need:.1f} GiB but one MIG {node.mig_profile} slice "
                    f"has {slice_gib:.1f} GiB", field="gpus.nodes.mig_profile",
                    value=node.mig_profile,
                    fix="choose a larger MIG profile, or lower the model's memory "
                        "(max_model_len, max_num_seqs, quantization)",
                )
            quantity = "1"
            out.append(Slice({f"nvidia.com/mig-{node.mig_profile}": quantity},
                             _util(share, slice_gib)))
        else:
            mem_mib = math.ceil(need * GIB / MIB)
            cores = max(1, math.floor(100 * inst.gpu_memory_utilization / total_util))
            out.append(Slice({
                "nvidia.com/gpu": str(inst.tensor_parallel_size),
                "nvidia.com/gpumem": str(mem_mib),
                "nvidia.com/gpucores": str(cores),
            }, _util(share, mem_mib * MIB / GIB)))
    return out


def with_utilization(kind: str, argv: list[str], util: float) -> list[str]:
    """The engine's argv with its GPU memory utilization set to `util` (added when missing)."""
    return list(engine_for(kind).planned(argv).with_gpu_memory_utilization(util).argv)


__all__ = ["Slice", "sharing_mode", "slices", "with_utilization"]
