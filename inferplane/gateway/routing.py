"""Route: the request's pool and replica, and the body as that replica must see it.

`pick_pool` turns the client-facing name into a pool (`GatewayState.resolve`: per-key
override, weighted route, alias, model) and applies the long-prompt lane; `rewrite` maps
the served name and the max_tokens cap (re-encoding only when a field changes);
`acquire` takes a replica slot, queueing by priority, or answers why there is none.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferplane.gateway.admission import QueueFull, QueueTimeout
from inferplane.gateway.asgi import Send, respond
from inferplane.gateway.backend import Backend
from inferplane.gateway.config import ModelRoute
from inferplane.gateway.errors import ClientError, error_body
from inferplane.gateway.lora import AdapterHoldings, AdapterLoadError, AdapterRoute
from inferplane.gateway.pool import NoReplica, Pool
from inferplane.gateway.record import Record
from inferplane.gateway.request import estimate_prompt_tokens
from inferplane.gateway.routes import GENERATION_LIMITS, ResponseOwners
from inferplane.gateway.scorers import RouteContext
from inferplane.gateway.state import GatewayState


def pick_pool(
    state: GatewayState, model: str, key_id: str | None, body: bytes
) -> tuple[Pool, AdapterRoute | None] | None:
    """The pool for `model` as the key `key_id` addresses it, and the LoRA adapter the
    name picks (None: the base model); None: no such name."""
    picked = state.pick(model, key_id)
    if picked is None:
        return None
    pool, adapter = picked
    lane = pool.route.long_prompt_lane
    if lane is not None and adapter is None and (
        estimate_prompt_tokens(body) > lane.threshold_tokens
    ):  # (an adapter stays on its base: the lane's model does not serve it)
        return state.pools[lane.model], None
    return picked


def rewrite(
    data: dict[str, Any], body: bytes, model: str, route: ModelRoute, path: str,
    adapter: str | None = None,
) -> bytes:  # fmt: skip
    """Apply the served-name map (an adapter's: its engine name) and the max_tokens cap;
    re-encode only when needed."""
    changed = False
    upstream = adapter if adapter is not None else route.upstream_name
    if upstream != model:
        data["model"] = upstream
        changed = True
    cap = route.max_tokens_cap
    keys = GENERATION_LIMITS.get(path)
    if cap is not None and keys is not None:
        present = False
        for key in keys:
            value = data.get(key)
            if value is None:
                continue
            if type(value) is not int:  # parse_body checks max_tokens, not the others
                raise ClientError(400, f"'{key}' must be an integer", key)
            present = True
            if value > cap:
                if route.max_tokens_mode == "reject":
                    raise ClientError(
                        400, f"'{key}' is {value}, above this model's cap of {cap}", key
                    )
                data[key] = cap
                changed = True
        if not present:
            data[keys[0]] = cap
            changed = True
    return orjson.dumps(data) if changed else body


def others_than_owner(
    responses: ResponseOwners, previous: object, pool: Pool, key_id: str | None
) -> list[Backend] | None:
    """A continuation (`previous_response_id`): the pool's replicas other than the one
    holding the earlier turn (vLLM keeps it in that replica's memory), to try after it;
    None when the id is unknown, another model's or another key's (vLLM's 404)."""
    owner = responses.get(previous) if type(previous) is str else None
    if owner is None or owner.model != pool.route.name or owner.key_id not in (None, key_id):
        return None
    return [b for b in pool.backends if b.url != owner.url]


async def acquire(
    pool: Pool, ctx: RouteContext, priority: int, send: Send, rid: bytes, rec: Record
) -> Backend | None:
    """A replica slot, waiting in the pool's queue; None: refused (answered already)."""
    route = pool.route
    retry_after = [(b"retry-after", str(route.admission.retry_after_s).encode())]
    try:
        return await pool.acquire(ctx, priority)
    except NoReplica:
        message = f"no ready replica for model `{route.name}`; retry later"
        status = 503
    except QueueFull:
        message = f"queue for model `{route.name}` is full; retry later"
        status = 429
    except QueueTimeout:
        wait = route.admission.max_queue_wait_s
        if pool.activator is not None and not pool.any_routable():
            # held for a wake or scale-from-zero, not for a busy replica's slot
            message = (f"model `{route.name}` did not wake within {wait:g} s "
                       "(no replica finished waking or starting); retry later")  # fmt: skip
        else:
            message = f"no replica of model `{route.name}` freed up within {wait:g} s"
        status = 503
    rec.status = status
    rec.finished = True
    await respond(send, status, error_body(status, message), rid, extra=retry_after)
    return None


async def adapter_ready(
    adapters: AdapterHoldings, pool: Pool, adapter: AdapterRoute, rec: Record, send: Send,
    rid: bytes,
) -> bool:  # fmt: skip
    """Make sure the chosen replica holds the LoRA adapter (loading it there, bounded by
    the model's queue wait); else answer 503 and say why."""
    backend = rec.backend
    assert backend is not None
    try:
        await adapters.ensure(backend, adapter, pool.route.admission.max_queue_wait_s)
        adapters.served(backend.url, adapter.name, pool.route.adapter_cache_slots)
        rec.adapter = adapter.name
        return True
    except AdapterLoadError as exc:
        rec.status = 503
        rec.finished = True
        retry = [(b"retry-after", str(pool.route.admission.retry_after_s).encode())]
        await respond(send, 503, error_body(503, str(exc)), rid, extra=retry)
        return False
