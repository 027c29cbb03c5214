"""The simulator against real vLLM 0.32's recorded answers, in the default run.

tests/data/vllm_contract/recording.json is what real vLLM (CPU build, tiny models) answered
to every case of `vllm_contract.CASES`; tests/real_engine/test_contract.py re-records it
against a live vLLM and fails when it drifts. Here the same cases go to simulated engines
started from the same `vllm serve` command lines, and every difference must be one that
docs/simulator.md's contract table explains, so simulator drift is caught without vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import vllm_contract as vc

from inferplane.engines.vllm_log import parse_startup_log
from inferplane.sim.build import build_parts
from inferplane.sim.fake_vllm import parse_serve_args
from inferplane.sim.startup_log import startup_lines

# config.json and tokenizer files of scripts/make_tiny_models.py's models (no weights: the
# simulator reads only the shape and the tokenizer), copied by the real-engine test.
MODELS = vc.RECORDING.parent / "models"
MODEL_DIRS = {name: MODELS / name for name in ("tiny-llama", "tiny-qwen3")}


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    return vc.load_recording()


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    adapters = vc.make_adapters(tmp_path_factory.mktemp("adapters"), MODEL_DIRS["tiny-llama"])
    return vc.record_simulator(MODEL_DIRS, adapters)


def test_every_difference_from_real_vllm_is_fixed_or_explained(
    real: dict[str, Any], simulated: dict[str, Any]
) -> None:
    diffs = vc.differences(real, simulated)
    missing, stale = vc.unexplained(diffs, vc.explained())
    assert missing == [], "differences docs/simulator.md's contract table does not explain"
    assert stale == [], "contract table rows that match no difference any more"


def test_the_recording_has_every_case_and_engine(real: dict[str, Any]) -> None:
    assert set(real["cases"]) == {case.name for case in vc.CASES}
    assert set(real["metrics"]) == {vc.CHAT, vc.PLAIN, vc.EMBED, vc.LORA}
    assert real["vllm_version"] == "0.32.0"


def test_every_table_row_gives_a_reason() -> None:
    rows = vc.explained()
    assert rows
    assert all(len(row.reason) > 20 for row in rows), [r.case for r in rows]


def test_the_simulators_kv_line_reads_like_real_vllms(real: dict[str, Any]) -> None:
    """Same command line, same model shape: the same KV cache size and concurrency, in
    vLLM's format (the GPU worker's word, the CPU build says CPU), parsed by the log reader
    `inferplane estimate --compare-log` uses."""
    config, _ = parse_serve_args(vc.serve_argv(vc.CHAT, MODEL_DIRS["tiny-llama"], 0))
    log = "\n".join(startup_lines(build_parts(config), pid=1234))
    sim = vc.kv_line(log)
    assert sim is not None
    recorded = real["startup"][vc.CHAT]
    assert recorded["device"] == "CPU" and sim["device"] == "GPU"
    assert {k: sim[k] for k in ("tokens", "max_model_len", "concurrency")} == {
        k: recorded[k] for k in ("tokens", "max_model_len", "concurrency")}
    facts = parse_startup_log(log)
    assert facts.kv_cache_tokens == int(sim["tokens"].replace(",", ""))
    assert facts.max_concurrency == float(sim["concurrency"])
    assert facts.max_model_len == vc.MAX_MODEL_LEN and facts.available_kv_gib is not None


# -- the comparison itself ----------------------------------------------------------------


def test_shape_keeps_paths_and_types_not_values() -> None:
    body = {"a": 1, "b": [{"c": "x"}, {"c": None, "d": 2.5}], "e": {}}
    assert vc.shape(body) == {"$": "object", "$.a": "int", "$.b": "list",
                              "$.b[]": "object", "$.b[].c": "null|str", "$.b[].d": "float",
                              "$.e": "object"}
    assert vc.shape(json.loads(json.dumps(body).replace('"x"', '"y"'))) == vc.shape(body)


def test_keys_that_are_data_are_wildcards() -> None:
    one = {"choices": [{"logprobs": {"top_logprobs": [{" sim": -0.1, " a": -2.0}]}}]}
    two = {"choices": [{"logprobs": {"top_logprobs": [{"hello": -0.5}]}}]}
    assert vc.shape(one) == vc.shape(two)


def test_differences_name_the_case_path_and_how() -> None:
    real = {"cases": {"c": {"status": 200, "content_type": "application/json",
                            "body": {"$": "object", "$.x": "int", "$.y": "str"}}},
            "metrics": {"chat": {"vllm:a": "counter {engine}"}}}
    sim = {"cases": {"c": {"status": 200, "content_type": "application/json",
                           "body": {"$": "object", "$.x": "str", "$.z": "null"}}},
           "metrics": {"chat": {"vllm:a": "counter {engine,model_name}", "vllm:b": "gauge {}"}}}
    assert vc.differences(real, sim) == [
        "c $.x: type int != str", "c $.y: missing (str)", "c $.z: extra (null)",
        "metrics.chat vllm:a: counter {engine} != counter {engine,model_name}",
        "metrics.chat vllm:b: extra",
    ]
    assert vc.differences(real, real) == []


def test_status_and_error_differences_come_before_bodies() -> None:
    ok = {"status": 200, "content_type": "application/json", "body": {"$": "object"}}
    refused = {"status": 400, "content_type": "application/json", "body": {"$": "object"},
               "error": {"type": "BadRequestError", "param": None, "code": 400,
                         "message": "no N"}}
    assert vc.case_diffs("c", ok, refused) == [
        "c status: 200 != 400", "c error.type: None != 'BadRequestError'",
        "c error.code: None != 400", "c error.message: None != 'no N'"]


def test_table_rows_are_patterns_and_stale_rows_are_found(tmp_path: Path) -> None:
    docs = tmp_path / "sim.md"
    docs.write_text(f"{vc.TABLE_HEADING}\n\n| case | difference | reason |\n|---|---|---|\n"
                    "| `chat*` | `$.x: *` | the simulator has no x, for this reason |\n"
                    "| `gone` | `*` | a difference fixed since, so the row is stale |\n"
                    "\n## Next section\n| `other` | `*` | not part of the table |\n")
    rows = vc.explained(docs)
    assert [r.case for r in rows] == ["chat*", "gone"]
    missing, stale = vc.unexplained(["chat_n2 $.x: missing (int)", "models $.y: extra (str)"],
                                    rows)
    assert missing == ["models $.y: extra (str)"]
    assert stale == ["gone *"]


def test_sse_events_collapse_repeats_and_keep_done() -> None:
    chunk = 'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
    text = chunk * 3 + 'data: {"choices": [], "usage": {}}\n\n' + "data: [DONE]\n\n"
    events = vc._events(text)
    assert len(events) == 3 and events[-1] == "[DONE]"
    assert events[1]["shape"]["$.usage"] == "object"
