"""Inputs and outputs of the GPU memory estimator (`inferplane.estimator.memory`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferplane.estimator.lora import LoraSlots


@dataclass(frozen=True)
class EngineSettings:
    """The vLLM settings that change memory. `None` means "vLLM's default for this case"."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None  # None = model default; -1 = auto-fit (vLLM's "auto")
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = "auto"  # "auto" = checkpoint dtype (float32 checkpoints are served as bf16)
    quantization: str | None = None  # None = whatever the checkpoint says
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None  # vLLM --kv-cache-memory: skip profiling
    enforce_eager: bool = False
    block_size: int | None = None  # None = 16 on CUDA (64 for MLA with FlashMLA)
    vllm_version: str | None = None  # None = the current release inferplane models
    pipeline_parallel_size: int = 1  # stages (nodes); each holds ~1/pp of the decoder layers
    pipeline_layer_partition: tuple[int, ...] | None = None  # VLLM_PP_LAYER_PARTITION
    lora: LoraSlots | None = None  # --enable-lora: adapter slots reserved on every GPU


@dataclass(frozen=True)
class RankMemory:
    """One pipeline stage's per-GPU numbers (every GPU of the stage holds the same)."""

    rank: int
    start_layer: int  # first decoder layer of the stage, inclusive
    end_layer: int  # exclusive
    weights_gib: float
    activation_gib: float  # the sampler warm-up runs on the last stage only
    non_torch_gib: float
    cuda_graph_gib: float
    kv_cache_gib: float  # available to this stage's KV cache
    lora_gib: float  # LoRA adapter slots (estimator/lora.py) on this stage's GPUs
    num_gpu_blocks: int  # before vLLM takes the minimum over stages
    kv_bytes_per_token_per_gpu: int  # this stage's layers only


@dataclass
class MemoryEstimate:
    """Per-GPU memory breakdown, the way vLLM's startup log reports it."""

    total_memory_gib: float
    requested_memory_gib: float  # gpu_memory_utilization x total
    weights_gib: float  # per GPU, after TP sharding ("Model loading took" without LoRA)
    activation_gib: float  # profile-run peak for max_num_batched_tokens
    non_torch_gib: float  # NCCL/cuBLAS/attention buffers
    cuda_graph_gib: float  # CUDA graph pool (0 with enforce_eager)
    cuda_graph_in_budget: bool  # True when vLLM subtracts graphs from the KV budget (>= 0.21)
    cuda_context_gib: float  # per-process context, outside the utilization budget (P01)
    kv_cache_gib: float  # "Available KV cache memory", per GPU
    kv_bytes_per_token: int  # whole model, all layers, before the TP split
    kv_bytes_per_token_per_gpu: int
    block_size: int
    num_gpu_blocks: int
    kv_cache_tokens: int  # "GPU KV cache size: N tokens"
    max_model_len: int
    max_concurrency: float  # "Maximum concurrency for max_model_len tokens per request"
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor_parallel_size: int
    gpu_memory_utilization: float
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    vllm_version: str
    fits: bool
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # --enable-lora: the stacked adapter slots vLLM allocates while loading the model (so
    # "Model loading took" = weights_gib + lora_gib) and the KV cache gives up.
    lora_gib: float = 0.0
    # Pipeline parallelism: the numbers above are per GPU of `worst_rank`, the stage with the
    # fewest KV blocks (vLLM gives every stage that many); KV tokens and concurrency are the
    # replica's. `ranks` lists every stage when pipeline_parallel_size > 1.
    pipeline_parallel_size: int = 1
    worst_rank: int = 0
    ranks: list[RankMemory] = field(default_factory=list)
