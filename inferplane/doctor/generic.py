"""The generic layer of `diagnose`: a class, a cause and a safe next step for a log that no
exact signature explains.

Exact signatures quote one wording; the next user's log has another version's wording, a
Ray or NCCL wrapper, the error three frames deeper. This layer reads what every failure
log has instead: the exception chain (class, message, the frame it came from), errno names,
CUDA/NCCL/HTTP error codes, and how far the engine got (the phase). Rules are data
(`generic.yaml`); a finding from here is marked generic and never claims an exact cause.
"""

from __future__ import annotations

import contextlib
import errno
import re
import signal
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from inferplane.doctor.logtext import LogLine
from inferplane.errors import InferplaneError

RULES_PATH = Path(__file__).with_name("generic.yaml")
PHASES = ("import", "config", "weight load", "profile run", "graph capture", "serving")
UNKNOWN_PHASE = "unknown phase"
_FIELDS = {"phase", "exception", "frame", "code"}
_FIELD = re.compile(r"(?<!\{)\{([a-z_]+)\}(?!\})")

# How far the engine got, by the lines each phase prints (vLLM V0 and V1 wordings) and the
# frames of its tracebacks. The furthest phase with a marker is the one the log reached.
_PHASE_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("import", re.compile(r"Automatically detected platform|in <module>|^ImportError|"
                          r"^ModuleNotFoundError|import_module")),
    ("config", re.compile(r"non-default args|args: Namespace|Initializing an? (?:V1 )?LLM "
                          r"engine|Resolved architecture|supports multiple tasks|Using max "
                          r"model len|ModelConfig|EngineArgs|create_engine_config|"
                          r"ValidationError|get_config")),
    ("weight load", re.compile(r"Starting to load model|Loading weights|load_model|"
                               r"Loading safetensors|checkpoint shards|Model loading took|"
                               r"load_weights|safe_open|weight_utils|hf_hub_download|"
                               r"snapshot_download")),
    ("profile run", re.compile(r"profile_run|determine_available_memory|_dummy_run|"
                               r"_dummy_sampler_run|Memory profiling|Available KV cache "
                               r"memory|# GPU blocks|GPU KV cache size|initialize_cache|"
                               r"determine_num_available_blocks")),
    ("graph capture", re.compile(r"Capturing (?:CUDA )?graphs?|capture_model|Capturing "
                                 r"cudagraphs|Graph capturing finished|cudagraph")),
    ("serving", re.compile(r"Starting vLLM API server|Uvicorn running|Application startup "
                           r"complete|Avg prompt throughput|\"(?:POST|GET) /v1/|"
                           r"Engine \d+: Avg|Running: \d+ reqs")),
)
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>[\w<>.]+)')
# `Name: message`, also wrapped (`RayTaskError(ValueError): ...`, `[address=..] Name: ...`)
_EXCEPTION = re.compile(
    r"(?P<name>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))(?:\((?P<inner>[\w.]+)\))?"
    r"(?::\s*(?P<message>.*))?$")
_ERRNO = re.compile(r"\[Errno (\d+)\]|os error (\d+)|\b(E[A-Z]{3,}[A-Z0-9]*)\b")
_CUDA = re.compile(r"\b(cudaError\w+)\b|CUDA error: ([^.\n]+)|[Ee]rror (80[0-9]|3[0-9]):|"
                   r"cuda runtime error \((\d+)\)|cudaSuccess \((\d+) vs")
_NCCL = re.compile(r"\b(nccl[A-Z]\w*Error|NCCL_ERROR_\w+)\b|NCCL (?:error|Error \d+): ?"
                   r"([^,(\n]+)")
# signals by number or name, and the shell's 128+N exit codes; "signal 7" is SIGBUS on Linux
_SIGNAL = re.compile(r"\bsignal:? ?(\d{1,2})\b|\b(SIG(?:BUS|SEGV|KILL|TERM|ABRT|ILL|INT|"
                     r"HUP|PIPE|FPE))\b|\bexit(?:ed with)? code:? ?(1[3-5][0-9])\b|"
                     r"killed by signal: (Bus error|Segmentation fault|Killed|Aborted)")
_SIGNAL_WORDS = {"Bus error": "SIGBUS", "Segmentation fault": "SIGSEGV", "Killed": "SIGKILL",
                 "Aborted": "SIGABRT"}
_HTTP = re.compile(r"\b([45][0-9][0-9]) (?:Client|Server) Error|HTTP/[0-9.]+\" ([45][0-9]"
                   r"[0-9]) |\b(50[234]) (?:Gateway|Bad Gateway|Service)|\b(40[134]|413|429) "
                   r"(?:Unauthorized|Forbidden|Not Found|Request Entity|Too Many)")


@dataclass(frozen=True)
class GenericRule:
    id: str
    class_of: str | None
    any: tuple[re.Pattern[str], ...]
    unless: tuple[re.Pattern[str], ...]
    phases: tuple[str, ...]
    cause: str
    next: str


@dataclass(frozen=True)
class ExceptionInfo:
    name: str
    message: str
    frame: str | None  # "func (path:line)" of the last frame before it, when shown
    line: LogLine


@dataclass
class GenericFinding:
    """A classification by the kind of error, not by an exact wording."""

    rule: GenericRule
    phase: str
    evidence: list[LogLine]
    exception: ExceptionInfo | None
    codes: dict[str, list[str]]
    cause: str
    next_step: str

    @property
    def id(self) -> str:
        return f"generic:{self.rule.id}"

    def to_json(self) -> dict[str, Any]:
        exc = self.exception
        return {
            "id": self.id,
            "class_of": self.rule.class_of,
            "generic": True,
            "phase": self.phase,
            "evidence": [{"line": e.number, "text": e.text} for e in self.evidence],
            "exception": None if exc is None else {
                "class": exc.name, "message": exc.message, "frame": exc.frame,
                "line": exc.line.number},
            "codes": {k: list(v) for k, v in sorted(self.codes.items())},
            "cause": self.cause,
            "next_step": self.next_step,
        }


def _rule(raw: dict[str, Any]) -> GenericRule:
    rid = str(raw.get("id", "?"))
    unknown = set(raw) - {"id", "class_of", "any", "unless", "phases", "cause", "next"}
    if unknown:
        raise ValueError(f"{rid}: unknown keys {sorted(unknown)}")
    for key in ("id", "any", "cause", "next"):
        if not raw.get(key):
            raise ValueError(f"{rid}: missing {key}")
    phases = tuple(str(p) for p in raw.get("phases") or ())
    bad = set(phases) - {*PHASES, UNKNOWN_PHASE}
    if bad:
        raise ValueError(f"{rid}: unknown phases {sorted(bad)}")
    cause = " ".join(str(raw["cause"]).split())
    step = " ".join(str(raw["next"]).split())
    for text in (cause, step):
        fields = set(_FIELD.findall(text)) - _FIELDS
        if fields:
            raise ValueError(f"{rid}: template fields {sorted(fields)} are not one of "
                             f"{sorted(_FIELDS)}")
    return GenericRule(
        id=rid, class_of=str(raw["class_of"]) if raw.get("class_of") else None,
        any=tuple(re.compile(str(p)) for p in raw["any"]),
        unless=tuple(re.compile(str(p)) for p in raw.get("unless") or ()),
        phases=phases, cause=cause, next=step,
    )


def parse_rules(data: Any) -> list[GenericRule]:
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ValueError("the generic rules are a mapping with a `rules` list")
    rules = [_rule(r) for r in data["rules"]]
    ids = [r.id for r in rules]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate generic rule ids: {dupes}")
    return rules


@lru_cache(maxsize=2)
def load_rules(path: Path = RULES_PATH) -> tuple[GenericRule, ...]:
    import yaml

    try:
        return tuple(parse_rules(yaml.safe_load(path.read_text(encoding="utf-8"))))
    except (OSError, ValueError, re.error, yaml.YAMLError) as exc:
        raise InferplaneError(
            f"invalid generic rules: {exc}", field="rules", value=str(path),
            fix="fix the entry named in the message (see the header of generic.yaml)",
        ) from None


def phase_reached(lines: list[LogLine]) -> str:
    reached = -1
    for line in lines:
        for index, (_, marker) in enumerate(_PHASE_MARKERS):
            if index > reached and marker.search(line.text):
                reached = index
    return PHASES[reached] if reached >= 0 else UNKNOWN_PHASE


def _frame_text(line: LogLine) -> str | None:
    fm = _FRAME.search(line.text)
    if fm is None:
        return None
    where = f"{Path(fm.group('path')).name}:{fm.group('line')}"
    func = fm.group("func")
    # `<module>` is Python's name for top-level code; written out, it reads as a template
    # placeholder
    return f"top-level code ({where})" if func == "<module>" else f"{func} ({where})"


def last_frame(lines: list[LogLine]) -> str | None:
    """The last traceback frame the log shows: where a traceback cut before its message
    stopped."""
    found: str | None = None
    for line in lines:
        found = _frame_text(line) or found
    return found


def last_exception(lines: list[LogLine]) -> ExceptionInfo | None:
    """The innermost exception the log ends with, and the frame it was raised in."""
    found: ExceptionInfo | None = None
    frame: str | None = None
    for line in lines:
        text = _frame_text(line)
        if text is not None:
            frame = text
            continue
        em = _EXCEPTION.search(line.text)
        if em is not None and not line.text.startswith(("File ", "raise ", "return ")):
            name = em.group("name") + (f"({em.group('inner')})" if em.group("inner") else "")
            found = ExceptionInfo(name, (em.group("message") or "").strip(), frame, line)
    return found


def error_codes(lines: list[LogLine]) -> dict[str, list[str]]:
    """errno names, CUDA, NCCL and HTTP error codes the log names, each once, in order."""
    codes: dict[str, list[str]] = {}

    def add(kind: str, value: str) -> None:
        value = value.strip()
        if value and value not in codes.setdefault(kind, []):
            codes[kind].append(value)

    for line in lines:
        for m in _ERRNO.finditer(line.text):
            number = m.group(1) or m.group(2)
            if number is not None:
                add("errno", errno.errorcode.get(int(number), f"errno {number}"))
            elif m.group(3) in errno.errorcode.values():
                add("errno", m.group(3))
        for m in _CUDA.finditer(line.text):
            add("cuda", next(g for g in m.groups() if g))
        for m in _NCCL.finditer(line.text):
            add("nccl", next(g for g in m.groups() if g))
        for m in _HTTP.finditer(line.text):
            add("http", next(g for g in m.groups() if g))
        for m in _SIGNAL.finditer(line.text):
            add("signal", _signal_name(*m.groups()))
    for kind in list(codes):
        if not codes[kind]:
            del codes[kind]
    return codes


def _signal_name(number: str | None, name: str | None, exit_code: str | None,
                 words: str | None) -> str:
    """`SIGBUS (signal 7)` for any of the ways a log names a signal (Linux numbering)."""
    if words is not None:
        name = _SIGNAL_WORDS[words]
    num = int(number) if number else (int(exit_code) - 128 if exit_code else None)
    if num is not None:
        with contextlib.suppress(ValueError):
            name = signal.Signals(num).name
        return f"{name} (signal {num})" if name else f"signal {num}"
    if name is not None and hasattr(signal, name):
        return f"{name} (signal {int(getattr(signal, name))})"
    return name or "a signal"


def _code_text(codes: dict[str, list[str]]) -> str:
    if not codes:
        return "the log names no error code"
    return "; ".join(f"{kind} {', '.join(values[:3])}" for kind, values in sorted(codes.items()))


def classify(lines: list[LogLine], rules: tuple[GenericRule, ...] | None = None
             ) -> GenericFinding | None:
    """The first generic rule that matches the log, with its phase, exception and codes;
    None when the log has no error at all."""
    texts = [ln.text for ln in lines]
    phase = phase_reached(lines)
    exc = last_exception(lines)
    codes = error_codes(lines)
    for rule in rules if rules is not None else load_rules():
        if rule.phases and phase not in rule.phases:
            continue
        if any(u.search(t) for u in rule.unless for t in texts):
            continue
        evidence = [ln for ln in lines if ln.text and any(p.search(ln.text) for p in rule.any)]
        if not evidence:
            continue
        values = {
            "phase": phase,
            "exception": f"{exc.name}: {exc.message}" if exc and exc.message else
            (exc.name if exc else "an error the log does not name"),
            "frame": exc.frame if exc and exc.frame else
            (last_frame(lines) or "a frame the log does not show"),
            "code": _code_text(codes),
        }
        unique: list[LogLine] = []
        for ln in evidence:
            if ln.text not in {u.text for u in unique}:
                unique.append(ln)
        return GenericFinding(rule, phase, unique[:5], exc, codes,
                              rule.cause.format_map(values), rule.next.format_map(values))
    return None
