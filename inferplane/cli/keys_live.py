"""What `keys create` does to a running fleet: with `gateway.auth: auto` the first key
turns auth on in the live gateway within its refresh (2 s), so the command says so, and
refuses unless `--enable-auth` says that is meant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError


def live_fleet(url: str, state_dir: Path | None) -> dict[str, Any] | None:
    """The state of the running fleet whose gateway uses the database `url`, else None."""
    from inferplane.runtime.registry import find_state_dir
    from inferplane.store import database_url

    try:
        state = find_state_dir(state_dir)
    except InferplaneError:
        return None  # several fleets: the key goes to the database named, not to one of them
    if state.running_pid() is None:
        return None
    data = state.read()
    try:
        recorded = (state.path / "database_url").read_text().strip()
    except OSError:
        return None
    if data is None or not data.get("tenancy") or database_url(recorded) != url:
        return None
    return data


def first_key_turns_auth_on(live: dict[str, Any] | None, keys_before: int) -> bool:
    return live is not None and live["tenancy"].get("auth") == "auto" and keys_before == 0


def refuse(live: dict[str, Any]) -> InferplaneError:
    gateway = (live.get("gateway") or {}).get("url", "the running gateway")
    return InferplaneError(
        f"this is the first API key of the fleet serving {gateway} (gateway.auth: auto): "
        "creating it turns auth ON there within 2 s, and every client without a key then "
        "gets 401", field="--enable-auth",
        fix="pass --enable-auth to create it and turn auth on, or set gateway.auth: off "
        "(keys then only carry limits and usage)",
    )


def announce(live: dict[str, Any]) -> list[str]:
    """What just changed for the live gateway and its console."""
    tenancy = live["tenancy"]
    gateway = (live.get("gateway") or {}).get("url", "the gateway")
    lines = [f"auth is now ON at {gateway} (gateway.auth: auto, first key): from the next "
             "refresh (2 s) every request needs 'Authorization: Bearer KEY'"]
    env = tenancy.get("admin_token_env") or "INFERPLANE_ADMIN_TOKEN"
    if tenancy.get("admin_token_file"):
        lines.append(f"the console now asks for the admin token in "
                     f"{tenancy['admin_token_file']}")
    elif tenancy.get("admin_token"):
        lines.append(f"the console now asks for the admin token (${env})")
    else:
        lines.append(f"the console refuses (403) until ${env} is set and the fleet restarted")
    return lines
