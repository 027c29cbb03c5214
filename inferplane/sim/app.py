"""The ASGI app of one simulated engine: vLLM's HTTP surface over a `SimEngine`."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inferplane.sim.disconnect import unless_disconnected
from inferplane.sim.engine import SimEngine
from inferplane.sim.fields import Fields, chat_fields, chat_validators, completion_fields
from inferplane.sim.generate import Generation, Prompt
from inferplane.sim.metrics import CONTENT_TYPE
from inferplane.sim.protocol import (
    ApiError,
    SamplingRequest,
    engine_dead,
    parse_sampling,
    prompt_too_long,
    usage,
)
from inferplane.sim.responses import ResponsesApi
from inferplane.sim.scheduler import SimRequest, TokenEvent
from inferplane.sim.tokenize import detokenize, tokenize
from inferplane.sim.tokens import render_chat
from inferplane.sim.validation import validate_request, validation_error

# vLLM's request log line (`--enable-log-requests`), so a request id is found in the
# engine's log (`inferplane trace`); off unless a handler is attached (`inferplane sim`).
requests_log = logging.getLogger("inferplane.sim.requests")


def log_requests() -> None:
    """Print the request lines on stdout as vLLM does (`inferplane sim`, one engine per
    process, so the runtime's per-instance log holds them)."""
    import sys

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [logger.py] %(message)s"))
    requests_log.addHandler(handler)
    requests_log.setLevel(logging.INFO)
    requests_log.propagate = False


class _OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


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
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                *self.responses.routes(),
                # vLLM registers these only with VLLM_ALLOW_RUNTIME_LORA_UPDATING (else 404)
                *([Route("/v1/load_lora_adapter", self.load_lora_adapter, methods=["POST"]),
                   Route("/v1/unload_lora_adapter", self.unload_lora_adapter,
                         methods=["POST"])] if engine.loras.runtime_updates else []),
            ],
            exception_handlers={
                ApiError: self._api_error,  # type: ignore[dict-item]
                HTTPException: self._http_error,  # type: ignore[dict-item]
            },
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
        if self.engine.dead:
            raise engine_dead()
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

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        # FastAPI's shape, as vLLM answers a route it has not registered (a generate model's
        # /v1/embeddings, a pooling model's /v1/chat/completions, any unknown path).
        return _OrjsonResponse({"detail": exc.detail}, status_code=exc.status_code,
                               headers=exc.headers)

    def _require_task(self, task: str) -> None:
        """vLLM registers each API's routes only for models of its task: elsewhere 404."""
        if (self.engine.parts.profile.default_task == "embed") != (task == "embed"):
            raise HTTPException(404, "Not Found")

    # -- simple endpoints ------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        await self._gate()
        return Response(status_code=503 if self.engine.dead else 200)

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
            # vLLM's ModelPermission card (OpenAI's legacy shape), one per model
            "permission": [{
                "id": f"modelperm-{engine.parts.profile.name.encode().hex()[:32]}",
                "object": "model_permission", "created": engine.created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
            # Not vLLM's: how usage counts were formed ("tokenizer": the model's
            # tokenizer.json; "approximate": ceil(len/4) per word, see docs/simulator.md).
            "inferplane": {
                "simulated": True,
                "token_counts": (
                    "approximate" if engine.parts.tokenizer.approximate else "tokenizer"
                ),
            },
        }
        cards = [card, *engine.loras.cards(engine.created)]  # adapters: parent = the base
        return _OrjsonResponse({"object": "list", "data": cards})

    async def load_lora_adapter(self, request: Request) -> Response:
        """vLLM's run-time adapter load: 200 with its text, or its refusal."""
        await self._gate()
        text = await self.engine.loras.load(await self._json_object(request))
        return Response(text, status_code=200)

    async def unload_lora_adapter(self, request: Request) -> Response:
        await self._gate()
        text = self.engine.loras.unload(await self._json_object(request))
        return Response(text, status_code=200)

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

    async def tokenize(self, request: Request) -> Response:
        await self._gate()
        body = await self._json_object(request)
        self._check_model(body.get("model"))
        return _OrjsonResponse(tokenize(self.engine.parts, body, self.engine.max_model_len))

    async def detokenize(self, request: Request) -> Response:
        await self._gate()
        body = await self._json_object(request)
        self._check_model(body.get("model"))
        return _OrjsonResponse(detokenize(self.engine.parts, body))

    # -- generation ------------------------------------------------------------------

    async def _json_object(self, request: Request) -> dict[str, Any]:
        """The request body as a JSON object, or the 400 vLLM answers when it is not one."""
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            # FastAPI's json_invalid validation error (position and message of json.loads)
            try:
                json.loads(raw)
                pos, why = 0, "JSON decode error"
            except json.JSONDecodeError as exc:
                pos, why = exc.pos, exc.msg
            except UnicodeDecodeError as exc:
                pos, why = exc.start, str(exc)
            raise validation_error([{"type": "json_invalid", "loc": ("body", pos),
                                     "msg": "JSON decode error", "input": {},
                                     "ctx": {"error": why}}]) from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        return body

    async def _body(self, request: Request, kind: str) -> dict[str, Any]:
        body = await self._json_object(request)
        validate_request(body, kind)  # field types as vLLM's protocol models check them
        return body

    def _check_model(self, model: Any, *, aliases: bool = True) -> None:
        """vLLM's unknown-model 404; the generate APIs name the served aliases."""
        if model is not None and model != self.engine.model_name:
            if aliases and self.engine.loras.get(model) is not None:
                return  # a loaded adapter (vLLM: models.lora_requests)
            if not aliases:  # the pooling APIs' check is older and plainer
                raise ApiError(404, f"The model `{model}` does not exist.")
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: "
                                f"{self.engine.model_name}.", "model")

    def _submit(
        self, request: SimRequest, queue: asyncio.Queue[TokenEvent] | None = None
    ) -> asyncio.Queue[TokenEvent]:
        try:
            return self.engine.submit(request, queue)
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
        self._require_task("generate")
        body = await self._body(request, "chat")
        chat_validators(body)  # the request model's own checks run while it is parsed
        sampling = parse_sampling(body, chat=True)
        self._check_model(sampling.model)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", "messages")
        parts = self.engine.parts
        fields = chat_fields(body, parts.config, parts.profile.vocab_size)
        await self._count_request()
        tokenizer = parts.tokenizer
        text = render_chat(tokenizer.chat_family, messages)
        pieces = tuple(tokenizer.pieces(text)) if fields.prompt_logprobs is not None else None
        prompt = Prompt(tokenizer.encode(text), text, pieces)
        return await self._generate(request, [prompt], sampling, fields, chat=True)

    async def completions(self, request: Request) -> Response:
        await self._gate()
        self._require_task("generate")
        body = await self._body(request, "completion")
        sampling = parse_sampling(body, chat=False)
        self._check_model(sampling.model)
        fields = completion_fields(
            body, self.engine.parts.config, self.engine.parts.profile.vocab_size
        )
        prompts = self._prompts(body.get("prompt"), echo=fields.echo,
                                pieces=fields.prompt_logprobs is not None)
        await self._count_request()
        return await self._generate(request, prompts, sampling, fields, chat=False)

    async def _generate(
        self, request: Request, prompts: list[Prompt], sampling: SamplingRequest,
        fields: Fields, *, chat: bool,
    ) -> Response:
        """Run the call's choices through the engine: an SSE stream, or one JSON body."""
        # vLLM's ids: the client's X-Request-Id when sent, else a random uuid.
        rid = self.engine.new_request_id(
            "chatcmpl" if chat else "cmpl", request.headers.get("x-request-id")
        )
        adapter = self.engine.loras.get(sampling.model)
        if requests_log.isEnabledFor(logging.INFO):
            lora = (f"LoRARequest(lora_name='{adapter.name}', lora_int_id={adapter.int_id}, "
                    f"lora_path='{adapter.path}')" if adapter is not None else "None")
            requests_log.info("Received request %s: params: SamplingParams(max_tokens=%s, "
                              "stream=%s), lora_request: %s.", rid, sampling.max_tokens,
                              sampling.stream, lora)  # fmt: skip
        generation = Generation(self.engine, prompts, sampling, fields, chat=chat,
                                request_id=rid)
        if adapter is not None:
            for choice in generation.choices:
                choice.sim.lora = adapter.name
            await self.engine.loras.activate(adapter)  # read again if the cache evicted it
        generation.submit()
        if sampling.stream:
            return StreamingResponse(generation.stream(), media_type="text/event-stream")
        body = await unless_disconnected(request, generation.body())
        if body is None:  # the client is gone: nothing is sent (vLLM's handler returns None)
            return Response(status_code=499)
        return _OrjsonResponse(body)

    def _prompt_ids(self, prompt: Any) -> list[int]:
        """One prompt's ids (embeddings inputs): a string or a list of token ids."""
        return self._prompt(prompt, echo=False).ids

    def _prompts(self, prompt: Any, *, echo: bool, pieces: bool = False) -> list[Prompt]:
        """A completions `prompt`: a string, token ids, or a list of either (one choice set
        per prompt, as vLLM's batched completions)."""
        if isinstance(prompt, list) and prompt and all(
            isinstance(p, (str, list)) for p in prompt
        ):
            return [self._prompt(p, echo=echo, pieces=pieces) for p in prompt]
        return [self._prompt(prompt, echo=echo, pieces=pieces)]

    def _prompt(self, prompt: Any, *, echo: bool, pieces: bool = False) -> Prompt:
        """One prompt; with `echo` or `pieces` also the text of each token."""
        tokenizer = self.engine.parts.tokenizer
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
            text_pieces = tuple(tokenizer.pieces(prompt)) if echo or pieces else None
            return Prompt(ids, prompt, text_pieces)
        if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            ids = list(prompt)
            if not echo and not pieces:
                return Prompt(ids)
            decoded = [tokenizer.decode([t]) for t in ids]
            if not echo:  # prompt_logprobs: decoded_token stays None where unknown
                known = all(piece is not None for piece in decoded)
                return Prompt(ids, None, tuple(str(p) for p in decoded) if known else None)
            if any(piece is None for piece in decoded):
                raise ApiError(
                    400,
                    "echo of a token-id prompt needs the model's tokenizer to decode it; "
                    "this engine counts tokens approximately (no tokenizer.json in the model "
                    "directory). Send the prompt as text or start the simulator with "
                    "--model-dir pointing at a directory with tokenizer.json",
                    "echo",
                )
            text = tokenizer.decode(ids) or ""
            return Prompt(ids, text, tuple(str(piece) for piece in decoded))
        raise ApiError(
            400, "prompt must be a string, a list of token ids, or a list of those", "prompt"
        )

    # -- embeddings ------------------------------------------------------------------

    def _dimensions(self, dimensions: Any) -> int | None:
        """vLLM's PoolingParams check: `dimensions` only for matryoshka models."""
        if dimensions is None:
            return None
        parts = self.engine.parts
        name = self.engine.model_name
        if not parts.is_matryoshka:
            raise ApiError(400, f"Model '{name}' does not support Matryoshka embeddings; "
                                f"dimensions must be unset (received dimensions={dimensions}).")
        allowed = parts.matryoshka_dimensions
        if allowed is not None and dimensions not in allowed:
            raise ApiError(400, f'Model "{name}" only supports {list(allowed)} matryoshka '
                                "dimensions, use other output dimensions will lead to poor "
                                "results.")
        if allowed is None and dimensions < 1:
            raise ApiError(400, "Dimensions must be greater than 0")
        return int(dimensions)

    async def embeddings(self, request: Request) -> Response:
        await self._gate()
        self._require_task("embed")
        body = await self._body(request, "embedding")
        model = body.get("model")
        if not isinstance(model, str):
            raise ApiError(400, "model must be a string", "model")
        self._check_model(model, aliases=False)
        raw = body.get("input")
        batched = isinstance(raw, list) and bool(raw) and not isinstance(raw[0], int)
        inputs: list[Any] = list(raw) if batched and isinstance(raw, list) else [raw]
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ApiError(400, "encoding_format must be 'float' or 'base64'", "encoding_format")
        dim = self._dimensions(body.get("dimensions"))
        await self._count_request()
        prompts = [self._prompt_ids(item) for item in inputs]
        for ids in prompts:
            if len(ids) > self.engine.max_model_len:
                raise prompt_too_long(self.engine.max_model_len, len(ids))
        rid = self.engine.new_request_id("embd", request.headers.get("x-request-id"))
        sims = [SimRequest(f"{rid}-{i}", ids, 1, "stop", 0.0) for i, ids in enumerate(prompts)]
        queues = [self._submit(sim) for sim in sims]
        await asyncio.gather(*(self._collect(s, q) for s, q in zip(sims, queues, strict=True)))
        data = []
        for index, ids in enumerate(prompts):
            vector = _embedding(ids, self.engine.parts.profile.hidden_size, dim)
            dim = len(vector)
            value: Any = vector
            if fmt == "base64":
                value = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"index": index, "object": "embedding", "embedding": value})
        prompt_tokens = sum(len(ids) for ids in prompts)
        return _OrjsonResponse({
            "id": rid,
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": usage(prompt_tokens, 0, 0),
        })


def _embedding(token_ids: list[int], hidden: int, dimensions: int | None) -> list[float]:
    """A deterministic unit vector derived from the tokens (equal inputs, equal vectors).

    With `dimensions` (matryoshka models) the first that many values, normalised again, as
    vLLM's pooler truncates and then normalises."""
    seed = zlib.crc32(struct.pack(f"<{len(token_ids)}q", *token_ids))
    size = hidden if dimensions is None else min(dimensions, hidden)
    values = [math.sin(seed * 0.001 + i * 0.37) for i in range(size)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]
