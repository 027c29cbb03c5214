"""How long `plan_fleet` takes on the plan-quality fleets, per objective, as ratios
against `min_gpus` measured in the same run (the planner runs on every what-if).

The fleets are benchmarks/plan_quality.py's generated ones (`--kind classic` by default:
the same seeded fleets the quality benchmark has always used), plus the two-node H100 fleet
of issue 25. Each fleet is planned once per objective, in turn, with the default time limit
(5 s, deterministic) unless `--time-limit-s` says otherwise.

    .venv/bin/python benchmarks/plan_time.py [--fleets 300] [--seed 0] [--kind classic]
        [--objectives min_gpus,utilize]

`--objectives default` plans without naming one (to time a tree from before
`planning.objective` existed with this same script).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from plan_quality import MODELS, POOL, random_fleet  # noqa: E402

from inferplane.errors import InferplaneError  # noqa: E402
from inferplane.models import load_profile  # noqa: E402
from inferplane.planner import plan_fleet  # noqa: E402
from inferplane.spec import parse_fleet  # noqa: E402

H100_FLEET = """
gpus:
  nodes:
    - {name: a, gpu_type: H100, count: 8}
    - {name: b, gpu_type: H100, count: 8}
models:
  - {name: llama-70b, source: meta-llama--Llama-3.1-70B-Instruct, replicas: 2,
     max_model_len: 32768, max_num_seqs: 64}
  - {name: qwen3-32b, source: Qwen--Qwen3-32B, replicas: 2, max_model_len: 32768,
     max_num_seqs: 64}
  - {name: qwen2-5-7b, source: Qwen--Qwen2.5-7B-Instruct, replicas: 3,
     max_model_len: 32768, max_num_seqs: 64, placement: {node: b}}
  - {name: embed, source: Qwen--Qwen3-Embedding-0.6B, task: embed, replicas: 3,
     max_model_len: 8192, placement: {colocate_with: [qwen2-5-7b]}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fleets", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", default="classic")
    parser.add_argument("--objectives", default="min_gpus,utilize")
    parser.add_argument("--time-limit-s", type=float, default=5.0)
    args = parser.parse_args()
    import random

    rng = random.Random(args.seed)
    fleets = []
    while len(fleets) < args.fleets:
        # (one argument: the classic generator, also in trees from before `kind` existed)
        spec = random_fleet(rng) if args.kind == "classic" else random_fleet(rng, args.kind)
        if spec is not None:
            fleets.append(spec)
    fleets.append(parse_fleet(H100_FLEET, filename=str(ROOT / "h100.yaml"), base_dir=MODELS))
    profiles = {n: load_profile(MODELS / d) for n, d in POOL.items()}
    profiles.update({"llama-70b": load_profile(MODELS / "meta-llama--Llama-3.1-70B-Instruct")})
    objectives = args.objectives.split(",")
    seconds: dict[str, list[float]] = {o: [] for o in objectives}
    for n, spec in enumerate(fleets):
        # interleaved, the first one rotating: machine load and warm caches hit all alike
        for objective in objectives[n % len(objectives):] + objectives[:n % len(objectives)]:
            extra: dict[str, Any] = {} if objective == "default" else {"objective": objective}
            t0 = time.perf_counter()
            with contextlib.suppress(InferplaneError):  # a refusal is an answer too: timed
                plan_fleet(spec, profiles=profiles, time_limit_s=args.time_limit_s,
                           check_fixes=False, **extra)
            seconds[objective].append(time.perf_counter() - t0)
    base = sum(seconds[objectives[0]])
    print(f"{len(fleets)} fleets (seed {args.seed}, kind {args.kind}; the last is issue "
          f"25's two-node H100 fleet)")
    for objective, values in seconds.items():
        ordered = sorted(values)
        median = statistics.median(values) * 1e3
        print(f"  {objective:9} total {sum(values):7.2f} s  median {median:6.0f} ms"
              f"  p95 {ordered[int(0.95 * (len(ordered) - 1))] * 1e3:6.0f} ms"
              f"  max {ordered[-1] * 1e3:6.0f} ms  H100 fleet {values[-1] * 1e3:6.0f} ms"
              f"  x{sum(values) / base:.2f} of {objectives[0]}")


if __name__ == "__main__":
    main()
