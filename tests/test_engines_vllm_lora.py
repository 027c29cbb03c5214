"""vLLM's LoRA flags from the engine boundary: what `--lora-modules` items vLLM parses back,
the run-time loading variable, and the container path swap the deploy renders use."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferplane.engines import engine_for
from inferplane.engines.vllm import VllmArgs, build_vllm_argv
from inferplane.engines.vllm.lora import (
    LoraArgs,
    LoraModule,
    module_item,
    parse_module_item,
)
from inferplane.errors import InferplaneError


def _args(lora: LoraArgs | None, **extra: object) -> VllmArgs:
    return VllmArgs(source="/models/base", served_model_name="base", port=8100,
                    max_model_len=4096, tensor_parallel_size=1, gpu_memory_utilization=0.9,
                    lora=lora, extra_args=extra)  # type: ignore[arg-type]


LORA = LoraArgs(max_loras=2, max_lora_rank=16, max_cpu_loras=4,
                modules=(LoraModule("sql", "/adapters/sql"), LoraModule("chat", "/a,b/chat")))


def test_lora_flags_and_modules_on_the_argv() -> None:
    argv = build_vllm_argv(_args(LORA), version="0.32.0")
    start = argv.index("--enable-lora")
    assert argv[start:start + 10] == [
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--max-cpu-loras", "4",
        "--lora-modules", "sql=/adapters/sql",
        '{"name":"chat","path":"/a,b/chat"}',  # a comma: only the JSON form parses back
    ]
    assert "--enable-lora" not in build_vllm_argv(_args(None), version="0.32.0")


def test_no_modules_and_default_cpu_slots_write_no_flag() -> None:
    argv = build_vllm_argv(_args(LoraArgs(max_loras=1, max_lora_rank=8)), version="0.32.0")
    assert "--lora-modules" not in argv and "--max-cpu-loras" not in argv


def test_the_engine_opens_runtime_loading() -> None:
    launch = engine_for("vllm").launches(_args(LORA), version="0.32.0")[0]
    assert launch.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert engine_for("vllm").launches(_args(None), version="0.32.0")[0].env == {}
    static = LoraArgs(max_loras=1, max_lora_rank=8, runtime_updates=False)
    assert engine_for("vllm").launches(_args(static), version="0.32.0")[0].env == {}


def test_extra_args_may_not_set_what_the_lora_block_owns() -> None:
    with pytest.raises(InferplaneError, match="--max-loras") as caught:
        build_vllm_argv(_args(LORA, **{"max-loras": 8}), version="0.32.0")
    assert caught.value.field == "extra_args" and "models[].lora" in (caught.value.fix or "")


def test_container_paths_replace_host_paths_keeping_the_form() -> None:
    launch = engine_for("vllm").launches(_args(LORA), version="0.32.0")[0]
    assert launch.lora_paths() == {"sql": "/adapters/sql", "chat": "/a,b/chat"}
    moved = launch.with_lora_paths({"/adapters/sql": "/mnt/lora/sql", "/a,b/chat": "/mnt/c"})
    assert moved.lora_paths() == {"sql": "/mnt/lora/sql", "chat": "/mnt/c"}
    assert "sql=/mnt/lora/sql" in moved.argv and "chat=/mnt/c" in moved.argv
    assert moved.flag("max-loras") == "2"


def _vllm_reads(item: str) -> tuple[str, str, str | None]:
    """vLLM 0.32's LoRAParserAction, restated: `name=path` unless a comma, else JSON."""
    if "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return name, path, None
    body = json.loads(item)
    return body["name"], body["path"], body.get("base_model_name")


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1),
       st.text(st.characters(blacklist_categories=("Cs",)), min_size=1),
       st.none() | st.text(min_size=1))
def test_every_item_parses_back_as_written(name: str, path: str, base: str | None) -> None:
    item = module_item(LoraModule(name, path), base)
    assert _vllm_reads(item) == (name, path, base)
    assert parse_module_item(item) == (LoraModule(name, path), base)
