"""Admit: tenancy's decision for a parsed request (API key, model allowed, limits).

What the request reserves is its prompt estimate (~4 bytes per token) plus the most it may
generate (`reserve.output_reservation`); tenancy settles it with the engine's usage when
the request ends (`account.tenancy_done`). With limits in this process's memory the
decision never awaits (`Tenancy.admit_now`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from inferplane.gateway.request import estimate_prompt_tokens
from inferplane.gateway.reserve import output_reservation
from inferplane.gateway.state import GatewayState

if TYPE_CHECKING:
    from inferplane.tenancy.service import Admission, Rejection, Tenancy


class Reservation(NamedTuple):
    total: int  # prompt estimate + output reservation: what admission charges
    output: int  # the most the request may generate (n × max_tokens)
    prompt_estimate: int


def reservation(
    state: GatewayState, model: str, data: dict[str, Any], body: bytes, path: str
) -> Reservation:
    prompt_est = estimate_prompt_tokens(body)
    out = output_reservation(data, path, state.max_tokens_cap(model))
    return Reservation(prompt_est + out, out, prompt_est)


async def admit(
    tenancy: Tenancy, auth: bytes | None, model: str, need: Reservation
) -> Admission | Rejection:
    """The decision with a shared (Redis) limiter; in memory `Tenancy.admit_now` decides
    without awaiting, and the proxy calls it directly."""
    return await tenancy.admit(auth, model, need.total, need.output)
