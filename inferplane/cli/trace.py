"""`inferplane trace REQUEST_ID`: one request's path and timings from a fleet's local logs.

Joins, by request id, what `inferplane up` keeps in its state directory: the gateway's
access log (STATE/logs/gateway-access.log: arrival, admission, queue wait, replica, TTFT,
total, tokens, status), the engines' logs (STATE/logs/INSTANCE.log: vLLM and the
simulator log `Received request chatcmpl-<id>` for the X-Request-Id the gateway sends) and
the usage ledger (tokens and status billed to the key).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.errors import InferplaneError

ACCESS_LOG = "gateway-access.log"
_GATEWAY_LOGS = ("gateway-access.log", "gateway.log")


@app.command()
def trace(
    request_id: str = typer.Argument(..., help="The request's id (its x-request-id header)."),
    state_dir: Path | None = state_dir_option(),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show one request's path through the fleet: received, admitted, queued, the replica
    chosen, the engine's first byte (TTFT), finished, tokens and status, with the engine's
    log lines for it and its usage-ledger row."""
    from inferplane.runtime.registry import find_state_dir

    if not request_id.strip():
        raise InferplaneError(
            "empty request id", field="REQUEST_ID", fix="pass the x-request-id of a response"
        )
    state = find_state_dir(state_dir)
    if not state.path.is_dir():  # a mistyped --state-dir, not a missing request
        raise InferplaneError(
            "no fleet has run from this state directory", field="--state-dir",
            value=str(state.path), fix="pass the directory `inferplane up` ran with "
            "(`inferplane status` finds a running fleet without it)")  # fmt: skip
    log_dir = state.log_dir
    searched: list[str] = []
    access = log_dir / ACCESS_LOG
    searched.append(str(access))
    records = list(access_records(access, request_id))
    engine_files = sorted(
        p for p in log_dir.glob("*.log*") if not p.name.startswith(_GATEWAY_LOGS)
    ) if log_dir.is_dir() else []
    searched += [str(p) for p in engine_files]
    engine_lines = list(engine_log_lines(engine_files, request_id))
    usage, ledger = ledger_rows(state.path, request_id)
    if ledger is not None:
        searched.append(ledger)
    if not (records or engine_lines or usage):
        where = ", ".join(searched) if log_dir.is_dir() else f"{log_dir} (no logs yet)"
        raise InferplaneError(
            f"request id {request_id!r} is not in the fleet's logs (searched {where})",
            field="REQUEST_ID",
            fix="give the x-request-id of a response from this fleet (the access log is "
            "written within a second of the response), or pass the fleet's --state-dir if "
            "it runs from another directory",
        )
    # An older access log named a replica by its URL; the state file says which instance.
    instances = {
        str(i.get("url")): str(i.get("name")) for i in (state.read() or {}).get("instances", [])
    }
    doc = {
        "request_id": request_id,
        "requests": [timeline(_named(r, instances)) for r in records],
        "engine_log": engine_lines,
        "usage": usage,
        "searched": searched,
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    _print(doc)


def _named(record: dict[str, Any], instances: dict[str, str]) -> dict[str, Any]:
    """`replica`: the URL, `instance`: its name. The access log writes the name as `replica`
    and the URL as `replica_url` (names are what clients and /metrics see, issue 30)."""
    url = record.get("replica_url")
    if url is None:  # written before replicas were named
        url = record.get("replica")
        return {**record, "instance": instances.get(str(url), url)}
    return {**record, "replica": url, "instance": record.get("replica")}


def access_records(path: Path, request_id: str) -> list[dict[str, Any]]:
    """The access-log records of `request_id` (a client may reuse an id: all of them)."""
    if not path.is_file():
        return []
    needle = json.dumps(request_id).encode()  # as orjson wrote it, quotes included
    found = []
    with open(path, "rb") as handle:
        for line in handle:
            if needle not in line:  # cheap filter before parsing
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            if isinstance(record, dict) and record.get("request_id") == request_id:
                found.append(record)
    return found


def engine_log_lines(files: list[Path], request_id: str) -> list[dict[str, str]]:
    """Engine log lines that name the id (vLLM's own ids are `<kind>-<X-Request-Id>`)."""
    needle = request_id.encode()
    out = []
    for path in files:
        instance = path.name.split(".log")[0]
        try:
            with open(path, "rb") as handle:
                for line in handle:
                    if needle in line:
                        text = line.decode("utf-8", "replace").rstrip("\n")
                        out.append({"instance": instance, "file": str(path), "line": text})
        except OSError:
            continue
    return out


def ledger_rows(state: Path, request_id: str) -> tuple[list[dict[str, Any]], str | None]:
    """The usage rows of `request_id` from the fleet's database, if it has one; never
    creates a database. Returns the rows and what was searched (hidden password)."""
    url_file = state / "database_url"
    sqlite_file = state / "inferplane.db"
    if url_file.is_file():
        url = url_file.read_text().strip()
    elif sqlite_file.is_file():
        url = f"sqlite+aiosqlite:///{sqlite_file}"
    else:
        return [], None
    import asyncio

    from sqlalchemy import select
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    from inferplane.store.models import UsageRow

    async def query() -> list[dict[str, Any]]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                result = await conn.execute(
                    select(UsageRow).where(UsageRow.request_id == request_id)
                )
                return [dict(row._mapping) for row in result]
        finally:
            await engine.dispose()

    shown = make_url(url).render_as_string(hide_password=True)
    try:
        rows = asyncio.run(query())
    except Exception as exc:  # the trace still shows the logs
        return [{"error": f"cannot read the usage ledger: {type(exc).__name__}: {exc}"}], shown
    return rows, shown


def timeline(record: dict[str, Any]) -> dict[str, Any]:
    """The access-log record as events on the clock. Offsets are from arrival; the queue
    wait and TTFT fields are the gateway's own (docs/monitoring.md)."""
    received = record.get("received_at")
    events: list[dict[str, Any]] = []

    def event(name: str, offset: float | None, detail: str = "") -> None:
        if offset is None:
            return
        at = received + offset if isinstance(received, (int, float)) else None
        events.append({"event": name, "offset_s": round(offset, 6), "at": at, "detail": detail})

    admission = record.get("admission_s")
    queue_wait = record.get("queue_wait_s")
    ttft = record.get("upstream_ttft_s")
    total = record.get("total_s")
    replica = record.get("instance") or record.get("replica", "-")
    event("received", 0.0 if received is not None or total is not None else None)
    event("admitted", admission, "keys, limits, model resolved")
    if queue_wait is not None:
        waited = queue_wait - (admission or 0.0)
        event("replica chosen", queue_wait, f"{replica} (queued {max(waited, 0.0):.3f} s)")
    if ttft:
        event("upstream first byte", (queue_wait or 0.0) + ttft, f"TTFT {ttft:.3f} s")
    event("finished", total, f"status {record.get('status')}")
    return {**record, "events": events}


def _clock(at: float | None) -> str:
    if at is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def _replica(req: dict[str, Any]) -> str:
    """The instance and its URL; an endpoint (no instance) by its URL alone; none when the
    gateway answered itself (an unknown model, a refusal)."""
    url, instance = req.get("replica"), req.get("instance")
    if not url or url == "-":
        return "no replica (the gateway answered itself)"
    return f"replica {url}" if instance in (None, "", url) else f"replica {instance} ({url})"


def _print(doc: dict[str, Any]) -> None:
    say = typer.echo
    for req in doc["requests"]:
        model = req.get("model", "-")
        if req.get("requested_model"):  # an unknown model: what the client asked for
            model = f"{model} (asked for `{req['requested_model']}`)"
        say(
            f"request {doc['request_id']}: model {model}, "
            f"{_replica(req)}, status {req.get('status')}, tokens "
            f"{req.get('prompt_tokens', 0)} prompt + {req.get('completion_tokens', 0)} "
            f"completion, retries {req.get('retries', 0)}"
        )
        for ev in req["events"]:
            say(f"  {_clock(ev['at'])}  +{ev['offset_s']:.3f} s  {ev['event']:<20} {ev['detail']}")
    if not doc["requests"]:
        say(f"request {doc['request_id']}: not in the gateway's access log")
    if doc["engine_log"]:
        say("engine log:")
        for item in doc["engine_log"]:
            say(f"  [{item['instance']}] {item['line']}")
    else:
        say("engine log: no line names it (vLLM logs requests with --enable-log-requests)")
    for row in doc["usage"]:
        if "error" in row:
            say(f"usage ledger: {row['error']}")
            continue
        say(
            f"usage ledger: key {row.get('key_id') or 'anonymous'}, {row.get('prompt_tokens')} "
            f"prompt + {row.get('completion_tokens')} completion tokens, status "
            f"{row.get('status')}, {row.get('duration_s', 0):.3f} s"
        )
