"""The admin HTTP API under /admin/, guarded by its own token (never an API key).

    GET  /admin/keys                      list keys (no secrets)
    POST /admin/keys                      create: {"name", "models", "rpm", "tpm",
                                          "max_concurrent", "budget_tokens", "budget_period",
                                          "priority", "expires_in_s", "team"} -> 201, "key"
    POST /admin/keys/{id}/revoke          revoke
    POST /admin/keys/{id}/rotate          new secret under "key"
    GET  /admin/routes                    weighted routes and per-key overrides
    PUT  /admin/routes/{name}             {"targets": {"model": weight, ...}, "key_id": null}
    DELETE /admin/routes/{name}?key_id=   remove a route (or one key's override)
    GET  /admin/usage?by=key&since=UNIX   usage report
The token comes from the environment variable named by `gateway.admin_token_env`
(INFERPLANE_ADMIN_TOKEN by default); without one the admin API answers 403.

Bodies are validated strictly, each refusal a 400 in OpenAI's error shape naming the field
(`param`): a string is not a list (`"models": "alpha"`), counts are positive integers
(never booleans), weights and durations are finite numbers; unknown fields are refused.
Names are checked against the running fleet as the fleet file is (`admin_checks`): route
targets are served models of one task, a key's models are names clients can address.
"""

from __future__ import annotations

import hmac
import logging
import math
from typing import Any
from urllib.parse import parse_qs

import orjson

from inferplane.errors import InferplaneError
from inferplane.gateway.asgi import Receive, Scope, Send
from inferplane.tenancy.keys import _get as get_key
from inferplane.tenancy.keys import create_key, list_keys, revoke_key, rotate_key
from inferplane.tenancy.ledger import usage_report
from inferplane.tenancy.routes import load_routes, set_route
from inferplane.tenancy.service import Tenancy

log = logging.getLogger("inferplane.tenancy.admin")

_CREATE_FIELDS = {
    "models", "rpm", "tpm", "max_concurrent", "budget_tokens", "budget_period", "priority",
    "expires_in_s", "team",
}  # fmt: skip
_COUNTS = ("rpm", "tpm", "max_concurrent", "budget_tokens")
_MAX_COUNT = 2**53  # what a JSON number and every database integer column hold exactly
_MAX_NAME = 256


class BadInput(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _string(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_NAME:
        raise BadInput(f"'{name}' must be a non-empty string of at most {_MAX_NAME} "
                       "characters", name)  # fmt: skip
    return value


def _create_args(body: Any) -> tuple[str, dict[str, Any]]:
    """The validated arguments of `create_key` from a POST /admin/keys body."""
    if not isinstance(body, dict):
        raise BadInput("the body must be a JSON object")
    unknown = set(body) - _CREATE_FIELDS - {"name"}
    if unknown:
        raise BadInput(f"unknown fields: {', '.join(sorted(map(str, unknown)))}",
                       sorted(map(str, unknown))[0])  # fmt: skip
    name = _string(body, "name", required=True)
    assert name is not None
    args: dict[str, Any] = {}
    models = body.get("models")
    if models is not None:
        if not isinstance(models, list) or not all(
            isinstance(m, str) and m and len(m) <= _MAX_NAME for m in models
        ):
            raise BadInput("'models' must be a list of model names (a string is not a list)",
                           "models")  # fmt: skip
        args["models"] = models
    for field in _COUNTS:
        value = body.get(field)
        if value is None:
            continue
        if type(value) is not int or not 0 < value <= _MAX_COUNT:
            raise BadInput(f"'{field}' must be a positive integer", field)
        args[field] = value
    for field in ("budget_period", "priority", "team"):
        value = _string(body, field)
        if value is not None:
            args[field] = value
    expires = body.get("expires_in_s")
    if expires is not None:
        if not _finite(expires) or not 0 < expires <= 100 * 365 * 86400:
            raise BadInput("'expires_in_s' must be a positive number of seconds",
                           "expires_in_s")  # fmt: skip
        args["expires_in_s"] = float(expires)
    return name, args


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _route_args(body: Any) -> tuple[list[tuple[str, float]], str | None]:
    """The validated targets and key of a PUT /admin/routes/{name} body."""
    if not isinstance(body, dict):
        raise BadInput("the body must be a JSON object")
    unknown = set(body) - {"targets", "key_id"}
    if unknown:
        raise BadInput(f"unknown fields: {', '.join(sorted(map(str, unknown)))}",
                       sorted(map(str, unknown))[0])  # fmt: skip
    targets = body.get("targets")
    if not isinstance(targets, dict):
        raise BadInput("'targets' must map model -> weight", "targets")
    out: list[tuple[str, float]] = []
    for model, weight in targets.items():
        if not model or len(model) > _MAX_NAME:
            raise BadInput("'targets' keys must be model names", "targets")
        if not _finite(weight) or weight < 0:
            raise BadInput(f"weight of '{model}' must be a finite number >= 0", "targets")
        out.append((model, float(weight)))
    if out and sum(w for _, w in out) <= 0:
        raise BadInput("weights sum to zero; give one target a positive weight", "targets")
    return out, _string(body, "key_id")


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


def _error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": status}}  # fmt: skip


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
        raise BadInput("the body is not JSON; send a JSON object") from None


async def handle(tenancy: Tenancy, scope: Scope, receive: Receive, send: Send) -> None:
    from inferplane.tenancy.admin_checks import check_allowed_models, check_route_targets

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
            name, args = _create_args(await _json_body(receive))
            if tenancy.state is not None and "models" in args:
                check_allowed_models(tenancy.state, args["models"])
            row, secret = await create_key(store, name, **args)
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
            targets, key_id = _route_args(await _json_body(receive))
            if tenancy.state is not None:
                check_route_targets(tenancy.state, targets)
            if key_id is not None:
                await get_key(store, key_id)  # 404 for a key that does not exist
            await set_route(store, parts[1], targets, key_id)
            await tenancy.refresh()
            await _send(send, 200, {"route": parts[1], "targets": dict(targets)})
        elif len(parts) == 2 and parts[0] == "routes" and method == "DELETE":
            query = parse_qs(scope.get("query_string", b"").decode())
            key_id = query.get("key_id", [None])[0]
            await set_route(store, parts[1], [], key_id)  # no targets: removed
            await tenancy.refresh()
            await _send(send, 200, {"route": parts[1], "deleted": True})
        elif parts == ["usage"] and method == "GET":
            query = parse_qs(scope.get("query_string", b"").decode())
            since_text = query.get("since", [None])[0]
            since = None
            if since_text:
                try:
                    since = float(since_text)
                except ValueError:
                    since = math.nan
                if not math.isfinite(since):
                    raise BadInput("'since' must be a UNIX time in seconds", "since")
            report = await usage_report(store, query.get("by", ["key"])[0], since)
            await _send(send, 200, {"usage": report})
        else:
            await _send(send, 404, _error(404, f"no admin route {method} {scope['path']}"))
    except BadInput as exc:
        await _send(send, 400, _error(400, exc.message, exc.param))
    except InferplaneError as exc:
        status = 404 if exc.message.lower().startswith("no such") else 400
        await _send(send, status, _error(status, str(exc), exc.field))
    except Exception:  # never a traceback nor a bare 500 page for a bad admin request
        log.exception("admin API: %s %s", method, scope["path"])
        await _send(send, 500, _error(500, "internal error; see the gateway log"))
