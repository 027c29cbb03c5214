"""Replicas that span nodes (pipeline parallel across nodes, P13/P15): what every target needs.

The plan gives each rank of such a replica its own argv and env (rank 0, the leader, serves
HTTP; the others are headless workers). Wherever a rank needs the leader's address the plan
writes `LEADER_ADDRESS_TOKEN`; a target substitutes what it knows: Kubernetes
`$(LWS_LEADER_ADDRESS)`, systemd the leader's host. Kubernetes also needs one worker
template for all workers, so the workers' argv/env must differ only by the rank number,
which becomes `$(LWS_WORKER_INDEX)` there.
"""

from __future__ import annotations

from inferplane.engines.vllm.launch import RANK_OPTION, is_direct_vllm
from inferplane.errors import InferplaneError
from inferplane.planner.plan import LEADER_ADDRESS_TOKEN, Plan, PlanInstance, PlanRank

RANK_FLAGS = (f"--{RANK_OPTION}",)  # vLLM's native multi-node rank flag


def spanning(plan: Plan) -> list[PlanInstance]:
    """Instances whose replica spans more than one node, in plan order."""
    return [inst for inst in plan.instances if inst.spans_nodes]


def ranks_of(inst: PlanInstance) -> list[PlanRank]:
    """The instance's ranks, leader first, after checking the plan is coherent."""
    where = f"plan.instances[{inst.id}].ranks"
    fix = "re-create the plan with `inferplane plan`"
    ranks = list(inst.ranks)
    if len(ranks) != inst.pipeline_parallel_size or inst.pipeline_parallel_size < 2:
        raise InferplaneError(
            f"{inst.id} spans {inst.pipeline_parallel_size} nodes but lists {len(ranks)} ranks",
            field=where, value=len(ranks), fix=fix)
    for i, rank in enumerate(ranks):
        if rank.rank != i:
            raise InferplaneError(f"{inst.id}: rank {i} is listed as rank {rank.rank}",
                                  field=where, value=rank.rank, fix=fix)
        if not rank.argv:
            raise InferplaneError(f"{inst.id}: rank {i} has no command", field=where,
                                  value=rank.node, fix=fix)
    if ranks[0].node != inst.node:
        raise InferplaneError(f"{inst.id}: rank 0 is on {ranks[0].node}, the instance on "
                              f"{inst.node}", field=where, value=ranks[0].node, fix=fix)
    nodes = [r.node for r in ranks]
    if len(set(nodes)) != len(nodes):
        raise InferplaneError(f"{inst.id}: two ranks on one node ({', '.join(nodes)})",
                              field=where, value=", ".join(nodes), fix=fix)
    return ranks


def substitute(text: str, leader: str) -> str:
    return text.replace(LEADER_ADDRESS_TOKEN, leader)


def _template(values: list[str], ranks: list[int], index: str) -> str | None:
    """One string that gives `values[i]` when `index` is replaced by `ranks[i]`."""
    first, mark = values[0], str(ranks[0])
    start = 0
    while (k := first.find(mark, start)) >= 0:
        pattern = first[:k] + "\0" + first[k + len(mark):]
        if all(pattern.replace("\0", str(r)) == v for v, r in zip(values, ranks, strict=True)):
            return pattern.replace("\0", index)
        start = k + 1
    return None


def worker_argv(inst: PlanInstance, index: str) -> list[str]:
    """The workers' argv as one template: the rank number (where it differs, or follows
    `--node-rank`) becomes `index`. Refuses workers that differ in anything else."""
    workers = ranks_of(inst)[1:]
    numbers = [r.rank for r in workers]
    lengths = {len(r.argv) for r in workers}
    if len(lengths) != 1:
        raise _differ(inst, "argv lengths", ", ".join(str(len(r.argv)) for r in workers))
    out: list[str] = []
    for i in range(len(workers[0].argv)):
        values = [r.argv[i] for r in workers]
        prev = workers[0].argv[i - 1] if i else ""
        if prev in RANK_FLAGS and all(v == str(n) for v, n in zip(values, numbers, strict=True)):
            out.append(index)
            continue
        flag = next((f for f in RANK_FLAGS if values[0].startswith(f"{f}=")), None)
        if flag is not None and all(v == f"{flag}={n}" for v, n in zip(values, numbers,
                                                                       strict=True)):
            out.append(f"{flag}={index}")
            continue
        if len(set(values)) == 1:
            out.append(values[0])
            continue
        templated = _template(values, numbers, index)
        if templated is None:
            raise _differ(inst, f"argv[{i}]", " / ".join(values))
        out.append(templated)
    return out


def worker_env(inst: PlanInstance, index: str) -> dict[str, str]:
    """The workers' environment as one template (see `worker_argv`)."""
    workers = ranks_of(inst)[1:]
    numbers = [r.rank for r in workers]
    keys = {tuple(sorted(r.env)) for r in workers}
    if len(keys) != 1:
        raise _differ(inst, "env names", " / ".join(",".join(sorted(r.env)) for r in workers))
    out: dict[str, str] = {}
    for key in sorted(workers[0].env):
        values = [r.env[key] for r in workers]
        if len(set(values)) == 1:
            out[key] = values[0]
            continue
        templated = _template(values, numbers, index)
        if templated is None:
            raise _differ(inst, f"env {key}", " / ".join(values))
        out[key] = templated
    return out


def _differ(inst: PlanInstance, what: str, values: str) -> InferplaneError:
    return InferplaneError(
        f"the workers of {inst.id} differ in {what} by more than their rank number, so one "
        "worker template cannot start them", field=f"plan.instances[{inst.id}].ranks",
        value=values, fix="re-create the plan with `inferplane plan`; give workers the same "
                          "command apart from the rank",
    )


__all__ = ["RANK_FLAGS", "is_direct_vllm", "ranks_of", "spanning", "substitute", "worker_argv",
           "worker_env"]
