"""The console's HTTP surface under `/ui`, called by the gateway's dispatch.

    GET  /ui                               -> 303 /ui/fleet
    GET  /ui/{fleet,models,charts,usage,playground}   pages (HTML)
    GET  /ui/partials/{fleet,models,usage}            fragments htmx swaps in
    GET  /ui/partials/logs/{instance}
    GET  /ui/api/fleet | models | usage?days=7 | series?since=UNIX
    GET  /ui/api/instances/{instance}/logs?lines=100
    POST /ui/api/instances/{instance}/restart   what `inferplane restart` does, through the
                                               same control channel (`runtime.channel`)
    GET  /ui/login, POST /ui/login, POST /ui/logout
    GET  /ui/static/...                        the console's own files (no CDN)

Without the admin token (when one is needed, `inferplane.console.auth`) an API call gets
a 401 JSON error and a page gets the sign-in form with status 401; neither carries data.
An action (`POST /ui/api/...`) also needs the `x-inferplane-console` header (htmx sends it
on every request): a form on another site cannot set it, so a signed-in browser cannot be
made to restart anything from elsewhere.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from inferplane.console import auth, pages
from inferplane.console.hosts import rebinding_refusal
from inferplane.console.sampler import Sampler
from inferplane.console.source import FleetSource
from inferplane.console.usage import usage_view
from inferplane.console.views import fleet_view, logs_view, models_view
from inferplane.errors import InferplaneError
from inferplane.gateway.asgi import Receive, Scope, Send
from inferplane.gateway.errors import openai_error
from inferplane.gateway.redact import redact_url

if TYPE_CHECKING:
    from inferplane.gateway.app import GatewayApp


log = logging.getLogger("inferplane.console")

STATIC = Path(__file__).with_name("static")
_TYPES = {".js": b"text/javascript; charset=utf-8", ".css": b"text/css; charset=utf-8"}
# Scripts and styles come from this origin only: the CSP itself forbids any CDN.
_SECURITY = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; "
     b"style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
     b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]  # fmt: skip
_HTML = b"text/html; charset=utf-8"
_JSON = b"application/json"
RESTART_TIMEOUT_S = 15.0
MAX_FORM_BYTES = 4096


def _error(status: int, message: str, param: str | None = None) -> bytes:
    """OpenAI's error shape, as the rest of the gateway answers."""
    return openai_error(message, "invalid_request_error", status, param)


def _static_files() -> dict[str, Path]:
    files = {}
    for path in STATIC.rglob("*"):
        if path.suffix in _TYPES and path.is_file():
            files[path.relative_to(STATIC).as_posix()] = path
    return files


class ConsoleApp:
    """One gateway's console. `source` is the fleet runtime (None: a bare gateway)."""

    def __init__(
        self,
        gateway: GatewayApp,
        source: FleetSource | None = None,
        *,
        admin_token_env: str = "INFERPLANE_ADMIN_TOKEN",
        sample_interval_s: float = 1.0,
    ) -> None:
        self.gateway = gateway
        self.source = source
        self.admin_token_env = admin_token_env
        self.sampler = Sampler(gateway, source, sample_interval_s)
        self._static = _static_files()
        self.sessions = auth.Sessions()  # sign-ins: expiring, revoked at sign-out
        self.throttle = auth.LoginThrottle()  # failed sign-ins per client and overall

    async def stop(self) -> None:
        await self.sampler.stop()

    # ---- dispatch --------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"].rstrip("/") or "/ui"
        method: str = scope["method"]
        headers = list(scope["headers"])
        if path.startswith("/ui/static/") and method == "GET":
            await self._send_static(send, path[len("/ui/static/"):])
            return
        if path == "/ui/login":
            await self._login(scope, receive, send, method)
            return
        verdict = auth.check(self.gateway.tenancy, headers, self.sessions)
        is_api = path.startswith("/ui/api/")
        if verdict == "open":
            foreign = rebinding_refusal(headers, self.gateway.config.console_allowed_hosts)
            if foreign is not None:  # DNS rebinding: another site's page at this address
                await self._send(send, 403, _error(403, (
                    f"the open console does not answer to {foreign}; open it at "
                    "http://127.0.0.1:PORT/ui, add the name to gateway.console_allowed_hosts "
                    "or set an admin token (docs/console.md)")))
                return  # fmt: skip
        if verdict in ("missing", "disabled"):
            await self._refuse(send, verdict, is_api or path.startswith("/ui/partials/"),
                               wrong_token=bool(auth.bearer(headers)))
            return
        if is_api and method == "POST" and not any(n == b"x-inferplane-console"
                                                   for n, _ in headers):
            await self._send(send, 403, _error(403, "console actions need the "
                             "x-inferplane-console header (sent by the console's pages)"))
            return  # fmt: skip
        self.sampler.ensure_started()
        try:
            await self._route(scope, send, path, method, verdict, headers)
        except InferplaneError as exc:
            status = 404 if exc.message.startswith("no such") else 400
            message = exc.message + (f" ({exc.fix})" if exc.fix else "")
            await self._send(send, status, _error(status, message, exc.field))
        except Exception:  # never a traceback in the browser; the gateway log has it
            log.exception("console: %s %s", method, path)
            await self._send(send, 500, _error(500, "console error; see the gateway log"))

    async def _route(
        self, scope: Scope, send: Send, path: str, method: str, verdict: str,
        headers: list[tuple[bytes, bytes]],
    ) -> None:  # fmt: skip
        parts = path.split("/")[2:]  # after "/ui"
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        who = self._who(verdict)
        if method == "GET" and not parts:
            await self._send(send, 303, b"", b"text/plain", [(b"location", b"/ui/fleet")])
        elif method == "GET" and len(parts) == 1 and parts[0] in dict(pages.PAGES):
            await self._send(send, 200, self._page(parts[0], who).encode(), _HTML)
        elif method == "GET" and parts[:1] == ["partials"] and len(parts) in (2, 3):
            await self._send(send, 200, (await self._partial(parts[1:], query)).encode(), _HTML)
        elif method == "GET" and parts[:1] == ["api"]:
            await self._send(send, 200, orjson.dumps(await self._api(parts[1:], query)))
        elif (method == "POST" and len(parts) == 4 and parts[:2] == ["api", "instances"]
              and parts[3] == "restart"):  # fmt: skip
            await self._restart(send, parts[2], any(n == b"hx-request" for n, _ in headers))
        elif method == "POST" and parts == ["logout"]:
            self.sessions.revoke(auth.session_cookie(headers))
            await self._send(send, 303, b"", b"text/plain", [
                (b"location", b"/ui/login"),
                (b"set-cookie", f"{auth.COOKIE}=; Path=/ui; Max-Age=0; HttpOnly; "
                 "SameSite=Strict".encode()),
            ])  # fmt: skip
        elif method == "GET" and parts[:1] not in (["api"], ["partials"]):  # a browser: a page
            links = " · ".join(f'<a href="/ui/{p}">{t}</a>' for p, t in pages.PAGES)
            body = (f"<h1>No such page</h1><p>{pages.e(path)} is not a console page; "
                    f"the pages are {links}.</p>")
            await self._send(send, 404, pages.page("", "not found", body, who).encode(), _HTML)
        else:
            await self._send(send, 404, _error(404, f"no console route {method} {path}"))

    # ---- pages -------------------------------------------------------------------------

    def _who(self, verdict: str) -> str:
        if verdict == "open":
            return "open (no admin token needed: auth is off)"
        return ('signed in · <form method="post" action="/ui/logout" class="inline" '
                'hx-boost="false"><button class="link">sign out</button></form>')  # fmt: skip

    def _models(self) -> list[str]:
        return self.gateway.state.client_names()

    def _embeddings(self) -> set[str]:
        """Client names (models, aliases, weighted routes) that reach an embedding model."""
        config = self.gateway.state.config
        names = {n for m in config.models if m.task == "embed" for n in (m.name, *m.aliases)}
        # A route's targets share one task (the fleet file refuses mixed ones).
        names.update(r.name for r in config.routes if r.targets[0].model in names)
        return names

    def _page(self, name: str, who: str) -> str:
        refresh = 'hx-trigger="load, every 2s" hx-swap="innerHTML"'
        fast = 'hx-trigger="every 1s" hx-swap="innerHTML"'  # a restart lasts seconds
        if name == "fleet":
            body = (f'<h1>Fleet</h1><div id="fleet" hx-get="/ui/partials/fleet" {refresh}>'
                    f"{pages.fleet_fragment(fleet_view(self.source, self.sampler))}</div>")
        elif name == "models":
            models = pages.models_fragment(models_view(self.gateway, self.source), self._actions)
            body = (f'<h1>Models</h1><div id="action" class="note"></div><div id="models" '
                    f'hx-get="/ui/partials/models" {fast}>{models}'

                    '</div><div id="logs" class="panel"><p class="note">pick a replica\'s '
                    "<b>logs</b> to see its last lines and events</p></div>")
        elif name == "charts":
            body = "<h1>Live charts</h1>" + pages.charts_body(
                list(self.gateway.state.pools), self._embeddings())
        elif name == "usage":
            body = ('<h1>Keys and usage</h1><div id="usage" hx-get="/ui/partials/usage" '
                    'hx-trigger="load, every 10s" hx-swap="innerHTML"></div>')
        else:
            body = "<h1>Playground</h1>" + pages.playground_body(
                self._models(), self._replicas(), self._embeddings(),
                self.gateway.replica_header.token)
        return pages.page(name, name.title(), body, who)  # fmt: skip

    @property
    def _actions(self) -> bool:
        return self.source is not None

    def _replicas(self) -> dict[str, str]:
        """Replica name (what x-inferplane-replica says: chat-0) -> its engine URL, which
        only the console's operator sees next to a playground answer."""
        return {
            b.label: redact_url(b.url)
            for pool in self.gateway.state.pools.values() for b in pool.backends
        }  # fmt: skip

    async def _partial(self, parts: list[str], query: dict[str, list[str]]) -> str:
        if parts == ["fleet"]:
            return pages.fleet_fragment(fleet_view(self.source, self.sampler))
        if parts == ["models"]:
            return pages.models_fragment(models_view(self.gateway, self.source), self._actions)
        if parts == ["usage"]:
            return pages.usage_fragment(await self._usage(query))
        if len(parts) == 2 and parts[0] == "logs":
            lines = _int(query, "lines", 100)
            return pages.logs_fragment(logs_view(self.source, self.sampler, parts[1], lines))
        raise InferplaneError("no such console fragment", field="path", value="/".join(parts))

    async def _api(self, parts: list[str], query: dict[str, list[str]]) -> Any:
        if parts == ["fleet"]:
            return fleet_view(self.source, self.sampler)
        if parts == ["models"]:
            return models_view(self.gateway, self.source)
        if parts == ["usage"]:
            return await self._usage(query)
        if parts == ["series"]:
            since = _float(query, "since", 0.0)
            return {"interval_s": self.sampler.interval_s, "points": self.sampler.since(since)}
        if len(parts) == 3 and parts[0] == "instances" and parts[2] == "logs":
            return logs_view(self.source, self.sampler, parts[1], _int(query, "lines", 100))
        raise InferplaneError("no such console API", field="path", value="/".join(parts),
                              fix="see docs/console.md for the /ui/api routes")  # fmt: skip

    async def _usage(self, query: dict[str, list[str]]) -> dict[str, Any]:
        started = None
        if self.source is not None:
            started = self.source.status().get("started_at")
        plan = self.source.plan if self.source is not None else None
        return await usage_view(self.gateway.tenancy, plan, started, _int(query, "days", 7))

    # ---- actions -----------------------------------------------------------------------

    async def _restart(self, send: Send, name: str, htmx: bool) -> None:
        """`inferplane restart NAME --no-wait`, through the fleet's control channel."""
        from inferplane.runtime.channel import call

        if self.source is None:
            await self._send(send, 409, _error(409, "no fleet runtime to restart through "
                             "(this gateway runs without `inferplane up`)"))
            return  # fmt: skip
        request = {"op": "restart", "instance": name, "wait_s": None}
        reply = await asyncio.to_thread(call, self.source.state_dir, request, RESTART_TIMEOUT_S)
        ok = bool(reply.get("ok"))
        if ok:
            log.info("console: restart of %s requested", name)
        if htmx:
            text = (f"{name}: restart requested" if ok
                    else f"{name}: {reply.get('error', 'refused')}")  # fmt: skip
            await self._send(send, 200 if ok else 409,
                             f'<span class="{"ok" if ok else "error"}">{pages.e(text)}</span>'
                             .encode(), _HTML)  # fmt: skip
            return
        if ok:
            await self._send(send, 202, orjson.dumps({"ok": True, "instance": reply["instance"]}))
        else:
            status = 404 if "instances" in reply else 409
            await self._send(send, status, _error(status, str(reply.get("error")), "instance"))

    # ---- sign-in -----------------------------------------------------------------------

    async def _login(self, scope: Scope, receive: Receive, send: Send, method: str) -> None:
        tenancy = self.gateway.tenancy
        if not auth.protected(tenancy):
            await self._send(send, 303, b"", b"text/plain", [(b"location", b"/ui/fleet")])
            return
        assert tenancy is not None
        if method != "POST":
            await self._send(send, 200, self._login_page().encode(), _HTML)
            return
        client = str((scope.get("client") or ("-",))[0])
        wait = self.throttle.retry_after(client)
        if wait > 0:  # guessing the token: 5 tries a minute per client, 30 in all
            await self._send(send, 429, self._login_page(
                f"too many failed sign-ins; try again in {wait:.0f} s").encode(), _HTML,
                [(b"retry-after", b"%d" % max(1, round(wait)))])
            return  # fmt: skip
        form = parse_qs((await _body(receive, MAX_FORM_BYTES)).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0].strip()
        token = tenancy.admin_token
        if token and hmac.compare_digest(given.encode(), token.encode()):
            cookie = (f"{auth.COOKIE}={self.sessions.issue(token)}; Path=/ui; HttpOnly; "
                      f"SameSite=Strict; Max-Age={int(self.sessions.ttl_s)}")  # fmt: skip
            await self._send(send, 303, b"", b"text/plain",
                             [(b"location", b"/ui/fleet"), (b"set-cookie", cookie.encode())])
            return  # fmt: skip
        if token:
            self.throttle.failed(client)
        error = ("the admin token is not set in the gateway's environment" if not token
                 else "wrong admin token")  # fmt: skip
        await self._send(send, 401, self._login_page(error).encode(), _HTML)

    def _login_page(self, error: str = "") -> str:
        return pages.login("The console shows the whole fleet and can restart engines: it "
                           "needs the gateway's admin token.", self.admin_token_env, error)

    async def _refuse(self, send: Send, verdict: str, is_api: bool, wrong_token: bool) -> None:
        if verdict == "disabled":
            message = (f"the console needs the admin token but none is set: export "
                       f"{self.admin_token_env} before `inferplane up`")  # fmt: skip
            status = 403
        elif wrong_token:  # say so: "needs the admin token" reads as "none was sent"
            message = ("the bearer token is not the gateway's admin token (the value of "
                       f"{self.admin_token_env}; API keys do not open the console)")
            status = 401
        else:
            message = ("the console needs the admin token: 'Authorization: Bearer TOKEN' "
                       "or sign in at /ui/login")  # fmt: skip
            status = 401
        if is_api:
            await self._send(send, status, _error(status, message))
        else:
            await self._send(send, status, self._login_page(
                message if verdict == "disabled" else "").encode(), _HTML)  # fmt: skip

    # ---- plumbing ----------------------------------------------------------------------

    async def _send_static(self, send: Send, name: str) -> None:
        path = self._static.get(name)
        if path is None:
            await self._send(send, 404, _error(404, f"no console file {name}"))
            return
        await self._send(send, 200, path.read_bytes(), _TYPES[path.suffix],
                         [(b"cache-control", b"max-age=300")], security=False)  # fmt: skip

    @staticmethod
    async def _send(
        send: Send, status: int, body: bytes, content_type: bytes = _JSON,
        extra: list[tuple[bytes, bytes]] | None = None, security: bool = True,
    ) -> None:  # fmt: skip
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        if security:
            headers += _SECURITY
        headers += extra or []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise InferplaneError("form too large", field="body", value=size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _int(query: dict[str, list[str]], name: str, default: int) -> int:
    values = query.get(name)
    if not values:
        return default
    text = values[0]
    try:
        return int(text)
    except ValueError:
        raise InferplaneError(f"'{name}' must be a whole number", field=name, value=text,
                              fix=f"e.g. ?{name}={default}") from None  # fmt: skip


def _float(query: dict[str, list[str]], name: str, default: float) -> float:
    values = query.get(name)
    if not values:
        return default
    text = values[0]
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        raise InferplaneError(f"'{name}' must be a UNIX time in seconds", field=name,
                              value=text, fix="e.g. ?since=0 for every point kept")  # fmt: skip
    return value


def attach(gateway: GatewayApp, source: FleetSource | None, admin_token_env: str) -> ConsoleApp:
    """Serve the console from `gateway` (its dispatch sends `/ui` here)."""
    console = ConsoleApp(gateway, source, admin_token_env=admin_token_env)
    gateway.console = console
    return console

