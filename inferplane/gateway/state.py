"""Live routing state: client-facing names -> pools, weighted versions, backend sets.

This is the object the runtime holds to change backends without a restart:

    state.set_backends("llama-8b", [Backend("http://127.0.0.1:8001", ready=True)])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inferplane.errors import InferplaneError
from inferplane.gateway.backend import Backend
from inferplane.gateway.config import GatewayConfig, WeightedRoute, WeightedTarget
from inferplane.gateway.lora import AdapterRoute
from inferplane.gateway.pool import Pool
from inferplane.gateway.scorers import OnUnusable


class WeightedChooser:
    """Smooth weighted round robin (as nginx does it): exact shares over any window of
    sum-of-weights picks, deterministic, no randomness to drift."""

    def __init__(self, targets: Sequence[WeightedTarget]) -> None:
        self.names = [t.model for t in targets]
        self.weights = [float(t.weight) for t in targets]
        self.total = sum(self.weights)
        self.current = [0.0] * len(targets)

    def choose(self) -> str:
        best = 0
        current = self.current
        for i, w in enumerate(self.weights):
            current[i] += w
            if current[i] > current[best]:
                best = i
        current[best] -= self.total
        return self.names[best]


class GatewayState:
    def __init__(
        self,
        config: GatewayConfig,
        on_unusable: OnUnusable | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.pools: dict[str, Pool] = {
            m.name: Pool(m, config.engine_metrics_stale_after_s, on_unusable, clock)
            for m in config.models
        }
        self._by_name: dict[str, Pool] = {}
        for m in config.models:
            for name in (m.name, *m.aliases):
                self._by_name[name] = self.pools[m.name]
        self._weighted: dict[str, WeightedChooser] = {
            r.name: WeightedChooser(r.targets) for r in config.routes
        }
        # LoRA adapters (gateway/lora.py): each client name -> its adapter; the base's pool
        # serves it.
        self.adapters: dict[str, AdapterRoute] = {
            name: adapter for m in config.models for adapter in m.adapters
            for name in adapter.client_names
        }
        # Per-key overrides (tenancy's DB routes): key id -> client-facing name -> split.
        self._per_key: dict[str, dict[str, WeightedChooser]] = {}

    def resolve(self, name: str, key_id: str | None = None) -> Pool | None:
        """The pool serving a client-facing name (model, alias, adapter or weighted route)."""
        picked = self.pick(name, key_id)
        return picked[0] if picked is not None else None

    def pick(
        self, name: str, key_id: str | None = None
    ) -> tuple[Pool, AdapterRoute | None] | None:
        """The pool serving a client-facing name for the API key `key_id` (the key's own
        override of that name first), and the adapter it names (None: the base model
        itself); a weighted route picks its target (a model or an adapter) here. The one
        place a name becomes a pool."""
        if key_id is not None and self._per_key:
            per_key = self._per_key.get(key_id, {}).get(name)
            if per_key is not None:
                return self.target(per_key.choose())
        pool = self._by_name.get(name)
        if self._weighted:
            # A route named after a model also splits that model's aliases (an adapter's
            # route its aliases).
            adapter = self.adapters.get(name)
            own = pool.route.name if pool is not None else adapter.name if adapter else name
            chooser = self._weighted.get(own) or self._weighted.get(name)
            if chooser is not None:
                return self.target(chooser.choose())
        if pool is not None:
            return pool, None
        return self.target(name)

    def target(self, name: str) -> tuple[Pool, AdapterRoute | None] | None:
        """A model (canonical name) or adapter (any of its names), weights not applied."""
        pool = self.pools.get(name)
        if pool is not None:
            return pool, None
        adapter = self.adapters.get(name)
        if adapter is not None:
            return self.pools[adapter.model], adapter
        return None

    def max_tokens_cap(self, name: str) -> int | None:
        """The cap of the model a name addresses directly (None: none, or a weighted route
        whose target is only chosen later)."""
        pool = self._by_name.get(name)
        adapter = self.adapters.get(name)
        if pool is None and adapter is not None:
            pool = self.pools[adapter.model]
        return pool.route.max_tokens_cap if pool is not None else None

    def serves(self, name: str) -> bool:
        """Whether `name` is a model, alias or weighted route of this gateway."""
        return name in self._by_name or name in self._weighted or name in self.adapters

    def client_names(self) -> list[str]:
        return list(dict.fromkeys([*self._by_name, *self.adapters, *self._weighted]))

    def parent_of(self, name: str) -> str | None:
        """The base model of an adapter's name (None: not an adapter)."""
        adapter = self.adapters.get(name)
        return adapter.model if adapter is not None else None

    def _pool(self, model: str) -> Pool:
        pool = self.pools.get(model)
        if pool is None:
            raise InferplaneError(
                "no such model in the gateway",
                field="model",
                value=model,
                fix=f"use one of {', '.join(sorted(self.pools)) or '(none configured)'}",
            )
        return pool

    def set_backends(self, model: str, backends: Sequence[Backend]) -> None:
        """Replace the replicas of `model` (its canonical name) at run time."""
        self._pool(model).set_backends(backends)

    def backends(self, model: str) -> list[Backend]:
        return list(self._pool(model).backends)

    def set_key_routes(self, per_key: dict[str, dict[str, WeightedChooser]]) -> None:
        """Replace every per-key override (key id -> name -> weighted targets)."""
        self._per_key = per_key

    def clear_weights(self, route: str) -> None:
        """Drop a weighted route; its name resolves as a plain model name again."""
        self._weighted.pop(route, None)

    def set_weights(self, route: str, targets: Sequence[WeightedTarget]) -> None:
        """Hot-reload a weighted route's split (canary steps, P43)."""
        for t in targets:
            if t.model not in self.adapters:
                self._pool(t.model)
        self._weighted[route] = WeightedChooser(WeightedRoute(route, tuple(targets)).targets)
