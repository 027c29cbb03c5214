"""Estimator vs real vLLM startup logs: prints the per-case error table for docs/estimator.md.

    python benchmarks/estimate_accuracy.py [--markdown]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from vllm_log_cases import load_cases
from vllm_log_estimates import LLMD_H100_ACTIVATION, estimate_case, llmd_h100_activation_gib


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def main() -> None:
    markdown = "--markdown" in sys.argv
    header = (
        "case", "vLLM", "weights log/est GiB", "err", "KV log/est GiB", "err",
        "KV tokens log/est", "err",
    )
    rows = []
    for case in load_cases():
        r = estimate_case(case)
        e = r.estimate
        rows.append((
            case.case_id, case.vllm_version or "V0",
            f"{r.logged_weights_gib} / {e.weights_gib:.2f}", _pct(r.weights_error),
            f"{r.logged_kv_gib} / {e.kv_cache_gib:.2f}", _pct(r.kv_gib_error),
            f"{r.logged_kv_tokens} / {e.kv_cache_tokens}", _pct(r.kv_tokens_error),
        ))
    _print(header, rows, markdown)
    print()
    # Published peak activations at vLLM's 1,024-sequence H100 default (llm-d's profile).
    act_header = ("model (H100, llm-d profile)", "TP", "activation log/est GiB", "err")
    act_rows = []
    for model, tp, logged in LLMD_H100_ACTIVATION:
        est = llmd_h100_activation_gib(model, tp)
        act_rows.append((model, str(tp), f"{logged} / {est:.2f}", _pct((est - logged) / logged)))
    _print(act_header, act_rows, markdown)


def _print(header: tuple[str, ...], rows: list[tuple[str, ...]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)))


if __name__ == "__main__":
    main()
