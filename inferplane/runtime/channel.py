"""The control channel of a running `inferplane up`, for commands run from another shell.

The runtime listens on 127.0.0.1 (a port the OS picks) and writes `STATE/control.json`
(mode 0600: port, pid and a random token). A client connects, sends one JSON line
`{"token": ..., "op": ..., ...}` and reads one JSON line back: `{"ok": true, ...}` or
`{"ok": false, "error": "..."}`. A request without the right token is refused.

Operations:
- `ping`: `{"ok": true, "pid": ...}`.
- `restart` (`instance`, `wait_s`): `Supervisor.restart(instance)` — the instance leaves
  `ready` at once (the gateway stops routing to it), its process group is stopped and it
  starts again through the usual path (backoff, crash-loop limit). With `wait_s` the answer
  comes once it is ready again (or failed, or `wait_s` ran out) and carries its record.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import secrets
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplane.errors import InferplaneError
from inferplane.runtime.state import StateDir

if TYPE_CHECKING:
    from inferplane.runtime.runner import Runtime

CONTROL_FILE = "control.json"
CONTROL_HOST = "127.0.0.1"
MAX_REQUEST_BYTES = 64 * 1024


def control_file(state: StateDir) -> Path:
    return state.path / CONTROL_FILE


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by this user only (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class ControlServer:
    """Serves the control channel for one `Runtime`."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.token = secrets.token_urlsafe(32)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._file = control_file(runtime.state_dir)
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, CONTROL_HOST, 0, limit=MAX_REQUEST_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]
        _write_private(
            self._file,
            json.dumps(
                {"host": CONTROL_HOST, "port": self.port, "pid": os.getpid(), "token": self.token}
            )
            + "\n",
        )

    async def stop(self) -> None:
        """Stop listening, answer nothing more, remove `control.json`."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        with contextlib.suppress(Exception):
            await server.wait_closed()
        self._file.unlink(missing_ok=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), 10)
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("not an object")
            except (ValueError, TimeoutError, asyncio.LimitOverrunError) as exc:
                reply: dict[str, Any] = {"ok": False, "error": f"bad request: {exc}"}
            else:
                reply = await self._dispatch(request)
            writer.write(json.dumps(reply).encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        token = request.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token, self.token):
            return {"ok": False, "error": "wrong or missing token"}
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "restart":
            name = request.get("instance")
            wait_s = request.get("wait_s")
            if not isinstance(name, str):
                return {"ok": False, "error": "restart needs an instance name"}
            if wait_s is not None and not isinstance(wait_s, int | float):
                return {"ok": False, "error": "wait_s must be a number of seconds"}
            return await self._restart(name, float(wait_s) if wait_s is not None else None)
        return {"ok": False, "error": f"unknown operation {op!r}"}

    async def _restart(self, name: str, wait_s: float | None) -> dict[str, Any]:
        runtime = self.runtime
        records = runtime.supervisor.records
        rec = records.get(name)
        if rec is None:
            return {
                "ok": False,
                "error": f"no instance {name!r} in this fleet",
                "instances": sorted(records),
            }
        if runtime.phase in ("draining", "stopped"):
            return {"ok": False, "error": f"the fleet is {runtime.phase}"}
        pid_before, state_before = rec.pid, rec.state
        runtime.supervisor.restart(name)
        if wait_s is None:
            return {"ok": True, "instance": rec.to_json()}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        left = False  # the instance went through a stop since the request
        while loop.time() < deadline:
            if rec.pid != pid_before or rec.state != state_before:
                left = True
            if left and rec.state == "ready" and rec.pid != pid_before:
                return {"ok": True, "instance": rec.to_json()}
            if left and rec.state == "failed":
                return {
                    "ok": False,
                    "error": f"{name} failed: {rec.last_error}",
                    "instance": rec.to_json(),
                }
            await asyncio.sleep(0.05)
        return {
            "ok": False,
            "error": f"{name} was not ready again within {wait_s:g} s",
            "instance": rec.to_json(),
        }


def call(state: StateDir, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Send one request to the `up` owning `state`; its answer (raises when unreachable)."""
    path = control_file(state)
    pid = state.running_pid()
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        info = None
    if pid is None or not isinstance(info, dict) or info.get("pid") != pid:
        raise InferplaneError(
            "no running fleet to control from this state directory",
            field="--state-dir",
            value=str(state.path),
            fix="start one with `inferplane up FLEET.yaml`, or pass its --state-dir",
        )
    message = json.dumps({**request, "token": info["token"]}).encode() + b"\n"
    try:
        with socket.create_connection((str(info["host"]), int(info["port"])), timeout_s) as sock:
            sock.sendall(message)
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        raise InferplaneError(
            f"the fleet's control channel did not answer: {exc}",
            field="--state-dir",
            value=str(state.path),
            fix="check `inferplane status`; the fleet may be stopping",
        ) from exc
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise InferplaneError(
            "the fleet's control channel closed without an answer",
            field="--state-dir",
            value=str(state.path),
            fix="check `inferplane status`; the fleet may be stopping",
        )
    return reply
