"""The commands of a replica that spans nodes: one per node, rank 0 (the leader) first.

Two ways, by vLLM version:

* **Native (vLLM >= 0.12.0)**: the multiprocessing executor across nodes (vLLM PR 23691,
  `ParallelConfig.nnodes/node_rank/master_addr/master_port`; docs/serving/
  parallelism_scaling.md "Running vLLM with MultiProcessing"). Every node runs the same
  `vllm serve ...` with `--nnodes N --node-rank R --master-addr LEADER --master-port P`;
  ranks above 0 add `--headless` (no API server). `--distributed-executor-backend mp` is
  written out: since that release Ray is only used when asked for explicitly.
* **Ray (older releases, or `extra_args: {distributed-executor-backend: ray}`)**: the leader
  starts a Ray head and then the server with `--distributed-executor-backend ray` (vLLM
  waits for the placement group until the workers have joined); workers join the head
  with `ray start --address=LEADER:PORT --block`. These argvs are `bash -c` lines.

The leader's address is `LEADER_ADDRESS_TOKEN` ("{leader_address}"): only the deployment
target knows it and substitutes it (Kubernetes: $(LWS_LEADER_ADDRESS); systemd: the host).
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from inferplane.engines.base import LEADER_ADDRESS_TOKEN
from inferplane.engines.vllm.argv import VllmArgs, build_vllm_argv, check_argv
from inferplane.engines.vllm.versions import DEFAULT_VLLM_VERSION, parse_version
from inferplane.errors import InferplaneError

NATIVE_MULTINODE_SINCE = (0, 12, 0)  # first release with --nnodes/--node-rank/--master-addr
DEFAULT_MASTER_PORT = 29501  # vLLM's ParallelConfig.master_port default
DEFAULT_RAY_PORT = 6379  # `ray start --head` default
BACKEND_FLAG = "distributed-executor-backend"


def multinode_backend(version: str, requested: object = None) -> str:
    """"mp" (native) or "ray" for a replica spanning nodes on vLLM `version`; `requested` is
    the model's `extra_args` value of --distributed-executor-backend, if any."""
    native = parse_version(version) >= NATIVE_MULTINODE_SINCE
    if requested is None:
        return "mp" if native else "ray"
    if requested == "ray":
        return "ray"
    if requested == "mp":
        if not native:
            since = ".".join(str(p) for p in NATIVE_MULTINODE_SINCE)
            raise InferplaneError(
                f"vLLM {version} cannot run one replica over several nodes without Ray "
                f"(--nnodes arrived in {since})",
                field=f"extra_args.{BACKEND_FLAG}", value="mp",
                fix=f"upgrade engine.version to {since} or newer, or drop the flag (Ray)",
            )
        return "mp"
    raise InferplaneError(
        "a replica that spans nodes runs with the mp (multiprocessing) or ray executor",
        field=f"extra_args.{BACKEND_FLAG}", value=requested,
        fix="drop the flag (inferplane picks by engine.version), or use mp or ray",
    )


def multinode_argvs(
    args: VllmArgs,
    *,
    version: str = DEFAULT_VLLM_VERSION,
    master_port: int = DEFAULT_MASTER_PORT,
    ray_port: int = DEFAULT_RAY_PORT,
    vllm: str = "vllm",
) -> list[list[str]]:
    """One argv per node (pipeline stage) for `args.pipeline_parallel_size` nodes with
    `args.tensor_parallel_size` GPUs each; index 0 is the leader, which serves the API."""
    nodes = args.pipeline_parallel_size
    if nodes < 2:
        raise InferplaneError(
            "a replica on one node has a single command", field="pipeline_parallel_size",
            value=nodes, fix="use build_vllm_argv",
        )
    extra = dict(args.extra_args)
    backend = multinode_backend(version, extra.pop(BACKEND_FLAG, None))
    serve = build_vllm_argv(replace(args, extra_args=extra), version=version, vllm=vllm)
    serve += [f"--{BACKEND_FLAG}", backend]
    if backend == "mp":
        argvs = [
            [
                *serve,
                "--nnodes", str(nodes),
                "--node-rank", str(rank),
                "--master-addr", LEADER_ADDRESS_TOKEN,
                "--master-port", str(master_port),
                *(["--headless"] if rank else []),
            ]
            for rank in range(nodes)
        ]
        for argv in argvs:
            check_argv(argv, version)
        return argvs
    check_argv(serve, version)
    gpus = args.tensor_parallel_size
    leader = (
        f"ray start --head --port={ray_port} --num-gpus={gpus} && exec {shlex.join(serve)}"
    )
    worker = (
        f"exec ray start --address={LEADER_ADDRESS_TOKEN}:{ray_port} --num-gpus={gpus} --block"
    )
    return [["bash", "-c", leader]] + [["bash", "-c", worker] for _ in range(nodes - 1)]
