"""Build `inferplane/doctor/similar.json`, the similarity layer's model, from the train
fixtures only (deterministic: the same fixtures give the same file byte for byte).

Train is every `kind: real` fixture of tests/data/diagnose/SOURCES.yaml whose split is
`train` (a `split: heldout-N` set is never read), plus the near-miss fixtures as the class
`near-miss`. The score and margin thresholds are chosen by 5-fold cross-validation over
train, folds grouped by source URL so that excerpts of one report never sit on both sides:
the pair with the most train logs classed right, among those whose firings are >= 95% right
and that fire on <= 15% of the held-out near-misses. The cross-validated figures are
stored in the model and printed.

    python scripts/build_similar_model.py            # write the model
    python scripts/build_similar_model.py --check    # exit 1 when the stored file differs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferplane.doctor.logtext import LogLine, read_lines
from inferplane.doctor.similar import (
    MODEL_PATH,
    NEAR_MISS,
    SCHEMA,
    Neighbour,
    SimilarModel,
    Vector,
    features,
    resemble,
    weigh,
)

DATA = Path(__file__).parents[1] / "tests" / "data" / "diagnose"
FOLDS = 5
MIN_DF = 2  # words seen in one fixture only are that fixture's, not its class's
SCORES = tuple(round(0.1 + 0.05 * i, 2) for i in range(9))  # 0.10 .. 0.50
MARGINS = (0.0, 0.02, 0.05, 0.1)
MIN_PRECISION = 0.95
MAX_NEAR_MISS_RATE = 0.15
DIGITS = 4
DOC_TERMS = 32  # a train log's heaviest terms: enough to name its nearest reports
CLASS_TERMS = 400  # a class centroid's heaviest terms


@dataclass(frozen=True)
class Doc:
    file: str
    source: str
    cls: str
    lines: list[LogLine]
    counts: Counter[str]


def train_docs(data: Path = DATA) -> list[Doc]:
    fixtures = yaml.safe_load((data / "SOURCES.yaml").read_text(encoding="utf-8"))["fixtures"]
    docs = []
    for fx in fixtures:
        if fx.get("kind") == "real" and fx.get("signature"):
            if fx.get("split", "train") != "train":
                continue  # held out: never read while the model is built
            cls = str(fx["signature"])
        elif fx.get("kind") == "near-miss":
            cls = NEAR_MISS
        else:
            continue
        text = (data / fx["file"]).read_text(encoding="utf-8", errors="replace")
        lines = read_lines(text)
        docs.append(Doc(str(fx["file"]), str(fx["source"]).split()[0], cls, lines, features(lines)))
    return docs


def _normalise(vec: dict[int, float], keep: int) -> Vector:
    """The `keep` heaviest terms, L2-normalised again (ties broken by term id)."""
    top = sorted(vec.items(), key=lambda kv: (-kv[1], kv[0]))[:keep]
    vec = dict(top)
    norm = math.sqrt(sum(x * x for x in vec.values())) or 1.0
    return {k: x / norm for k, x in vec.items()}


def fit(docs: list[Doc]) -> tuple[list[str], list[float], list[Vector], dict[str, Vector]]:
    df: Counter[str] = Counter()
    for d in docs:
        df.update(set(d.counts))
    vocab = sorted(t for t, c in df.items() if c >= MIN_DF)
    n = len(docs)
    idf = [math.log((1 + n) / (1 + df[t])) + 1.0 for t in vocab]
    index = {t: i for i, t in enumerate(vocab)}
    vectors = [_normalise(weigh(d.counts, index, idf), DOC_TERMS) for d in docs]
    sums: dict[str, dict[int, float]] = defaultdict(dict)
    for d, v in zip(docs, vectors, strict=True):
        acc = sums[d.cls]
        for k, x in v.items():
            acc[k] = acc.get(k, 0.0) + x
    centroids = {c: _normalise(v, CLASS_TERMS) for c, v in sorted(sums.items())}
    return vocab, idf, vectors, centroids


def model_of(docs: list[Doc], score: float, margin: float) -> SimilarModel:
    vocab, idf, vectors, centroids = fit(docs)
    return SimilarModel(
        index={t: i for i, t in enumerate(vocab)},
        idf=idf,
        centroids=centroids,
        docs=tuple(
            Neighbour(d.file, d.source, d.cls, v) for d, v in zip(docs, vectors, strict=True)
        ),
        min_score=score,
        min_margin=margin,
    )


def _fold(doc: Doc) -> int:
    return int(hashlib.sha1(doc.source.encode()).hexdigest(), 16) % FOLDS


def cross_validate(docs: list[Doc]) -> dict[str, Any]:
    """Per threshold pair: how many held-out train logs it classes right / wrong, and how
    many held-out near-misses it fires on. Each fold's model sees the other folds only."""
    # predictions without thresholds, then every pair applied to them
    preds: list[tuple[Doc, str | None, float, float]] = []
    top_class = 0  # the nearest centroid alone, no gate: the classifier's own accuracy
    for k in range(FOLDS):
        model = model_of([d for d in docs if _fold(d) != k], 0.0, -1.0)
        for d in (d for d in docs if _fold(d) == k):
            ranked = [
                c
                for _, c in model.scores(weigh(d.counts, model.index, model.idf))
                if c != NEAR_MISS
            ]
            top_class += d.cls != NEAR_MISS and bool(ranked) and ranked[0] == d.cls
            found = resemble(d.lines, model)
            preds.append(
                (
                    d,
                    found.cls if found else None,
                    found.score if found else 0.0,
                    found.margin if found else 0.0,
                )
            )
    positives = sum(d.cls != NEAR_MISS for d, *_ in preds)
    near = len(preds) - positives
    grid = []
    for score in SCORES:
        for margin in MARGINS:
            fired = [(d, c) for d, c, s, m in preds if c is not None and s >= score and m >= margin]
            right = sum(d.cls == c for d, c in fired if d.cls != NEAR_MISS)
            wrong = sum(d.cls != c for d, c in fired if d.cls != NEAR_MISS)
            near_fired = sum(d.cls == NEAR_MISS for d, _ in fired)
            grid.append(
                {
                    "score": score,
                    "margin": margin,
                    "right": right,
                    "wrong": wrong,
                    "near_miss_fired": near_fired,
                }
            )
    top1 = sum(c == d.cls for d, c, *_ in preds if d.cls != NEAR_MISS)
    return {
        "folds": FOLDS,
        "train_logs": positives,
        "near_misses": near,
        "grid": grid,
        "fired_unthresholded_right": top1,
        "top_class_right": top_class,
    }


def choose(cv: dict[str, Any]) -> dict[str, Any]:
    ok = [
        g
        for g in cv["grid"]
        if g["right"] + g["wrong"]
        and g["right"] / (g["right"] + g["wrong"]) >= MIN_PRECISION
        and g["near_miss_fired"] <= MAX_NEAR_MISS_RATE * cv["near_misses"]
    ]
    if not ok:
        raise SystemExit("no threshold pair meets the precision and near-miss bounds")
    return max(ok, key=lambda g: (g["right"], g["score"], g["margin"]))


def _sparse(vec: Vector) -> tuple[list[int], list[float]]:
    keys = sorted(vec)
    return keys, [round(vec[k], DIGITS) for k in keys]


def build(data: Path = DATA) -> tuple[str, dict[str, Any]]:
    docs = train_docs(data)
    cv = cross_validate(docs)
    best = choose(cv)
    vocab, idf, vectors, centroids = fit(docs)
    n = cv["train_logs"]
    summary = {
        "folds": FOLDS,
        "grouped_by": "source URL",
        "train_logs": n,
        "near_misses": cv["near_misses"],
        "top_class_right_pct": round(100 * cv["top_class_right"] / n, 1),
        "gated_right_pct": round(100 * cv["fired_unthresholded_right"] / n, 1),
        "fired_pct": round(100 * (best["right"] + best["wrong"]) / n, 1),
        "fired_right_pct": round(100 * best["right"] / max(1, best["right"] + best["wrong"]), 1),
        "right_of_all_pct": round(100 * best["right"] / n, 1),
        "near_miss_fired": best["near_miss_fired"],
    }
    model = {
        "schema": SCHEMA,
        "built_by": "scripts/build_similar_model.py (train fixtures only)",
        "thresholds": {"score": best["score"], "margin": best["margin"]},
        "cross_validation": summary,
        "vocab": vocab,
        "idf": [round(x, DIGITS) for x in idf],
        "centroids": {c: _sparse(v) for c, v in centroids.items()},
        "docs": [
            {"file": d.file, "source": d.source, "class": d.cls, "vector": _sparse(v)}
            for d, v in zip(docs, vectors, strict=True)
        ],
    }
    text = json.dumps(model, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return text + "\n", summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored model")
    args = parser.parse_args(argv)
    text, summary = build()
    print(json.dumps(summary, indent=1))
    if args.check:
        same = MODEL_PATH.read_text(encoding="utf-8") == text
        print("stored model is current" if same else "stored model differs: rebuild it")
        return 0 if same else 1
    MODEL_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
