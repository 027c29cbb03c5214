"""Keys and usage for the console: tokens per key, model and UTC day from the tenancy
ledger, with each row's share of what the fleet's GPUs cost while it ran.

Cost is self-hosted cost, not a price list: the planned cards' rental price per hour
(`inferplane/bench/prices.yaml`, the list `inferplane capacity` prices fleets with) times the hours
this fleet has run inside the window, split between rows by their share of the tokens.
A day row gets that day's hours. Without a plan (no `gpus:`) or a price for a card type,
cost is null and the reason is given.
"""

from __future__ import annotations

import calendar
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferplane.planner.plan import Plan
    from inferplane.tenancy.service import Tenancy

MAX_DAYS = 366


def fleet_usd_per_hour(plan: Plan | None) -> tuple[float | None, str | None]:
    """The rental price of the cards the plan uses, or (None, why not)."""
    if plan is None:
        return None, "no plan (the fleet lists no gpus:), so no GPU cost to share"
    if plan.device == "cpu":
        return None, ("the fleet runs on CPU hosts (engine device cpu), and prices.yaml "
                      "prices GPUs only: no cost to share")
    from inferplane.bench.cost import load_prices

    prices = load_prices()
    used = [g for g in plan.gpus if g.instances]
    missing = sorted({g.type for g in used if g.type not in prices})
    if missing:
        return None, f"no price for {', '.join(missing)} in prices.yaml"
    return sum(prices[g.type].usd_per_gpu_hour for g in used), None


def _day_hours(day: str, start: float, end: float) -> float:
    d0 = float(calendar.timegm(time.strptime(day, "%Y-%m-%d")))
    return max(0.0, min(end, d0 + 86400) - max(start, d0)) / 3600


async def usage_view(
    tenancy: Tenancy | None, plan: Plan | None, started_at: float | None, days: int,
    now: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    from inferplane.errors import InferplaneError
    from inferplane.tenancy.ledger import usage_reports

    if tenancy is None or tenancy.store is None:
        return {"tenancy": False,
                "message": "tenancy is off (`up --no-tenancy`): no API keys and no usage "
                           "ledger to show; start the fleet without --no-tenancy"}  # fmt: skip
    if not 1 <= days <= MAX_DAYS:
        raise InferplaneError("days must be between 1 and 366", field="days", value=days,
                              fix="e.g. ?days=7")  # fmt: skip
    now = time.time() if now is None else now
    since = now - days * 86400
    if tenancy.ledger is not None:
        await tenancy.ledger.flush()  # what was just served shows at once
    tables = await usage_reports(tenancy.store, since)  # one query: totals always agree
    usd_h, why = fleet_usd_per_hour(plan)
    ran_from = max(since, started_at or since)
    hours = max(0.0, now - ran_from) / 3600
    total = sum(r["total_tokens"] for r in tables["model"])
    for by, rows in tables.items():
        for row in rows:
            if usd_h is None:
                row["cost_usd"] = None
            elif by == "day":
                row["cost_usd"] = round(usd_h * _day_hours(row["day"], ran_from, now), 4)
            else:
                share = row["total_tokens"] / total if total else 0.0
                row["cost_usd"] = round(usd_h * hours * share, 4)
    keys = [{"id": k.id, "name": k.name, "priority": k.priority,
             "models": sorted(k.allowed_models) if k.allowed_models is not None else None}
            for k in tenancy.keys.values()]  # fmt: skip
    return {
        "tenancy": True, "auth_required": tenancy.auth_required, "days": days,
        "since": since, "fleet_usd_per_hour": usd_h, "cost_note": why,
        "active_keys": keys, "by_key": tables["key"], "by_model": tables["model"],
        "by_day": tables["day"],
    }  # fmt: skip
