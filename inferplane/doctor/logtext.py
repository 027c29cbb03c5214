"""Reading a log for `diagnose`: line prefixes off, the engine settings it names, the first
error line and the exception chain.

Real vLLM logs carry prefixes of every kind - worker tags (`(VllmWorker rank=0 pid=1)`),
level and timestamp (`ERROR 06-20 12:27:37 [core.py:935]`), torch's `[rank0]:`, CI and
docker timestamps, ANSI colours (also written out as `^[[31m`). Matching sees the message
only; evidence keeps the original line and its number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;]*m")
_PREFIXES = (
    re.compile(r"^\s*\[\d{4}-\d\d-\d\dT[\d:.]+Z?\]\s*"),  # [2026-01-28T23:59:42Z]
    re.compile(r"^\s*\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\s*"),  # ISO / docker ts
    re.compile(r"^\s*\((?:[\w.]+ )?(?:rank=\d+ )?pid=\d+(?:, ip=[\d.]+)?\)\s*"),  # (Worker pid=1)
    re.compile(r"^\s*\[rank\d+\]:\s*"),
    re.compile(r"^\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d"
               r"(?:\.\d+)?\s*(?:\[[^\]]*\])?\s*"),
    re.compile(r"^\s*[\w.-]+\s+\|\s"),  # docker compose `service | `
    re.compile(r"^\s*\|\s+"),  # table-pipe quoting in copied logs
    re.compile(r"^\s*>\s?"),  # markdown quotes in copied issue text
)

_ERROR_LINE = re.compile(
    r"(?:\b[A-Z]\w*(?:Error|Exception)\b|\bTraceback \(most recent call last\)|"
    r"\berror:|\bFATAL\b|\bCRITICAL\b|\bFailed\b|\bOOMKilled\b|\bCrashLoopBackOff\b|"
    r"\bWarning\s+\w+\s)"
)
_EXCEPTION = re.compile(
    r"^(?P<name>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))"
    r"(?::\s*(?P<message>.*))?$"
)
_CHAIN_MARKERS = (
    "The above exception was the direct cause of the following exception",
    "During handling of the above exception, another exception occurred",
)


def clean_line(line: str) -> str:
    """The message of one log line: colours and known prefixes removed."""
    text = _ANSI.sub("", line).rstrip("\r\n")
    for _ in range(4):
        before = text
        for prefix in _PREFIXES:
            text = prefix.sub("", text, count=1)
        if text == before:
            break
    return text.strip()


@dataclass(frozen=True)
class LogLine:
    number: int  # 1-based
    raw: str
    text: str  # cleaned


def read_lines(text: str) -> list[LogLine]:
    return [
        LogLine(i, raw.rstrip("\r"), clean_line(raw))
        for i, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1)
    ]


@dataclass
class LogContext:
    """What the log says about the engine it came from; None where it does not say."""

    vllm_version: str | None = None
    model: str | None = None
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    gpu_name: str | None = None
    gpu_total_gib: float | None = None
    extras: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "vllm_version": self.vllm_version,
            "model": self.model,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "gpu_name": self.gpu_name,
            "gpu_total_gib": self.gpu_total_gib,
        }


def _first(text: str, *patterns: str) -> str | None:
    for pattern in patterns:
        m = re.search(pattern, text, re.MULTILINE)
        if m is not None:
            return m.group(1)
    return None


def read_context(text: str) -> LogContext:
    """The engine settings a log names (config lines, `non-default args`, command lines),
    reusing `inferplane.engines.vllm_log` for the startup facts."""
    from inferplane.engines.vllm_log import parse_startup_log

    facts = parse_startup_log(text)
    ctx = LogContext(vllm_version=facts.vllm_version)
    # a report's own template placeholder (`vllm serve {model_name}`) is not a model name
    ctx.model = _first(
        text, r"\bmodel='([^']+)'", r"'model': '([^']+)'", r"model_tag='([^']+)'",
        r"vllm serve\s+(?![-{<])(\S+)", r"--model[= ](?![{<])(\S+)",
    )
    tp = _first(
        text, r"tensor_parallel_size=(\d+)", r"'tensor_parallel_size': (\d+)",
        r"--tensor-parallel-size[= ](\d+)", r"(?:^|\s)-tp[= ](\d+)",
    )
    ctx.tensor_parallel_size = int(tp) if tp else None
    util = facts.gpu_memory_utilization
    if util is None:
        raw = _first(
            text, r"gpu_memory_utilization=([0-9.]+)", r"'gpu_memory_utilization': ([0-9.]+)",
            r"--gpu-memory-utilization[= ]([0-9.]+)",
            r"desired GPU memory utilization \(([0-9.]+),",
        )
        util = float(raw.rstrip(".")) if raw else None
    ctx.gpu_memory_utilization = util
    length = _first(
        text, r"'max_model_len': (\d+)", r"--max-model-len[= ](\d+)", r"max_model_len=(\d+)",
    )
    ctx.max_model_len = int(length) if length else facts.max_model_len
    ctx.dtype = _first(text, r"dtype=torch\.(\w+)", r"--dtype[= ](\w+)", r"'dtype': '(\w+)'")
    quant = _first(text, r"\bquantization=(\w+)", r"--quantization[= ](\w+)",
                   r"'quantization': '(\w+)'")
    ctx.quantization = None if quant in (None, "None") else quant
    ctx.gpu_name = _first(
        text, r"Your (.+?) GPU has compute capability",
        r"GPU \d+: (NVIDIA [^(\n]+?)\s*(?:\(|$)", r"\bGPU: ((?:NVIDIA )?[A-Z][\w -]+\d[\w-]*)",
    )
    total = _first(text, r"total capacity of ([0-9.]+) GiB", r"([0-9.]+) GiB total capacity")
    ctx.gpu_total_gib = float(total) if total else facts.total_gpu_memory_gib
    return ctx


@dataclass(frozen=True)
class UnknownReport:
    """What `diagnose` shows for a log no signature explains."""

    first_error: LogLine | None
    exception_chain: list[LogLine]

    def to_json(self) -> dict[str, object]:
        def line(item: LogLine) -> dict[str, object]:
            return {"line": item.number, "text": item.text}

        return {
            "first_error": line(self.first_error) if self.first_error else None,
            "exception_chain": [line(e) for e in self.exception_chain],
        }


def unknown_report(lines: list[LogLine]) -> UnknownReport:
    """The first error-looking line and the exception chain (each `Name: message` line that
    ends a traceback, outermost cause first), deduplicated across workers."""
    first = next((ln for ln in lines if ln.text and _ERROR_LINE.search(ln.text)), None)
    chain: list[LogLine] = []
    seen: set[str] = set()
    for ln in lines:
        m = _EXCEPTION.match(ln.text)
        if m is None or ln.text in seen:
            continue
        seen.add(ln.text)
        chain.append(ln)
    return UnknownReport(first, chain[:12])
