"""Harvest IO Foundation's vLLM 0.8.5 serving runs (H100 PCIe, RTX 4090) into
benchmarks/data/published_serving_iog.json.

    .venv/bin/python benchmarks/harvest_iog.py GIT_DIR [--commit SHA]

GIT_DIR is a clone of https://github.com/IOG-Foundation/llm-inference-benchmarks. Each
`results/vllm_<N>prompts<Q>qps_<model>_sharegpt_<k>x<GPU>.json` is one run of vLLM's
benchmark_serving.py (v0.8.5) against `vllm serve <model> --dtype float16
--tensor-parallel-size <k>` (the repository's README): N ShareGPT prompts arriving as a
Poisson process of Q requests/s (burstiness 1.0, no concurrency cap). The file gives the
request count, total input/output tokens (so mean lengths), mean TTFT, median TPOT and
output throughput; the name gives the model, GPU and TP.

Left out, by rule: runs on more than one RTX 4090 (consumer cards without NVLink or
peer-to-peer: the published TTFT of DeepSeek-R1-Distill-Llama-8B at 1 request/s is 48 ms on
one card and 1188 ms on two, an interconnect pathology the roofline has no term for), and
models without a config under tests/data/models.

Split, fixed before any fit: a run is held out when the first byte of sha256 of its id is
odd, fitted on otherwise (`split_of`); the rule is stored in the output file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "data" / "published_serving_iog.json"
REPO = "https://github.com/IOG-Foundation/llm-inference-benchmarks"
GPUS = {"NVIDIA-H100-PCIe": "H100-PCIE-80GB", "NVIDIA-GeForce-RTX-4090": "RTX-4090"}
# Served model -> (config directory under tests/data/models, max_model_len the run needs
# when the config's own limit is longer than the checkpoint's). Same-architecture configs
# stand in for fine-tunes: timing depends on the shapes only.
MODELS: dict[str, tuple[str, int | None]] = {
    "meta-llama/Meta-Llama-3-8B-Instruct": ("meta-llama--Llama-3.1-8B-Instruct", 8192),
    "meta-llama/Meta-Llama-3-70B-Instruct": ("meta-llama--Llama-3.1-70B-Instruct", 8192),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": ("meta-llama--Llama-3.1-8B", None),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-70B": ("meta-llama--Llama-3.1-70B-Instruct", None),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": ("Qwen--Qwen2.5-7B-Instruct", None),
    "nvidia/AceMath-7B-Instruct": ("Qwen--Qwen2.5-7B-Instruct", None),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": ("Qwen--Qwen2.5-14B-Instruct", None),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": ("Qwen--Qwen2.5-32B-Instruct", None),
    "Qwen/QwQ-32B-Preview": ("Qwen--Qwen2.5-32B-Instruct", 32768),
    "google/gemma-2-9b-it": ("google--gemma-2-9b-it", None),
    "microsoft/phi-4": ("microsoft--phi-4", None),
    "neuralmagic/Llama-3.1-Nemotron-70B-Instruct-HF-FP8-dynamic":
        ("nvidia--Llama-3.1-70B-Instruct-FP8", None),
}
_NAME = re.compile(r"vllm_(\d+)prompts(\d+)qps_(.+)_sharegpt_(\d+)x(.+)\.json$")

SPLIT_RULE = ("IO Foundation runs: held out when the first byte of sha256(id) is odd, "
              "fit otherwise (benchmarks/harvest_iog.py split_of), fixed before fitting")


def split_of(point_id: str) -> str:
    return "holdout" if hashlib.sha256(point_id.encode()).digest()[0] % 2 else "fit"


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True, capture_output=True,
                          text=True).stdout


def first_result(text: str) -> dict[str, Any]:
    """The first run of a result file (a few hold two runs of the same command, appended;
    the README's tables quote the first)."""
    doc, _ = json.JSONDecoder().raw_decode(text.lstrip())
    result: dict[str, Any] = doc
    return result


def point_of(path: str, doc: dict[str, Any], commit: str) -> dict[str, Any] | None:
    m = _NAME.search(path)
    if m is None or doc.get("backend") != "vllm":
        return None
    _, qps, _, count, gpu_name = m.groups()
    tp = int(count)
    model = doc["model_id"]
    if gpu_name not in GPUS or model not in MODELS:
        return None
    if GPUS[gpu_name] == "RTX-4090" and tp > 1:
        return None  # see the module docstring
    config, max_len = MODELS[model]
    n = int(doc["completed"])
    short = model.split("/")[1]
    point_id = f"iog-{GPUS[gpu_name].lower()}-{short}-tp{tp}-qps{qps}"
    return {
        "id": point_id,
        "source": f"{REPO}/blob/{commit}/{path}",
        "publisher": "IO Foundation, llm-inference-benchmarks (io.net cloud)",
        "vllm": "0.8.5",
        "gpu": GPUS[gpu_name],
        "model": config,
        "served_model": model,
        "tp": tp,
        "engine": {"max_model_len": max_len} if max_len else {},
        "serve_flags": ["--dtype", "float16", "--tensor-parallel-size", str(tp)],
        "workload": {
            "num_prompts": n,
            "mean_input_len": round(doc["total_input_tokens"] / n, 1),
            "mean_output_len": round(doc["total_output_tokens"] / n, 1),
            "max_concurrency": None,
            "request_rate": float(doc["request_rate"]),
            "arrivals": "poisson",
            "lengths": "sharegpt",
        },
        "measured": {k: round(float(doc[k]), 2) for k in (
            "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms")}
        | {"output_throughput_tok_s": round(float(doc["output_throughput"]), 2)},
        "split": split_of(point_id),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("--commit", default="HEAD")
    args = parser.parse_args()
    commit = git(args.git_dir, "rev-parse", args.commit).strip()
    paths = [p for p in git(args.git_dir, "ls-tree", "-r", "--name-only", commit,
                            "results").split() if p.endswith(".json")]
    points = []
    for path in sorted(paths):
        point = point_of(path, first_result(git(args.git_dir, "show", f"{commit}:{path}")),
                         commit)
        if point is not None:
            points.append(point)
    doc = {
        "description": "vLLM 0.8.5 serving runs on H100 PCIe and RTX 4090 (benchmark_serving.py "
                       "result files) with their settings and sources, harvested by "
                       "benchmarks/harvest_iog.py. ShareGPT prompts, Poisson arrivals at "
                       "request_rate, fp16 weights (the same bytes and kernels as bf16).",
        "split_rule": SPLIT_RULE,
        "points": points,
    }
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(OUT)
    held = sum(p["split"] == "holdout" for p in points)
    print(f"{len(points)} points ({held} held out) -> {OUT}")


if __name__ == "__main__":
    main()
