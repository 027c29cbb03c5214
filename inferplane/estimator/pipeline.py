"""Pipeline parallelism: which decoder layers each stage holds, and a stage's own profile.

vLLM splits the decoder layers over `pipeline_parallel_size` stages with
`vllm.distributed.utils.get_pp_indices`: every stage gets `layers // pp`; the remainder
goes one layer each to the stages before the last, starting from the second-to-last
(`partitions[-2] += 1`, `partitions[-3] += 1`, ...) because the last stage also runs the
final norm and the LM head. `VLLM_PP_LAYER_PARTITION="20,20,21,19"` overrides the split
(one count per stage, summing to the layer count).

The first stage holds the input embedding, the last the final norm and the LM head (with
tied embeddings the last stage builds its own embedding matrix for the LM head: each model
file's `embed_tokens = ... if is_first_rank or (tie_word_embeddings and is_last_rank)`).
Every stage holds the rotary table and its own layers' KV cache.

`stage_profile` returns a `ModelProfile` of one stage: its layers, its share of the
parameters and no file sizes, so the estimator's per-GPU rules (weights, KV layout, CUDA
graphs) apply to the stage unchanged. Per-layer parameters are spread evenly over the
layers (experts over the MoE layers, taken to be the last `num_moe_layers`, as in
DeepSeek's `first_k_dense_replace` and all-MoE families); DeepSeek's three dense layers
make its first stage ~0.07 GiB per GPU heavier than this at TP 8, well inside the headroom.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from inferplane.errors import InferplaneError
from inferplane.models.profile import ModelProfile, ParamCounts

PP_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


@dataclass(frozen=True)
class Stage:
    """One pipeline stage (one node of a multi-node replica)."""

    rank: int
    size: int  # pipeline_parallel_size
    start_layer: int  # first decoder layer, inclusive
    end_layer: int  # last decoder layer, exclusive

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.start_layer

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1


def layer_split(
    num_layers: int, pipeline_parallel_size: int, partition: Sequence[int] | None = None
) -> list[int]:
    """Decoder layers per stage, as vLLM's `get_pp_indices` assigns them."""
    pp = pipeline_parallel_size
    if pp < 1:
        raise InferplaneError(
            "must be >= 1", field="pipeline_parallel_size", value=pp, fix="use 1, 2, 3, ..."
        )
    if pp > num_layers:
        raise InferplaneError(
            f"pipeline_parallel_size {pp} exceeds the model's {num_layers} decoder layers: "
            "a stage would hold no layer",
            field="pipeline_parallel_size", value=pp,
            fix=f"use at most {num_layers} stages",
        )
    if partition is not None:
        counts = list(partition)
        if len(counts) != pp or sum(counts) != num_layers or min(counts) < 1:
            raise InferplaneError(
                f"{PP_PARTITION_ENV} must give {pp} positive layer counts summing to "
                f"{num_layers}",
                field=PP_PARTITION_ENV, value=",".join(str(c) for c in counts),
                fix=f"e.g. {','.join(str(c) for c in layer_split(num_layers, pp))}, or unset it",
            )
        return counts
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    return counts


def parse_partition(text: str | None) -> tuple[int, ...] | None:
    """`VLLM_PP_LAYER_PARTITION` as vLLM reads it: comma-separated integers."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InferplaneError(
            "not a comma-separated list of layer counts", field=PP_PARTITION_ENV, value=text,
            fix='write one integer per stage, e.g. "40,40"',
        ) from None


def stages(
    num_layers: int, pipeline_parallel_size: int, partition: Sequence[int] | None = None
) -> list[Stage]:
    counts = layer_split(num_layers, pipeline_parallel_size, partition)
    out: list[Stage] = []
    start = 0
    for rank, count in enumerate(counts):
        out.append(Stage(rank, len(counts), start, start + count))
        start += count
    return out


def stage_profile(profile: ModelProfile, stage: Stage) -> ModelProfile:
    """The part of `profile` one stage loads; the profile itself for a single stage."""
    if stage.size == 1:
        return profile
    p = profile.params
    total_layers = profile.num_layers
    layers = stage.num_layers
    moe_layers = profile.num_moe_layers or (total_layers if profile.is_moe else 0)
    first_moe = total_layers - moe_layers
    stage_moe = max(0, stage.end_layer - max(stage.start_layer, first_moe))
    has_embedding = stage.is_first or (profile.tie_word_embeddings and stage.is_last)
    params = ParamCounts(
        embedding=p.embedding if has_embedding else 0,
        lm_head=p.lm_head if stage.is_last else 0,
        linear=p.linear * layers // total_layers,
        experts=p.experts * stage_moe // moe_layers if moe_layers else 0,
        other=p.other * layers // total_layers,
    )
    return replace(
        profile,
        num_layers=layers,
        layer_attention=profile.layer_attention[stage.start_layer:stage.end_layer],
        params=params,
        num_moe_layers=stage_moe,
        weight_bytes_on_disk=None,
        weight_bytes_loaded=None,
        params_source="config",
    )
