"""Roofline step-time model: how long one vLLM scheduler step takes on a GPU.

One step runs every scheduled token through the model once. Its time is the slower of
  * memory: reading the weights once plus the KV cache of every scheduled sequence, and
  * compute: 2 FLOPs per active parameter per token plus attention (4 FLOPs per
    query-token x context-token pair per head dim),
plus tensor-parallel all-reduces and a fixed per-step host overhead (scheduling, sampling,
kernel launches). Efficiency factors turn peak bandwidth/FLOPs into achieved ones; they are
calibrated against published vLLM measurements (benchmarks/sim_fidelity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.gpus.spec import GpuSpec
from inferplane.models.profile import ModelProfile

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


# Fitted on the calibration split of tests/data/vllm_perf by `benchmarks/sim_fidelity.py --fit`
# (grid search); the held-out split measures the error (docs/simulator.md). Used for GPUs
# without measured constants below.
DEFAULT_CALIBRATION = Calibration(
    bandwidth_efficiency=0.70,
    compute_efficiency=0.35,
    step_overhead_s=0.001,
    per_seq_overhead_s=2.0e-5,
)

# Per GPU where published sweeps exist: fitted on the `train` points (10 and 160 concurrent
# requests; Llama-3 8B TP1 and 70B TP4 together) of benchmarks/data/vllm_concurrency.json
# by `benchmarks/sim_fidelity.py --fit-gpu`; its `holdout` points (40, 80, 640) measure the
# error (docs/bench.md). A100s reach a larger fraction of their (lower) peak FLOPs in
# prefill than H100s. The per-sequence cost is held at 10 us, not fitted (see the script).
GPU_CALIBRATION: dict[str, Calibration] = {
    "H100-SXM-80GB": Calibration(
        bandwidth_efficiency=0.75, compute_efficiency=0.35, step_overhead_s=0.001,
        per_seq_overhead_s=1.0e-5,
    ),
    "A100-SXM-80GB": Calibration(
        bandwidth_efficiency=0.65, compute_efficiency=0.45, step_overhead_s=0.0005,
        per_seq_overhead_s=1.0e-5,
    ),
}


def calibration_for(gpu_name: str, calibration: Calibration = DEFAULT_CALIBRATION) -> Calibration:
    """The constants an engine on `gpu_name` runs with: an explicit calibration as given;
    the shipped default replaced by the GPU's measured one where there is one."""
    if calibration is DEFAULT_CALIBRATION:
        return GPU_CALIBRATION.get(gpu_name, DEFAULT_CALIBRATION)
    return calibration


@dataclass(frozen=True)
class StepShape:
    """What one step computes: tokens by kind and the KV read by attention."""

    prefill_tokens: int  # prompt tokens computed this step (all chunks together)
    decode_seqs: int  # sequences generating one token this step
    context_tokens: int  # KV tokens attention reads, summed over scheduled sequences
    attention_pairs: int  # sum over scheduled query tokens of their context length
    num_seqs: int  # sequences scheduled this step


@dataclass(frozen=True)
class ModelCost:
    """Per-GPU costs of one model instance (after tensor-parallel sharding)."""

    weight_bytes: float  # read once per step
    kv_bytes_per_token: float  # read per context token per step
    linear_flops_per_token: float  # 2 x active non-embedding parameters / TP
    attention_flops_per_pair: float  # 4 x layers x heads x head_dim / TP
    allreduce_bytes_per_token: float  # 2 all-reduces per layer x hidden x 2 bytes
    allreduces_per_step: int
    tensor_parallel_size: int


def model_cost(
    profile: ModelProfile,
    *,
    weight_bytes_per_gpu: float,
    kv_bytes_per_token_per_gpu: float,
    tensor_parallel_size: int,
) -> ModelCost:
    """Derive the per-GPU costs from a profile and the estimator's byte counts."""
    tp = tensor_parallel_size
    # The embedding is a lookup, not a matmul; the LM head is a matmul (tied or not).
    lm_head = profile.params.lm_head or profile.params.embedding
    matmul_params = profile.active_params - profile.params.embedding + lm_head
    heads_dim = profile.num_attention_heads * profile.head_dim
    return ModelCost(
        weight_bytes=weight_bytes_per_gpu,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu,
        linear_flops_per_token=2.0 * matmul_params / tp,
        attention_flops_per_pair=4.0 * profile.num_layers * heads_dim / tp,
        allreduce_bytes_per_token=2.0 * profile.num_layers * profile.hidden_size * 2.0,
        allreduces_per_step=2 * profile.num_layers if tp > 1 else 0,
        tensor_parallel_size=tp,
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
        object.__setattr__(self, "calibration", calibration_for(self.gpu.name, self.calibration))

    def step_time_s(self, shape: StepShape) -> float:
        """Seconds one step of this shape takes; 0 for an empty step."""
        if shape.num_seqs == 0:
            return 0.0
        cal = self.calibration
        if cal.fixed_prefill_step_s is not None or cal.fixed_decode_step_s is not None:
            return self._fixed_step_s(shape) * self.slowdown
        bandwidth = self.gpu.memory_bandwidth_gbps * 1e9 * cal.bandwidth_efficiency
        read_bytes = self.cost.weight_bytes + self.cost.kv_bytes_per_token * shape.context_tokens
        memory_s = read_bytes / bandwidth

        peak_tflops = self.gpu.bf16_tflops
        if self.use_fp8_compute and self.gpu.fp8_tflops is not None:
            peak_tflops = self.gpu.fp8_tflops
        flops_per_s = peak_tflops * 1e12 * cal.compute_efficiency
        tokens = shape.prefill_tokens + shape.decode_seqs
        flops = (
            self.cost.linear_flops_per_token * tokens
            + self.cost.attention_flops_per_pair * shape.attention_pairs
        )
        compute_s = flops / flops_per_s

        comm_s = self._allreduce_s(tokens)
        host_s = cal.step_overhead_s + cal.per_seq_overhead_s * shape.num_seqs
        return (max(memory_s, compute_s) + comm_s + host_s) * self.slowdown

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
