"""The estimator against real published vLLM startup logs (tests/data/vllm_logs/).

Weights must be within 3% of "Model loading took", KV-cache tokens within 5% of what vLLM
printed. The per-case error table is in docs/estimator.md
(`python benchmarks/estimate_accuracy.py` regenerates it).
"""

from __future__ import annotations

import pytest
from vllm_log_cases import load_cases
from vllm_log_estimates import estimate_case

CASES = load_cases()


def test_there_are_enough_published_logs() -> None:
    assert len(CASES) >= 8


@pytest.mark.parametrize("case", CASES, ids=[c.case_id for c in CASES])
def test_weights_within_3_percent(case: object) -> None:
    result = estimate_case(case)  # type: ignore[arg-type]
    assert result.weights_error is not None
    assert abs(result.weights_error) <= 0.03, (
        f"estimated {result.estimate.weights_gib:.2f} GiB vs logged {result.logged_weights_gib}"
    )


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.facts.kv_cache_tokens or c.facts.num_gpu_blocks],
    ids=lambda c: c.case_id,
)
def test_kv_tokens_within_5_percent(case: object) -> None:
    result = estimate_case(case)  # type: ignore[arg-type]
    if result.kv_tokens_error is None:
        pytest.skip("the source does not state the GPU size or the settings that shape the pool")
    assert abs(result.kv_tokens_error) <= 0.05, (
        f"estimated {result.estimate.kv_cache_tokens} tokens "
        f"({result.estimate.kv_cache_gib:.2f} GiB) vs logged {result.logged_kv_tokens} "
        f"({result.logged_kv_gib} GiB)"
    )
