"""`models[].lora` validation: the adapters' files, rank, target modules and base model,
the names, and where LoRA cannot be. Every mistake is a located problem with a fix (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import MODELS, make_adapter
from planner_fleets import fleet

from inferplane.spec.lora_checks import model_key, same_model
from inferplane.spec.problems import FleetValidationError

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"


def _text(adapters: list[tuple[str, Path]], *, lora: str = "max_lora_rank: 16",
          extra_models: str = "", model: str = LLAMA, task: str = "") -> str:
    items = "\n".join(f"        - {{name: {n}, source: {p}}}" for n, p in adapters)
    return f"""
models:
  - name: llama
    source: {model}
    aliases: [chat]
{task}    lora:
      {lora}
      adapters:
{items}
{extra_models}"""


def _problems(text: str) -> list[str]:
    with pytest.raises(FleetValidationError) as caught:
        fleet(text)
    return [p.render() for p in caught.value.problems]


def test_a_sound_adapter_validates(tmp_path: Path) -> None:
    good = make_adapter(tmp_path / "sql", LLAMA, rank=16)
    spec = fleet(_text([("sql", good)]))
    assert spec.models[0].lora is not None
    assert spec.models[0].lora.adapters[0].source == str(good)


def test_rank_above_max_lora_rank_names_the_rank_to_set(tmp_path: Path) -> None:
    big = make_adapter(tmp_path / "big", LLAMA, rank=24)
    [problem] = _problems(_text([("big", big)]))
    assert "models[0].lora.adapters[0].source" in problem
    assert "adapter rank 24 is above max_lora_rank 16" in problem
    assert "set models[0].lora.max_lora_rank to 32" in problem  # vLLM's next accepted rank


def test_rank_pattern_counts_too(tmp_path: Path) -> None:
    patterned = make_adapter(tmp_path / "p", LLAMA, rank=8, config={"rank_pattern": {"q_proj": 64}})
    [problem] = _problems(_text([("p", patterned)]))
    assert "adapter rank 64" in problem and "to 64" in problem


def test_target_modules_the_base_lacks(tmp_path: Path) -> None:
    mod = make_adapter(tmp_path / "bad", LLAMA)
    # rename the tensors as if the adapter came from a model with fused attention (Phi-3)
    weights = mod / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes().replace(b"q_proj", b"qkv_pr"))
    problems = _problems(_text([("bad", mod)]))
    assert any("targets modules the base model does not have" in p and "qkv_pr" in p
               for p in problems)


def test_an_adapter_of_another_base_is_refused(tmp_path: Path) -> None:
    other = make_adapter(tmp_path / "o", LLAMA, base_name="Qwen/Qwen3-8B")
    [problem] = _problems(_text([("o", other)]))
    assert "trained on 'Qwen/Qwen3-8B'" in problem
    assert "base_model_name_or_path" in problem


@pytest.mark.parametrize("recorded", [
    "meta-llama/Llama-3.1-8B-Instruct",  # the hub id of the same model
    "/data/models/Llama-3.1-8B-Instruct/",  # a local copy
    "/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/0e9e39f",
    "unsloth/llama-3.1-8b-instruct",  # a re-upload, other case
])
def test_the_base_name_rule_is_lenient_on_form(recorded: str) -> None:
    assert same_model(recorded, [str(MODELS / LLAMA)])


def test_the_base_name_rule_still_tells_models_apart() -> None:
    assert not same_model("meta-llama/Llama-3.1-8B", [str(MODELS / LLAMA)])
    assert model_key("org--name") == model_key("other/Name") == "name"
    assert same_model("", ["anything"])  # nothing recorded: nothing to check


def test_missing_files_are_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    no_weights = make_adapter(tmp_path / "nw", LLAMA)
    (no_weights / "adapter_model.safetensors").unlink()
    problems = _problems(_text([("e", empty), ("n", no_weights),
                                ("m", tmp_path / "missing")]))
    assert any("adapters[0].source" in p and "no adapter_config.json" in p for p in problems)
    assert any("adapters[1].source" in p and "no weights file" in p for p in problems)
    assert any("adapters[2].source" in p and "does not exist" in p for p in problems)


def test_features_vllm_refuses(tmp_path: Path) -> None:
    dora = make_adapter(tmp_path / "d", LLAMA, config={"use_dora": True, "bias": "all"})
    problems = _problems(_text([("d", dora)]))
    assert any("DoRA" in p for p in problems) and any("LoRA bias" in p for p in problems)


def test_adapter_names_may_not_shadow_models_or_other_adapters(tmp_path: Path) -> None:
    one = make_adapter(tmp_path / "one", LLAMA)
    other = f"""
  - name: qwen
    source: Qwen--Qwen3-8B
    lora:
      adapters:
        - {{name: sql, source: {make_adapter(tmp_path / "two", "Qwen--Qwen3-8B")}}}
"""
    problems = _problems(_text([("chat", one), ("qwen", one), ("sql", one)],
                               extra_models=other))
    assert any("adapters[0].name" in p and "name of model 'llama'" in p for p in problems)
    assert any("adapters[1].name" in p and "name of model 'qwen'" in p for p in problems)
    assert any("models[1].lora.adapters[0].name" in p
               and "already used by an adapter of model 'llama'" in p for p in problems)


def test_no_lora_on_an_embedding_model_or_an_endpoint(tmp_path: Path) -> None:
    embed = _problems("""
models:
  - {name: e, source: Qwen--Qwen3-Embedding-0.6B, task: embed, lora: {max_loras: 1}}
""")
    assert any("models[0].lora" in p and "generation models only" in p for p in embed)
    remote = _problems("""
models:
  - {name: r, endpoints: ["http://127.0.0.1:9"], lora: {max_loras: 1}}
""")
    assert any("models[0].lora" in p and "served elsewhere" in p for p in remote)
