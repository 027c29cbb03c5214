"""The commands of a replica that spans nodes: native multi-node (vLLM >= 0.12.0) and Ray
(older releases, or asked for), with the leader's address left as a token."""

from __future__ import annotations

import shlex

import pytest

from inferplane.engines.vllm import (
    NATIVE_MULTINODE_SINCE,
    VllmArgs,
    build_vllm_argv,
    check_argv,
    multinode_argvs,
    multinode_backend,
)
from inferplane.errors import InferplaneError
from inferplane.planner.plan import LEADER_ADDRESS_TOKEN

SERVE = [
    "vllm", "serve", "/models/llama-70b", "--served-model-name", "llama-70b",
    "--port", "8100", "--max-model-len", "8192", "--tensor-parallel-size", "2",
    "--pipeline-parallel-size", "2", "--gpu-memory-utilization", "0.9",
]


def _args(**fields: object) -> VllmArgs:
    base: dict[str, object] = {
        "source": "/models/llama-70b", "served_model_name": "llama-70b", "port": 8100,
        "max_model_len": 8192, "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
    }
    base.update(fields)
    return VllmArgs(**base)  # type: ignore[arg-type]


def test_native_leader_and_worker_argv() -> None:
    leader, worker = multinode_argvs(_args(), version="0.26.0")
    tail = ["--distributed-executor-backend", "mp", "--nnodes", "2"]
    assert leader == [*SERVE, *tail, "--node-rank", "0", "--master-addr", LEADER_ADDRESS_TOKEN,
                      "--master-port", "29501"]
    assert worker == [*SERVE, *tail, "--node-rank", "1", "--master-addr", LEADER_ADDRESS_TOKEN,
                      "--master-port", "29501", "--headless"]


def test_three_nodes_each_get_their_rank_and_only_rank_zero_serves() -> None:
    argvs = multinode_argvs(_args(pipeline_parallel_size=3), version="0.31.0", master_port=29600)
    assert len(argvs) == 3
    for rank, argv in enumerate(argvs):
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--nnodes") + 1] == "3"
        assert argv[argv.index("--master-port") + 1] == "29600"
        assert ("--headless" in argv) == (rank > 0)


def test_version_cut_over_between_ray_and_native() -> None:
    assert NATIVE_MULTINODE_SINCE == (0, 12, 0)
    assert multinode_backend("0.12.0") == "mp"
    assert multinode_backend("0.11.2") == "ray"
    with pytest.raises(InferplaneError, match=r"--nnodes needs vLLM 0\.12\.0 or newer"):
        check_argv(["vllm", "serve", "m", "--nnodes", "2"], "0.11.2")


def test_ray_leader_starts_the_head_then_serves_and_workers_join() -> None:
    leader, worker = multinode_argvs(_args(), version="0.11.2", ray_port=6380)
    assert leader[:2] == ["bash", "-c"] and worker[:2] == ["bash", "-c"]
    start, serve = leader[2].split(" && exec ")
    assert start == "ray start --head --port=6380 --num-gpus=2"
    assert shlex.split(serve) == [*SERVE, "--distributed-executor-backend", "ray"]
    assert worker[2] == (
        f"exec ray start --address={LEADER_ADDRESS_TOKEN}:6380 --num-gpus=2 --block"
    )


def test_extra_args_choose_the_executor() -> None:
    ray = multinode_argvs(_args(extra_args={"distributed-executor-backend": "ray"}),
                          version="0.26.0")
    assert ray[0][:2] == ["bash", "-c"]
    assert ray[0][2].count("--distributed-executor-backend") == 1
    with pytest.raises(InferplaneError, match="cannot run one replica over several nodes"):
        multinode_argvs(_args(extra_args={"distributed-executor-backend": "mp"}),
                        version="0.11.0")
    with pytest.raises(InferplaneError) as caught:
        multinode_argvs(_args(extra_args={"distributed-executor-backend": "uni"}),
                        version="0.26.0")
    assert caught.value.field == "extra_args.distributed-executor-backend"


def test_flags_are_still_checked_against_the_version() -> None:
    with pytest.raises(InferplaneError, match="swap-space"):
        multinode_argvs(_args(extra_args={"swap-space": 4}), version="0.26.0")


def test_single_node_argv_has_no_pipeline_flag() -> None:
    argv = build_vllm_argv(_args(pipeline_parallel_size=1), version="0.26.0")
    assert "--pipeline-parallel-size" not in argv
    with pytest.raises(InferplaneError, match="single command"):
        multinode_argvs(_args(pipeline_parallel_size=1))
