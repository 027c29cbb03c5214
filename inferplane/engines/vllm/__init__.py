"""The vLLM adapter: the version-aware `vllm serve` argv builder and flag rules."""

from inferplane.engines.vllm.argv import (
    VllmArgs,
    build_vllm_argv,
    capture_sizes_from_extra_args,
    check_argv,
)
from inferplane.engines.vllm.flags import ADDED_FLAGS, REMOVED_FLAGS, flag_problem
from inferplane.engines.vllm.multinode import (
    NATIVE_MULTINODE_SINCE,
    multinode_argvs,
    multinode_backend,
)

__all__ = [
    "ADDED_FLAGS",
    "NATIVE_MULTINODE_SINCE",
    "REMOVED_FLAGS",
    "VllmArgs",
    "build_vllm_argv",
    "capture_sizes_from_extra_args",
    "check_argv",
    "flag_problem",
    "multinode_argvs",
    "multinode_backend",
]
