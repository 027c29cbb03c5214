"""The similarity layer of `diagnose`: for a log that no signature and no generic rule
classes, the failure class whose known reports it reads most like.

Prose reports, issue titles and pull-request text often lack the engine's error line that a
signature or a generic rule keys on, yet use the words of their class ("liveness probe
restarts it while loading", "stuck after NCCL init"). This layer compares the log's words
(TF-IDF over lowercased word unigrams and bigrams; numbers, paths, URLs and hex normalised;
CJK characters as tokens) with the per-class centroids of the train fixtures, and fires only
when its gate (`Gate`, chosen by cross-validation over train with near-misses held out) clears:
the best class's score and margin, distinct train reports of that class among the nearest,
no near-miss among the nearest, and a learned look-alike score (how much more the log's
terms occur in near-misses than in real failure logs) low enough; the failure-word cue is
one more gate that cross-validation may choose. The model is data (`similar.json`), built by
`scripts/build_similar_model.py` from the train fixtures only; a finding from here is marked
as a similarity match, names the nearest train reports, and gives the class's cause and fix
in the words the signature uses when it has no numbers.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from inferplane.doctor.logtext import LogLine

MODEL_PATH = Path(__file__).with_name("similar.json")
SCHEMA = "inferplane.diagnose-similar/v2"
NEAR_MISS = "near-miss"  # the class of the look-alikes that must not match
MAX_NEIGHBOURS = 3

_URL = re.compile(r"https?://\S+")
_PATH = re.compile(r"(?:~|\.{1,2})?(?:/[\w.@+-]+){2,}/?")
_HEX = re.compile(r"\b0x[0-9a-f]+\b|\b[0-9a-f]{12,}\b")
_NUM = re.compile(r"\b\d+(?:\.\d+)?\b")
_TOKEN = re.compile(
    r"[a-z_][a-z0-9_]*|<[a-z]+>|"
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]"
)
# Words a failure report uses: a gate cross-validation may choose (healthy logs have none;
# near-misses often do, so on its own it does not keep look-alikes out).
_FAILURE_CUE = re.compile(
    r"(?i)\b(?:errors?|fail\w*|crash\w*|hang\w*|hung|stuck|freez\w*|oom\w*|killed|kill|"
    r"cannot|can't|can ?not|unable|refus\w*|timed? ?out|timeout|exceed\w*|insufficient|"
    r"not (?:supported|found|enough|work\w*)|doesn't work|does not work|abort\w*|exception|"
    r"traceback|invalid|denied|unauthori[sz]ed|forbidden|pending|restart\w*|"
    r"crashloopbackoff|out of memory|no space|too (?:many|large|small|old)|mismatch|"
    r"segfault|sigbus|deadlock\w*|broken|wrong|bug|issue)\b|"
    r"报错|错误|失败|卡住|卡死|无法|不能|不支持|超时|エラー"
)


def tokens(text: str) -> list[str]:
    t = _URL.sub(" <url> ", text.lower())
    t = _PATH.sub(" <path> ", t)
    t = _HEX.sub(" <hex> ", t)
    t = _NUM.sub(" <num> ", t)
    return _TOKEN.findall(t)


def features(lines: list[LogLine]) -> Counter[str]:
    """Unigram and bigram counts of the cleaned lines (prefixes off, as matching sees them)."""
    toks = tokens(" ".join(ln.text for ln in lines))
    counts = Counter(toks)
    counts.update(f"{a} {b}" for a, b in itertools.pairwise(toks))
    return counts


def reads_like_failure(lines: list[LogLine]) -> bool:
    return any(_FAILURE_CUE.search(ln.text) for ln in lines)


Vector = dict[int, float]


def weigh(counts: Counter[str], index: dict[str, int], idf: list[float]) -> Vector:
    """The L2-normalised sublinear TF-IDF vector over the model's vocabulary."""
    vec = {index[t]: (1.0 + math.log(c)) * idf[index[t]] for t, c in counts.items() if t in index}
    norm = math.sqrt(sum(x * x for x in vec.values())) or 1.0
    return {k: x / norm for k, x in vec.items()}


def cosine(a: Vector, b: Vector) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(x * b.get(k, 0.0) for k, x in a.items())


@dataclass(frozen=True)
class Neighbour:
    file: str
    source: str
    cls: str
    vector: Vector


NEAREST = 5  # the nearest train reports a gate looks at


@dataclass(frozen=True)
class Gate:
    """When the nearest class is trusted; every field is chosen by cross-validation over train
    (`scripts/build_similar_model.py`), none is a failure word list except `cue`."""

    cue: bool  # the text must carry a failure word
    score: float  # the best centroid's cosine at least this
    margin: float  # and this far above the runner-up class (near-miss included)
    support: int  # distinct sources of that class among the NEAREST nearest reports
    veto: int  # no near-miss among the `veto` nearest reports
    over_near: float  # the best centroid at least this far above the near-miss centroid
    lookalike: float  # the learned look-alike score at most this (see `Reading.lookalike`)


@dataclass(frozen=True)
class Reading:
    """The numbers the gates compare for one log (computed once, so a grid of gates is cheap)."""

    cls: str  # the nearest class centroid
    cue: bool
    score: float
    margin: float
    support: int
    first_near_miss: int  # 1-based rank of the nearest near-miss report, NEAREST + 1 if none
    over_near: float
    # how much more the log's terms occur in near-misses than in real failure logs (TF-IDF
    # weighted naive-Bayes log-odds learned from train): a healthy look-alike of a failure
    # scores high whatever class it mimics, with no hand-written word list
    lookalike: float


@dataclass(frozen=True)
class Evidence:
    """What the gates read for one log: failure word, centroid ranking, nearest reports."""

    cue: bool
    ranked: tuple[tuple[float, str], ...]
    nearest: tuple[tuple[float, Neighbour], ...]
    lookalike: float

    def reading(self) -> Reading:
        (score, cls), top = self.ranked[0], self.nearest[:NEAREST]
        runner_up = self.ranked[1][0] if len(self.ranked) > 1 else 0.0
        near_miss = next((s for s, c in self.ranked if c == NEAR_MISS), 0.0)
        first = next((i for i, (_, d) in enumerate(top, 1) if d.cls == NEAR_MISS), NEAREST + 1)
        return Reading(
            cls=cls,
            cue=self.cue,
            score=score,
            margin=score - runner_up,
            support=len({d.source for _, d in top if d.cls == cls}),
            first_near_miss=first,
            over_near=score - near_miss,
            lookalike=self.lookalike,
        )


def decide(r: Reading, gate: Gate) -> str | None:
    """The class when every gate clears, else None."""
    if r.cls == NEAR_MISS or (gate.cue and not r.cue):
        return None
    if r.score < gate.score or r.margin < gate.margin or r.over_near < gate.over_near:
        return None
    if r.lookalike > gate.lookalike:
        return None
    if r.first_near_miss <= gate.veto or r.support < gate.support:
        return None
    return r.cls


@dataclass(frozen=True)
class SimilarModel:
    index: dict[str, int]
    idf: list[float]
    centroids: dict[str, Vector]
    docs: tuple[Neighbour, ...]
    lookalike: list[float]  # per vocabulary term: log-odds of near-miss over real failure log
    gate: Gate

    def scores(self, vec: Vector) -> list[tuple[float, str]]:
        return sorted(((cosine(vec, c), cls) for cls, c in self.centroids.items()), reverse=True)

    def evidence(self, lines: list[LogLine], counts: Counter[str] | None = None) -> Evidence | None:
        vec = weigh(features(lines) if counts is None else counts, self.index, self.idf)
        if not vec:
            return None
        near = sorted(((cosine(vec, d.vector), d) for d in self.docs), key=lambda p: -p[0])
        look = sum(x * self.lookalike[k] for k, x in vec.items())
        return Evidence(reads_like_failure(lines), tuple(self.scores(vec)), tuple(near), look)


def _sparse(raw: list[list[float]]) -> Vector:
    ids, weights = raw
    return {int(i): float(w) for i, w in zip(ids, weights, strict=True)}


def parse_gate(raw: dict[str, Any]) -> Gate:
    return Gate(
        cue=bool(raw["cue"]),
        score=float(raw["score"]),
        margin=float(raw["margin"]),
        support=int(raw["support"]),
        veto=int(raw["veto"]),
        over_near=float(raw["over_near"]),
        lookalike=float(raw["lookalike"]),
    )


def parse_model(data: dict[str, Any]) -> SimilarModel:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} model")
    vocab = [str(t) for t in data["vocab"]]
    return SimilarModel(
        index={t: i for i, t in enumerate(vocab)},
        idf=[float(x) for x in data["idf"]],
        centroids={str(c): _sparse(v) for c, v in data["centroids"].items()},
        docs=tuple(
            Neighbour(str(d["file"]), str(d["source"]), str(d["class"]), _sparse(d["vector"]))
            for d in data["docs"]
        ),
        lookalike=[float(x) for x in data["lookalike"]],
        gate=parse_gate(data["gate"]),
    )


@lru_cache(maxsize=2)
def load_model(path: Path = MODEL_PATH) -> SimilarModel:
    return parse_model(json.loads(path.read_text(encoding="utf-8")))


@dataclass
class SimilarFinding:
    """A class by resemblance to known reports, not by any line of the log."""

    cls: str
    title: str
    score: float
    margin: float
    neighbours: list[tuple[str, str, float]]  # (fixture, source, cosine) of that class
    cause: str
    next_step: str
    missing: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": f"similar:{self.cls}",
            "class_of": self.cls,
            "similarity": True,
            "score": round(self.score, 3),
            "margin": round(self.margin, 3),
            "nearest": [
                {"fixture": f, "source": s, "cosine": round(c, 3)} for f, s, c in self.neighbours
            ],
            "cause": self.cause,
            "next_step": self.next_step,
            "missing": list(self.missing),
        }


@dataclass(frozen=True)
class Resemblance:
    cls: str
    score: float
    margin: float
    neighbours: list[tuple[str, str, float]]


def resemble(lines: list[LogLine], model: SimilarModel | None = None) -> Resemblance | None:
    """The class the log reads like when every gate clears, else None."""
    m = model if model is not None else load_model()
    ev = m.evidence(lines)
    if ev is None:
        return None
    r = ev.reading()
    cls = decide(r, m.gate)
    if cls is None:
        return None
    same = [(d.file, d.source, c) for c, d in ev.nearest if d.cls == cls][:MAX_NEIGHBOURS]
    return Resemblance(cls, r.score, r.margin, same)
