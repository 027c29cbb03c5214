"""Leave-one-set-out cross-validation of the similarity layer over the held-out sets.

For each held-out set k of heldout-7 .. heldout-18 (`held_out_in` or `split` in
tests/data/diagnose/SOURCES.yaml), the model is built from every other real log and the
near-misses, its score and margin chosen by the builder's own 5-fold rule on that training
part only, and then run on set k alone: as if no signature and no generic rule existed, so
it measures how far the learned layer carries to wordings it has never seen. Per set:
the share of logs it names the right class for (right), the wrong class for (wrong), and the
nearest centroid with no gate (top-1). Variants:

- `words`: the shipped features (word unigrams and bigrams, normalised numbers/paths);
- `words, precision 0.90`: the shipped features, thresholds chosen for >= 90% right
  firings on train instead of >= 95% (fires more, abstains less);
- `words+chars`: the same plus character 4-grams inside each token, so a misspelling, a
  word cut by wrapping or another inflection still shares most of its features.

    python benchmarks/similar_loso.py            # markdown table
    python benchmarks/similar_loso.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import build_similar_model as build

from inferplane.doctor import similar
from inferplane.doctor.logtext import LogLine, read_lines

DATA = build.DATA
SETS = tuple(f"heldout-{n}" for n in range(7, 19))
Featurizer = Callable[[list[LogLine]], Counter[str]]


def char_features(lines: list[LogLine]) -> Counter[str]:
    counts = _WORDS(lines)
    for tok in similar.tokens(" ".join(ln.text for ln in lines)):
        if tok.startswith("<") or len(tok) < 5:
            continue
        padded = f"^{tok}$"
        counts.update(f"c:{padded[i : i + 4]}" for i in range(len(padded) - 3))
    return counts


_WORDS: Featurizer = similar.features
# name: (features, the precision the builder's threshold rule demands on train)
VARIANTS: dict[str, tuple[Featurizer, float]] = {
    "words": (_WORDS, build.MIN_PRECISION),
    "words, precision 0.90": (_WORDS, 0.90),
    "words+chars": (char_features, build.MIN_PRECISION),
}


@contextmanager
def variant(fn: Featurizer, precision: float) -> Iterator[None]:
    """The layer's `resemble` reads `similar.features` and the builder's threshold rule
    `build.MIN_PRECISION`; swap both for one variant's run."""
    saved = similar.features, build.MIN_PRECISION
    setattr(similar, "features", fn)  # noqa: B010 - a module global, not an attribute typo
    build.MIN_PRECISION = precision
    try:
        yield
    finally:
        setattr(similar, "features", saved[0])  # noqa: B010
        build.MIN_PRECISION = saved[1]


def load(data: Path = DATA) -> list[tuple[str | None, build.Doc]]:
    """Every real log and near-miss, each with the held-out set it came from (or None)."""
    fixtures = yaml.safe_load((data / "SOURCES.yaml").read_text(encoding="utf-8"))["fixtures"]
    out: list[tuple[str | None, build.Doc]] = []
    for fx in fixtures:
        if fx.get("kind") == "real" and fx.get("signature"):
            cls = str(fx["signature"])
            split = str(fx.get("split", "train"))
            held = fx.get("held_out_in") or (split if split != "train" else None)
        elif fx.get("kind") == "near-miss":
            cls, held = similar.NEAR_MISS, None
        else:
            continue
        text = (data / fx["file"]).read_text(encoding="utf-8", errors="replace")
        lines = read_lines(text)
        doc = build.Doc(str(fx["file"]), str(fx["source"]).split()[0], cls, lines, Counter())
        out.append((str(held) if held else None, doc))
    return out


def _with_counts(doc: build.Doc, fn: Featurizer) -> build.Doc:
    return build.Doc(doc.file, doc.source, doc.cls, doc.lines, fn(doc.lines))


def evaluate(
    fn: Featurizer, precision: float, rows: list[tuple[str | None, build.Doc]]
) -> dict[str, Any]:
    per_set: dict[str, dict[str, Any]] = {}
    with variant(fn, precision):
        docs = [(held, _with_counts(d, fn)) for held, d in rows]
        for k in SETS:
            train = [d for held, d in docs if held != k]
            test = [d for held, d in docs if held == k]
            if not test:
                continue
            chosen = build.choose(build.cross_validate(train))
            model = build.model_of(train, chosen["score"], chosen["margin"])
            right = wrong = top1 = 0
            for d in test:
                ranked = [
                    c
                    for _, c in model.scores(similar.weigh(d.counts, model.index, model.idf))
                    if c != similar.NEAR_MISS
                ]
                top1 += bool(ranked) and ranked[0] == d.cls
                found = similar.resemble(d.lines, model)
                if found is not None:
                    right += found.cls == d.cls
                    wrong += found.cls != d.cls
            n = len(test)
            per_set[k] = {
                "logs": n,
                "right_pct": round(100 * right / n, 1),
                "wrong_pct": round(100 * wrong / n, 1),
                "top1_pct": round(100 * top1 / n, 1),
                "score": chosen["score"],
                "margin": chosen["margin"],
            }
    mean = {
        key: round(sum(s[key] for s in per_set.values()) / len(per_set), 1)
        for key in ("right_pct", "wrong_pct", "top1_pct")
    }
    return {"per_set": per_set, "mean": mean}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = load()
    report = {name: evaluate(fn, p, rows) for name, (fn, p) in VARIANTS.items()}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print("| set | logs | " + " | ".join(f"{v} right / wrong / top-1" for v in report) + " |")
    print("|---|---|" + "---|" * len(report))
    for k in SETS:
        cells = [report[v]["per_set"].get(k) for v in report]
        if cells[0] is None:
            continue
        print(
            f"| {k} | {cells[0]['logs']} | "
            + " | ".join(
                f"{c['right_pct']}% / {c['wrong_pct']}% / {c['top1_pct']}%" for c in cells if c
            )
            + " |"
        )
    print(
        "| mean per set | | "
        + " | ".join(
            f"{r['mean']['right_pct']}% / {r['mean']['wrong_pct']}% / {r['mean']['top1_pct']}%"
            for r in report.values()
        )
        + " |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
