"""`inferplane status`: instances, their state and ports, and the gateway URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.errors import InferplaneError


@app.command()
def status(
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (stable schema)."),
) -> None:
    """Show the fleet running from STATE_DIR (works from any shell)."""
    from inferplane.cli.up import print_status
    from inferplane.runtime.registry import find_state_dir

    state = find_state_dir(state_dir)
    data = state.read()
    if data is None:
        raise InferplaneError(
            "no fleet state here, and no fleet of this user is running", field="--state-dir",
            value=str(state.path),
            fix="start a fleet with `inferplane up FLEET.yaml`, or pass its --state-dir "
            "(or set $INFERPLANE_STATE_DIR)",
        )
    running = state.running_pid() is not None
    if not running and data.get("phase") != "stopped":
        data["phase"] = "stopped"  # the owner died without writing its final state
        for inst in data.get("instances", []):
            inst["state"] = "stopped"
    add_live_figures(data, running)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_status(data)


def add_live_figures(data: dict[str, Any], running: bool) -> None:
    """Add `uptime_s` (fleet and instance) and each instance's `waiting`, `running`,
    `kv_cache_usage` read from its engine's /metrics now (None when unavailable), and for
    a model with LoRA adapters the `adapters` its engine holds (its /v1/models now)."""
    import asyncio
    import time

    from inferplane.runtime.engine_stats import EngineStats, read_engine_stats

    now = time.time()
    started = data.get("started_at")
    data["uptime_s"] = now - started if running and started else None
    instances = data.get("instances", [])
    live = [i for i in instances if running and i.get("state") in ("ready", "unhealthy")]
    stats = asyncio.run(read_engine_stats(i["url"] for i in live)) if live else {}
    for inst in instances:
        if "adapters" in inst and inst not in live:
            inst["adapters"] = None  # not answering now: what it held is unknown
    lora = [i for i in live if "adapters" in i]  # the runtime marks models with adapters
    if lora:
        from inferplane.runtime.engine_adapters import read_engine_adapters

        held = asyncio.run(read_engine_adapters(i["url"] for i in lora))
        for inst in lora:
            inst["adapters"] = held.get(inst["url"])
    for inst in instances:
        got = stats.get(inst.get("url", ""), EngineStats()) if inst in live else EngineStats()
        since = inst.get("ready_since")
        ready = running and inst.get("state") == "ready" and since
        inst["uptime_s"] = now - since if ready else None
        inst["waiting"] = got.waiting
        inst["running"] = got.running
        inst["kv_cache_usage"] = got.kv_cache_usage
