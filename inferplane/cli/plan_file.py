"""Reading a saved plan (`inferplane plan --json`) given as `--plan` to a command."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.planner.plan import Plan
    from inferplane.spec import FleetSpec


def load_plan(path: Path) -> Plan:
    from pydantic import ValidationError

    from inferplane.planner.plan import Plan

    try:
        return Plan.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InferplaneError("cannot read the plan file", field="--plan", value=str(path),
                              fix="give a JSON plan written by `inferplane plan --json`") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InferplaneError(f"not a valid plan: {where}: {first['msg']}", field="--plan",
                              value=str(path), fix="re-create it with `inferplane plan`") from exc


def check_plan_matches(plan: Plan, fleet: FleetSpec, path: Path) -> None:
    """A plan made from another fleet file would cap replicas of models it never sized."""
    names = {m.name for m in fleet.models}
    stray = sorted({inst.model for inst in plan.instances} - names)
    if stray:
        raise InferplaneError(
            "the plan places models the fleet file does not have",
            field="--plan", value=f"{path}: {', '.join(stray)}",
            fix="re-create the plan from this fleet file (`inferplane plan FLEET --json`), "
                "or give the fleet file it was made from",
        )
