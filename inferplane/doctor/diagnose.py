"""`diagnose`: find every known failure signature in a log and explain it.

Pure over its inputs: `diagnose(text, fix_context)` matches the knowledge base
(`inferplane.doctor.kb`) line by line and returns a `Diagnosis` with one `Finding` per
signature found, in log order. A log that no signature explains gets an `UnknownReport`
(first error line, exception chain) and, from the generic layer (`inferplane.doctor.generic`),
a class by the kind of error - marked generic, never dressed as an exact finding. When the
generic layer names no class either, the similarity layer (`inferplane.doctor.similar`) may
name the class whose known reports the log reads like - marked as a resemblance.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferplane.doctor.fixes import COMPUTE, GIB, FixContext, Values
from inferplane.doctor.generic import GenericFinding, classify
from inferplane.doctor.kb import Signature, load_kb
from inferplane.doctor.logtext import (
    LogContext,
    LogLine,
    UnknownReport,
    read_context,
    read_lines,
    unknown_report,
)
from inferplane.doctor.similar import Resemblance, SimilarFinding, resemble

SCHEMA = "inferplane.diagnose/v1"
MAX_EVIDENCE = 5


@dataclass
class Finding:
    signature: Signature
    evidence: list[LogLine]
    occurrences: int
    values: Values
    cause: str
    fix: str
    numbers_computed: bool  # the fix carries numbers the estimator computed
    missing: list[str] = field(default_factory=list)  # numbers neither the log nor we had

    def to_json(self) -> dict[str, Any]:
        sig = self.signature
        return {
            "id": sig.id,
            "title": sig.title,
            "kind": sig.kind,
            "pitfall": sig.pitfall,
            "pitfalls": list(sig.pitfalls),
            "evidence": [{"line": e.number, "text": e.text} for e in self.evidence],
            "occurrences": self.occurrences,
            "values": dict(sorted(self.values.items())),
            "cause": self.cause,
            "fix": self.fix,
            "numbers_computed": self.numbers_computed,
            "sources": list(sig.sources),
            "missing": list(self.missing),
        }


@dataclass
class Diagnosis:
    source: str
    context: LogContext
    findings: list[Finding] = field(default_factory=list)
    unknown: UnknownReport | None = None
    generic: GenericFinding | None = None  # only when no signature matched
    similar: SimilarFinding | None = None  # only when neither a signature nor a rule classed it
    model_profile: str | None = None  # what the numbers were computed for
    gpu: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        # Stable schema (docs/diagnose.md): keys are only ever added.
        return {
            "schema": SCHEMA,
            "source": self.source,
            "context": self.context.to_json(),
            "computed_for": {"model": self.model_profile, "gpu": self.gpu},
            "findings": [f.to_json() for f in self.findings],
            "unknown": self.unknown.to_json() if self.unknown else None,
            "notes": list(self.notes),
            "generic": self.generic.to_json() if self.generic else None,
            "similar": self.similar.to_json() if self.similar else None,
        }


class _Missing(dict[str, str]):
    def __missing__(self, key: str) -> str:
        raise KeyError(key)


class _Said(dict[str, str]):
    """Renders a number no one had as words saying so (never a placeholder), and records it."""

    def __init__(self, values: Values, missing: list[str]) -> None:
        super().__init__(values)
        self.missing_names = missing

    def __missing__(self, key: str) -> str:
        if key not in self.missing_names:
            self.missing_names.append(key)
        return f"[{key.replace('_', ' ')}: not in the log]"


def _render(template: str, values: Values) -> str | None:
    try:
        return template.format_map(_Missing(values))
    except (KeyError, IndexError, ValueError):
        return None


def _match(sig: Signature, lines: list[LogLine], version: str | None) -> Finding | None:
    texts = [ln.text for ln in lines]
    if any(u.search(t) for u in sig.unless for t in texts):
        return None
    for pattern in sig.all:
        if not pattern.applies_to(version) or not any(pattern.regex.search(t) for t in texts):
            return None
    evidence: list[LogLine] = []
    seen: set[str] = set()
    occurrences = 0
    values: Values = {}
    patterns = [p for p in sig.any if p.applies_to(version)]
    for i, line in enumerate(lines):
        for pattern in patterns:
            m = pattern.regex.search(line.text)
            if m is None and i + 1 < len(lines) and lines[i + 1].text:
                # messages wrapped over two lines (terminals, copied reports)
                m = pattern.regex.search(f"{line.text} {lines[i + 1].text}")
                if m is None:
                    # wrapped mid-word at the terminal's width ("KV cach" / "e is needed")
                    m = pattern.regex.search(f"{line.text}{lines[i + 1].text}")
                if m is not None and m.start() >= len(line.text):
                    m = None  # the next line matches by itself
            if m is None:
                continue
            occurrences += 1
            if pattern.assume and "assumed_version" not in values:
                values["assumed_version"] = pattern.assume
            for key, val in m.groupdict().items():
                if val is not None and key not in values:
                    values[key] = val.strip()
            if line.text not in seen and len(evidence) < MAX_EVIDENCE:
                seen.add(line.text)
                evidence.append(line)
            break
    if not evidence:
        return None
    whole = "\n".join(texts)
    for key, regex in sig.extract.items():
        m = regex.search(whole)
        if m is not None and key not in values:
            group = next((g for g in m.groups() if g is not None), None)
            if group is not None:
                values[key] = group
    return Finding(sig, evidence, occurrences, values, "", "", False)


def _complete(finding: Finding, ctx: FixContext) -> None:
    sig = finding.signature
    values = finding.values
    ctx.used_estimator = False
    ctx.assumed_version = values.pop("assumed_version", None)
    if sig.compute is not None:
        # a number the template needs stays missing on failure: the generic fix is shown
        with contextlib.suppress(Exception):  # never a traceback from a fix computation
            values.update(COMPUTE[sig.compute](ctx, dict(values)))
    missing = finding.missing
    finding.cause = _render(sig.cause, values) or sig.cause.format_map(
        _Said(values, missing))
    fix = _render(sig.fix, values)
    if fix is not None:
        finding.fix = fix
        finding.numbers_computed = ctx.used_estimator
    elif sig.fix_generic is not None:
        finding.fix = _render(sig.fix_generic, values) or sig.fix_generic.format_map(
            _Said(values, missing))
    else:
        finding.fix = sig.fix.format_map(_Said(values, missing))


def diagnose(text: str, ctx: FixContext | None = None, *, source: str = "-",
             kb: tuple[Signature, ...] | None = None) -> Diagnosis:
    """Every known failure signature in `text` (a log of any length and prefix style)."""
    lines = read_lines(text)
    log_ctx = ctx.log if ctx is not None else read_context(text)
    fix_ctx = ctx if ctx is not None else FixContext(log_ctx)
    result = Diagnosis(source, log_ctx)
    if fix_ctx.profile is not None:
        result.model_profile = fix_ctx.profile.name
    if fix_ctx.gpu is not None:
        result.gpu = fix_ctx.gpu.name
    elif fix_ctx.gpu_total_bytes:
        result.gpu = f"{fix_ctx.gpu_total_bytes / GIB:.2f} GiB"
    for sig in kb if kb is not None else load_kb():
        finding = _match(sig, lines, log_ctx.vllm_version)
        if finding is not None:
            _complete(finding, fix_ctx)
            result.findings.append(finding)
    result.findings.sort(key=lambda f: f.evidence[0].number)
    if not result.findings:
        result.unknown = unknown_report(lines)
        result.generic = classify(lines)
        if result.generic is None or result.generic.rule.class_of is None:
            result.similar = similar_finding(lines, fix_ctx, kb)
    return result


def similar_finding(lines: list[LogLine], ctx: FixContext,
                    kb: tuple[Signature, ...] | None = None) -> SimilarFinding | None:
    """The similarity layer's class, with that class's cause and fix as its signature words
    them when the log gives no numbers (never a number taken from another report)."""
    found = resemble(lines)
    return None if found is None else explain_resemblance(found, ctx, kb)


def explain_resemblance(found: Resemblance, ctx: FixContext,
                        kb: tuple[Signature, ...] | None = None) -> SimilarFinding | None:
    sig = next((s for s in (kb if kb is not None else load_kb()) if s.id == found.cls), None)
    if sig is None:
        return None
    probe = Finding(sig, [], 0, {}, "", "", False)
    _complete(probe, ctx)
    nearest = ", ".join(source for _, source, _ in found.neighbours) or "none shown"
    cause = (f"No line of this log matches a signature or a generic rule, but its words "
             f"resemble known reports of {sig.id} ({sig.title}; nearest: {nearest}). If it is "
             f"that failure: {probe.cause}")
    step = ("First check that it is this failure (a resemblance in wording, not an exact "
            f"match: look for what the cause describes); then: {probe.fix}")
    return SimilarFinding(sig.id, sig.title, found.score, found.margin, found.neighbours,
                          cause, step, list(probe.missing))


# --- resolving the model and GPU the numbers are computed for -------------------------


def _hf_cache_dirs() -> list[Path]:
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]) / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    return roots


def find_model_dir(name: str) -> Path | None:
    """A local directory with config.json for the model a log names: the path itself, or
    its snapshot in the Hugging Face cache. Never downloads."""
    path = Path(name)
    if (path / "config.json").is_file():
        return path
    if "/" in name and not name.startswith("/"):
        repo = "models--" + name.replace("/", "--")
        for root in _hf_cache_dirs():
            snapshots = root / repo / "snapshots"
            if snapshots.is_dir():
                for snap in sorted(snapshots.iterdir(), reverse=True):
                    if (snap / "config.json").is_file():
                        return snap
    return None


def fix_context(log: LogContext, *, model_dir: Path | None = None,
                gpu_name: str | None = None) -> tuple[FixContext, list[str]]:
    """The model profile and GPU for the fix numbers: given explicitly, else what the log
    names (a local path or a cached Hugging Face snapshot; a catalog GPU name or the total
    memory the log prints). Notes say what could not be resolved."""
    from inferplane.errors import InferplaneError
    from inferplane.gpus.catalog import find_gpu, lookup_gpu
    from inferplane.models import load_profile

    notes: list[str] = []
    ctx = FixContext(log)
    directory = model_dir
    if directory is None and log.model:
        directory = find_model_dir(log.model)
        if directory is None:
            notes.append(f"model {log.model!r} is not a local directory or cached snapshot: "
                         "pass --model DIR for computed numbers")
    if directory is not None:
        try:
            ctx.profile = load_profile(directory)
        except InferplaneError as exc:
            notes.append(f"could not read the model at {directory}: {exc.render()}")
    if gpu_name is not None:
        ctx.gpu = lookup_gpu(gpu_name)  # a bad --gpu is a usage error
    elif log.gpu_name and find_gpu(log.gpu_name) is not None:
        ctx.gpu = find_gpu(log.gpu_name)
    elif log.gpu_total_gib:
        ctx.gpu_total_bytes = round(log.gpu_total_gib * GIB)
    elif ctx.profile is not None:
        notes.append("the log names no GPU: pass --gpu NAME for computed numbers")
    return ctx, notes


def diagnose_text(text: str, *, source: str, model_dir: Path | None = None,
                  gpu_name: str | None = None) -> Diagnosis:
    """`diagnose` with the model and GPU resolved as `fix_context` does."""
    log = read_context(text)
    ctx, notes = fix_context(log, model_dir=model_dir, gpu_name=gpu_name)
    result = diagnose(text, ctx, source=source)
    result.notes.extend(notes)
    return result
