"""vLLM sleep mode as the swapper uses it (https://docs.vllm.ai/en/latest/features/sleep_mode/).

- The engine starts with `--enable-sleep-mode`; the HTTP endpoints exist only with
  `VLLM_SERVER_DEV_MODE=1`. The gateway never routes them (they are not model paths), so
  only the runtime, on 127.0.0.1, can put an engine to sleep.
- `POST /sleep?level=1`: the weights are copied to host RAM (pinned), the KV cache is
  discarded; `POST /wake_up` copies them back. Host RAM must hold the weights of every
  level-1 sleeper: `host_ram_ok` checks it before sleeping and falls back to level 2.
- `POST /sleep?level=2`: weights and KV cache are discarded (buffers such as RoPE tables
  stay in host RAM). Waking reallocates the weights (`/wake_up?tags=weights`), reloads
  them from disk in place (`POST /collective_rpc {"method": "reload_weights"}`), then
  reallocates the KV cache (`/wake_up?tags=kv_cache`): slower than level 1, no host RAM.
- Either level keeps the process, the CUDA context, the compiled kernels and captured
  CUDA graphs, so waking takes seconds where a cold start takes minutes (P28).
- Engines before `SLEEP_MODE_SINCE` have no sleep endpoints: the swapper then stops and
  starts replicas instead, with a warning (`sleep_supported`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from inferplane.engines import engine_for
from inferplane.engines.vllm.launch import SLEEP_MODE_SINCE
from inferplane.errors import InferplaneError
from inferplane.runtime.instances import Instance
from inferplane.spec import FleetSpec

log = logging.getLogger("inferplane.scaling")

_WARNED: set[str] = set()


def sleep_supported(fleet: FleetSpec) -> bool:
    if fleet.engine.kind == "sim":
        return True
    ok = engine_for(fleet.engine.kind).supports_sleep(fleet.engine.version)
    if not ok and fleet.engine.version not in _WARNED:
        _WARNED.add(fleet.engine.version)
        log.warning(
            "vLLM %s has no sleep mode (since %s): scaling.models.*.sleep stops and starts "
            "replicas instead (cold starts)", fleet.engine.version,
            ".".join(map(str, SLEEP_MODE_SINCE)),
        )
    return ok


def with_sleep_mode(fleet: FleetSpec, inst: Instance) -> Instance:
    """A vLLM instance of a model with a sleep policy gets `--enable-sleep-mode` and the
    dev-mode variable its endpoints need."""
    bounds = fleet.scaling.models.get(inst.model)
    if inst.engine != "vllm" or bounds is None or bounds.sleep is None:
        return inst
    if not sleep_supported(fleet):
        return inst
    launch = engine_for(inst.engine).planned(inst.argv, inst.env).with_sleep_mode()
    return replace(inst, argv=launch.argv, env=dict(launch.env))


def host_ram_ok(weights_bytes: int) -> bool:
    """Whether host RAM can take another level-1 sleeper's weights (with 10% to spare)."""
    import psutil

    return psutil.virtual_memory().available > weights_bytes * 1.1


async def _post(session: Any, url: str, json: Any = None) -> None:
    import aiohttp

    try:
        async with session.post(url, json=json,
                                timeout=aiohttp.ClientTimeout(total=600)) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                raise InferplaneError(f"POST {url} answered {resp.status}: {text}",
                                      field="scaling", value=url)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise InferplaneError(f"POST {url} failed: {type(exc).__name__}: {exc}",
                              field="scaling", value=url) from exc


# Sleep mode's paths, from the engine boundary (the simulator answers vLLM's).
_PATHS = engine_for("vllm").endpoints


async def engine_sleep(session: Any, base_url: str, level: int) -> None:
    await _post(session, f"{base_url}{_PATHS.sleep}?level={level}")


async def engine_wake(session: Any, base_url: str, level: int) -> None:
    if level == 2:
        await _post(session, f"{base_url}{_PATHS.wake}?tags=weights")
        await _post(session, f"{base_url}{_PATHS.rpc}", {"method": "reload_weights"})
        await _post(session, f"{base_url}{_PATHS.wake}?tags=kv_cache")
    else:
        await _post(session, f"{base_url}{_PATHS.wake}")
