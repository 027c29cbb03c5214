"""Which of the similarity layer's gates keep it from unseen held-out logs (leave one set out).

The same folds as `similar_loso.py` (model built from every log outside held-out set k, run
on set k), with the shipped word features and no thresholds; then each gate is applied to
those predictions: the failure-word cue, the nearest train report not being a near-miss, a
minimum centroid score, and (instead of a margin) agreement of the centroid's class with the
majority of the 3 nearest train reports. Near-misses are always in training here, so this
does not measure firing on look-alikes: a gate that this run favours still needs the
builder's near-miss check before it can ship.

    python benchmarks/similar_gates.py
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import build_similar_model as build
import similar_loso as loso

from inferplane.doctor import similar


@dataclass(frozen=True)
class Pred:
    held: str
    cls: str
    failure_cue: bool
    top: str | None
    score: float
    neighbours: tuple[str, ...]


def predictions() -> list[Pred]:
    docs = [(held, loso._with_counts(d, loso._WORDS)) for held, d in loso.load()]
    out = []
    for k in loso.SETS:
        model = build.model_of([d for h, d in docs if h != k], 0.0, -1.0)
        for d in (d for h, d in docs if h == k):
            vec = similar.weigh(d.counts, model.index, model.idf)
            top, score, near = None, 0.0, ()
            if vec:
                score, top = model.scores(vec)[0]
                ranked = sorted(
                    ((similar.cosine(vec, n.vector), n.cls) for n in model.docs),
                    key=lambda p: -p[0],
                )
                near = tuple(c for _, c in ranked[:3])
            out.append(Pred(k, d.cls, similar.reads_like_failure(d.lines), top, score, near))
    return out


def fires(p: Pred, cue: bool, score: float, agree: bool) -> str | None:
    if p.top is None or p.top == similar.NEAR_MISS or p.score < score:
        return None
    if (cue and not p.failure_cue) or (p.neighbours and p.neighbours[0] == similar.NEAR_MISS):
        return None
    if agree and Counter(p.neighbours).most_common(1)[0][0] != p.top:
        return None
    return p.top


def main() -> int:
    preds = predictions()
    print(
        "| failure-word gate | neighbour agreement | min score | right (mean per set) "
        "| wrong (mean) | wrong (worst set) |"
    )
    print("|---|---|---|---|---|---|")
    for cue in (True, False):
        for agree in (False, True):
            for score in (0.1, 0.15, 0.2):
                rates = []
                for k in loso.SETS:
                    got = [(fires(p, cue, score, agree), p.cls) for p in preds if p.held == k]
                    right = sum(c == cls for c, cls in got) / len(got)
                    wrong = sum(c is not None and c != cls for c, cls in got) / len(got)
                    rates.append((right, wrong))
                mean_r = 100 * sum(r for r, _ in rates) / len(rates)
                mean_w = 100 * sum(w for _, w in rates) / len(rates)
                worst = 100 * max(w for _, w in rates)
                print(
                    f"| {cue} | {agree} | {score} | {mean_r:.1f}% | {mean_w:.1f}% | {worst:.1f}% |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
