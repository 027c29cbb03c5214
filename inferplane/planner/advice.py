"""What a plan says about each model, once: one line per model, never one per replica.

* P09: replicas holding fewer full-length requests than the `max_num_seqs` the user asked
  for (vLLM's default is a cap, not a demand: no line for it), with advice that fits the
  model's size - a wider TP for a model whose weights fill a good part of a card, a card of
  its own or more replicas for a small one (TP 8 for a 0.6B embedding is never advice);
* replicas of one model not sized alike (KV pools more than 25% apart) and why;
* a small model run at TP > 1 (its weights a few percent of a card): only because the
  wider TP holds more of its demand, and by how much;
* `colocate_with` a model with fewer replicas: how many share a card with it.
"""

from __future__ import annotations

from collections import defaultdict

from inferplane.planner.placement import ALIKE_RATIO, Item, alike
from inferplane.planner.plan import PlanInstance
from inferplane.planner.sizing import Shape
from inferplane.spec import ModelSpec

# Weights below this fraction of a card make a model "small" for that card: more GPUs per
# replica (TP) add almost nothing but KV room another replica would add as well.
SMALL_MODEL_FRACTION = 0.10


def model_notes(
    instances: list[PlanInstance],
    items: dict[str, Item],
    models: dict[str, ModelSpec],
    card_bytes: dict[str, int],
    objective: str,
) -> list[str]:
    """The plan's per-model lines, in fleet order."""
    by_model: dict[str, list[PlanInstance]] = defaultdict(list)
    for inst in instances:
        by_model[inst.model].append(inst)
    model_of = {inst.id: inst.model for inst in instances}
    out: list[str] = []
    for name, insts in by_model.items():
        spec, item = models[name], items[insts[0].id]
        out += _colocation(spec, item, insts, model_of)
        out += _small_at_tp(spec, item, insts, card_bytes)
        out += _unalike(spec, insts, objective)
        out += _short(spec, item, insts, card_bytes)
    return out


def _held(insts: list[PlanInstance]) -> list[float]:
    return [i.memory.max_concurrency for i in insts]


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f}" if high - low < 0.05 else f"{low:.1f}-{high:.1f}"


def _smallest(item: Item, gpu_type: str) -> Shape:
    return item.shapes[gpu_type][0]


def _weights_fraction(item: Item, gpu_type: str, total: int) -> float:
    return _smallest(item, gpu_type).non_kv_bytes / total


def _short(
    spec: ModelSpec, item: Item, insts: list[PlanInstance], card_bytes: dict[str, int]
) -> list[str]:
    """P09, once per model: only for an explicit max_num_seqs (a demand)."""
    if spec.max_num_seqs is None:
        return []
    seqs = spec.max_num_seqs
    short = [i for i in insts if i.memory.max_concurrency < seqs]
    if not short:
        return []
    first = short[0]
    count = ("its replica holds" if len(insts) == 1
             else f"{len(short)} of its {len(insts)} replicas hold")
    line = (f"P09: {spec.name}: {count} {_span(_held(short))} concurrent requests of "
            f"{first.max_model_len} tokens (max_num_seqs {seqs}); the rest queue")
    return [line + _advice(item, first, card_bytes)]


def _advice(item: Item, inst: PlanInstance, card_bytes: dict[str, int]) -> str:
    gpu_type, tp = inst.gpu_type, inst.tensor_parallel_size
    total = card_bytes[gpu_type]
    if _weights_fraction(item, gpu_type, total) < SMALL_MODEL_FRACTION:
        own = _smallest(item, gpu_type)
        alone = own.concurrency_at(own.want_units, total)
        if inst.shares_gpu_with and alone > inst.memory.max_concurrency * 1.05:
            return (f"; a card of its own would hold {alone:.1f} per replica (it shares "
                    f"{gpu_type} cards)")
        return "; more replicas (or a shorter max_model_len) hold more"
    wider = [s for s in item.shapes[gpu_type] if s.tensor_parallel_size > tp]
    if wider:
        widest = wider[-1]
        held = widest.concurrency_at(widest.want_units, total)
        if held > inst.memory.max_concurrency * 1.05:
            return (f"; TP {widest.tensor_parallel_size} ({widest.gpus} {gpu_type} per "
                    f"replica) would hold {held:.1f}")
    return "; a shorter max_model_len or kv_cache_dtype: fp8 holds more"


def _unalike(spec: ModelSpec, insts: list[PlanInstance], objective: str) -> list[str]:
    if len(insts) < 2 or alike(_held(insts)):
        return []
    tokens = [i.memory.kv_cache_tokens for i in insts]
    shapes = sorted({f"TP {i.tensor_parallel_size} at {i.gpu_memory_utilization:.2f}"
                     for i in insts})
    why = ("no placement on this inventory gives them the same room next to the other "
           "models" if objective == "utilize"
           else "planning.objective min_gpus packs for the fewest GPUs; utilize sizes them "
           "alike")
    return [f"{spec.name}: its replicas hold {min(tokens):,} to {max(tokens):,} KV tokens "
            f"({', '.join(shapes)}), more than {ALIKE_RATIO - 1:.0%} apart: {why}"]


def _small_at_tp(
    spec: ModelSpec, item: Item, insts: list[PlanInstance], card_bytes: dict[str, int]
) -> list[str]:
    """A small model at TP > 1 chosen by the planner (not the user): say what it buys."""
    if spec.tensor_parallel_size != "auto":
        return []
    wide = [i for i in insts if i.tensor_parallel_size > 1]
    if not wide:
        return []
    inst = wide[0]
    total = card_bytes[inst.gpu_type]
    fraction = _weights_fraction(item, inst.gpu_type, total)
    if fraction >= SMALL_MODEL_FRACTION:
        return []
    own = _smallest(item, inst.gpu_type)
    alone = own.concurrency_at(own.want_units, total)
    return [f"{spec.name}: TP {inst.tensor_parallel_size} although its weights are "
            f"{fraction:.0%} of a {inst.gpu_type}: it holds {inst.memory.max_concurrency:.1f} "
            f"concurrent requests of {inst.max_model_len} tokens where TP "
            f"{own.tensor_parallel_size} would hold at most {alone:.1f}"]


def _colocation(
    spec: ModelSpec, item: Item, insts: list[PlanInstance], model_of: dict[str, str]
) -> list[str]:
    partners = list(spec.placement.colocate_with)
    if not partners or len(insts) <= item.colocate_count:
        return []
    sharing = [i for i in insts
               if any(model_of.get(other) in partners for other in i.shares_gpu_with)]
    count = item.colocate_count
    who = " and ".join(partners)
    verb = "has" if len(partners) == 1 else "have"
    return [f"{spec.name}: {len(sharing)} of its {len(insts)} replicas share a GPU with "
            f"{who} ({who} {verb} {count} replica{'s' if count != 1 else ''}); the other "
            f"{len(insts) - len(sharing)} run where they fit"]
