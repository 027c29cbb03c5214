"""The knowledge base of failure signatures, loaded from `signatures.yaml` (data, not code).

Each `Signature` is matched against a log line by line: `any` patterns find the evidence,
`all` patterns must each match some line, `unless` patterns rule the signature out (the
near-misses that look alike but are something else). Named regex groups are the numbers a
fix template uses; `compute` names a function in `inferplane.doctor.fixes` that adds numbers
derived by the estimator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from inferplane.errors import InferplaneError

KB_PATH = Path(__file__).with_name("signatures.yaml")
KINDS = ("engine", "host", "kubernetes", "proxy")
_PID = re.compile(r"^P[0-9]{2}$")
_SPEC = re.compile(r"^(>=|<=|==|<|>)\s*([0-9][0-9.]*)$")


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = re.findall(r"[0-9]+", text)[:3]
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


@dataclass(frozen=True)
class VersionRange:
    """A conjunction of `>=0.6.4`, `<0.10`-style clauses over vLLM versions."""

    clauses: tuple[tuple[str, tuple[int, ...]], ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        clauses = []
        for part in text.split(","):
            m = _SPEC.match(part.strip())
            if m is None:
                raise ValueError(f"bad version clause {part!r} in {text!r}")
            clauses.append((m.group(1), _version_tuple(m.group(2))))
        return cls(tuple(clauses), text)

    def contains(self, version: str) -> bool:
        v = _version_tuple(version)
        ops = {
            ">=": v.__ge__, "<=": v.__le__, "==": v.__eq__, "<": v.__lt__, ">": v.__gt__,
        }
        return all(ops[op](bound) for op, bound in self.clauses)


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern[str]
    versions: VersionRange | None = None
    assume: str | None = None  # the release to compute fixes for when the log names none

    def applies_to(self, version: str | None) -> bool:
        return version is None or self.versions is None or self.versions.contains(version)


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    pitfalls: tuple[str, ...]
    kind: str
    any: tuple[Pattern, ...]
    all: tuple[Pattern, ...]
    unless: tuple[re.Pattern[str], ...]
    extract: dict[str, re.Pattern[str]]
    cause: str
    fix: str
    fix_generic: str | None
    compute: str | None
    sources: tuple[str, ...]
    version_ranges: tuple[str, ...] = field(default=())

    @property
    def pitfall(self) -> str:
        return self.pitfalls[0]


# Copied logs change case (issue titles, chat pastes, "valueerror: bfloat16 ..."), and no
# signature tells two failures apart by case alone: every pattern ignores it.
_FLAGS = re.IGNORECASE


def _pattern(raw: Any, where: str) -> Pattern:
    if isinstance(raw, str):
        return Pattern(re.compile(raw, _FLAGS))
    if isinstance(raw, dict) and set(raw) <= {"regex", "versions", "assume"} and "regex" in raw:
        versions = VersionRange.parse(str(raw["versions"])) if "versions" in raw else None
        assume = str(raw["assume"]) if "assume" in raw else None
        if assume is not None and versions is not None and not versions.contains(assume):
            raise ValueError(f"{where}: assume {assume} is outside versions {versions.text}")
        return Pattern(re.compile(str(raw["regex"]), _FLAGS), versions, assume)
    raise ValueError(f"{where}: a pattern is a regex or {{regex, versions, assume}}, got {raw!r}")


_KEYS = {"id", "title", "pitfalls", "kind", "match", "extract", "cause", "fix", "fix_generic",
         "compute", "sources"}


def _signature(raw: dict[str, Any]) -> Signature:
    sid = str(raw.get("id", "?"))
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(f"{sid}: unknown keys {sorted(unknown)}")
    for key in ("id", "title", "pitfalls", "kind", "match", "cause", "fix", "sources"):
        if not raw.get(key):
            raise ValueError(f"{sid}: missing {key}")
    pitfalls = tuple(str(p) for p in raw["pitfalls"])
    if not all(_PID.match(p) for p in pitfalls):
        raise ValueError(f"{sid}: pitfalls must be P-ids, got {pitfalls}")
    if raw["kind"] not in KINDS:
        raise ValueError(f"{sid}: kind must be one of {KINDS}")
    match = raw["match"]
    if not isinstance(match, dict) or set(match) - {"any", "all", "unless"} or not match.get("any"):
        raise ValueError(f"{sid}: match needs `any` (and optionally `all`, `unless`)")
    anys = tuple(_pattern(p, sid) for p in match["any"])
    alls = tuple(_pattern(p, sid) for p in match.get("all") or ())
    unless = tuple(re.compile(str(p), _FLAGS) for p in match.get("unless") or ())
    extract = {str(k): re.compile(str(v), _FLAGS) for k, v in (raw.get("extract") or {}).items()}
    ranges = tuple(p.versions.text for p in anys + alls if p.versions is not None)
    return Signature(
        id=sid, title=str(raw["title"]), pitfalls=pitfalls, kind=str(raw["kind"]),
        any=anys, all=alls, unless=unless, extract=extract,
        cause=" ".join(str(raw["cause"]).split()), fix=" ".join(str(raw["fix"]).split()),
        fix_generic=" ".join(str(raw["fix_generic"]).split()) if raw.get("fix_generic") else None,
        compute=str(raw["compute"]) if raw.get("compute") else None,
        sources=tuple(str(s) for s in raw["sources"]), version_ranges=ranges,
    )


def parse_kb(data: Any) -> list[Signature]:
    """Signatures from the parsed YAML document; ValueError names the bad entry."""
    if not isinstance(data, dict) or not isinstance(data.get("signatures"), list):
        raise ValueError("the knowledge base is a mapping with a `signatures` list")
    sigs = [_signature(raw) for raw in data["signatures"]]
    ids = [s.id for s in sigs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate signature ids: {dupes}")
    return sigs


@lru_cache(maxsize=4)
def load_kb(path: Path = KB_PATH) -> tuple[Signature, ...]:
    """The knowledge base; an unreadable or invalid file is an InferplaneError."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return tuple(parse_kb(data))
    except (OSError, ValueError, re.error, yaml.YAMLError) as exc:
        raise InferplaneError(
            f"invalid knowledge base: {exc}", field="signatures", value=str(path),
            fix="fix the entry named in the message (see the header of signatures.yaml)",
        ) from None


def _plain(template: str) -> str:
    """A template for reading: `{name}` placeholders as <name>, `{{` as `{`."""
    text = re.sub(r"(?<!\{)\{([a-z_]+)\}(?!\})", r"<\1>", template)
    return text.replace("{{", "{").replace("}}", "}")


def render_markdown(kb: tuple[Signature, ...]) -> str:
    """The signature reference of docs/diagnose.md (kept equal to the KB by a test)."""
    out = [f"{len(kb)} signatures. `<name>` in a fix is a number read from the log or "
           "computed by the estimator.", ""]
    for sig in kb:
        out.append(f"### {sig.id}")
        out.append("")
        pits = ", ".join(sig.pitfalls)
        versions = f"; wording by vLLM version: {', '.join(sig.version_ranges)}" \
            if sig.version_ranges else ""
        out.append(f"**{sig.title}** ({sig.kind}; {pits}{versions})")
        out.append("")
        out.append(f"- cause: {_plain(sig.cause)}")
        out.append(f"- fix: {_plain(sig.fix)}")
        if sig.fix_generic:
            out.append(f"- fix without model/GPU: {_plain(sig.fix_generic)}")
        if sig.compute:
            out.append(f"- numbers: `{sig.compute}` in inferplane/doctor/fixes.py")
        out.append("- sources: " + "; ".join(sig.sources))
        out.append("")
    return "\n".join(out)
