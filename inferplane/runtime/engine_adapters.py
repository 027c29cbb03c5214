"""Which LoRA adapters each engine holds, for `inferplane status`: the cards with a
`parent` in its `/v1/models` (vLLM lists every loaded adapter so, the simulator too).

An engine that does not answer reads as None (unknown), one without adapters as [].
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx

from inferplane.engines import engine_for


def adapters_in(body: object) -> list[str] | None:
    """The adapter names of a `/v1/models` answer, sorted; None when it is not a list."""
    cards = body.get("data") if isinstance(body, dict) else None
    if not isinstance(cards, list):
        return None
    return sorted(str(c["id"]) for c in cards if isinstance(c, dict) and c.get("parent")
                  and "id" in c)


async def read_engine_adapters(
    urls: Iterable[str], timeout_s: float = 1.0
) -> dict[str, list[str] | None]:
    """GET URL/v1/models of every engine at once."""
    unique = list(dict.fromkeys(urls))
    path = engine_for("vllm").endpoints.models
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:

        async def one(url: str) -> list[str] | None:
            try:
                resp = await client.get(url + path)
                return adapters_in(resp.json()) if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                return None

        results = await asyncio.gather(*(one(u) for u in unique))
    return dict(zip(unique, results, strict=True))
