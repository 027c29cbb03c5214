"""The vLLM adapter: the version-aware `vllm serve` argv builder and flag rules."""

from inferplane.engines.vllm.argv import (
    VllmArgs,
    build_vllm_argv,
    capture_sizes_from_extra_args,
    check_argv,
)
from inferplane.engines.vllm.flags import ADDED_FLAGS, REMOVED_FLAGS, flag_problem

__all__ = [
    "ADDED_FLAGS",
    "REMOVED_FLAGS",
    "VllmArgs",
    "build_vllm_argv",
    "capture_sizes_from_extra_args",
    "check_argv",
    "flag_problem",
]
