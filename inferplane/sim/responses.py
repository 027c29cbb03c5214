"""vLLM's Responses API on the simulator, as vLLM serves it (`OpenAIServingResponses`).

Routes: `POST /v1/responses` (one JSON body, or the SSE events `response.created`,
`response.in_progress`, `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta`..., `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, `response.completed`, each framed `event: TYPE\\ndata: JSON`),
`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`.

As in vLLM, responses are only stored when the engine runs with
`VLLM_ENABLE_RESPONSES_API_STORE=1`; otherwise `store: true` is silently ignored, retrieval
answers 404 and `background: true` is refused. The store keeps the newest `STORE_LIMIT`
responses (vLLM's never forgets, which its own log line calls a leak).

What the simulator cannot honestly produce is refused with a 400 naming the field: forced
tool calls, structured `text.format`, output logprobs, and streamed background responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from inferplane.sim.disconnect import unless_disconnected
from inferplane.sim.protocol import ApiError
from inferplane.sim.scheduler import SimRequest, TokenEvent
from inferplane.sim.tokens import apply_stop, chat_prompt_ids, visible_text

if TYPE_CHECKING:
    from inferplane.sim.app import EngineApp

STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
STORE_LIMIT = 10_000
_INVALID = "invalid_request_error"


def _json(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", "response_id", _INVALID)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation vLLM renders: instructions as the system message, then the input."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, "instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and all(isinstance(item, dict) for item in raw):
        for item in raw:
            content = item.get("content", item.get("output", ""))
            messages.append({"role": str(item.get("role", "user")), "content": content})
    else:
        raise ApiError(400, "input must be a string or a list of input items", "input")
    return messages


def _check_supported(body: dict[str, Any]) -> None:
    """400 for what vLLM would do and the simulator cannot fake (never a silent 200)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise ApiError(400, "tools must be a list", "tools")
    choice = body.get("tool_choice", "auto")
    named = isinstance(choice, dict) and choice.get("type") == "function"
    if not tools and choice == "required":
        raise ApiError(400, "Tool choice 'required' must be specified with 'tools' parameter.",
                       "tool_choice")
    if not tools and named:
        raise ApiError(400, "Tool choice 'function' not found in 'tools' parameter.",
                       "tool_choice")
    if tools and (choice == "required" or named):
        raise ApiError(400, "the simulator cannot force a tool call on /v1/responses; use "
                            "tool_choice 'auto' or 'none'", "tool_choice")
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        raise ApiError(400, "the simulator does not generate structured output on "
                            "/v1/responses; omit text.format", "text")
    include = body.get("include") or []
    if isinstance(include, list) and "message.output_text.logprobs" in include:
        raise ApiError(400, "the simulator does not return output logprobs on /v1/responses",
                       "include")
    if body.get("prompt") is not None:
        raise ApiError(400, "prompt template is not supported", "prompt")


class ResponsesApi:
    """The Responses routes of one simulated engine, over the engine's own request path."""

    def __init__(self, app: EngineApp, enable_store: bool | None = None) -> None:
        self.app = app
        if enable_store is None:  # read once at start-up, like vLLM's envs
            enable_store = os.environ.get(STORE_ENV, "0").strip().lower() in ("1", "true")
        self.enable_store = enable_store
        self.store: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", self.cancel, methods=["POST"]),
        ]

    def _keep(self, response: dict[str, Any]) -> None:
        self.store[response["id"]] = response
        self.store.move_to_end(response["id"])
        while len(self.store) > STORE_LIMIT:
            self.store.popitem(last=False)

    # -- create ----------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        app = self.app
        engine = app.engine
        await app._gate()
        body = await app._json_object(request)
        model = body.get("model", engine.model_name)
        if not isinstance(model, str):
            raise ApiError(400, "model must be a string", "model")
        app._check_model(model)
        if engine.parts.profile.default_task == "embed":
            raise ApiError(400, "The model does not support Responses API")
        stream = body.get("stream") is True
        background = body.get("background") is True
        store = body.get("store", True) is not False
        if background and not store:
            raise ApiError(400, "background can only be used when `store` is true",
                           "background")
        _check_supported(body)
        if background and not self.enable_store:
            raise ApiError(
                400,
                "This vLLM engine does not support `store=True` and therefore does not "
                "support the background mode. To enable these features, set the environment "
                f"variable `{STORE_ENV}=1` when launching the vLLM server.",
                "background", _INVALID,
            )
        if background and stream:
            raise ApiError(400, "the simulator does not stream background responses; poll "
                                "GET /v1/responses/{id} instead", "stream")
        store = store and self.enable_store  # vLLM ignores store=true without the env var
        messages = _messages(body)
        previous = body.get("previous_response_id")
        if previous is not None:
            prior = self.store.get(str(previous))
            if prior is None:
                raise _not_found(str(previous))
            messages = [*prior["_messages"], *messages]
        max_output = body.get("max_output_tokens")
        if max_output is not None and (
            isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1
        ):
            raise ApiError(400, "max_output_tokens must be a positive integer",
                           "max_output_tokens")
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ApiError(400, "stop must be a string or a list of strings", "stop")
        await app._count_request()
        prompt_ids = chat_prompt_ids(engine.parts.tokenizer, messages)
        max_len = engine.max_model_len
        if len(prompt_ids) >= max_len:
            raise ApiError(
                400,
                f"The engine prompt length {len(prompt_ids)} exceeds the max_model_len "
                f"{max_len}. Please reduce prompt.",
                "input", _INVALID,
            )
        # vLLM clamps max_output_tokens to what the context leaves (get_max_tokens).
        max_tokens = max_len - len(prompt_ids)
        if max_output is not None:
            max_tokens = min(max_output, max_tokens)
        natural = engine.parts.config.eos_after_tokens
        ignore_eos = body.get("ignore_eos") is True
        count = max_tokens if ignore_eos else min(max_tokens, natural)
        reason = "length" if count == max_tokens else "stop"
        count, matched = apply_stop(count, stop)
        if matched is not None:
            reason = "stop"
        response_id = body.get("request_id")
        if not isinstance(response_id, str) or not response_id:
            response_id = f"resp_{uuid.uuid4().hex}"
        sim = SimRequest(
            request_id=engine.new_request_id("resp"),
            prompt_token_ids=prompt_ids,
            output_tokens=count,
            finish_reason=reason,
            arrival_s=0.0,
            max_tokens_param=max_tokens,
            lora=model if engine.loras.get(model) is not None else None,
        )
        queue = app._submit(sim)
        turn = _Turn(response_id, model, body, messages, max_tokens, int(time.time()), matched)
        if stream:
            return StreamingResponse(
                self._stream(sim, queue, turn, store), media_type="text/event-stream"
            )
        if background:
            queued = turn.response("queued", [], None)
            self._keep(queued)
            task = asyncio.get_running_loop().create_task(self._background(sim, queue, turn))
            self.tasks[response_id] = task
            task.add_done_callback(lambda _: self.tasks.pop(response_id, None))
            return _json(_public(queued))
        if not await unless_disconnected(request, self._collected(sim, queue)):
            return Response(status_code=499)  # the client is gone; its _collect aborted it
        final = turn.finish(sim)
        if store:
            self._keep(final)
        return _json(_public(final))

    async def _background(
        self, sim: SimRequest, queue: asyncio.Queue[TokenEvent], turn: _Turn
    ) -> None:
        stored = self.store.get(turn.response_id)
        if stored is not None:
            stored["status"] = "in_progress"
        await self.app._collect(sim, queue)
        current = self.store.get(turn.response_id)
        if current is not None and current["status"] != "cancelled":
            self._keep(turn.finish(sim))

    async def _stream(
        self,
        sim: SimRequest,
        queue: asyncio.Queue[TokenEvent],
        turn: _Turn,
        store: bool,
    ) -> AsyncIterator[bytes]:
        seq = 0

        def event(payload: dict[str, Any]) -> bytes:
            nonlocal seq
            payload["sequence_number"] = seq
            seq += 1
            return _event(payload)

        full = visible_text(sim.output_tokens, turn.stop)
        item_id = f"msg_{uuid.uuid4().hex}"
        opened = False
        sent = 0
        try:
            initial = _public(turn.response("in_progress", [], None))
            yield event({"response": initial, "type": "response.created"})
            yield event({"response": initial, "type": "response.in_progress"})
            while True:
                token = await queue.get()
                end = len(full)
                if not token.finished:
                    end = min(end, len(visible_text(token.index + 1, None)))
                piece, sent = full[sent:end], max(sent, end)
                if piece:
                    if not opened:
                        opened = True
                        yield event({"item": {"id": item_id, "content": [],
                                              "role": "assistant", "status": "in_progress",
                                              "type": "message", "phase": None},
                                     "output_index": 0, "type": "response.output_item.added"})
                        yield event({"content_index": 0, "item_id": item_id, "output_index": 0,
                                     "part": {"annotations": [], "text": "",
                                              "type": "output_text", "logprobs": []},
                                     "type": "response.content_part.added"})
                    yield event({"content_index": 0, "delta": piece, "item_id": item_id,
                                 "logprobs": [], "output_index": 0,
                                 "type": "response.output_text.delta"})
                if token.finished:
                    break
            if opened:
                part: dict[str, Any] = {"annotations": [], "text": full, "type": "output_text",
                                        "logprobs": None}
                yield event({"content_index": 0, "item_id": item_id, "logprobs": [],
                             "output_index": 0, "text": full,
                             "type": "response.output_text.done"})
                yield event({"content_index": 0, "item_id": item_id, "output_index": 0,
                             "part": part, "type": "response.content_part.done"})
                yield event({"item": {"id": item_id, "content": [part], "role": "assistant",
                                      "status": "completed", "type": "message", "phase": None},
                             "output_index": 0, "type": "response.output_item.done"})
            final = turn.finish(sim, item_id)
            if store:
                self._keep(final)
            yield event({"response": _public(final), "type": "response.completed"})
        finally:
            if sim.finished_s is None:
                self.app.engine.abort(sim)
            self.app.engine.release(sim)

    async def _collected(self, sim: SimRequest, queue: asyncio.Queue[TokenEvent]) -> bool:
        await self.app._collect(sim, queue)
        return True

    # -- by id -----------------------------------------------------------------------

    async def _stored(self, request: Request) -> tuple[str, dict[str, Any]]:
        """The id in the path and its stored response, or the 404 vLLM answers."""
        await self.app._gate()
        response_id = request.path_params["response_id"]
        response = self.store.get(response_id)
        if response is None:
            raise _not_found(response_id)
        return response_id, response

    async def retrieve(self, request: Request) -> Response:
        response_id, response = await self._stored(request)
        if request.query_params.get("stream", "false").lower() == "true":
            # vLLM replays only background streams' events; the simulator has none.
            raise ApiError(400, f"Unknown response_id: {response_id}", "response_id")
        return _json(_public(response))

    async def cancel(self, request: Request) -> Response:
        response_id, response = await self._stored(request)
        if response["status"] not in ("queued", "in_progress"):
            raise ApiError(400, "Cannot cancel a synchronous response.", "response_id",
                           _INVALID)
        response["status"] = "cancelled"
        task = self.tasks.get(response_id)
        if task is not None:
            task.cancel()  # its _collect aborts the engine request
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return _json(_public(response))


def _public(response: dict[str, Any]) -> dict[str, Any]:
    """The response without the simulator's bookkeeping (keys starting with '_')."""
    return {k: v for k, v in response.items() if not k.startswith("_")}


class _Turn:
    """What one create call asked for; builds the response object at each status."""

    def __init__(
        self,
        response_id: str,
        model: str,
        body: dict[str, Any],
        messages: list[dict[str, Any]],
        max_tokens: int,
        created: int,
        stop: str | None,
    ) -> None:
        self.response_id = response_id
        self.model = model
        self.body = body
        self.messages = messages
        self.max_tokens = max_tokens
        self.created = created
        self.stop = stop

    def response(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        body = self.body
        tools = body.get("tools") or []
        choice = body.get("tool_choice", "auto")
        if not tools and choice == "auto":
            choice = "none"  # as vLLM's check_tool_usage rewrites it
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        return {
            "id": self.response_id,
            "created_at": self.created,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "temperature": 1.0 if temperature is None else temperature,
            "tool_choice": choice,
            "tools": tools,
            "top_p": 1.0 if top_p is None else top_p,
            "background": body.get("background") is True,
            "max_output_tokens": self.max_tokens,
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": body.get("reasoning"),
            "service_tier": body.get("service_tier", "auto"),
            "status": status,
            "text": body.get("text"),
            "top_logprobs": None,
            "truncation": body.get("truncation", "disabled"),
            "usage": usage,
            "user": body.get("user"),
            "presence_penalty": body.get("presence_penalty", 0.0),
            "frequency_penalty": body.get("frequency_penalty", 0.0),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
            "_messages": self.messages,  # for previous_response_id (not sent)
        }

    def finish(self, sim: SimRequest, item_id: str | None = None) -> dict[str, Any]:
        """The final response: the generated text as one assistant message, and usage."""
        text = visible_text(sim.num_output, self.stop)
        message: dict[str, Any] = {
            "id": item_id or f"msg_{uuid.uuid4().hex}",
            "content": (
                [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}]
                if text else []
            ),
            "role": "assistant",
            "status": "completed",
            "type": "message",
            "phase": None,
        }
        prompt, output, cached = sim.num_prompt_tokens, sim.num_output, sim.cached_tokens
        usage = {
            "input_tokens": prompt,
            # vLLM 0.32 fills the per-turn lists only for multi-turn (tool) loops
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0,
                                     "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                      "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": prompt + output,
        }
        status = "incomplete" if sim.finish_reason == "length" else "completed"
        # Assistant output joins the conversation a previous_response_id continues.
        response = self.response(status, [message], usage)
        response["_messages"] = [*self.messages, {"role": "assistant", "content": text}]
        return response

