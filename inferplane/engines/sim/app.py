"""The ASGI app of one simulated engine: vLLM's HTTP surface over a `SimEngine`."""

from __future__ import annotations

import asyncio
import base64
import math
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inferplane.engines.sim.engine import SimEngine
from inferplane.engines.sim.metrics import CONTENT_TYPE
from inferplane.engines.sim.protocol import (
    ApiError,
    SamplingRequest,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    parse_sampling,
    usage,
    usage_chunk,
)
from inferplane.engines.sim.responses import ResponsesApi
from inferplane.engines.sim.scheduler import SimRequest, TokenEvent
from inferplane.engines.sim.tokens import apply_stop, chat_prompt_ids, visible_text
from inferplane.engines.sim.validation import validate_request


class _OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class EngineApp:
    """Routes of one engine. `on_crash` is called when `crash_after_requests` is reached."""

    def __init__(self, engine: SimEngine, on_crash: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.on_crash = on_crash
        self._hang = asyncio.Event()  # never set: a hung engine waits on it forever
        self.responses = ResponsesApi(self)  # /v1/responses[/{id}[/cancel]] (responses.py)
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/sleep", self.sleep, methods=["POST"]),
                Route("/wake_up", self.wake_up, methods=["POST"]),
                Route("/is_sleeping", self.is_sleeping, methods=["GET"]),
                Route("/collective_rpc", self.collective_rpc, methods=["POST"]),
                *self.responses.routes(),
            ],
            exception_handlers={ApiError: self._api_error},  # type: ignore[dict-item]
        )

    # -- faults ----------------------------------------------------------------------

    @property
    def hung(self) -> bool:
        limit = self.engine.parts.config.faults.hang_after_requests
        return limit is not None and self.engine.requests_seen >= limit

    async def _gate(self) -> None:
        if self.hung:
            await self._hang.wait()
        if not self.engine.ready:
            raise ApiError(503, "The engine is still loading the model.")

    async def _count_request(self) -> None:
        """Count an API request and apply the per-request faults."""
        faults = self.engine.parts.config.faults
        if self.hung:
            await self._hang.wait()
        self.engine.requests_seen += 1
        seen = self.engine.requests_seen
        if faults.crash_after_requests is not None and seen > faults.crash_after_requests:
            if self.on_crash is not None:
                self.on_crash()
            raise ApiError(500, "The engine crashed (simulated by --crash-after-requests).")
        if self.engine.sleeping:
            raise ApiError(400, "The engine is sleeping; POST /wake_up first.")
        if not self.engine.sleep_state.weights_valid:
            raise ApiError(500, "The weights were discarded by sleep level 2; reload them "
                                '(POST /collective_rpc {"method": "reload_weights"}).')
        if faults.fail_rate and self.engine.random.random() < faults.fail_rate:
            raise ApiError(500, "Simulated engine failure (--fail-rate).")

    async def _api_error(self, request: Request, exc: ApiError) -> Response:
        return _OrjsonResponse(exc.body(), status_code=exc.status)

    # -- simple endpoints ------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        await self._gate()
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        await self._gate()
        engine = self.engine
        card = {
            "id": engine.model_name,
            "object": "model",
            "created": engine.created,
            "owned_by": "vllm",
            "root": engine.parts.profile.name,
            "parent": None,
            "max_model_len": engine.max_model_len,
            "permission": [],
        }
        return _OrjsonResponse({"object": "list", "data": [card]})

    async def metrics(self, request: Request) -> Response:
        if self.hung:
            await self._hang.wait()
        return Response(self.engine.metrics.render(), media_type=CONTENT_TYPE)

    async def sleep(self, request: Request) -> Response:
        """vLLM's `POST /sleep?level=N` (1: weights to host RAM; 2: weights discarded)."""
        await self._gate()
        try:
            seconds = self.engine.sleep_state.sleep(int(request.query_params.get("level", 1)))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        self.engine.sleeping = True
        self.engine.core.reset_prefix_cache()  # the KV cache is gone
        await asyncio.sleep(seconds)
        return Response(status_code=200)

    async def wake_up(self, request: Request) -> Response:
        """vLLM's `POST /wake_up[?tags=weights&tags=kv_cache]`."""
        await self._gate()
        state = self.engine.sleep_state
        try:
            seconds = state.wake(request.query_params.getlist("tags"))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        await asyncio.sleep(seconds)
        self.engine.sleeping = state.sleeping
        return Response(status_code=200)

    async def collective_rpc(self, request: Request) -> Response:
        """vLLM's dev-mode `POST /collective_rpc`; only `reload_weights` is simulated."""
        await self._gate()
        body = orjson.loads(await request.body() or b"{}")
        method = body.get("method") if isinstance(body, dict) else None
        if method != "reload_weights":
            raise ApiError(400, f"the simulator supports only method 'reload_weights', not "
                                f"{method!r}")
        try:
            seconds = self.engine.sleep_state.reload_weights()
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        await asyncio.sleep(seconds)
        return _OrjsonResponse({"results": [None]})

    async def is_sleeping(self, request: Request) -> Response:
        await self._gate()
        return _OrjsonResponse({"is_sleeping": self.engine.sleeping})

    # -- generation ------------------------------------------------------------------

    async def _body(self, request: Request, kind: str) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        validate_request(body, kind)  # field types as vLLM's protocol models check them
        return body

    def _check_model(self, model: str) -> None:
        if model != self.engine.model_name:
            raise ApiError(404, f"The model `{model}` does not exist.", "model")

    def _plan_request(
        self, prompt_ids: list[int], sampling: SamplingRequest, prefix: str
    ) -> tuple[SimRequest, str | None]:
        max_len = self.engine.max_model_len
        prompt = len(prompt_ids)
        if prompt >= max_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your "
                f"request has {prompt} input tokens. Please reduce the length of the input.",
                "messages",
            )
        max_tokens = sampling.max_tokens if sampling.max_tokens is not None else max_len - prompt
        if prompt + max_tokens > max_len:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {max_len} tokens and your request has "
                f"{prompt} input tokens ({max_tokens} > {max_len} - {prompt}).",
                "max_tokens",
            )
        natural = self.engine.parts.config.eos_after_tokens
        count = max_tokens if sampling.ignore_eos else min(max_tokens, natural)
        reason = "length" if count == max_tokens else "stop"
        count, matched = apply_stop(count, sampling.stop)
        if matched is not None:
            reason = "stop"
        return (
            SimRequest(
                request_id=self.engine.new_request_id(prefix),
                prompt_token_ids=prompt_ids,
                output_tokens=count,
                finish_reason=reason,
                arrival_s=0.0,
                max_tokens_param=max_tokens,
            ),
            matched,
        )

    def _submit(self, request: SimRequest) -> asyncio.Queue[TokenEvent]:
        try:
            return self.engine.submit(request)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    async def _collect(self, request: SimRequest, queue: asyncio.Queue[TokenEvent]) -> None:
        try:
            while not (await queue.get()).finished:
                pass
        finally:
            if request.finished_s is None:
                self.engine.abort(request)
            self.engine.release(request)

    async def chat(self, request: Request) -> Response:
        await self._gate()
        body = await self._body(request, "chat")
        sampling = parse_sampling(body, chat=True)
        self._check_model(sampling.model)
        if self.engine.parts.profile.default_task == "embed":
            raise ApiError(400, "The model does not support Chat Completions API")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", "messages")
        await self._count_request()
        prompt_ids = chat_prompt_ids(self.engine.parts.tokenizer, messages)
        return await self._generate(prompt_ids, sampling, chat=True)

    async def completions(self, request: Request) -> Response:
        await self._gate()
        body = await self._body(request, "completion")
        sampling = parse_sampling(body, chat=False)
        self._check_model(sampling.model)
        if self.engine.parts.profile.default_task == "embed":
            raise ApiError(400, "The model does not support Completions API")
        prompt_ids = self._prompt_ids(body.get("prompt"))
        await self._count_request()
        return await self._generate(prompt_ids, sampling, chat=False)

    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingRequest, *, chat: bool
    ) -> Response:
        """Run one request through the engine: an SSE stream, or one JSON body at the end."""
        sim, stop = self._plan_request(prompt_ids, sampling, "chatcmpl" if chat else "cmpl")
        queue = self._submit(sim)
        if sampling.stream:
            return StreamingResponse(
                self._stream(sim, queue, stop, sampling, chat=chat),
                media_type="text/event-stream",
            )
        await self._collect(sim, queue)
        text = visible_text(sim.num_output, stop)
        use = usage(sim.num_prompt_tokens, sim.num_output, sim.cached_tokens)
        build = chat_response if chat else completion_response
        return _OrjsonResponse(build(sim.request_id, sampling.model, text, sim.finish_reason, use))

    def _prompt_ids(self, prompt: Any) -> list[int]:
        tokenizer = self.engine.parts.tokenizer
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tokenizer.encode(prompt)
        if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return list(prompt)
        raise ApiError(
            400,
            "prompt must be a string or a list of token ids (one prompt per request in the "
            "simulator)",
            "prompt",
        )

    async def _stream(
        self,
        sim: SimRequest,
        queue: asyncio.Queue[TokenEvent],
        stop: str | None,
        sampling: SamplingRequest,
        *,
        chat: bool,
    ) -> AsyncIterator[bytes]:
        model = sampling.model
        created = self.engine.created
        full = visible_text(sim.output_tokens, stop)
        sent = 0
        try:
            if chat:
                yield _sse(chat_chunk(sim.request_id, model, created,
                                      {"role": "assistant", "content": ""}, None))
            while True:
                event = await queue.get()
                end = len(full)
                if not event.finished:
                    end = min(end, len(visible_text(event.index + 1, None)))
                piece, sent = full[sent:end], end
                reason = sim.finish_reason if event.finished else None
                if chat:
                    delta = {"content": piece}
                    yield _sse(chat_chunk(sim.request_id, model, created, delta, reason))
                else:
                    yield _sse(completion_chunk(sim.request_id, model, created, piece, reason))
                if event.finished:
                    break
            if sampling.include_usage:
                obj = "chat.completion.chunk" if chat else "text_completion"
                use = usage(sim.num_prompt_tokens, sim.num_output, sim.cached_tokens)
                yield _sse(usage_chunk(sim.request_id, model, created, obj, use))
            yield b"data: [DONE]\n\n"
        finally:
            if sim.finished_s is None:
                self.engine.abort(sim)
            self.engine.release(sim)

    # -- embeddings ------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        await self._gate()
        body = await self._body(request, "embedding")
        model = body.get("model")
        if not isinstance(model, str):
            raise ApiError(400, "model must be a string", "model")
        self._check_model(model)
        if self.engine.parts.profile.default_task != "embed":
            raise ApiError(400, "The model does not support Embeddings API", "model")
        raw = body.get("input")
        batched = isinstance(raw, list) and bool(raw) and not isinstance(raw[0], int)
        inputs: list[Any] = list(raw) if batched and isinstance(raw, list) else [raw]
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ApiError(400, "encoding_format must be 'float' or 'base64'", "encoding_format")
        await self._count_request()
        prompts = [self._prompt_ids(item) for item in inputs]
        for ids in prompts:
            if len(ids) > self.engine.max_model_len:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {self.engine.max_model_len} "
                    f"tokens. However, your request has {len(ids)} input tokens.",
                    "input",
                )
        sims = [
            SimRequest(self.engine.new_request_id("embd"), ids, 1, "stop", 0.0)
            for ids in prompts
        ]
        queues = [self._submit(sim) for sim in sims]
        await asyncio.gather(*(self._collect(s, q) for s, q in zip(sims, queues, strict=True)))
        dim = self.engine.parts.profile.hidden_size
        data = []
        for index, ids in enumerate(prompts):
            vector = _embedding(ids, dim)
            value: Any = vector
            if fmt == "base64":
                value = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"index": index, "object": "embedding", "embedding": value})
        prompt_tokens = sum(len(ids) for ids in prompts)
        return _OrjsonResponse({
            "id": sims[0].request_id,
            "object": "list",
            "created": self.engine.created,
            "model": model,
            "data": data,
            "usage": usage(prompt_tokens, 0, 0),
        })


def _embedding(token_ids: list[int], dim: int) -> list[float]:
    """A deterministic unit vector derived from the tokens (equal inputs, equal vectors)."""
    seed = zlib.crc32(struct.pack(f"<{len(token_ids)}q", *token_ids))
    values = [math.sin(seed * 0.001 + i * 0.37) for i in range(dim)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]
