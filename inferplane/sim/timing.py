"""Roofline step-time model: how long one vLLM scheduler step takes on a GPU.

One step runs every scheduled token through the model once. Its time is the slower of
  * memory: reading the weights the step touches (all of a dense model; for an MoE model
    the dense part plus the routed experts its tokens were sent to, `moe_read.py`) at the
    format's kernel efficiency (`formats.py`), plus the KV cache of every scheduled
    sequence, and
  * compute: 2 FLOPs per active parameter per token plus attention (4 FLOPs per
    query-token x context-token pair per head dim),
plus tensor-parallel all-reduces and a fixed per-step host overhead (scheduling, sampling,
kernel launches). A fixed per-request serving cost (`request_overhead_s`: HTTP, chat
template, tokenization, detokenization, the first streamed chunk) is added to what a
client sees (TTFT and end-to-end latency), outside the GPU's steps. Efficiency factors
turn peak bandwidth/FLOPs into achieved ones; they are fitted per GPU generation on
published vLLM runs (benchmarks/sim_fidelity.py, docs/simulator.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.gpus.spec import GpuSpec
from inferplane.models.arch import SPARSE_MLA_FAMILIES
from inferplane.models.profile import ModelProfile
from inferplane.sim.formats import generation
from inferplane.sim.moe_read import weight_bytes_read

# Latency of one NCCL all-reduce launch inside a step (small messages), seconds.
_ALLREDUCE_LATENCY_S = 8e-6


@dataclass(frozen=True)
class Calibration:
    """Achieved fraction of peak and fixed costs. Fitted values live in `DEFAULT_CALIBRATION`."""

    bandwidth_efficiency: float  # achieved / peak HBM bandwidth in decode
    compute_efficiency: float  # achieved / peak dense tensor FLOPs in prefill
    step_overhead_s: float  # host-side cost of one scheduler step
    per_seq_overhead_s: float  # per scheduled sequence (sampling, detokenization, output)
    # Fixed step times instead of the roofline (known-answer tests of `inferplane bench`):
    # a step with prompt tokens takes `fixed_prefill_step_s`, a decode-only step
    # `fixed_decode_step_s`. Either one set switches the roofline off.
    fixed_prefill_step_s: float | None = None
    fixed_decode_step_s: float | None = None
    # Client-visible cost per request outside the engine's steps (API server in and out):
    # added to TTFT and end-to-end latency, never to TPOT. Ignored with fixed step times.
    request_overhead_s: float = 0.0
    # A chat request's input processing in vLLM's API server (request validation, chat
    # template, tokenization), shared with the other requests in that phase
    # (frontend.py): through a Jinja chat template, and through a renderer in code
    # (gpt-oss's Harmony, DeepSeek-V3.2's encoder); each includes its tokenization.
    # Fitted on GPUStack's chat bursts (published_fidelity.fit_frontend).
    chat_template_s: float = 0.0
    chat_renderer_s: float = 0.0
    # A completions request's share of that queue: tokenizing its prompt only. Not fitted
    # (0): the fit split has no completions burst, and at low load a completions
    # request's input processing is inside request_overhead_s (IO Foundation's runs).
    tokenize_s: float = 0.0
    # Routed-expert (fused MoE) kernels on bf16 experts: achieved fraction of the dense
    # kernels' bandwidth when reading experts.
    moe_kernel_efficiency: float = 1.0
    # MoE prefill: achieved fraction of compute_efficiency (grouped expert GEMMs, routing).
    moe_compute_efficiency: float = 1.0
    # MLA models (DeepSeek-V2/V3 family): achieved fraction of the compute above. vLLM
    # prefills MLA without weight absorption, up-projecting the cached latent of every
    # earlier chunk again per chunk, so its prefill runs below a GQA model's.
    mla_compute_efficiency: float = 1.0
    # MLA with DeepSeek Sparse Attention (V3.2): the same for its path (the indexer over
    # the whole context, sparse MLA kernels); it replaces mla_compute_efficiency there.
    # Fitted apart from dense MLA (its path is not R1's); while the fit split's MLA runs
    # are all V3.2's, dense MLA borrows this value (published_fidelity.fit_moe).
    dsa_compute_efficiency: float = 1.0
    # Quantized weight formats (formats.weight_format): fraction of bf16's achieved
    # bandwidth their kernels reach on this GPU (dense and expert weights in that format:
    # it replaces moe_kernel_efficiency for quantized experts); a format not listed runs
    # at 1.0.
    format_efficiency: tuple[tuple[str, float], ...] = ()
    # Quantized routed experts (fused-MoE kernels in that format, e.g. block-FP8 or MXFP4
    # grouped GEMMs): achieved fraction of bf16's bandwidth. Fitted apart from the dense
    # GEMMs of the same format (an FP8 dense model and FP8 experts run different
    # kernels); a format not listed here falls back to `format_efficiency`.
    moe_format_efficiency: tuple[tuple[str, float], ...] = ()
    # Fused-MoE work per decode token beyond the expert read, by the experts' format
    # ("bf16", "fp8", "mxfp4": each runs its own kernels): each decode token costs its
    # top-k experts' bytes at this many times the expert bandwidth (a small batch's
    # grouped GEMMs run few rows per expert, so the step grows with the batch even once
    # every expert is read). A format not listed has no such cost.
    moe_decode_token_rate: tuple[tuple[str, float], ...] = ()

    def format_factor(self, fmt: str) -> float:
        return dict(self.format_efficiency).get(fmt, 1.0)

    def moe_format_factor(self, fmt: str) -> float:
        return dict(self.moe_format_efficiency).get(fmt, self.format_factor(fmt))


# Fitted on the calibration split of tests/data/vllm_perf by `benchmarks/sim_fidelity.py --fit`
# (grid search); the held-out split measures the error (docs/simulator.md). Used for GPUs
# without measured constants below.
DEFAULT_CALIBRATION = Calibration(
    bandwidth_efficiency=0.70,
    compute_efficiency=0.35,
    step_overhead_s=0.001,
    per_seq_overhead_s=2.0e-5,
)

# vLLM 0.6 (V0 engine, multi-step scheduling), not what the simulator models by default:
# fitted on the `train` points (10 and 160 concurrent requests; Llama-3 8B TP1 and 70B TP4
# together) of benchmarks/data/vllm_concurrency.json by `benchmarks/sim_fidelity.py
# --fit-gpu`; its `holdout` points (40, 80, 640) measure the error (docs/bench.md). The
# fidelity benchmark replays those vLLM 0.6 runs with these; pass one as `calibration`
# to simulate that engine. The per-sequence cost is held at 10 us, not fitted.
VLLM_V0_CALIBRATION: dict[str, Calibration] = {
    "H100-SXM-80GB": Calibration(
        bandwidth_efficiency=0.75, compute_efficiency=0.35, step_overhead_s=0.001,
        per_seq_overhead_s=1.0e-5,
    ),
    "A100-SXM-80GB": Calibration(
        bandwidth_efficiency=0.65, compute_efficiency=0.45, step_overhead_s=0.0005,
        per_seq_overhead_s=1.0e-5,
    ),
}


# Per GPU type, over its generation's constants below; none shipped (every published V1
# run is on a GPU type whose generation constants fit it).
GPU_CALIBRATION: dict[str, Calibration] = {}

# Per GPU generation (formats.generation), for vLLM V1 (0.8.5+): fitted on the fit split of
# benchmarks/data/published_serving*.json by `benchmarks/sim_fidelity.py --only published
# --fit-published 4` (median-ratio updates: compute from TTFT of direct low-load runs,
# bandwidth from low-load TPOT, MoE and format factors from their runs' throughput), then
# `--refine-published 1` (a coordinate search on the fit split's median |errors|). A GPU of
# a generation listed here (H200 from the Hopper fit, L40S from Ada's) uses it when
# GPU_CALIBRATION has no entry of its own; the held-out split measures the error
# (docs/simulator.md), then `--fit-moe 3` (published_fidelity.fit_moe); all three rerun
# after the LM head moved to once per sequence; the chat front end (chat_template_s,
# chat_renderer_s) by `--fit-frontend 2` on the fit split's short chat bursts (Hopper
# 7.6 / 1.5 ms, Ampere 5.7 / 0 ms per request). The per-request cost fits to ~0.6 ms on
# runs straight to `vllm serve` (IO Foundation's; GPUStack's serving path adds ~35 ms
# beyond the chat front end, which only its replays carry). Quantized weights on Ampere
# run through weight-only (Marlin-style) kernels (fp8 0.17).
GENERATION_CALIBRATION: dict[str, Calibration] = {
    "hopper": Calibration(
        bandwidth_efficiency=0.792, compute_efficiency=0.379, step_overhead_s=0.001,
        per_seq_overhead_s=3.0e-5, request_overhead_s=0.00056, chat_template_s=0.00757,
        chat_renderer_s=0.00146, moe_kernel_efficiency=0.2744,
        moe_compute_efficiency=0.729, mla_compute_efficiency=0.236,
        dsa_compute_efficiency=0.236, format_efficiency=(("fp8", 0.665),),
        moe_format_efficiency=(("fp8", 0.232), ("mxfp4", 0.596)),
    ),
    "ampere": Calibration(
        bandwidth_efficiency=0.715, compute_efficiency=0.480, step_overhead_s=0.0005,
        per_seq_overhead_s=1.92e-5, request_overhead_s=0.00056, chat_template_s=0.00572,
        moe_kernel_efficiency=0.44,
        moe_compute_efficiency=0.4295, format_efficiency=(("fp8", 0.17),),
        moe_format_efficiency=(("fp8", 0.262), ("mxfp4", 0.993)),
    ),
    # Fitted on dense bf16 RTX 4090 runs only: the MoE and format factors are Ampere's,
    # and so is the chat front end (the RTX 4090 runs sent completions).
    "ada": Calibration(
        bandwidth_efficiency=0.795, compute_efficiency=0.686, step_overhead_s=0.0005,
        per_seq_overhead_s=3.75e-5, request_overhead_s=0.00056, chat_template_s=0.00572,
        moe_kernel_efficiency=0.44,
        moe_compute_efficiency=0.4295, format_efficiency=(("fp8", 0.17),),
        moe_format_efficiency=(("fp8", 0.262), ("mxfp4", 0.993)),
    ),
}


# A generation without published runs borrows the nearest fitted one's factors (applied
# to its own peak bandwidth and FLOPs from the catalog); error_bands warns that no run
# backs it.
NEAREST_GENERATION = {"blackwell": "hopper", "turing": "ampere",
                      "volta": "ampere", "unknown": "hopper"}


def calibration_for(gpu_name: str, calibration: Calibration = DEFAULT_CALIBRATION,
                    gpu_generation: str | None = None) -> Calibration:
    """The constants an engine on `gpu_name` runs with: an explicit calibration as given;
    the shipped default replaced by the GPU's measured one, else its generation's, else
    the nearest fitted generation's."""
    if calibration is DEFAULT_CALIBRATION:
        if gpu_name in GPU_CALIBRATION:
            return GPU_CALIBRATION[gpu_name]
        gen = gpu_generation or ""
        if gen not in GENERATION_CALIBRATION:
            gen = NEAREST_GENERATION.get(gen, "")
        return GENERATION_CALIBRATION.get(gen, DEFAULT_CALIBRATION)
    return calibration


def calibration_source(gpu: GpuSpec) -> str:
    """Where the shipped constants for `gpu` come from: "gpu", "generation" (its own) or
    "nearest generation" (borrowed: no published runs of its generation)."""
    if gpu.name in GPU_CALIBRATION:
        return "gpu"
    if generation(gpu) in GENERATION_CALIBRATION:
        return "generation"
    return "nearest generation"


@dataclass(frozen=True)
class StepShape:
    """What one step computes: tokens by kind and the KV read by attention."""

    prefill_tokens: int  # prompt tokens computed this step (all chunks together)
    decode_seqs: int  # sequences generating one token this step
    context_tokens: int  # KV tokens attention reads, summed over scheduled sequences
    attention_pairs: int  # sum over scheduled query tokens of their context length
    num_seqs: int  # sequences scheduled this step
    # The same two sums with every sequence's context capped at the model's sliding
    # window (the scheduler fills them for a model with sliding-window layers); None:
    # not computed, those layers are costed like full attention.
    windowed_context_tokens: int | None = None
    windowed_attention_pairs: int | None = None


@dataclass(frozen=True)
class ModelCost:
    """Per-GPU costs of one model instance (after tensor-parallel sharding)."""

    weight_bytes: float  # read once per step
    kv_bytes_per_token: float  # read per context token per step
    linear_flops_per_token: float  # 2 x active parameters but embedding and LM head / TP
    attention_flops_per_pair: float  # 4 x layers x heads x head_dim / TP
    allreduce_bytes_per_token: float  # 2 all-reduces per layer x hidden x 2 bytes
    allreduces_per_step: int
    tensor_parallel_size: int
    # 2 x LM-head parameters / TP, per scheduled sequence (logits of its last position).
    lm_head_flops_per_seq: float = 0.0
    # MoE: bytes of all routed experts on this GPU (a part of weight_bytes), read in
    # proportion to the experts a step's tokens touch (moe_read.py).
    expert_bytes: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    # The checkpoint's weight format (formats.weight_format) and which weights it covers.
    weight_format: str = "bf16"
    quantized_dense: bool = False  # projections are in weight_format (else bf16)
    quantized_experts: bool = False  # routed experts are in weight_format
    mla: bool = False  # multi-head latent attention (profile.uses_mla)
    sparse_mla: bool = False  # MLA with DeepSeek Sparse Attention (SPARSE_MLA_FAMILIES)
    # Sliding-window attention layers (gpt-oss, Gemma 2/3) read the KV of their last
    # `sliding_window` tokens only: the fraction of KV-carrying layers that are windowed.
    sliding_window: int | None = None
    sliding_fraction: float = 0.0


def model_cost(
    profile: ModelProfile,
    *,
    weight_bytes_per_gpu: float,
    kv_bytes_per_token_per_gpu: float,
    tensor_parallel_size: int,
    expert_bytes_per_gpu: float = 0.0,
    weight_format: str = "bf16",
    quantized_dense: bool = False,
    quantized_experts: bool = False,
) -> ModelCost:
    """Derive the per-GPU costs from a profile and the estimator's byte counts."""
    tp = tensor_parallel_size
    # The embedding is a lookup, not a matmul; the LM head is a matmul (tied or not) that
    # vLLM runs for each scheduled sequence's last position only, not every prompt token.
    # active_params counts the embedding and, when untied, the LM head once each.
    lm_head = profile.params.lm_head or profile.params.embedding
    body_params = profile.active_params - profile.params.embedding - profile.params.lm_head
    heads_dim = profile.num_attention_heads * profile.head_dim
    kv_layers = [k for k in profile.layer_attention if k != "none"]
    sliding = sum(1 for k in kv_layers if k == "sliding")
    windowed = bool(sliding and profile.sliding_window)
    return ModelCost(
        weight_bytes=weight_bytes_per_gpu,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu,
        linear_flops_per_token=2.0 * body_params / tp,
        lm_head_flops_per_seq=2.0 * lm_head / tp,
        attention_flops_per_pair=4.0 * profile.num_layers * heads_dim / tp,
        allreduce_bytes_per_token=2.0 * profile.num_layers * profile.hidden_size * 2.0,
        allreduces_per_step=2 * profile.num_layers if tp > 1 else 0,
        tensor_parallel_size=tp,
        expert_bytes=expert_bytes_per_gpu if profile.is_moe else 0.0,
        num_experts=profile.num_experts,
        experts_per_token=profile.num_experts_per_tok,
        weight_format=weight_format,
        quantized_dense=quantized_dense,
        quantized_experts=quantized_experts,
        mla=profile.uses_mla,
        sparse_mla=profile.uses_mla and profile.model_type in SPARSE_MLA_FAMILIES,
        sliding_window=profile.sliding_window if windowed else None,
        sliding_fraction=sliding / len(kv_layers) if windowed else 0.0,
    )


@dataclass(frozen=True)
class StepTimeModel:
    """Step time of one engine: model costs on one GPU type, with calibration."""

    cost: ModelCost
    gpu: GpuSpec
    calibration: Calibration = DEFAULT_CALIBRATION
    use_fp8_compute: bool = False  # fp8 weights on a GPU with fp8 tensor cores
    slowdown: float = 1.0  # fault injection: multiply every step

    def __post_init__(self) -> None:
        # The shipped default stands for "the measured constants of this GPU, if any".
        object.__setattr__(self, "calibration", calibration_for(
            self.gpu.name, self.calibration, generation(self.gpu)))

    def step_time_s(self, shape: StepShape) -> float:
        """Seconds one step of this shape takes; 0 for an empty step."""
        if shape.num_seqs == 0:
            return 0.0
        cal = self.calibration
        if cal.fixed_prefill_step_s is not None or cal.fixed_decode_step_s is not None:
            return self._fixed_step_s(shape) * self.slowdown
        bandwidth = self.gpu.memory_bandwidth_gbps * 1e9 * cal.bandwidth_efficiency
        tokens = shape.prefill_tokens + shape.decode_seqs
        context, pairs = self._attended(shape)
        memory_s = (self.weight_read_s(tokens, bandwidth)
                    + self.expert_token_s(shape.decode_seqs, bandwidth)
                    + self.cost.kv_bytes_per_token * context / bandwidth)

        peak_tflops = self.gpu.bf16_tflops
        if self.use_fp8_compute and self.gpu.fp8_tflops is not None:
            peak_tflops = self.gpu.fp8_tflops
        flops_per_s = peak_tflops * 1e12 * cal.compute_efficiency
        if self.cost.num_experts:
            flops_per_s *= cal.moe_compute_efficiency
        if self.cost.mla:
            flops_per_s *= (cal.dsa_compute_efficiency if self.cost.sparse_mla
                            else cal.mla_compute_efficiency)
        flops = (
            self.cost.linear_flops_per_token * tokens
            + self.cost.lm_head_flops_per_seq * shape.num_seqs
            + self.cost.attention_flops_per_pair * pairs
        )
        compute_s = flops / flops_per_s

        comm_s = self._allreduce_s(tokens)
        host_s = cal.step_overhead_s + cal.per_seq_overhead_s * shape.num_seqs
        return (max(memory_s, compute_s) + comm_s + host_s) * self.slowdown

    @property
    def request_overhead_s(self) -> float:
        """What a client waits per request beyond the engine's steps (0 with fixed steps)."""
        cal = self.calibration
        if cal.fixed_prefill_step_s is not None or cal.fixed_decode_step_s is not None:
            return 0.0
        return cal.request_overhead_s

    def weight_read_s(self, tokens: int, bandwidth: float) -> float:
        """Seconds to read the weights a step over `tokens` tokens touches: the dense part
        always, routed experts as far as the tokens reach them; quantized parts at their
        format's kernel efficiency on this GPU."""
        c = self.cost
        dense, experts = weight_bytes_read(c.weight_bytes - c.expert_bytes, c.expert_bytes,
                                           c.num_experts, c.experts_per_token, max(tokens, 1))
        cal = self.calibration
        dense_bw = bandwidth * (cal.format_factor(c.weight_format) if c.quantized_dense else 1.0)
        return dense / dense_bw + experts / self.expert_bandwidth(bandwidth)

    def expert_bandwidth(self, bandwidth: float) -> float:
        """Achieved bandwidth of the routed-expert kernels in this checkpoint's format."""
        c, cal = self.cost, self.calibration
        return bandwidth * (cal.moe_format_factor(c.weight_format) if c.quantized_experts
                            else cal.moe_kernel_efficiency)

    def expert_token_s(self, decode_tokens: int, bandwidth: float) -> float:
        """Seconds of fused-MoE work per decode token (`moe_decode_token_rate`): each
        token's top-k experts' bytes at that multiple of the expert bandwidth; 0 for a
        dense model or a format without a rate."""
        c = self.cost
        if not (c.num_experts and c.expert_bytes and decode_tokens):
            return 0.0
        fmt = c.weight_format if c.quantized_experts else "bf16"
        rate = dict(self.calibration.moe_decode_token_rate).get(fmt)
        if not rate:
            return 0.0
        per_token = c.expert_bytes * min(c.experts_per_token, c.num_experts) / c.num_experts
        return decode_tokens * per_token / (self.expert_bandwidth(bandwidth) * rate)

    def _attended(self, shape: StepShape) -> tuple[float, float]:
        """(context tokens, query x context pairs) averaged over the layers: windowed
        layers count each sequence's context up to the window only."""
        f = self.cost.sliding_fraction
        if not f or shape.windowed_context_tokens is None:
            return shape.context_tokens, shape.attention_pairs
        pairs = shape.windowed_attention_pairs
        return ((1 - f) * shape.context_tokens + f * shape.windowed_context_tokens,
                (1 - f) * shape.attention_pairs + f * (pairs or 0))

    def _fixed_step_s(self, shape: StepShape) -> float:
        cal = self.calibration
        prefill = cal.fixed_prefill_step_s
        decode = cal.fixed_decode_step_s
        if shape.prefill_tokens > 0:
            return prefill if prefill is not None else decode or 0.0
        return decode if decode is not None else prefill or 0.0

    def _allreduce_s(self, tokens: int) -> float:
        tp = self.cost.tensor_parallel_size
        if tp == 1:
            return 0.0
        # Ring all-reduce moves 2(tp-1)/tp of the message over each link.
        link_bytes_per_s = self.gpu.interconnect_bandwidth_gbps * 1e9 / 2
        moved = self.cost.allreduce_bytes_per_token * tokens * 2 * (tp - 1) / tp
        return moved / link_bytes_per_s + self.cost.allreduces_per_step * _ALLREDUCE_LATENCY_S
