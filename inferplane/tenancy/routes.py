"""Routing rules in the database: weighted versions of a client-facing name (canary 5% ->
50% -> 100%, P43) and per-key overrides. The gateway polls them and applies changes live."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, select

from inferplane.errors import InferplaneError
from inferplane.store import RouteRule, Store

Targets = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class RouteTable:
    """`weighted[route]` for everyone; `per_key[key_id][route]` overrides it for one key."""

    weighted: dict[str, Targets] = field(default_factory=dict)
    per_key: dict[str, dict[str, Targets]] = field(default_factory=dict)


def _check(route: str, targets: Sequence[tuple[str, float]]) -> None:
    if not route:
        raise InferplaneError("a route needs a name", field="route", fix="e.g. 'llama'")
    names = [t for t, _ in targets]
    if len(set(names)) != len(names):
        raise InferplaneError(
            "a target is listed twice", field=f"routes.{route}", value=names,
            fix="give each target one weight",
        )  # fmt: skip
    if any(w < 0 for _, w in targets) or (targets and sum(w for _, w in targets) <= 0):
        raise InferplaneError(
            "weights must be >= 0 and not all 0", field=f"routes.{route}",
            value=[w for _, w in targets], fix="e.g. llama-v1=95 llama-v2=5",
        )  # fmt: skip


async def load_routes(store: Store) -> RouteTable:
    async with store.session() as session:
        rows = (
            await session.execute(select(RouteRule).order_by(RouteRule.route, RouteRule.id))
        ).scalars()
        weighted: dict[str, list[tuple[str, float]]] = {}
        per_key: dict[str, dict[str, list[tuple[str, float]]]] = {}
        for r in rows:
            bucket = weighted if r.key_id is None else per_key.setdefault(r.key_id, {})
            bucket.setdefault(r.route, []).append((r.target, r.weight))
    return RouteTable(
        {k: tuple(v) for k, v in weighted.items()},
        {key: {k: tuple(v) for k, v in m.items()} for key, m in per_key.items()},
    )


async def set_route(
    store: Store,
    route: str,
    targets: Sequence[tuple[str, float]],
    key_id: str | None = None,
    now: float | None = None,
) -> None:
    """Replace the targets of `route` (for one key when `key_id` is set); no targets deletes
    the route, so the name resolves as a plain model again."""
    _check(route, targets)
    now = time.time() if now is None else now
    async with store.session() as session:
        await session.execute(
            delete(RouteRule).where(
                RouteRule.route == route,
                RouteRule.key_id.is_(None) if key_id is None else RouteRule.key_id == key_id,
            )
        )
        for target, weight in targets:
            session.add(
                RouteRule(route=route, target=target, weight=weight, key_id=key_id, updated_at=now)
            )
        await session.commit()


async def seed_routes(store: Store, routes: Iterable[tuple[str, Targets]]) -> list[str]:
    """Insert the fleet file's routes that the table does not hold yet; the table wins for
    routes it already has (they may have been changed live). Returns the seeded names."""
    current = (await load_routes(store)).weighted
    seeded = []
    for name, targets in routes:
        if name not in current:
            await set_route(store, name, targets)
            seeded.append(name)
    return seeded
