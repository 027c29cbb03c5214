"""Leave-one-set-out study of the similarity layer's gates over the held-out sets.

For each held-out set k of heldout-7 .. heldout-18 (`held_out_in` or `split` in
tests/data/diagnose/SOURCES.yaml) the model is built from every other real log and from the
near-misses outside fold k (near-misses are dealt to the 12 folds by source, so each is
scored once by a model that never saw it), and each gate family's settings are chosen by the
builder's own 5-fold rule on that training part only (scripts/build_similar_model.py:
`cross_validate` + `choose`). Then set k and the fold's near-misses are read as if no
signature and no generic rule existed. Per variant: right and wrong class (mean per set of
the share of that set's logs, and the worst set's wrong), near-misses fired (of all of them,
summed over the folds), healthy vLLM starts fired on by any fold's model, and the nearest
centroid with no gate (top-1). Feature variants: `words` (the shipped unigrams and bigrams)
and `words+chars` (plus character 4-grams inside tokens).

    python benchmarks/similar_loso.py            # markdown table
    python benchmarks/similar_loso.py --json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import build_similar_model as build

from inferplane.doctor import similar
from inferplane.doctor.logtext import LogLine, read_lines

DATA = build.DATA
ROOT = Path(__file__).parents[1]
SETS = tuple(f"heldout-{n}" for n in range(7, 19))
Featurizer = Callable[[list[LogLine]], Counter[str]]


def char_features(lines: list[LogLine]) -> Counter[str]:
    counts = similar.features(lines)
    for tok in similar.tokens(" ".join(ln.text for ln in lines)):
        if tok.startswith("<") or len(tok) < 5:
            continue
        padded = f"^{tok}$"
        counts.update(f"c:{padded[i : i + 4]}" for i in range(len(padded) - 3))
    return counts


FEATURES: dict[str, Featurizer] = {"words": similar.features, "words+chars": char_features}
# (features, gate family) pairs measured; the character features only with the widest family
VARIANTS: list[tuple[str, str]] = [("words", f) for f in build.FAMILIES] + [
    ("words+chars", build.SHIPPED)
]


NEVER = dataclasses.replace(build.OPEN, score=2.0)  # a gate nothing clears


def _set_of_near_miss(source: str) -> str:
    return SETS[int(hashlib.sha1(source.encode()).hexdigest(), 16) % len(SETS)]


def load(data: Path = DATA) -> list[tuple[str | None, build.Doc]]:
    """Every real log and near-miss with the fold it is scored in (None: always trained on)."""
    fixtures = yaml.safe_load((data / "SOURCES.yaml").read_text(encoding="utf-8"))["fixtures"]
    out: list[tuple[str | None, build.Doc]] = []
    for fx in fixtures:
        source = str(fx["source"]).split()[0]
        if fx.get("kind") == "real" and fx.get("signature"):
            split = str(fx.get("split", "train"))
            if split != "train":
                continue  # a set not yet measured is never read here
            cls, held = str(fx["signature"]), fx.get("held_out_in")
            held = str(held) if held in SETS else None
        elif fx.get("kind") == "near-miss":
            cls, held = similar.NEAR_MISS, _set_of_near_miss(str(fx["source"]))
        else:
            continue
        text = (data / fx["file"]).read_text(encoding="utf-8", errors="replace")
        out.append((held, build.Doc(str(fx["file"]), source, cls, read_lines(text), Counter())))
    return out


def healthy_logs() -> list[list[LogLine]]:
    logs = []
    for folder in ("vllm_logs", "vllm_logs_lora"):
        for path in sorted((ROOT / "tests" / "data" / folder).glob("*.yaml")):
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and doc.get("log"):
                logs.append(read_lines(str(doc["log"])))
    return logs


def evaluate(rows: list[tuple[str | None, build.Doc]]) -> dict[str, Any]:
    healthy = healthy_logs()
    out: dict[str, Any] = {
        f"{feat} | {fam}": {
            "per_set": {},
            "near_miss_fired": 0,
            "healthy_fired": set(),
            "gates": [],
        }
        for feat, fam in VARIANTS
    }
    near_total = sum(d.cls == similar.NEAR_MISS for _, d in rows)
    for feat, fn in FEATURES.items():
        docs = [(h, build.Doc(d.file, d.source, d.cls, d.lines, fn(d.lines))) for h, d in rows]
        fams = [fam for f, fam in VARIANTS if f == feat]
        for k in SETS:
            train = [d for h, d in docs if h != k]
            test = [d for h, d in docs if h == k]
            inner = build.cross_validate(train)
            model = build.model_of(train)
            outer = build.read_all(model, test)
            fresh = [
                (i, ev.reading())
                for i, lines in enumerate(healthy)
                if (ev := model.evidence(lines, fn(lines))) is not None
            ]
            logs = sum(t != similar.NEAR_MISS for t, _ in outer)
            top1 = sum(r is not None and r.cls == t for t, r in outer if t != similar.NEAR_MISS)
            for fam in fams:
                chosen = build.choose(inner, build.FAMILIES[fam])
                gate = chosen[0] if chosen else NEVER  # no setting met the bounds: silent
                t = build.tally(outer, gate)
                cell = out[f"{feat} | {fam}"]
                cell["per_set"][k] = {
                    "logs": logs,
                    "right_pct": round(100 * t.right / logs, 1),
                    "wrong_pct": round(100 * t.wrong / logs, 1),
                    "top1_pct": round(100 * top1 / logs, 1),
                    "near_miss_fired": t.near_miss_fired,
                }
                cell["near_miss_fired"] += t.near_miss_fired
                cell["healthy_fired"] |= {i for i, r in fresh if similar.decide(r, gate)}
                cell["gates"].append(gate)
            print(f"{feat} {k} done", file=sys.stderr, flush=True)
    for cell in out.values():
        per = cell["per_set"].values()
        cell["mean"] = {
            key: round(sum(s[key] for s in per) / len(per), 1)
            for key in ("right_pct", "wrong_pct", "top1_pct")
        }
        cell["worst_wrong_pct"] = max(s["wrong_pct"] for s in per)
        cell["near_misses"] = near_total
        cell["healthy_fired"] = len(cell["healthy_fired"])
        cell["healthy_logs"] = len(healthy)
        common = Counter(cell["gates"]).most_common(1)[0]
        cell["usual_gate"] = {**vars(common[0]), "folds": common[1]}
        del cell["gates"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = evaluate(load())
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        "| features | gate family | right (mean per set) | wrong (mean) | wrong (worst set) "
        "| near-misses fired | healthy starts fired | top-1 | usual gate (folds of 12) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, c in report.items():
        feat, fam = name.split(" | ", 1)
        g = c["usual_gate"]
        usual = {k: v for k, v in g.items() if k != "folds"}
        never = usual == vars(NEVER)
        gate = "no setting qualifies" if never else ", ".join(f"{k} {v}" for k, v in usual.items())
        print(
            f"| {feat} | {fam} | {c['mean']['right_pct']}% | {c['mean']['wrong_pct']}% "
            f"| {c['worst_wrong_pct']}% | {c['near_miss_fired']} / {c['near_misses']} "
            f"| {c['healthy_fired']} / {c['healthy_logs']} | {c['mean']['top1_pct']}% "
            f"| {gate} ({g['folds']}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
