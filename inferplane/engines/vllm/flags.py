"""Which `vllm serve` flags each vLLM release knows: removed and renamed flags (P32) and
flags that only exist from some release on.

Copied tutorials carry flags newer releases reject with "unrecognized arguments" (S2:
`--swap-space`). The builder checks every flag it emits, including `extra_args`, against the
fleet's engine version and fails with the replacement instead of letting vLLM die at startup.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferplane.engines.vllm.versions import parse_version

Version = tuple[int, int, int]


@dataclass(frozen=True)
class RemovedFlag:
    flag: str  # without dashes
    removed_in: Version  # first release that rejects it
    replacement: str  # what to write instead (a flag, a config, or "nothing")


@dataclass(frozen=True)
class AddedFlag:
    flag: str
    added_in: Version  # first release that accepts it
    instead: str  # what older releases offer


REMOVED_FLAGS: dict[str, RemovedFlag] = {
    f.flag: f
    for f in (
        RemovedFlag(
            "swap-space", (0, 11, 0),
            "nothing: the V1 engine has no CPU swap space; use --kv-offloading-size "
            "(KV offload to CPU) or --cpu-offload-gb (weights) if you need host memory",
        ),
        RemovedFlag("use-v2-block-manager", (0, 7, 0), "nothing: it is the only block manager"),
        RemovedFlag(
            "worker-use-ray", (0, 6, 0), "--distributed-executor-backend ray"
        ),
        RemovedFlag("engine-use-ray", (0, 6, 0), "nothing: run the engine in-process"),
        RemovedFlag(
            "speculative-model", (0, 9, 0),
            "--speculative-config '{\"model\": ..., \"num_speculative_tokens\": N}'",
        ),
        RemovedFlag(
            "num-speculative-tokens", (0, 9, 0),
            "--speculative-config '{\"num_speculative_tokens\": N, ...}'",
        ),
        RemovedFlag("num-scheduler-steps", (0, 11, 0), "nothing: V1 schedules every step"),
        RemovedFlag(
            "max-seq-len-to-capture", (0, 11, 0),
            "--compilation-config '{\"max_cudagraph_capture_size\": N}'",
        ),
        RemovedFlag(
            "disable-log-requests", (0, 12, 0),
            "nothing: requests are not logged by default (--enable-log-requests turns it on)",
        ),
        RemovedFlag(
            "guided-decoding-backend", (0, 12, 0),
            "--structured-outputs-config '{\"backend\": ...}'",
        ),
        RemovedFlag("rope-scaling", (0, 12, 0), "--hf-overrides '{\"rope_scaling\": {...}}'"),
        RemovedFlag("rope-theta", (0, 12, 0), "--hf-overrides '{\"rope_theta\": ...}'"),
        RemovedFlag("tokenizer-pool-size", (0, 10, 0), "nothing: tokenization is in-process"),
        RemovedFlag("preemption-mode", (0, 11, 0), "nothing: V1 always recomputes"),
    )
}

ADDED_FLAGS: dict[str, AddedFlag] = {
    f.flag: f
    for f in (
        AddedFlag(
            "kv-cache-memory-bytes", (0, 11, 0),
            "gpu_memory_utilization only: co-located instances must start one at a time",
        ),
        AddedFlag("runner", (0, 10, 2), "--task embed"),
        AddedFlag("enable-log-requests", (0, 10, 2), "requests are logged by default"),
        AddedFlag("pipeline-parallel-size", (0, 5, 1), "one node per replica (TP only)"),
        # New in 0.32.0 / 0.33.0 (EngineArgs fields added, none removed; read from the
        # released wheels). Deprecated but still accepted in 0.33.0, so not in REMOVED_FLAGS:
        # --log-config-file, --mamba-cache-mode, --disable-cascade-attn (no effect),
        # --ir-op-priority (to go in 0.34).
        AddedFlag(
            "sleep-mode-offload-cudagraph", (0, 32, 0),
            "nothing: CUDA-graph memory stays on the GPU during sleep",
        ),
        AddedFlag("enable-shm-tensor-arena", (0, 32, 0), "nothing (leave it out)"),
        AddedFlag("custom-histogram-buckets", (0, 32, 0), "vLLM's default metric buckets"),
        AddedFlag("enable-hc-sp", (0, 32, 0), "nothing (leave it out)"),
        AddedFlag("sleep-mode-backend", (0, 33, 0), "the built-in cumem sleep backend"),
        AddedFlag("watchdog-config", (0, 33, 0), "nothing (leave it out)"),
        AddedFlag("monokernel", (0, 33, 0), "nothing (leave it out)"),
        # Multi-node replicas without Ray (the multiprocessing executor, vLLM PR 23691).
        *(
            AddedFlag(flag, (0, 12, 0), "a Ray cluster: --distributed-executor-backend ray")
            for flag in ("nnodes", "node-rank", "master-addr", "master-port")
        ),
    )
}


def flag_problem(flag: str, version: str) -> tuple[str, str] | None:
    """(message, fix) when `--flag` is not accepted by vLLM `version`, else None."""
    name = flag.lstrip("-")
    base = name.removeprefix("no-")
    release = parse_version(version)
    removed = REMOVED_FLAGS.get(base)
    if removed is not None and release >= removed.removed_in:
        since = ".".join(str(p) for p in removed.removed_in)
        return (
            f"--{name} was removed in vLLM {since} (this fleet runs {version}); vLLM would "
            "exit with 'unrecognized arguments' (P32)",
            f"remove it; instead: {removed.replacement}",
        )
    added = ADDED_FLAGS.get(base)
    if added is not None and release < added.added_in:
        since = ".".join(str(p) for p in added.added_in)
        return (
            f"--{name} needs vLLM {since} or newer (this fleet runs {version})",
            f"upgrade engine.version, or use {added.instead}",
        )
    return None
