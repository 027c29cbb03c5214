"""LoRA adapters on a simulated engine, as vLLM 0.32 serves them.

What is modelled, each after the vLLM code named:

- the adapter registry of the API server (`entrypoints/openai/models/serving.py`,
  OpenAIServingModels): `--lora-modules` loaded at start, `POST /v1/load_lora_adapter` and
  `/v1/unload_lora_adapter` with their refusals word for word, `/v1/models` cards with
  `parent` = the base's served name and `root` = the adapter's path;
- the adapter's own check (`lora/peft_helper.py`, validate_legal): a rank above
  `--max-lora-rank` is refused, through the engine core's utility call
  ("Call to add_lora method failed: ...", a 500);
- the host-memory cache of `--max-cpu-loras` adapters (`lora/worker_manager.py`,
  LRUCacheWorkerLoRAManager): a request for an adapter evicted from it waits while the
  adapter is read from disk again (`load_time_s`);
- the batch limit of `--max-loras` distinct adapters per step lives in the scheduler
  (`scheduler.py`, after `v1/core/sched/scheduler.py`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError
from inferplane.sim.config import SimLoraConfig
from inferplane.sim.protocol import ApiError
from inferplane.sim.validation import validation_error

RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# Reading an adapter: a fixed cost (open, parse, allocate) plus its bytes from disk.
LOAD_FIXED_S = 0.02
LOAD_BYTES_PER_S = 1.5 * 2**30


def runtime_updates_from_env(env: Mapping[str, str] | None = None) -> bool:
    """vLLM's reading of VLLM_ALLOW_RUNTIME_LORA_UPDATING (vllm/envs.py): "1" or "true"."""
    value = (os.environ if env is None else env).get(RUNTIME_ENV, "0")
    return value.strip().lower() in ("1", "true")


@dataclass(frozen=True)
class Adapter:
    """One loaded adapter: vLLM's LoRARequest as the API server keeps it."""

    name: str
    path: str
    int_id: int
    rank: int
    load_time_s: float


def _not_found(name: str, path: str) -> ApiError:
    # vllm/exceptions.py LoRAAdapterNotFoundError, answered as a NotFoundError (no param)
    return ApiError(404, f"Loading lora {name} failed: No adapter found for {path}")


def _add_lora_failed(why: str, multiproc: bool = False) -> ApiError:
    # The engine core's utility call failing (v1/engine/core.py), answered as a 500. With
    # the multiprocess executor (TP > 1; the CPU build always) the worker's error arrives
    # wrapped (v1/executor/multiproc_executor.py); the in-process one (TP 1) raises it as is.
    if multiproc:
        why = (f"Worker failed with error '{why}', please check the stack trace above for "
               "the root cause")
    return ApiError(500, f"Call to add_lora method failed: {why}",
                    error_type="InternalServerError")


class SimAdapters:
    """The adapters one simulated engine serves; `config` None: started without
    `--enable-lora`."""

    def __init__(self, config: SimLoraConfig | None, base_name: str,
                 multiproc: bool = False) -> None:
        self.config = config
        self.base_name = base_name
        self.multiproc = multiproc  # vLLM's multiprocess executor (tensor parallel > 1)
        self.adapters: dict[str, Adapter] = {}
        self._next_id = 0
        self._cpu: OrderedDict[int, None] = OrderedDict()  # host-memory LRU (max_cpu_loras)
        self._reading: dict[int, asyncio.Future[None]] = {}
        self.disk_loads = 0  # adapters read from disk (loads and cache misses), for benchmarks
        self.cache_misses = 0  # of those, requests that waited for an evicted adapter

    @property
    def enabled(self) -> bool:
        return self.config is not None

    @property
    def runtime_updates(self) -> bool:
        return self.config is not None and self.config.runtime_updates

    def load_static(self) -> None:
        """`--lora-modules`: loaded before the server answers; one that fails stops the
        start as vLLM's does (init_static_loras raises)."""
        if self.config is None:
            return
        for name, path in self.config.modules:
            try:
                adapter = self._check_and_read(name, path, inplace=False)
            except ApiError as exc:
                raise InferplaneError(
                    exc.message, field="lora_modules", value=f"{name}={path}",
                    fix="point --lora-modules at a PEFT directory (adapter_config.json, "
                        "adapter_model.safetensors) whose rank is within --max-lora-rank",
                ) from None
            self._register(adapter)

    # -- the API -----------------------------------------------------------------------

    async def load(self, body: Mapping[str, Any]) -> str:
        """POST /v1/load_lora_adapter: vLLM's success text, or its ApiError."""
        name = body.get("lora_name")
        path = body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            raise _field_error(body, "lora_name" if not isinstance(name, str) else "lora_path")
        adapter = self._check_and_read(name, path, inplace=body.get("load_inplace") is True)
        await asyncio.sleep(adapter.load_time_s)  # add_lora reads it into host memory
        self._register(adapter)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: Mapping[str, Any]) -> str:
        """POST /v1/unload_lora_adapter."""
        name = body.get("lora_name")
        if not isinstance(name, str):
            raise _field_error(body, "lora_name")
        if not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.",
                           error_type="InvalidUserInput")
        if name not in self.adapters:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.")
        del self.adapters[name]  # vLLM's API forgets it; the engine's cache ages it out
        return f"Success: LoRA adapter '{name}' removed successfully."

    def get(self, name: str | None) -> Adapter | None:
        return self.adapters.get(name) if name is not None else None

    def cards(self, created: int) -> list[dict[str, Any]]:
        """The `/v1/models` cards of the adapters (vLLM: ModelCard with root and parent)."""
        return [{
            "id": a.name, "object": "model", "created": created, "owned_by": "vllm",
            "root": a.path, "parent": self.base_name, "max_model_len": None,
            "permission": [_permission(created, a.name)],
        } for a in self.adapters.values()]

    async def activate(self, adapter: Adapter) -> None:
        """Before a request with `adapter` is scheduled: read it from disk again when the
        host-memory cache evicted it (one read however many requests wait for it)."""
        if adapter.int_id in self._cpu:
            self._cpu.move_to_end(adapter.int_id)
            return
        pending = self._reading.get(adapter.int_id)
        if pending is None:
            self.cache_misses += 1
            pending = asyncio.get_running_loop().create_future()
            self._reading[adapter.int_id] = pending
            try:
                await asyncio.sleep(adapter.load_time_s)
                self._cache(adapter.int_id)
                self.disk_loads += 1
            finally:
                del self._reading[adapter.int_id]
                pending.set_result(None)
            return
        await asyncio.shield(pending)

    # -- internals ---------------------------------------------------------------------

    def _check_and_read(self, name: str, path: str, *, inplace: bool) -> Adapter:
        """vLLM's checks in their order: request fields, name clashes, then the adapter
        itself (add_lora)."""
        if not name or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                           error_type="InvalidUserInput")
        if name == self.base_name:
            raise ApiError(400, f"The lora adapter '{name}' conflicts with a served base "
                                "model.", error_type="InvalidUserInput")
        if not inplace and name in self.adapters:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded. If you "
                                "want to load the adapter in place, set 'load_inplace' to "
                                "True.", error_type="InvalidUserInput")
        if self.config is None:
            raise _add_lora_failed("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        directory = Path(path)
        config_file = directory / "adapter_config.json"
        try:
            raw = json.loads(config_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise _not_found(name, path) from None
        except (OSError, ValueError) as exc:
            raise _add_lora_failed(str(exc)) from None
        rank = _rank(raw)
        problems: list[str] = []
        if rank > self.config.max_lora_rank:
            problems.append(f"LoRA rank {rank} is greater than max_lora_rank "
                            f"{self.config.max_lora_rank}.")
        if raw.get("bias", "none") != "none":
            problems.append("Adapter bias is not supported.")
        if problems:  # the worker's own check (validate_legal)
            raise _add_lora_failed(" ".join(problems), self.multiproc)
        previous = self.adapters.get(name)
        if previous is not None:
            int_id = previous.int_id
        else:
            self._next_id += 1
            int_id = self._next_id
        return Adapter(name, path, int_id, rank, self._load_time(directory))

    def _register(self, adapter: Adapter) -> None:
        self.adapters[adapter.name] = adapter
        self._cache(adapter.int_id)
        self.disk_loads += 1

    def _cache(self, int_id: int) -> None:
        assert self.config is not None
        self._cpu[int_id] = None
        self._cpu.move_to_end(int_id)
        while len(self._cpu) > self.config.cpu_slots:
            self._cpu.popitem(last=False)

    def _load_time(self, directory: Path) -> float:
        assert self.config is not None
        if self.config.load_time_s is not None:
            return self.config.load_time_s
        size = 0
        for weights in ("adapter_model.safetensors", "adapter_model.bin"):
            try:
                size += (directory / weights).stat().st_size
            except OSError:
                continue
        return LOAD_FIXED_S + size / LOAD_BYTES_PER_S


def _rank(raw: Mapping[str, Any]) -> int:
    """The largest rank of an adapter_config.json (`r` and `rank_pattern`, as PEFTHelper)."""
    ranks = [raw.get("r", 8)]
    pattern = raw.get("rank_pattern")
    if isinstance(pattern, dict):
        ranks.extend(pattern.values())
    return max(int(r) for r in ranks if isinstance(r, int | float))


def _field_error(body: Mapping[str, Any], name: str) -> ApiError:
    """The 400 pydantic's LoadLoRAAdapterRequest / UnloadLoRAAdapterRequest gives a body
    without the string field (vLLM's validation handler)."""
    if name not in body:
        error = {"type": "missing", "loc": ("body", name), "msg": "Field required",
                 "input": dict(body)}
    else:
        error = {"type": "string_type", "loc": ("body", name),
                 "msg": "Input should be a valid string", "input": body[name]}
    return validation_error([error])


def _permission(created: int, name: str) -> dict[str, Any]:
    return {
        "id": f"modelperm-{name.encode().hex()[:32]}", "object": "model_permission",
        "created": created, "allow_create_engine": False, "allow_sampling": True,
        "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
        "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
    }


def _module(item: str, where: str) -> tuple[str, str]:
    """One `--lora-modules` value as vLLM parses it: `name=path`, or JSON with name, path."""
    if "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return name, path
    try:
        body = json.loads(item)
        return str(body["name"]), str(body["path"])
    except (ValueError, KeyError, TypeError):
        raise InferplaneError(
            "not a --lora-modules value", field=where, value=item,
            fix='use NAME=PATH or {"name": NAME, "path": PATH}',
        ) from None


def lora_config(
    enable: bool, *, max_loras: int = 1, max_lora_rank: int = 16,
    max_cpu_loras: int | None = None, modules: list[str] | tuple[str, ...] = (),
    load_time_s: float | None = None, env: Mapping[str, str] | None = None,
) -> SimLoraConfig | None:
    """The LoRA settings of a `vllm serve` / `inferplane sim` command line (None: off)."""
    if not enable:
        if modules:
            raise InferplaneError(
                "--lora-modules needs --enable-lora", field="lora_modules",
                value=list(modules), fix="add --enable-lora",
            )
        return None
    for name, value in (("max_loras", max_loras), ("max_lora_rank", max_lora_rank),
                        ("max_cpu_loras", max_cpu_loras)):
        if value is not None and value < 1:
            raise InferplaneError(f"{name} must be at least 1", field=name, value=value,
                                  fix="use a positive number")
    if max_cpu_loras is not None and max_cpu_loras < max_loras:
        # vLLM's LoRAConfig check, word for word
        raise InferplaneError(
            f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})",
            field="max_cpu_loras", value=max_cpu_loras, fix=f"use at least {max_loras}",
        )
    return SimLoraConfig(
        max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras,
        modules=tuple(_module(item, "lora_modules") for item in modules),
        runtime_updates=runtime_updates_from_env(env), load_time_s=load_time_s,
    )


def lora_from_mapping(entry: Any, where: str) -> SimLoraConfig:
    """A sim fleet file's `lora: {max_loras, max_lora_rank, max_cpu_loras, modules,
    runtime_updates, load_time_s}` (modules: NAME=PATH strings)."""
    known = set(SimLoraConfig.__dataclass_fields__)
    if not isinstance(entry, dict) or set(entry) - known:
        raise InferplaneError("not a LoRA block", location=where, value=entry,
                              fix=f"use a mapping of {sorted(known)}")
    values = dict(entry)
    values["modules"] = tuple(_module(str(m), f"{where}.modules") for m in
                              values.get("modules", ()))
    return SimLoraConfig(**values)
