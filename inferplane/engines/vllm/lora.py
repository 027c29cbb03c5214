"""vLLM's LoRA options: `--enable-lora`, the slot limits, `--lora-modules` and the variable
that opens the run-time load/unload endpoints.

vLLM 0.32 parses each `--lora-modules` item as `name=path` when it holds `=` and no comma,
else as JSON `{"name", "path", "base_model_name"}` (vllm/entrypoints/launchers/cli_args.py,
LoRAParserAction). The short form is written where it parses back unchanged; the JSON form
otherwise (a comma in the path, `=` in the name). `/v1/models` shows each adapter with
`parent` = `base_model_name`, or the first served model name when absent: the same here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from inferplane.errors import InferplaneError

# vLLM answers /v1/load_lora_adapter and /v1/unload_lora_adapter only with this set, so the
# gateway can load an adapter on the replica it routes to.
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
ENABLE_FLAG = "enable-lora"
MODULES_FLAG = "lora-modules"
# Options the fleet file's `lora:` block owns; `extra_args` may not set them too.
LORA_OPTIONS = (ENABLE_FLAG, "max-loras", "max-lora-rank", "max-cpu-loras", MODULES_FLAG)


@dataclass(frozen=True)
class LoraModule:
    """One adapter the engine loads at start: the name clients send and its PEFT dir."""

    name: str
    path: str


@dataclass(frozen=True)
class LoraArgs:
    """The LoRA part of one `vllm serve` command line."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int | None = None  # None: vLLM's default (max_loras)
    modules: tuple[LoraModule, ...] = ()
    runtime_updates: bool = True  # the gateway loads adapters on demand


def module_item(module: LoraModule, base_model_name: str | None = None) -> str:
    """One `--lora-modules` value vLLM parses back to `module` (and `base_model_name`)."""
    short = f"{module.name}={module.path}"
    if base_model_name is None and "," not in short and "=" not in module.name:
        return short
    body: dict[str, str] = {"name": module.name, "path": module.path}
    if base_model_name is not None:
        body["base_model_name"] = base_model_name
    return json.dumps(body, separators=(",", ":"))


def parse_module_item(item: str) -> tuple[LoraModule, str | None]:
    """vLLM's reading of one `--lora-modules` value: (module, base_model_name)."""
    if "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return LoraModule(name, path), None
    body = json.loads(item)
    return LoraModule(str(body["name"]), str(body["path"])), body.get("base_model_name")


def lora_argv(lora: LoraArgs, extra_args: Mapping[str, object]) -> list[str]:
    """The argv items for `lora`; raises when `extra_args` also sets one of them."""
    clash = [flag for flag in LORA_OPTIONS if flag in extra_args]
    if clash:
        raise InferplaneError(
            f"extra_args sets --{clash[0]} while the model has a lora: block",
            field="extra_args", value=clash[0],
            fix="set it in models[].lora (max_loras, max_lora_rank, max_cpu_loras, adapters) "
                "and drop it from extra_args",
        )
    argv = [f"--{ENABLE_FLAG}", "--max-loras", str(lora.max_loras),
            "--max-lora-rank", str(lora.max_lora_rank)]
    if lora.max_cpu_loras is not None:
        argv += ["--max-cpu-loras", str(lora.max_cpu_loras)]
    if lora.modules:
        argv += [f"--{MODULES_FLAG}", *(module_item(m) for m in lora.modules)]
    return argv


def lora_env(lora: LoraArgs | None) -> dict[str, str]:
    return dict(RUNTIME_LORA_ENV) if lora is not None and lora.runtime_updates else {}


def modules_in(argv: Sequence[str]) -> list[tuple[int, LoraModule]]:
    """(argv index, module) of every `--lora-modules` value in `argv`."""
    out: list[tuple[int, LoraModule]] = []
    flag = f"--{MODULES_FLAG}"
    for i, item in enumerate(argv):
        if item != flag:
            continue
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            out.append((j, parse_module_item(argv[j])[0]))
            j += 1
    return out


def with_module_paths(argv: Sequence[str], paths: Mapping[str, str]) -> tuple[str, ...]:
    """`argv` with each adapter dir in `paths` (host path -> path in the container) swapped,
    keeping the item's form."""
    out = list(argv)
    for index, module in modules_in(argv):
        if module.path in paths:
            _, base = parse_module_item(argv[index])
            out[index] = module_item(LoraModule(module.name, paths[module.path]), base)
    return tuple(out)
