"""What the admin API checks against the running fleet, as the fleet file's own checks do
(`inferplane.spec.references`): a route's targets are models the gateway serves, all of one
task (a chat model and an embedding model answer different requests; a LoRA adapter
serves its base's), and at least one;
a key's allowed models are names a client can address (models, aliases, routes)."""

from __future__ import annotations

from collections.abc import Sequence

from inferplane.gateway.state import GatewayState
from inferplane.tenancy.admin import BadInput


def check_route_targets(state: GatewayState, targets: Sequence[tuple[str, float]]) -> None:
    if not targets:
        raise BadInput("a route needs at least one target; DELETE /admin/routes/{name} "
                       "removes one", "targets")  # fmt: skip
    found = {m: state.target(m) for m, _ in targets}  # a model or a LoRA adapter
    unknown = [m for m, picked in found.items() if picked is None]
    if unknown:
        known = sorted({*state.pools, *state.adapters})
        raise BadInput(f"no such model: {', '.join(unknown)} (targets are the fleet's "
                       f"models and adapters: {', '.join(known)})", "targets")  # fmt: skip
    tasks = {m: picked[0].route.task for m, picked in found.items() if picked is not None}
    if len(set(tasks.values())) > 1:
        kinds = ", ".join(f"{m} ({t})" for m, t in tasks.items())
        raise BadInput(f"a route mixes models of different tasks: {kinds}; route only "
                       "between models of the same task", "targets")  # fmt: skip


def check_allowed_models(state: GatewayState, models: Sequence[str]) -> None:
    names = set(state.client_names())
    unknown = [m for m in models if m not in names]
    if unknown:
        raise BadInput(f"no such model: {', '.join(unknown)} (this gateway serves "
                       f"{', '.join(sorted(names))})", "models")  # fmt: skip
