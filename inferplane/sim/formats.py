"""Weight formats and GPU generations as the step-time model sees them.

A quantized checkpoint changes two things per step: the bytes its weights occupy (the
estimator's `weight_bytes` already counts them) and how close the kernels that read them
come to peak bandwidth. The second depends on the GPU: Hopper and Blackwell have FP8
tensor cores, Ampere runs FP8 and MXFP4 checkpoints through weight-only (Marlin-style)
kernels that dequantize in registers. Each generation's calibration (timing.py) holds the
fitted factor of the formats with published runs behind them; a format without one runs
at 1.0 and the error band (error_bands.py) says that no data backs it.
"""

from __future__ import annotations

from inferplane.estimator.weights import QUANT_FAMILY
from inferplane.gpus.spec import GpuSpec

# Generation by compute capability major (and Ada's 8.9).
_GENERATIONS: dict[tuple[int, int], str] = {
    (7, 0): "volta", (7, 5): "turing", (8, 0): "ampere", (8, 6): "ampere", (8, 7): "ampere",
    (8, 9): "ada", (9, 0): "hopper", (10, 0): "blackwell", (12, 0): "blackwell",
}

# vLLM quantization family -> the format name used in fits, bands and warnings.
_FORMATS = {"fp8": "fp8", "mxfp4": "mxfp4", "awq": "int4", "gptq": "int4",
            "bitsandbytes": "int4", "compressed-tensors": "int4", "modelopt_fp4": "fp4"}

def generation(gpu: GpuSpec) -> str:
    """The GPU's architecture generation ("ampere", "hopper", ...); "unknown" if new."""
    return _GENERATIONS.get(gpu.compute_capability, "unknown")


def weight_format(quantization: str | None) -> str:
    """The format of a vLLM quantization method: bf16 (none), fp8, mxfp4, int4, fp4."""
    if quantization is None:
        return "bf16"
    family = QUANT_FAMILY.get(quantization, quantization)
    return _FORMATS.get(family, family)
