"""scripts/make_tiny_adapter.py writes the PEFT layout vLLM loads: tensor names, shapes,
bf16 data, the config fields; deterministic; read back by inferplane.models.peft."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lora_adapters import MODELS, maker

from inferplane.models.peft import read_adapter
from inferplane.models.safetensors_reader import read_header

LLAMA = MODELS / "meta-llama--Llama-3.1-8B-Instruct"


def test_names_and_shapes_follow_the_base_config(tmp_path: Path) -> None:
    mod = maker()
    out = mod.write_adapter(tmp_path / "a", LLAMA, rank=4, targets=("q_proj", "down_proj"),
                            zeros=True)
    tensors = {t.name: t for t in read_header(out / "adapter_model.safetensors")}
    assert len(tensors) == 32 * 2 * 2  # layers x modules x (A, B)
    q_a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    down_b = tensors["base_model.model.model.layers.31.mlp.down_proj.lora_B.weight"]
    assert (q_a.shape, down_b.shape, q_a.dtype) == ((4, 4096), (4096, 4), "BF16")
    assert all(t.nbytes == 2 * math.prod(t.shape) for t in tensors.values())
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["peft_type"], config["target_modules"]) == (
        4, "LORA", ["q_proj", "down_proj"])
    adapter = read_adapter(out)
    assert adapter.rank == 4 and adapter.modules == ("down_proj", "q_proj")


def test_a_rebuild_writes_the_same_bytes(tmp_path: Path) -> None:
    mod = maker()
    shapes = mod.tensor_shapes(json.loads((LLAMA / "config.json").read_text()), 1, ("k_proj",))
    one = mod.safetensors_bytes(dict(list(shapes.items())[:4]), seed=3)
    assert one == mod.safetensors_bytes(dict(list(shapes.items())[:4]), seed=3)
    assert one != mod.safetensors_bytes(dict(list(shapes.items())[:4]), seed=4)
    header_len = int.from_bytes(one[:8], "little")
    assert (8 + header_len) % 8 == 0  # the data section is aligned
