"""Same fleet file, byte-identical plan: also while every CPU core is busy (the solver's
limits are deterministic work, not wall-clock time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from planner_fleets import fleet

from inferplane.planner import plan_fleet
from inferplane.spec import load_fleet, parse_fleet

ROOT = Path(__file__).resolve().parent.parent
FLEETS = ["demo-sim.yaml", "s0-l40s-colocated.yaml", "s4-deepseek-qwen-mix.yaml"]
BURN = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n"


def _colocated_demo() -> str:
    text = (ROOT / "examples" / "demo-sim.yaml").read_text(encoding="utf-8")
    hint = "    placement: {colocate_with: [qwen2.5-7b-instruct]}\n"
    return text.replace("    max_num_seqs: 64\n", "    max_num_seqs: 64\n" + hint)


# 20 replicas on 32 GPUs: demands the cards cannot all meet, so the solver models every
# share and stops at its (deterministic) limit before proving optimality.
CROWDED = """
gpus:
  nodes:
    - {name: h1, gpu_type: H100, count: 8}
    - {name: h2, gpu_type: H100, count: 8}
    - {name: a1, gpu_type: A100-80GB, count: 8}
    - {name: l1, gpu_type: L40S, count: 8}
models:
  - {name: m0, source: Qwen--Qwen3-8B, max_model_len: 8192, max_num_seqs: 32, replicas: 2}
  - {name: m1, source: meta-llama--Llama-3.1-8B-Instruct, max_model_len: 16384,
     max_num_seqs: 16, replicas: 2}
  - {name: m2, source: mistralai--Mistral-7B-Instruct-v0.3, max_model_len: 8192, replicas: 2}
  - {name: m3, source: Qwen--Qwen2.5-7B-Instruct, max_model_len: 16384, max_num_seqs: 16,
     replicas: 2}
  - {name: m4, source: google--gemma-2-9b-it, max_model_len: 4096, max_num_seqs: 16,
     replicas: 2}
  - {name: m5, source: Qwen--Qwen3-32B, max_model_len: 16384, max_num_seqs: 16, replicas: 2}
  - {name: m6, source: Qwen--Qwen3-32B-FP8, max_model_len: 8192, max_num_seqs: 16, replicas: 2}
  - {name: m7, source: Qwen--Qwen3-Embedding-0.6B, task: embed, max_model_len: 2048,
     max_num_seqs: 8, replicas: 2}
  - {name: m8, source: openai--gpt-oss-20b, max_model_len: 8192, max_num_seqs: 16, replicas: 2}
  - {name: m9, source: Qwen--Qwen3-30B-A3B, max_model_len: 8192, max_num_seqs: 8, replicas: 2}
"""


def _plans() -> list[str]:
    out = [plan_fleet(load_fleet(ROOT / "examples" / name)).model_dump_json()
           for name in FLEETS]
    demo = parse_fleet(_colocated_demo(), filename=str(ROOT / "examples" / "demo-sim.yaml"))
    out.append(plan_fleet(demo).model_dump_json())
    crowded = plan_fleet(fleet(CROWDED), time_limit_s=0.3)
    assert crowded.totals.solver == "cp-sat" and not crowded.totals.solver_optimal
    out.append(crowded.model_dump_json())
    return out


def test_plans_are_byte_identical_under_cpu_saturation() -> None:
    quiet = _plans()
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(4)]
    try:
        busy = _plans()
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert busy == quiet
