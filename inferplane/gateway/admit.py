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


class Verdict(NamedTuple):
    decision: Admission | Rejection
    reserved: int  # what tenancy charged: prompt estimate + output reservation
    prompt_estimate: int


async def admit(
    tenancy: Tenancy, state: GatewayState, auth: bytes | None, model: str,
    data: dict[str, Any], body: bytes, path: str,
) -> Verdict:  # fmt: skip
    prompt_est = estimate_prompt_tokens(body)
    out = output_reservation(data, path, state.max_tokens_cap(model))
    est = prompt_est + out
    if tenancy.sync_limits:
        decision = tenancy.admit_now(auth, model, est, out)
    else:
        decision = await tenancy.admit(auth, model, est, out)
    return Verdict(decision, est, prompt_est)
