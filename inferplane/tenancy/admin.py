"""The admin HTTP API under /admin/, guarded by its own token (never an API key).

    GET  /admin/keys                      list keys (no secrets)
    POST /admin/keys                      create: {"name", "models", "rpm", "tpm",
                                          "max_concurrent", "budget_tokens", "budget_period",
                                          "priority", "expires_in_s", "team"} -> 201, "key"
    POST /admin/keys/{id}/revoke          revoke
    POST /admin/keys/{id}/rotate          new secret under "key"
    GET  /admin/routes                    weighted routes and per-key overrides
    PUT  /admin/routes/{name}             {"targets": {"model": weight, ...}, "key_id": null}
    GET  /admin/usage?by=key&since=UNIX   usage report
The token comes from the environment variable named by `gateway.admin_token_env`
(INFERPLANE_ADMIN_TOKEN by default); without one the admin API answers 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import orjson

from inferplane.errors import InferplaneError
from inferplane.tenancy.keys import create_key, list_keys, revoke_key, rotate_key
from inferplane.tenancy.ledger import usage_report
from inferplane.tenancy.routes import load_routes, set_route
from inferplane.tenancy.service import Tenancy

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_CREATE_FIELDS = {
    "models", "rpm", "tpm", "max_concurrent", "budget_tokens", "budget_period", "priority",
    "expires_in_s", "team",
}  # fmt: skip


async def _send(send: Send, status: int, payload: Any) -> None:
    body = orjson.dumps(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", b"%d" % len(body))],
        }
    )  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": status}}


async def _json_body(receive: Receive) -> Any:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InferplaneError("body is not JSON", fix="send a JSON object") from None


async def handle(tenancy: Tenancy, scope: Scope, receive: Receive, send: Send) -> None:
    token = tenancy.admin_token
    given = b""
    for name, value in scope["headers"]:
        if name == b"authorization":
            given = value.partition(b" ")[2].strip()
    if not token:
        await _send(send, 403, _error(403, "admin API disabled: set INFERPLANE_ADMIN_TOKEN"))
        return
    if not hmac.compare_digest(given, token.encode()):
        await _send(send, 401, _error(401, "admin token missing or wrong"))
        return
    store = tenancy.store
    if store is None:
        await _send(send, 503, _error(503, "the gateway runs without a database"))
        return
    method, parts = scope["method"], scope["path"].strip("/").split("/")[1:]
    try:
        if parts == ["keys"] and method == "GET":
            rows = await list_keys(store, include_revoked=True)
            await _send(send, 200, {"keys": [r.as_dict() for r in rows]})
        elif parts == ["keys"] and method == "POST":
            body = await _json_body(receive)
            if not isinstance(body, dict) or not isinstance(body.get("name"), str):
                raise InferplaneError("'name' is required", field="name")
            unknown = set(body) - _CREATE_FIELDS - {"name"}
            if unknown:
                raise InferplaneError("unknown fields", value=sorted(unknown))
            args = {k: v for k, v in body.items() if k != "name"}
            row, secret = await create_key(store, body["name"], **args)
            await tenancy.refresh()
            await _send(send, 201, {**row.as_dict(), "key": secret})
        elif len(parts) == 3 and parts[0] == "keys" and method == "POST" and parts[2] in (
            "revoke", "rotate",
        ):  # fmt: skip
            if parts[2] == "revoke":
                row = await revoke_key(store, parts[1])
                out = row.as_dict()
            else:
                row, secret = await rotate_key(store, parts[1])
                out = {**row.as_dict(), "key": secret}
            await tenancy.refresh()
            await _send(send, 200, out)
        elif parts == ["routes"] and method == "GET":
            table = await load_routes(store)
            await _send(send, 200, {"routes": table.weighted, "per_key": table.per_key})
        elif len(parts) == 2 and parts[0] == "routes" and method == "PUT":
            body = await _json_body(receive)
            targets = body.get("targets") if isinstance(body, dict) else None
            if not isinstance(targets, dict):
                raise InferplaneError("'targets' must map model -> weight", field="targets")
            await set_route(
                store, parts[1], [(str(t), float(w)) for t, w in targets.items()],
                body.get("key_id"),
            )  # fmt: skip
            await tenancy.refresh()
            await _send(send, 200, {"route": parts[1], "targets": targets})
        elif parts == ["usage"] and method == "GET":
            query = parse_qs(scope.get("query_string", b"").decode())
            since = query.get("since", [None])[0]
            report = await usage_report(
                store, query.get("by", ["key"])[0], float(since) if since else None
            )
            await _send(send, 200, {"usage": report})
        else:
            await _send(send, 404, _error(404, f"no admin route {method} {scope['path']}"))
    except (InferplaneError, TypeError, ValueError) as exc:
        await _send(send, 400, _error(400, str(exc)))
