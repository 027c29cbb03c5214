"""Recall of `inferplane diagnose` over every real failure log in tests/data/diagnose.

Each fixture in SOURCES.yaml with `kind: real` names the class (signature id) a reader
confirmed from its source. Per fixture the outcome is one of:

- fully explained: the exact signature of that class matched and its cause and fix rendered
  with every number they name (no "[...: not in the log]");
- recognized: the exact signature matched, but some number was missing;
- generic-only: no exact signature matched, and the generic layer named the right class;
- similar-only: neither a signature nor a generic rule named a class, and the similarity
  layer (a model of the train fixtures' words) named the right one;
- wrong: a signature (or the generic layer) named another class, and not this one;
- missed: nothing named a class.

"Recognized with the right class" counts the first four. `generic alone` runs the generic
layer on every log as if no signature existed: how well an unseen wording of a known class
would still be classified. The split is explicit in the fixtures: `split: heldout-N` marks
the logs harvested (with their sources, and their class read from the source) after the last
change to any signature or generic rule and recorded before `diagnose` first ran on them;
they were never used to write or widen a pattern. Everything else is `train`. Earlier
held-out sets (`held_out_in: heldout` .. `heldout-19`) were measured once, then studied and
moved to train; their rows below show where they stand now, not an honest held-out figure
(their first measurements are in docs/diagnose.md). Fixtures marked `known_miss` are
measured misses kept in train with their reason.
Real vLLM logs captured by the real-engine tier (`real-cpu-*.log`) are train too, with
their own row. Run:

    python benchmarks/diagnose_recall.py            # markdown tables
    python benchmarks/diagnose_recall.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from inferplane.doctor.diagnose import diagnose_text
from inferplane.doctor.generic import classify
from inferplane.doctor.logtext import read_lines

DATA = Path(__file__).parents[1] / "tests" / "data" / "diagnose"
OUTCOMES = ("fully explained", "recognized", "generic-only", "similar-only", "wrong",
            "missed")
Row = dict[str, Any]


def _held_out_order(name: str) -> int:
    return int(name.rpartition("-")[2]) if "-" in name else 1


def groups(rows: list[Row]) -> dict[str, Callable[[Row], bool]]:
    """Rows of train shown on their own (where a log came from, not a separate split): one
    per earlier held-out set the fixtures name, so a set moved to train needs no edit here."""
    names = sorted({r["held_out_in"] for r in rows if r["held_out_in"]}, key=_held_out_order)
    out = {f"train: was {name}": _was(name) for name in names}
    out["train: real-cpu-* (real vLLM)"] = lambda r: str(r["file"]).startswith("real-cpu-")
    return out


def _was(name: str) -> Callable[[Row], bool]:
    return lambda r: bool(r["held_out_in"] == name)


def outcome(text: str, expected: str, source: str) -> str:
    result = diagnose_text(text, source=source)
    by_id = {f.signature.id: f for f in result.findings}
    if expected in by_id:
        return "recognized" if by_id[expected].missing else "fully explained"
    if result.findings:
        return "wrong"
    generic = result.generic
    if generic is not None and generic.rule.class_of == expected:
        return "generic-only"
    if generic is not None and generic.rule.class_of is not None:
        return "wrong"
    if result.similar is not None:
        return "similar-only" if result.similar.cls == expected else "wrong"
    return "missed"


def evaluate(data: Path = DATA) -> dict[str, Any]:
    fixtures = yaml.safe_load((data / "SOURCES.yaml").read_text())["fixtures"]
    rows: list[dict[str, Any]] = []
    for fx in fixtures:
        if fx.get("kind") != "real" or not fx.get("signature"):
            continue
        text = (data / fx["file"]).read_text(encoding="utf-8", errors="replace")
        alone = classify(read_lines(text))
        rows.append({"file": fx["file"], "class": fx["signature"],
                     "split": fx.get("split", "train"),
                     "held_out_in": fx.get("held_out_in"),
                     "outcome": outcome(text, fx["signature"], fx["file"]),
                     "generic_alone": alone.rule.class_of if alone else None})
    splits = ["train", *sorted({r["split"] for r in rows} - {"train"})]  # the sets not yet measured
    summary = {s: _summary([r for r in rows if r["split"] == s]) for s in splits}
    summary |= {g: _summary([r for r in rows if r["split"] == "train" and keep(r)])
                for g, keep in groups(rows).items()}
    return {"fixtures": rows, "summary": summary}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(r["outcome"] for r in rows)
    n = len(rows)
    right = (counts["fully explained"] + counts["recognized"] + counts["generic-only"]
             + counts["similar-only"])
    alone = sum(r["generic_alone"] == r["class"] for r in rows)
    return {"fixtures": n, **{o: counts[o] for o in OUTCOMES},
            "generic_alone_pct": round(100 * alone / n, 1) if n else 0.0,
            "right_class_pct": round(100 * right / n, 1) if n else 0.0,
            "fully_explained_pct": round(100 * counts["fully explained"] / n, 1) if n else 0.0}


def markdown(report: dict[str, Any]) -> str:
    out = ["| split | logs | right class | fully explained | recognized | generic-only "
           "| similar-only | wrong | missed | generic alone |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for split, s in report["summary"].items():
        out.append(f"| {split} | {s['fixtures']} | {s['right_class_pct']}% | "
                   f"{s['fully explained']} ({s['fully_explained_pct']}%) | {s['recognized']} | "
                   f"{s['generic-only']} | {s['similar-only']} | {s['wrong']} | {s['missed']} | "
                   f"{s['generic_alone_pct']}% |")
    out += ["", "| class | logs (held out) | fully explained | recognized | generic-only "
            "| similar-only | wrong | missed |", "|---|---|---|---|---|---|---|---|"]
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in report["fixtures"]:
        per[r["class"]].append(r)
    for cls in sorted(per):
        rows = per[cls]
        c = Counter(r["outcome"] for r in rows)
        held = sum(r["split"] != "train" for r in rows)
        held_bad = [r["file"] for r in rows if r["split"] != "train"
                    and r["outcome"] in ("wrong", "missed")]
        note = f" (held-out miss: {', '.join(held_bad)})" if held_bad else ""
        out.append(f"| {cls}{note} | {len(rows)} ({held}) | {c['fully explained']} | "
                   f"{c['recognized']} | {c['generic-only']} | {c['similar-only']} | "
                   f"{c['wrong']} | {c['missed']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    report = evaluate()
    print(json.dumps(report, indent=1) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
