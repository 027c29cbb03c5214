"""Every path a vLLM server exposes, and what the gateway does with each: one table.

- `MODEL_PATHS`: forwarded to a replica of the model named by the JSON body's `model`.
- `GENERATION_LIMITS`: the subset that generates tokens, with the fields the per-model
  `max_tokens` cap applies to (the first is set when the client sends none).
- `REFUSED`: answered by the gateway with an OpenAI-shaped JSON error that says why the
  path is not served through the gateway and what to use instead.
- The gateway's own routes (`/v1/models[/{id}]`, `/v1/responses/{id}[/cancel]`, `/health`,
  `/ready`, `/metrics`, `/admin/*`) are dispatched in `inferplane.gateway.app`.

The vLLM list was read from vLLM's route registrations (`vllm/frontend/entrypoints/**/
api_router.py`, `launchers/api_server/routers.py`) for the release the project targets
(`inferplane.engines.vllm.versions.DEFAULT_VLLM_VERSION`); tests/test_gateway_endpoints.py
keeps it as test data and checks that every path is either routed or refused.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

from inferplane.gateway.errors import openai_error

MODEL_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v1/score",
        "/score",
        "/tokenize",
        "/detokenize",
        "/pooling",
        "/classify",
        "/v2/embed",  # Cohere-style embeddings; the body names the model
        "/generative_scoring",
        # Prompt rendering without generation (no tokens generated, nothing to cap).
        "/v1/chat/completions/render",
        "/v1/completions/render",
    }
)

GENERATION_LIMITS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/responses": ("max_output_tokens",),
}

RESPONSES_PATH = "/v1/responses"
RESPONSES_PREFIX = "/v1/responses/"
MODELS_PREFIX = "/v1/models/"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the gateway does not serve a path, and what the client should use instead."""

    status: int
    why: str
    instead: str

    def body(self, method: str, path: str) -> bytes:
        kind = "NotImplementedError" if self.status == 501 else "NotFoundError"
        message = f"{method} {path} is not served by the gateway: {self.why}. {self.instead}"
        return openai_error(message, kind, self.status)


_ENGINE_ADMIN = Refusal(
    404,
    "it acts on one engine process, and the gateway fronts many",
    "Call the engine's own port (`inferplane status` lists them).",
)
_DEV_MODE = Refusal(
    404,
    "it is one of vLLM's development endpoints (VLLM_SERVER_DEV_MODE) and acts on one engine",
    "Call the engine's own port (`inferplane status` lists them); sleep and wake are "
    "driven by the fleet's scaling policy.",
)
_LORA = Refusal(
    404,
    "the gateway loads and unloads adapters itself: each adapter declared in the fleet "
    "file (models[].lora.adapters) is loaded on the replica a request for it is routed to",
    "Declare the adapter under models[].lora.adapters and send requests with its name as "
    "`model` (docs/lora.md).",
)
_DISAGG = Refusal(
    404,
    "it is part of vLLM's disaggregated-serving protocol between a router and its engines",
    "Use /v1/chat/completions or /v1/completions (a list of token ids is a valid prompt).",
)
_ANTHROPIC = Refusal(
    501,
    "the gateway speaks the OpenAI API (its errors, keys and usage accounting), not "
    "Anthropic's Messages API",
    "Use /v1/chat/completions.",
)
_AUDIO = Refusal(
    501,
    "the gateway routes by a JSON body's `model`, and audio uploads are multipart forms",
    "Send audio requests to the engine serving the model (`inferplane status` lists them).",
)

REFUSED: dict[str, Refusal] = {
    # OpenAI-compatible endpoints the gateway does not proxy.
    "/v1/audio/transcriptions": _AUDIO,
    "/v1/audio/translations": _AUDIO,
    "/v1/realtime": Refusal(
        501,
        "it is a WebSocket API and the gateway proxies HTTP only",
        "Connect to the engine serving the model directly (`inferplane status` lists them).",
    ),
    "/v1/messages": _ANTHROPIC,
    "/v1/messages/count_tokens": _ANTHROPIC,
    "/v1/messages/render": _ANTHROPIC,
    "/cohere/v2/chat": Refusal(501, "the gateway speaks the OpenAI API, not Cohere's chat API",
                               "Use /v1/chat/completions."),
    "/cohere/v2/chat/render": Refusal(501, "the gateway speaks the OpenAI API, not Cohere's "
                                      "chat API", "Use /v1/chat/completions/render."),
    "/v1/chat/completions/batch": Refusal(
        501,
        "a batch holds many conversations in one request, beyond the gateway's per-request "
        "limits and token cap",
        "Send each conversation as its own /v1/chat/completions request.",
    ),
    "/invocations": Refusal(
        404,
        "it is SageMaker's dispatcher, which picks the API from the body's shape and so "
        "bypasses the gateway's per-endpoint limits",
        "Call the endpoint itself (/v1/chat/completions, /v1/completions, /v1/embeddings, ...).",
    ),
    "/ping": Refusal(404, "it is SageMaker's health check of one engine",
                     "Use the gateway's /health (liveness) or /ready (every model routable)."),
    "/version": Refusal(
        404,
        "the gateway fronts many engines, possibly of different vLLM releases",
        "`inferplane status` shows each engine; the plan pins the release per model.",
    ),
    "/load": _ENGINE_ADMIN,
    "/tokenizer_info": Refusal(
        404,
        "it is a GET without a body, so it names no model to route by",
        "Call the engine serving the model (`inferplane status` lists them), or use /tokenize.",
    ),
    "/v1/load_lora_adapter": _LORA,
    "/v1/unload_lora_adapter": _LORA,
    # Scale-out / disaggregated serving.
    "/inference/v1/generate": _DISAGG,
    "/v1/chat/completions/derender": _DISAGG,
    "/v1/completions/derender": _DISAGG,
    "/abort_requests": _DISAGG,
    # Engine administration.
    "/start_profile": _ENGINE_ADMIN,
    "/stop_profile": _ENGINE_ADMIN,
    "/scale_elastic_ep": _ENGINE_ADMIN,
    "/is_scaling_elastic_ep": _ENGINE_ADMIN,
    "/fault_tolerance/apply": _ENGINE_ADMIN,
    "/fault_tolerance/status": _ENGINE_ADMIN,
    # Development mode (VLLM_SERVER_DEV_MODE=1).
    "/reset_prefix_cache": _DEV_MODE,
    "/reset_mm_cache": _DEV_MODE,
    "/reset_encoder_cache": _DEV_MODE,
    "/sleep": _DEV_MODE,
    "/wake_up": _DEV_MODE,
    "/is_sleeping": _DEV_MODE,
    "/collective_rpc": _DEV_MODE,
    "/server_info": _DEV_MODE,
    "/pause": _DEV_MODE,
    "/resume": _DEV_MODE,
    "/is_paused": _DEV_MODE,
    "/init_weight_transfer_engine": _DEV_MODE,
    "/start_weight_update": _DEV_MODE,
    "/start_draft_weight_update": _DEV_MODE,
    "/update_weights": _DEV_MODE,
    "/finish_weight_update": _DEV_MODE,
    "/update_weight_version": _DEV_MODE,
    "/weight_info": _DEV_MODE,
    "/get_world_size": _DEV_MODE,
}


def model_not_found(model: str) -> bytes:
    """OpenAI's 404 for a model the caller cannot address (unknown, or not for this key)."""
    return openai_error(
        f"The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error", "model_not_found",
    )  # fmt: skip


def response_not_found(response_id: str) -> bytes:
    """vLLM's own 404 for an unknown response id (`OpenAIServingResponses`)."""
    return openai_error(
        f"Response with id '{response_id}' not found.", "invalid_request_error", 404,
        "response_id",
    )  # fmt: skip


# The response object's own id is the first "id" in both a /v1/responses body and the
# first event of its stream (`response.created`: {"response": {"id": ...}}); vLLM's field
# order puts it before the output items' ids.
_FIRST_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')


@dataclass(frozen=True, slots=True)
class Owner:
    """Where a response lives: the model's route, the replica's URL, the key that made it."""

    model: str
    url: str
    key_id: str | None


class ResponseOwners:
    """Response id -> the replica that generated it, for `GET /v1/responses/{id}` and
    `POST /v1/responses/{id}/cancel`. vLLM keeps stored responses in the engine's memory
    and the id does not name the model, so the gateway remembers the newest ids it
    relayed: at most `per_key` per API key (one key's flood evicts only its own ids) and
    `limit` in all (beyond it the key holding the most loses its oldest). An id is never
    re-owned: a later response claiming a known id of another key is not remembered. An
    id it does not know (evicted, older than this gateway process, or made through another
    gateway replica) gets vLLM's own 404."""

    def __init__(self, limit: int = 10_000, per_key: int = 2_000) -> None:
        if limit < 1 or per_key < 1:
            raise ValueError(f"limit must be at least 1 (per_key too), got {limit}, {per_key}")
        self.limit = limit
        self.per_key = per_key
        self._owners: dict[str, Owner] = {}
        self._by_key: dict[str | None, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def learn(self, data: bytes, model: str, url: str, key_id: str | None) -> str | None:
        """Remember the response id found in a body or a stream's first bytes."""
        match = _FIRST_ID.search(data)
        if match is None:
            return None
        response_id = match.group(1).decode("utf-8", "replace")
        known = self._owners.get(response_id)
        if known is not None and known.key_id != key_id:
            return None  # another key's id: never re-owned
        self._owners[response_id] = Owner(model, url, key_id)
        ids = self._by_key.setdefault(key_id, OrderedDict())
        ids[response_id] = None
        ids.move_to_end(response_id)
        if len(ids) > self.per_key:
            self._forget(key_id)
        while len(self._owners) > self.limit:
            self._forget(max(self._by_key, key=lambda k: len(self._by_key[k])))
        return response_id

    def _forget(self, key_id: str | None) -> None:
        """Drop the oldest id of `key_id`."""
        ids = self._by_key[key_id]
        oldest, _ = ids.popitem(last=False)
        self._owners.pop(oldest, None)
        if not ids:
            del self._by_key[key_id]

    def get(self, response_id: str) -> Owner | None:
        return self._owners.get(response_id)


def split_response_path(path: str) -> tuple[str, str] | None:
    """'/v1/responses/ID' -> (ID, ''), '/v1/responses/ID/cancel' -> (ID, 'cancel');
    None for anything else under the prefix."""
    rest = path[len(RESPONSES_PREFIX):]
    response_id, _, action = rest.partition("/")
    if not response_id or action not in ("", "cancel"):
        return None
    return response_id, action
