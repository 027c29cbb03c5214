"""Harvest GPUStack's performance-lab vLLM runs into benchmarks/data/published_serving.json.

    .venv/bin/python benchmarks/harvest_gpustack.py GIT_DIR [--commit SHA]

GIT_DIR is a clone of https://github.com/gpustack/gpustack. Every `vllm bench serve`
result block in docs/performance-lab/*/*.md that follows a plain `vllm serve` command is one
point: the block gives requests, total input/output tokens (so mean lengths), the
concurrency cap, TTFT, TPOT and output throughput; the command gives TP and the engine
flags; the page gives the GPU. benchmarks/data/published_serving_extra.json (runs
transcribed from other sources, always held out) is appended. Runs with flags the
simulator does not model (speculative decoding, pipeline/expert parallelism, KV offload,
attention-backend switches) are skipped, and so is every block under another engine's
command (SGLang, TensorRT-LLM).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "data" / "published_serving.json"
# Hand-transcribed runs from other publishers (each with its source), appended as they are.
EXTRA = OUT.with_name("published_serving_extra.json")
REPO = "https://github.com/gpustack/gpustack"
# Page hardware -> catalog name (each page's "Hardware" section says SXM / 80GB).
GPUS = {"h100": "H100-SXM-80GB", "h200": "H200", "a100": "A100-SXM-80GB"}
# Served model -> config directory under tests/data/models.
MODELS = {
    "Qwen/Qwen3-8B": "Qwen--Qwen3-8B",
    "Qwen/Qwen3-14B": "Qwen--Qwen3-14B",
    "Qwen/Qwen3-32B": "Qwen--Qwen3-32B",
    "Qwen/Qwen3-32B-FP8": "Qwen--Qwen3-32B-FP8",
    "Qwen/Qwen3-30B-A3B": "Qwen--Qwen3-30B-A3B",
    "Qwen/Qwen3-235B-A22B": "Qwen--Qwen3-235B-A22B",
    "Qwen/Qwen3-235B-A22B-FP8": "Qwen--Qwen3-235B-A22B-FP8",
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "Qwen--Qwen3-235B-A22B",
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": "Qwen--Qwen3-235B-A22B-FP8",
    "openai/gpt-oss-120b": "openai--gpt-oss-120b",
    "openai/gpt-oss-20b": "openai--gpt-oss-20b",
    "deepseek-ai/DeepSeek-R1": "deepseek-ai--DeepSeek-R1",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-ai--DeepSeek-R1",  # same architecture
    # Added 2026-12-02 for MoE/MLA points on the fit side (split by HASH_SPLIT_MODELS).
    "zai-org/GLM-4.5-Air": "zai-org--GLM-4.5-Air",
    "deepseek-ai/DeepSeek-V3.2": "deepseek-ai--DeepSeek-V3.2",
    "zai-org/GLM-4.6": "zai-org--GLM-4.6",
    "zai-org/GLM-4.6-FP8": "zai-org--GLM-4.6-FP8",
}
# Serve commands that name another model than their page measured (page, as printed ->
# served). gpt-oss-20b/h100.md's "Tuning number of batched tokens" section prints
# `vllm serve openai/gpt-oss-120b`, but the page's Model section is gpt-oss-20b and the run
# (9027 tok/s, 4.96 s mean TTFT) is the 20b's async run above it within 0.4%; a 120b at TP1
# on that page runs at a third of that throughput.
ERRATA = {("docs/performance-lab/gpt-oss-20b/h100.md", "openai/gpt-oss-120b"):
          "openai/gpt-oss-20b"}
# Flags that change nothing the simulator models, or that it models (value kept).
KEPT_FLAGS = {"--max-model-len", "-tp", "--tensor-parallel-size", "--max-num-batched-tokens",
              "--max-num-seqs", "--gpu-memory-utilization"}
IGNORED_FLAGS = {"--async-scheduling", "--trust-remote-code", "--host", "--port",
                 "--disable-log-requests", "--no-enable-prefix-caching", "--enable-prefix-caching",
                 "--enable-auto-tool-choice"}
# Tokenizer, reasoning and tool-call parsers shape the text, not the engine's steps.
VALUE_IGNORED = {"--host", "--port", "--tokenizer-mode", "--reasoning-parser",
                 "--tool-call-parser"}
_NUM = r"([0-9.]+)"
FIELDS = {
    "requests": rf"Successful requests:\s+{_NUM}",
    "max_concurrency": rf"Maximum request concurrency:\s+{_NUM}",
    "input_tokens": rf"Total input tokens:\s+{_NUM}",
    "output_tokens": rf"Total generated tokens:\s+{_NUM}",
    "output_throughput_tok_s": rf"Output token throughput \(tok/s\):\s+{_NUM}",
    "mean_ttft_ms": rf"Mean TTFT \(ms\):\s+{_NUM}",
    "median_ttft_ms": rf"Median TTFT \(ms\):\s+{_NUM}",
    "mean_tpot_ms": rf"Mean TPOT \(ms\):\s+{_NUM}",
    "median_tpot_ms": rf"Median TPOT \(ms\):\s+{_NUM}",
}


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True, capture_output=True,
                          text=True).stdout


def parse_serve(line: str) -> dict[str, Any] | None:
    """The engine settings of a plain `vllm serve` line; None when it uses a flag the
    simulator does not model."""
    words = shlex.split(line.strip().rstrip("\\"))
    env = [w for w in words[: words.index("vllm")] if "=" in w] if "vllm" in words else []
    if env or "vllm" not in words:
        return None  # attention-backend switches etc. are not modelled
    rest = words[words.index("serve") + 1:]
    settings: dict[str, Any] = {"served": rest[0], "tp": 1, "flags": rest[1:]}
    i = 1
    while i < len(rest):
        flag = rest[i]
        if flag in KEPT_FLAGS:
            value = float(rest[i + 1])
            settings[flag.lstrip("-").replace("-", "_")] = value if value < 1 else int(value)
            i += 2
        elif flag in VALUE_IGNORED:
            i += 2
        elif flag in IGNORED_FLAGS:
            i += 1
        else:
            return None
    settings["tp"] = settings.pop("tp", None) or settings.pop("tensor_parallel_size", 1)
    return settings


def harvest_page(text: str, page: str) -> list[dict[str, Any]]:
    points = []
    current: dict[str, Any] | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if "vllm serve" in stripped and not stripped.startswith("#"):
            current = parse_serve(stripped)
        elif re.search(r"sglang|trtllm-serve|launch_server", stripped):
            current = None
        if "Serving Benchmark Result" in line:
            block = []
            while i + 1 < len(lines) and "=====" not in lines[i + 1]:
                i += 1
                block.append(lines[i])
            i += 1
            if current is not None:
                values = {k: float(m.group(1)) for k, pat in FIELDS.items()
                          if (m := re.search(pat, "\n".join(block)))}
                points.append({"page": page, "serve": current, "result": values})
        i += 1
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("--commit", default="HEAD")
    args = parser.parse_args()
    commit = git(args.git_dir, "rev-parse", args.commit).strip()
    pages = [p for p in git(args.git_dir, "ls-tree", "-r", "--name-only", commit,
                            "docs/performance-lab").split()
             if p.endswith(".md") and "/references/" not in p]
    out = []
    for page in pages:
        stem = Path(page).stem.split("-")[0]
        if stem not in GPUS:
            continue
        text = git(args.git_dir, "show", f"{commit}:{page}")
        version = re.search(r"vLLM: v?([0-9][0-9a-z.\-]*)", text)
        for n, point in enumerate(harvest_page(text, page)):
            serve, res = point["serve"], point["result"]
            serve["served"] = ERRATA.get((page, serve["served"]), serve["served"])
            if serve["served"] not in MODELS or "requests" not in res:
                continue
            reqs = res["requests"]
            out.append({
                "id": f"gpustack-{Path(page).parent.name}-{Path(page).stem}-{n}",
                "source": f"{REPO}/blob/{commit}/{page}",
                "publisher": "GPUStack performance lab",
                "vllm": version.group(1) if version else None,
                "gpu": GPUS[stem],
                "model": MODELS[serve["served"]],
                "tp": serve["tp"],
                "engine": {k: v for k, v in serve.items()
                           if k in ("max_model_len", "max_num_batched_tokens", "max_num_seqs",
                                    "gpu_memory_utilization")},
                "serve_flags": serve["flags"],
                "workload": {
                    "num_prompts": int(reqs),
                    "mean_input_len": round(res["input_tokens"] / reqs, 1),
                    "mean_output_len": round(res["output_tokens"] / reqs, 1),
                    "max_concurrency": int(res["max_concurrency"])
                    if "max_concurrency" in res else None,
                    "request_rate": None,
                },
                "measured": {k: res[k] for k in ("mean_ttft_ms", "median_ttft_ms",
                                                  "mean_tpot_ms", "median_tpot_ms",
                                                  "output_throughput_tok_s") if k in res},
            })
    doc = {
        "description": "Published vLLM serving runs (vllm bench serve result blocks) with their "
                       "settings and sources, harvested by benchmarks/harvest_gpustack.py. "
                       "mean_*_len are the run's total tokens / requests; lengths 'fixed' = "
                       "the random dataset (every request the same), 'sharegpt' = ShareGPT "
                       "(replayed with the ShareGPT length shape of "
                       "benchmarks/data/vllm_concurrency.json scaled to these means).",
        "split_rule": SPLIT_RULE,
        "points": assign_splits(dedupe(out)) + json.loads(EXTRA.read_text())["points"],
    }
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(OUT)
    print(f"{len(doc['points'])} points -> {OUT}")


SPLIT_RULE = ("held out: every point of the models in HELD_OUT_MODELS and of the GPUs in "
              "HELD_OUT_GPUS (never seen by the fit), and every second point (in page "
              "order) of each other (GPU, model, TP) series; fit: the rest. Models in "
              "HASH_SPLIT_MODELS (added 2026-12-02, split before any fit on them, on every "
              "GPU): held out when the first byte of sha256 of the point's id is odd")
HELD_OUT_MODELS = ("Qwen--Qwen3-14B", "openai--gpt-oss-20b")
HELD_OUT_GPUS = ("H200",)
# The second harvest (MoE with 128 experts on A100/H100, MLA + 256 FP8 experts on H200):
# hash split, so the fit sees MLA and H200 too.
HASH_SPLIT_MODELS = ("zai-org--GLM-4.5-Air", "zai-org--GLM-4.6", "zai-org--GLM-4.6-FP8",
                     "deepseek-ai--DeepSeek-V3.2")


def split_of(point_id: str) -> str:
    """The hash rule of HASH_SPLIT_MODELS (the same as harvest_iog.split_of)."""
    return "holdout" if hashlib.sha256(point_id.encode()).digest()[0] % 2 else "fit"


def dedupe(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pages repeat a run in their summary; keep the first copy. A result block printed
    on two GPUs' pages (GLM-4.5-Air's H100 page repeats the A100 page's four long-prompt
    runs digit for digit) cannot be told apart, so it is left out on both."""
    def run(p: dict[str, Any]) -> str:
        return json.dumps([p["model"], p["tp"], p["serve_flags"], p["workload"],
                           p["measured"]], sort_keys=True)

    gpus: dict[str, set[str]] = {}
    for p in points:
        gpus.setdefault(run(p), set()).add(p["gpu"])
    seen: set[str] = set()
    out = []
    for p in points:
        key = json.dumps([p["gpu"], run(p)])
        if key not in seen and len(gpus[run(p)]) == 1:
            seen.add(key)
            out.append(p)
    return out


def assign_splits(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    count: dict[tuple[str, str, int], int] = {}
    for p in points:
        w = p["workload"]
        # The pages' ShareGPT runs average ~215-233 input tokens; their random-dataset
        # runs ask 128, 2000, 4000 or 32000 (the benchmark command of each page).
        w["lengths"] = "sharegpt" if 200 <= w["mean_input_len"] <= 240 else "fixed"
        series = (p["gpu"], p["model"], p["tp"])
        n = count.get(series, 0)
        count[series] = n + 1
        if p["model"] in HASH_SPLIT_MODELS:
            p["split"] = split_of(p["id"])
            continue
        held = p["model"] in HELD_OUT_MODELS or p["gpu"] in HELD_OUT_GPUS or n % 2 == 1
        p["split"] = "holdout" if held else "fit"
    return points


if __name__ == "__main__":
    main()
