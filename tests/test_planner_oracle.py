"""The joint planner against a brute-force reference (tests/placement_oracle.py) on small
random fleets: it never refuses a fleet the reference places, never meets fewer demands,
and (binpack) never uses more GPUs at equal demands. Thousands more fleets:
`python benchmarks/plan_quality.py`."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from placement_oracle import TooBig, best_placement
from planner_fleets import MODELS, fleet

from inferplane.errors import InferplaneError
from inferplane.models import load_profile
from inferplane.models.profile import ModelProfile
from inferplane.planner import Plan, plan_fleet
from inferplane.planner.build import placement_problem
from inferplane.planner.placement import Item
from inferplane.planner.sizing import UNITS
from inferplane.spec import FleetSpec
from inferplane.spec.problems import FleetValidationError

POOL = {
    "qwen3-8b": "Qwen--Qwen3-8B",
    "llama-8b": "meta-llama--Llama-3.1-8B",
    "qwen2-5-7b": "Qwen--Qwen2.5-7B-Instruct",
    "qwen3-32b": "Qwen--Qwen3-32B",
    "embed": "Qwen--Qwen3-Embedding-0.6B",
    "embed-b": "Qwen--Qwen3-Embedding-0.6B",
}
PROFILES: dict[str, ModelProfile] = {n: load_profile(MODELS / d) for n, d in POOL.items()}
GPU_TYPES = ["L4", "L40S", "A100-80GB", "H100"]

nodes_st = st.lists(
    st.tuples(st.sampled_from(GPU_TYPES), st.sampled_from([1, 2, 2, 4])), min_size=1,
    max_size=3,
).filter(lambda nodes: sum(c for _, c in nodes) <= 8)


@st.composite
def models_st(draw: st.DrawFn, node_count: int) -> list[dict[str, object]]:
    names = draw(st.lists(st.sampled_from(sorted(POOL)), min_size=1, max_size=5, unique=True))
    out: list[dict[str, object]] = []
    for name in names:
        others = [n for n in names if n != name]
        out.append({
            "name": name,
            "replicas": draw(st.sampled_from([1, 1, 2])),
            "len": draw(st.sampled_from([2048, 8192, 16384])),
            "seqs": draw(st.sampled_from([None, 4, 16, 64])),
            "tp": draw(st.sampled_from(["auto", "auto", "auto", 1])),
            "util": draw(st.sampled_from(["auto"] * 5 + [0.3])),
            "exclusive": draw(st.sampled_from([False] * 5 + [True])),
            "node": draw(st.sampled_from([None] * 4 + list(range(node_count)))),
            "colocate": draw(st.sampled_from([None] * 4 + others)) if others else None,
        })
    return out


def _fleet(nodes: list[tuple[str, int]], models: list[dict[str, object]]) -> FleetSpec:
    lines = ["gpus:", "  nodes:"]
    lines += [f"    - {{name: node-{i}, gpu_type: {gpu}, count: {count}}}"
              for i, (gpu, count) in enumerate(nodes)]
    lines.append("models:")
    for m in models:
        placement = [f"exclusive: {str(m['exclusive']).lower()}"]
        if m["node"] is not None:
            placement.append(f"node: node-{m['node']}")
        if m["colocate"] is not None:
            placement.append(f"colocate_with: [{m['colocate']}]")
        entry = (f"  - {{name: {m['name']}, source: {POOL[str(m['name'])]}, "
                 f"replicas: {m['replicas']}, max_model_len: {m['len']}, "
                 f"tensor_parallel_size: {m['tp']}, gpu_memory_utilization: {m['util']}, "
                 f"placement: {{{', '.join(placement)}}}")
        if m["seqs"] is not None:
            entry += f", max_num_seqs: {m['seqs']}"
        if str(m["name"]).startswith("embed"):
            entry += ", task: embed"
        lines.append(entry + "}")
    return fleet("\n".join(lines) + "\n")


def _met(plan: Plan, items: list[Item]) -> int:
    by_model = {i.model: i for i in items}
    met = 0
    for inst in plan.instances:
        shape = by_model[inst.model].shape(inst.gpu_type, inst.tensor_parallel_size)
        met += shape.meets(round(inst.gpu_memory_utilization * UNITS))
    return met


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), nodes=nodes_st, policy=st.sampled_from(["binpack", "binpack", "spread"]))
def test_never_worse_than_brute_force(
    data: st.DataObject, nodes: list[tuple[str, int]], policy: str
) -> None:
    try:
        spec = _fleet(nodes, data.draw(models_st(len(nodes))))
    except FleetValidationError:
        assume(False)  # e.g. colocate_with an exclusive model: the fleet file is refused
        return
    try:
        slots, items, _, _ = placement_problem(spec, profiles=PROFILES)
    except InferplaneError:
        event("a model fits no GPU alone")
        return  # sizing refuses it, with its own explanation (test_planner_scenarios)
    try:
        oracle = best_placement(items, slots)
    except TooBig:
        event("too big for the oracle")
        assume(False)
        return
    try:
        plan = plan_fleet(spec, profiles=PROFILES, policy="spread" if policy == "spread"
                          else "binpack", time_limit_s=2.0)
    except InferplaneError as exc:
        assert oracle is None, f"refused a fleet the oracle places: {exc.render()}\n{oracle}"
        event("both refuse")
        return
    met = _met(plan, items)
    if oracle is None:
        event("planner places what the aligned-only oracle cannot")  # unaligned fallback
        return
    event("both place")
    assert met >= oracle.met, (met, oracle)
    if policy == "binpack" and met == oracle.met:
        assert plan.totals.gpus_used <= oracle.gpus, (plan.totals.gpus_used, oracle)
