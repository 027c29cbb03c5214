"""User errors while loading a model directory: clear InferplaneErrors, never tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_factory import make_model_dir, tiny_llama_config

from inferplane.errors import InferplaneError
from inferplane.models import load_profile


def test_directory_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(InferplaneError) as err:
        load_profile(tmp_path)
    assert "config.json not found" in str(err.value)
    assert err.value.location == str(tmp_path / "config.json") and err.value.fix


def test_path_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(InferplaneError, match="does not exist"):
        load_profile(tmp_path / "nope")


def test_malformed_config_json_names_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{\n  "hidden_size": 64,\n  oops\n}')
    with pytest.raises(InferplaneError, match=r"not valid JSON \(line 3, column 3"):
        load_profile(tmp_path)


def test_config_json_that_is_not_an_object(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(InferplaneError, match="JSON object"):
        load_profile(tmp_path / "config.json")


def test_config_file_path_is_accepted(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, tiny_llama_config(), name="m")
    assert load_profile(model_dir / "config.json").name == "m"


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size"])
def test_missing_required_field_is_named(tmp_path: Path, field: str) -> None:
    config = tiny_llama_config()
    del config[field]
    with pytest.raises(InferplaneError) as err:
        load_profile(make_model_dir(tmp_path, config))
    assert err.value.field == field and err.value.fix


def test_bad_torch_dtype(tmp_path: Path) -> None:
    with pytest.raises(InferplaneError) as err:
        load_profile(make_model_dir(tmp_path, tiny_llama_config(torch_dtype="int3")))
    assert err.value.field == "torch_dtype" and err.value.value == "int3"


def test_malformed_hf_quant_config(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, tiny_llama_config())
    (model_dir / "hf_quant_config.json").write_text("{")
    with pytest.raises(InferplaneError, match=r"hf_quant_config\.json is not valid JSON"):
        load_profile(model_dir)


def test_malformed_shard_index(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, tiny_llama_config())
    (model_dir / "model.safetensors.index.json").write_text("not json")
    with pytest.raises(InferplaneError, match="shard index"):
        load_profile(model_dir)


def test_sentence_transformers_files_mark_an_embedding_model(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, tiny_llama_config(), name="plain-name")
    assert load_profile(model_dir).default_task == "generate"
    (model_dir / "modules.json").write_text(json.dumps([]))
    assert load_profile(model_dir).default_task == "embed"


def test_hf_cache_snapshot_directory_is_named_by_repo_id(tmp_path: Path) -> None:
    root = tmp_path / "models--Qwen--Qwen3-8B" / "snapshots"
    model_dir = make_model_dir(root, tiny_llama_config(), name="0123abcd")
    assert load_profile(model_dir).name == "Qwen/Qwen3-8B"
    assert load_profile(model_dir, name="my-model").name == "my-model"
