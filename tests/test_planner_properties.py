"""Property tests over random inventories and fleets: whatever the input, a plan keeps every
card under budget, every TP group on one node and one GPU type, places every replica - or
raises an error that names the model, the field and a fix."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from planner_fleets import MODELS, fleet

from inferplane.errors import InferplaneError
from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.planner import Plan, plan_fleet
from inferplane.spec import FleetSpec

CHOICES = {
    "qwen3-8b": "Qwen--Qwen3-8B",
    "llama-8b": "meta-llama--Llama-3.1-8B",
    "qwen3-32b": "Qwen--Qwen3-32B",
    "embed": "Qwen--Qwen3-Embedding-0.6B",
    "mistral-7b": "mistralai--Mistral-7B-Instruct-v0.3",
}
PROFILES: dict[str, ModelProfile] = {n: load_profile(MODELS / d) for n, d in CHOICES.items()}
GPU_TYPES = ["L40S", "A100-80GB", "H100", "L4"]

node = st.fixed_dictionaries({
    "gpu_type": st.sampled_from(GPU_TYPES),
    "count": st.integers(1, 8),
    "interconnect": st.sampled_from(["nvlink", "pcie", "auto"]),
})
model = st.fixed_dictionaries({
    "name": st.sampled_from(sorted(CHOICES)),
    "replicas": st.integers(0, 3),
    "tp": st.sampled_from(["auto", 1, 2, 4]),
    "len": st.sampled_from([2048, 8192, 32768]),
    "seqs": st.sampled_from([None, 4, 32]),
    "util": st.sampled_from(["auto", "auto", 0.5, 0.9]),
    "exclusive": st.booleans(),
    "kv": st.sampled_from(["auto", "fp8"]),
})


def _fleet(nodes: list[dict[str, object]], models: list[dict[str, object]]) -> FleetSpec:
    lines = ["gpus:", "  nodes:"]
    for i, n in enumerate(nodes):
        lines.append(f"    - {{name: node-{i}, gpu_type: {n['gpu_type']}, count: {n['count']}, "
                     f"interconnect: {n['interconnect']}}}")
    lines.append("models:")
    seen: set[object] = set()
    for m in models:
        if m["name"] in seen:
            continue
        seen.add(m["name"])
        entry = (f"  - {{name: {m['name']}, source: {CHOICES[str(m['name'])]}, "
                 f"replicas: {m['replicas']}, tensor_parallel_size: {m['tp']}, "
                 f"max_model_len: {m['len']}, gpu_memory_utilization: {m['util']}, "
                 f"kv_cache_dtype: {m['kv']}, "
                 f"placement: {{exclusive: {str(m['exclusive']).lower()}}}")
        if m["seqs"] is not None:
            entry += f", max_num_seqs: {m['seqs']}"
        if m["name"] == "embed":
            entry += ", task: embed"
        lines.append(entry + "}")
    return fleet("\n".join(lines) + "\n")


def _check(plan: Plan, spec: FleetSpec) -> None:
    assert spec.gpus is not None
    types = {n.name: n.gpu_type for n in spec.gpus.nodes}
    for gpu in plan.gpus:
        assert gpu.used_gib <= gpu.budget_gib + 0.011, gpu
        here = [plan.instance(i) for i in gpu.instances]
        share = sum(i.gpu_memory_utilization for i in here)
        share += sum(i.memory.cuda_context_gib for i in here) / gpu.memory_gib
        assert share <= plan.card_budget_fraction + 1e-6
        if any(spec.model(i.model).placement.exclusive for i in here):  # type: ignore[union-attr]
            assert len(here) == 1
    for inst in plan.instances:
        assert len(inst.gpu_indices) == len(set(inst.gpu_indices)) == inst.tensor_parallel_size
        assert inst.gpu_type == types[inst.node]  # one node, one GPU type (P12)
        assert inst.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, inst.gpu_indices))
        assert inst.memory.max_concurrency >= 1  # one request of max_model_len fits (P02)
    # Replicas of one model never share a sharing group (GPUs linked by instances on them).
    group: dict[tuple[str, int], set[tuple[str, int]]] = {
        (g.node, g.index): {(g.node, g.index)} for g in plan.gpus}
    for inst in plan.instances:
        merged = set().union(*(group[(inst.node, i)] for i in inst.gpu_indices))
        for key in merged:
            group[key] = merged
    for linked in {frozenset(v) for v in group.values()}:
        ids = {i for g in plan.gpus if (g.node, g.index) in linked for i in g.instances}
        models = [plan.instance(i).model for i in ids]
        assert len(models) == len(set(models)), linked
    wanted = Counter({m.name: m.replicas for m in spec.placed_models if m.replicas})
    assert Counter(i.model for i in plan.instances) == wanted
    assert len({i.port for i in plan.instances}) == len(plan.instances)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(node, min_size=1, max_size=3),
    models=st.lists(model, min_size=1, max_size=4),
    policy=st.sampled_from(["binpack", "spread"]),
)
def test_any_fleet_is_placed_within_budget_or_explained(
    nodes: list[dict[str, object]], models: list[dict[str, object]], policy: str
) -> None:
    spec = _fleet(nodes, models)
    try:
        plan = plan_fleet(
            spec, policy="spread" if policy == "spread" else "binpack", time_limit_s=0.5,
            profiles=PROFILES,
        )
    except InferplaneError as exc:
        event("explained")
        assert exc.field and exc.field.startswith("models.")
        assert exc.fix
        named = exc.field.split(".")[1]
        assert named in {m.name for m in spec.placed_models}
        return
    event("planned")
    _check(plan, spec)
