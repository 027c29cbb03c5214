"""Which vLLM release behaves how, for the parts of memory accounting that changed.

Eras (see docs/estimator.md and ../shared/research/vllm-memory.md):
  v0     (< 0.8)   V0 engine; `# GPU blocks` = available // (page x layers)
  v1     (0.8)     V1 engine; "GPU KV cache size" = num_blocks x block_size
  v1mid  (0.9-0.20) as v1, tokens = num_blocks // groups x block_size; graphs outside budget
  v1new  (>= 0.21) CUDA-graph memory estimated and subtracted from the KV budget;
                   tokens = int(max_concurrency x max_model_len)
"""

from __future__ import annotations

import re
from typing import Literal

from inferplane.errors import InferplaneError

# The release inferplane models by default (latest checked against vLLM's source: 0.33.0's
# gpu_worker.determine_available_memory still subtracts the CUDA-graph estimate from the KV
# budget, its default utilization is 0.92, and its batch defaults match 0.31's).
DEFAULT_VLLM_VERSION = "0.33.0"

Era = Literal["v0", "v1", "v1mid", "v1new"]

# --gpu-memory-utilization when none is given: 0.9, and 0.92 from v0.21 on (vLLM PR 38284 made
# CUDA-graph memory profiling the default and raised the utilization to keep the KV pool).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_GPU_MEMORY_UTILIZATION_FROM_0_21 = 0.92

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-a-z0-9]*)$", re.IGNORECASE)


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.11.2' -> (0, 11, 2); accepts 'v0.9', '0.10.1.1', '0.8.5.post1'."""
    match = _VERSION_RE.match(text.strip())
    if not match:
        raise InferplaneError(
            "not a vLLM version",
            field="vllm_version",
            value=text,
            fix=f"use a release number such as {DEFAULT_VLLM_VERSION}",
        )
    major, minor, patch = match.group(1), match.group(2), match.group(3) or "0"
    return int(major), int(minor), int(patch)


def era_of(version: str) -> Era:
    major, minor, _ = parse_version(version)
    if major > 0 or minor >= 21:
        return "v1new"
    if minor >= 9:
        return "v1mid"
    if minor == 8:
        return "v1"
    return "v0"


def default_gpu_memory_utilization(version: str) -> float:
    """The utilization vLLM `version` uses when --gpu-memory-utilization is not given."""
    major, minor, _ = parse_version(version)
    if major > 0 or minor >= 21:
        return DEFAULT_GPU_MEMORY_UTILIZATION_FROM_0_21
    return DEFAULT_GPU_MEMORY_UTILIZATION
