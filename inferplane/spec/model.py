"""`models:` — one entry per client-facing model: what to serve and how, or where it runs."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from inferplane.spec.base import SpecModel
from inferplane.spec.extra_args import ExtraArgValue, check_extra_args
from inferplane.spec.gpu_names import canonical_gpu_type
from inferplane.spec.lora import LoraSpec
from inferplane.spec.problems import Issue, issues_error
from inferplane.spec.sources import is_hf_id, resolve_source, validate_endpoint
from inferplane.spec.types import (
    AutoOrFraction,
    AutoOrPositiveInt,
    EnvMap,
    PositiveFloat,
    PositiveInt,
)

Task = Literal["generate", "embed"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Quantization = Literal[
    "fp8",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "bitsandbytes",
    "compressed-tensors",
    "mxfp4",
    "modelopt",
]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
RoutingPolicy = Literal[
    "least_outstanding", "engine_metrics", "prefix_affinity", "session_affinity"
]
CapAction = Literal["clamp", "reject"]

# DNS-1123 subdomain-ish, one label long: the name becomes Kubernetes object names.
_MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
MODEL_NAME_MAX_CHARS = 63


def suggest_model_name(name: str) -> str:
    """The closest valid model name: `Qwen/Qwen3-32B` -> `qwen-qwen3-32b`."""
    text = re.sub(r"[^a-z0-9.-]+", "-", name.lower())
    text = re.sub(r"-{2,}", "-", text).strip("-.")
    return text[:MODEL_NAME_MAX_CHARS].rstrip("-.") or "model"


class PlacementSpec(SpecModel):
    """Hints for the planner. Unset hints leave the choice to it."""

    colocate_with: list[StrictStr] = Field(default_factory=list)  # share GPUs with these models
    node: StrictStr | None = None  # only this node (a name from gpus.nodes)
    gpu_type: StrictStr | None = None  # only GPUs of this type
    exclusive: StrictBool = False  # no other model's instances on this model's GPUs

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, value: str | None) -> str | None:
        return None if value is None else canonical_gpu_type(value)

    @model_validator(mode="after")
    def _consistent(self) -> PlacementSpec:
        if self.exclusive and self.colocate_with:
            raise issues_error(
                [
                    Issue(
                        ("exclusive",),
                        "an exclusive model cannot be co-located with others",
                        True,
                        "drop exclusive: true or empty colocate_with",
                    )
                ]
            )
        return self


class LongPromptSpec(SpecModel):
    """Prompts estimated above `threshold_tokens` go to `model`'s replicas instead (P39)."""

    threshold_tokens: PositiveInt
    model: StrictStr = Field(min_length=1)  # a model name from `models:`


class RoutingSpec(SpecModel):
    """How the gateway picks one of this model's replicas."""

    policy: RoutingPolicy = "least_outstanding"
    session_header: StrictStr = Field(default="X-Session-ID", min_length=1)  # session_affinity
    max_queue_depth: int = Field(default=512, strict=True, ge=0)  # gateway queue; full -> 429
    max_queue_wait_s: PositiveFloat = 30.0  # longest wait in the gateway queue; then 503
    long_prompt: LongPromptSpec | None = None  # a separate lane for long prompts (P39)
    retries: int = Field(default=2, strict=True, ge=0)  # other replicas, before the first byte
    # Outlier detection (docs/gateway.md): the replica's own failures in a row (connect,
    # reset, death mid-stream, timeouts), 5xx answers in a row that another replica did not
    # share, and the largest share of replicas ejected at once; readmitted when healthy.
    eject_after_failures: PositiveInt = 3
    eject_after_5xx: PositiveInt = 5
    max_ejection_percent: float = Field(default=50.0, ge=0, le=100, allow_inf_nan=False)


class MaxTokensCap(SpecModel):
    """Upper bound on a request's `max_tokens` (P39): clamp it, or reject the request."""

    limit: PositiveInt
    action: CapAction = "clamp"


class TimeoutsSpec(SpecModel):
    """Upstream timeouts in seconds (P40). Unset fields fall back to `gateway.timeouts`."""

    connect_s: PositiveFloat | None = None
    first_byte_s: PositiveFloat | None = None  # until the first byte / token
    idle_s: PositiveFloat | None = None  # longest gap between streamed chunks
    total_s: PositiveFloat | None = None  # whole request

    @model_validator(mode="after")
    def _ordered(self) -> TimeoutsSpec:
        if self.first_byte_s and self.total_s and self.first_byte_s > self.total_s:
            raise issues_error(
                [
                    Issue(
                        ("first_byte_s",),
                        f"first_byte_s is longer than total_s ({self.total_s:g})",
                        self.first_byte_s,
                        "make total_s at least first_byte_s",
                    )
                ]
            )
        return self


# Fields that only mean something for a model inferplane places and runs itself.
ENGINE_FIELDS: tuple[str, ...] = (
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "max_model_len",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "replicas",
    "gpu_memory_utilization",
    "kv_cache_memory_gib",
    "enforce_eager",
    "cpu_cores",
    "extra_args",
    "env",
    "placement",
    "lora",
)


class ModelSpec(SpecModel):
    """A client-facing model: served from `source` on our GPUs, or routed to `endpoints`."""

    name: StrictStr  # what clients send as "model"; also names Kubernetes objects
    source: StrictStr | None = None  # local model directory or Hugging Face id (org/name)
    endpoints: list[StrictStr] | None = None  # served elsewhere: routed to, never placed
    served_model_name: StrictStr | None = None  # engine-side name; default: `name`
    aliases: list[StrictStr] = Field(default_factory=list)  # more client-facing names
    task: Task = "generate"

    dtype: Dtype = "auto"
    quantization: Quantization | None = None  # None: whatever the checkpoint says
    kv_cache_dtype: KvCacheDtype = "auto"
    max_model_len: AutoOrPositiveInt = "auto"  # auto: the longest that fits (P02)
    max_num_seqs: PositiveInt | None = None  # for endpoints: the gateway's per-endpoint cap
    max_num_batched_tokens: PositiveInt | None = None
    tensor_parallel_size: AutoOrPositiveInt = "auto"  # auto: smallest that fits (P16)
    # Nodes per replica (pipeline stages, each with tensor_parallel_size GPUs): 1 keeps a
    # replica on one node; "auto" spans nodes only when no single node can hold it.
    pipeline_parallel_size: AutoOrPositiveInt = 1
    replicas: int = Field(default=1, strict=True, ge=0)
    gpu_memory_utilization: AutoOrFraction = "auto"  # fraction of the whole card (P01)
    kv_cache_memory_gib: PositiveFloat | None = None  # fixed KV pool (vLLM --kv-cache-memory)
    enforce_eager: StrictBool = False  # no CUDA graphs: slower (P33), planner's last resort
    # engine device cpu: the cores each replica binds (VLLM_CPU_OMP_THREADS_BIND); None:
    # the node's cores split evenly between the replicas that do not share cores.
    cpu_cores: PositiveInt | None = None
    extra_args: dict[str, ExtraArgValue] = Field(default_factory=dict)
    env: EnvMap = Field(default_factory=dict)

    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    max_tokens_cap: MaxTokensCap | None = None
    timeouts: TimeoutsSpec | None = None
    lora: LoraSpec | None = None  # fine-tuned adapters on this base (docs/lora.md)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if len(value) <= MODEL_NAME_MAX_CHARS and _MODEL_NAME.match(value):
            return value
        suggestion = suggest_model_name(value)
        raise PydanticCustomError(
            "model_name",
            "model name must be lowercase letters, digits, '-' or '.', start and end with a "
            "letter or digit, at most 63 characters (it becomes a Kubernetes name)",
            {
                "fix": f"use name: {suggestion} and list {value!r} under aliases "
                "if clients must send it"
            },
        )

    @field_validator("source")
    @classmethod
    def _source(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        base_dir = (info.context or {}).get("base_dir")
        return resolve_source(value, base_dir)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _endpoints(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value  # the list type check reports it
        issues: list[Issue] = []
        urls: list[str] = []
        for index, item in enumerate(value):
            try:
                url = validate_endpoint(item)
            except PydanticCustomError as exc:
                issues.append(Issue((index,), exc.message(), item, (exc.context or {}).get("fix")))
                continue
            if url in urls:
                issues.append(Issue((index,), "endpoint is listed twice", item, "remove it"))
            urls.append(url)
        if not value:
            raise PydanticCustomError(
                "endpoints_empty",
                "endpoints is empty",
                {"fix": 'list at least one URL, e.g. ["http://127.0.0.1:8100"], or use source:'},
            )
        if issues:
            raise issues_error(issues)
        return urls

    @field_validator("extra_args", mode="before")
    @classmethod
    def _extra_args(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        normalised, issues = check_extra_args(value)
        if issues:
            raise issues_error(issues)
        return normalised

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        if "CUDA_VISIBLE_DEVICES" in value:
            # The launcher sets it from the plan (P19-P21); a fixed value breaks placement.
            raise issues_error(
                [
                    Issue(
                        ("CUDA_VISIBLE_DEVICES",),
                        "CUDA_VISIBLE_DEVICES is set by the launcher from the plan",
                        value["CUDA_VISIBLE_DEVICES"],
                        "remove it; pin the model with placement.node / placement.gpu_type",
                    )
                ]
            )
        return value

    @model_validator(mode="after")
    def _source_xor_endpoints(self) -> ModelSpec:
        if self.source is None and self.endpoints is None:
            raise PydanticCustomError(
                "source_or_endpoints",
                "model has neither source nor endpoints",
                {
                    "fix": "add source: <model directory or org/name> to serve it here, "
                    'or endpoints: ["http://host:port"] if it runs elsewhere'
                },
            )
        if self.source is not None and self.endpoints is not None:
            raise issues_error(
                [
                    Issue(
                        ("endpoints",),
                        "model has both source and endpoints",
                        self.endpoints,
                        "keep source: to serve it on the fleet's GPUs, or endpoints: to route "
                        "to servers running elsewhere, not both",
                    )
                ]
            )
        if self.endpoints is not None:
            self._check_endpoint_only()
        self._check_spanning()
        if self.task == "embed" and self.lora is not None:
            raise issues_error([Issue(
                ("lora",), "vLLM serves LoRA adapters on generation models only", "embed",
                "remove lora, or serve the adapters on a generate model",
            )])
        if self.task == "embed" and self.max_tokens_cap is not None:
            raise issues_error(
                [
                    Issue(
                        ("max_tokens_cap",),
                        "an embedding model generates no tokens",
                        None,
                        "remove max_tokens_cap",
                    )
                ]
            )
        return self

    def _check_spanning(self) -> None:
        """A replica that spans nodes takes whole TP groups on several nodes, alone."""
        pp = self.pipeline_parallel_size
        if not isinstance(pp, int) or pp == 1:
            return
        issues: list[Issue] = []
        if self.placement.node is not None:
            issues.append(Issue(
                ("placement", "node"),
                f"a replica with pipeline_parallel_size {pp} spans {pp} nodes and cannot be "
                "pinned to one",
                self.placement.node,
                "drop placement.node (placement.gpu_type picks the nodes' GPU type), or set "
                "pipeline_parallel_size: 1",
            ))
        if self.placement.colocate_with:
            issues.append(Issue(
                ("placement", "colocate_with"),
                "a replica that spans nodes (pipeline_parallel_size > 1) never shares its GPUs",
                list(self.placement.colocate_with),
                "remove colocate_with, or set pipeline_parallel_size: 1",
            ))
        if issues:
            raise issues_error(issues)

    def _check_endpoint_only(self) -> None:
        issues = [
            Issue(
                (field,),
                f"{field} has no effect on a model served elsewhere (endpoints): inferplane "
                "never places or starts it",
                _dump(getattr(self, field)),
                f"remove {field}, or replace endpoints with source: to run it here",
            )
            for field in ENGINE_FIELDS
            if field in self.model_fields_set
        ]
        if issues:
            raise issues_error(issues)

    # --- convenience for the planner and gateway -------------------------------------------

    @property
    def is_endpoint(self) -> bool:
        """Served elsewhere: routed to, never placed."""
        return self.endpoints is not None

    @property
    def engine_model_name(self) -> str:
        """The name the engine serves it under (`--served-model-name`, P36)."""
        return self.served_model_name or self.name

    @property
    def client_names(self) -> tuple[str, ...]:
        """Every name a client may send for this model: its name, then its aliases."""
        return (self.name, *self.aliases)

    @property
    def spans_nodes(self) -> bool:
        """An explicit pipeline_parallel_size > 1: every replica spans that many nodes."""
        return isinstance(self.pipeline_parallel_size, int) and self.pipeline_parallel_size > 1

    @property
    def source_is_hf_id(self) -> bool:
        return self.source is not None and is_hf_id(self.source)


def _dump(value: Any) -> Any:
    return value.model_dump() if isinstance(value, SpecModel) else value
