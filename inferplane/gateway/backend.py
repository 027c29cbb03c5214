"""A replica the gateway can send requests to, with the live counters balancing reads."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from inferplane.aio import error_text
from inferplane.gateway.redact import redact_url


@dataclass(slots=True)
class EngineLoad:
    """One reading of a replica's vLLM `/metrics` (see `engine_metrics.py`)."""

    waiting: float
    running: float
    kv_usage: float  # fraction 0..1
    awake: bool
    read_at: float  # loop time of the reading


class Backend:
    """A replica of one model: its base URL (without `/v1`) plus mutable routing state.

    The runtime creates these and hands them to `GatewayState.set_backends`; the gateway
    updates `outstanding`, `consecutive_failures`, `consecutive_5xx`, `ejected` and
    `engine` in place. Two outlier counters, as Envoy keeps them: `consecutive_failures`
    counts the replica's own failures (no connection, reset, death mid-stream, timeouts);
    `consecutive_5xx` counts 5xx answers that a second replica did not share.
    """

    __slots__ = (
        "address",
        "api_key",
        "consecutive_5xx",
        "consecutive_failures",
        "ejected",
        "engine",
        "health_failures",
        "label",
        "max_concurrency",
        "outstanding",
        "ready",
        "url",
    )

    def __init__(
        self,
        url: str,
        *,
        ready: bool = True,
        max_concurrency: int | None = None,
        api_key: str | None = None,
        name: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # What /metrics, error messages, x-inferplane-replica, usage rows and the access log
        # call it: the instance (chat-0), the discovered pod, or the endpoint's place in its
        # model's list (`endpoint_backends`); never its address, which only operators see
        # (`inferplane status`, the admin-token console, the access log's `replica_url`).
        self.label = name or "replica-" + hashlib.sha256(self.url.encode()).hexdigest()[:8]
        self.address = redact_url(self.url)  # the URL without credentials, for operators
        self.ready = ready
        self.max_concurrency = max_concurrency  # None: the model's default cap
        self.api_key = api_key
        self.outstanding = 0
        self.consecutive_failures = 0
        self.consecutive_5xx = 0
        self.ejected = False
        self.health_failures = 0  # /health probes in a row that got no answer (monitor)
        self.engine: EngineLoad | None = None

    @property
    def public(self) -> str:
        """The name clients see in error messages: the same as `label`."""
        return self.label

    def __repr__(self) -> str:
        return (
            f"Backend({self.url!r}, ready={self.ready}, outstanding={self.outstanding}, "
            f"ejected={self.ejected})"
        )


def endpoint_name(model: str, index: int) -> str:
    """An `endpoints:` URL's name: its model and its place in the list (`chat-endpoint-0`)."""
    return f"{model}-endpoint-{index}"


def endpoint_backends(model: str, urls: Sequence[str]) -> list[Backend]:
    """The backends of a model's static `endpoints:` (fleet file, --backend), named by
    `endpoint_name` so no address reaches a client or `/metrics`."""
    return [Backend(url, name=endpoint_name(model, i)) for i, url in enumerate(urls)]


def failure_text(exc: BaseException, backend: Backend) -> str:
    """An upstream client's exception as a client may read it: `error_text` (its kind and
    cause, never the host and port aiohttp writes into it), with anything left that names
    `backend`'s address replaced by its name (issue 30 item 17)."""
    text = error_text(exc)
    netloc = urlsplit(backend.url).netloc.rpartition("@")[2]
    host = netloc.rpartition(":")[0] or netloc
    for secret in (backend.url, backend.address, netloc, host):
        if secret:
            text = text.replace(secret, backend.label)
    return text
