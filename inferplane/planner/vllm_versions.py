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

# The release inferplane models by default (latest checked against vLLM's source).
DEFAULT_VLLM_VERSION = "0.31.0"

Era = Literal["v0", "v1", "v1mid", "v1new"]

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
