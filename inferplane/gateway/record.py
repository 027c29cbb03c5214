"""What one request did, filled in stage by stage, and the engine's usage read from bytes.

The `Record` is the seam between the stages: admission, routing, forwarding and relaying
write into it; accounting (metrics, access log, the usage ledger) reads it once at the end,
also for a request that was cancelled half-way.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplane.gateway.asgi import Receive
    from inferplane.gateway.backend import Backend
    from inferplane.gateway.tracing import RequestTrace
    from inferplane.tenancy.streams import UsageStripper

_USAGE_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_USAGE_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
# The Responses API (and Anthropic-style bodies) name them input/output tokens.
_USAGE_INPUT = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
_USAGE_OUTPUT = re.compile(rb'"output_tokens"\s*:\s*(\d+)')


def usage_from(data: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens from the last `"usage"` object in a body or stream tail:
    `prompt_tokens`/`completion_tokens`, or the Responses API's `input_tokens`/`output_tokens`."""
    at = data.rfind(b'"usage"')
    if at < 0:
        return 0, 0
    tail = data[at:]
    p = _USAGE_PROMPT.search(tail) or _USAGE_INPUT.search(tail)
    c = _USAGE_COMPLETION.search(tail) or _USAGE_OUTPUT.search(tail)
    return (int(p.group(1)) if p else 0, int(c.group(1)) if c else 0)


class Record:
    """What one request did; filled in as it goes so a cancelled request still logs."""

    __slots__ = (
        "adapter",
        "admitted_s",
        "backend",
        "completion_tokens",
        "disconnected",
        "events",
        "finished",
        "headers",
        "keeps_response",
        "key_id",
        "prompt_tokens",
        "queue_wait",
        "retries",
        "sent",
        "show_replica",
        "started",
        "status",
        "stripper",
        "task",
        "trace",
        "trace_headers",
        "ttft",
        "usage_known",
    )

    def __init__(self) -> None:
        self.adapter: str | None = None  # the LoRA adapter it runs with (its engine name)
        self.backend: Backend | None = None
        self.headers: Sequence[tuple[bytes, bytes]] = ()  # tenancy's x-ratelimit-* headers
        self.key_id: str | None = None  # the API key that made the request (tenancy)
        self.keeps_response = False  # a /v1/responses call vLLM stores: remember its id
        self.show_replica = False  # answer with x-inferplane-replica (replica_header)
        self.stripper: UsageStripper | None = None  # drops the usage event tenancy asked for
        self.status = 0
        self.ttft = 0.0
        self.queue_wait = 0.0
        self.admitted_s = 0.0  # received -> admitted (keys, limits, model resolved)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.retries = 0
        self.sent = False  # the request went to a replica (its prompt was processed)
        self.events = 0  # SSE events relayed that carry tokens (billing of cut streams)
        self.usage_known = False  # the engine reported the request's usage
        self.started = False  # response headers sent to the client
        self.finished = False  # final body message being sent: a disconnect is normal now
        self.disconnected = False
        self.trace: RequestTrace | None = None  # tracing on: this request's spans
        self.trace_headers = b""  # tracing off: the client's traceparent/tracestate lines
        self.task: asyncio.Task[Any] | None = None  # the request's own task

    def client_gone(self) -> None:
        """The client disconnected: cancel the request unless its answer is going out
        already (then the disconnect is the normal end of the exchange)."""
        if not self.finished and self.task is not None:
            self.disconnected = True
            self.task.cancel()


async def watch_disconnect(receive: Receive, rec: Record) -> None:
    """After the request body, receive() only returns when the client goes away (or, with
    uvicorn, once the response is complete; `finished` tells the two apart). Only for
    servers other than the gateway's own (its protocol calls `on_lost`: no task)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            rec.client_gone()
            return
