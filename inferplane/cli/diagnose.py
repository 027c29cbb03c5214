"""`inferplane diagnose [LOGFILE | - | --instance NAME | --pod NS/POD]`: explain a failure."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from inferplane.cli.main import app
from inferplane.cli.options import state_dir_option
from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.doctor.diagnose import Diagnosis

TAIL_LINES = 20000  # of an instance or pod log: startup failures sit at its end


def _instance_text(name: str, state_dir: Path | None) -> tuple[str, str]:
    from inferplane.runtime import logs as logfile
    from inferplane.runtime.registry import find_state_dir

    state = find_state_dir(state_dir)
    path = state.log_dir / f"{name}.log"
    if "/" in name or name.startswith(".") or not path.is_file():
        data = state.read()
        names = sorted(i["name"] for i in (data or {}).get("instances", []))
        raise InferplaneError(
            f"no log for instance {name!r}", field="--instance", value=name,
            fix=f"instances: {', '.join(names)}" if names
            else f"no fleet has run from {state.path}; pass its --state-dir",
        )
    chunks = []
    rotated = path.with_name(path.name + ".1")
    if rotated.is_file():  # the failure may sit just before a rotation
        chunks.append(logfile.read_tail(rotated, TAIL_LINES))
    chunks.append(logfile.read_tail(path, TAIL_LINES))
    return b"".join(chunks).decode("utf-8", errors="replace"), str(path)


def _pod_text(ref: str, container: str | None) -> tuple[str, str]:
    from inferplane.doctor.k8s import KubernetesApi, parse_pod_ref, pod_text

    namespace, name = parse_pod_ref(ref)
    api = KubernetesApi()
    try:
        return pod_text(api, namespace, name, container=container, tail_lines=TAIL_LINES), ref
    except InferplaneError:
        raise
    except Exception as exc:  # the client's ApiException and connection errors
        reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
        raise InferplaneError(
            "could not read the pod", field="--pod", value=ref,
            fix=f"the API said: {reason}; check the name and your access (kubectl get pod)",
        ) from None


def read_source(logfile: str | None, instance: str | None, pod: str | None,
                container: str | None, state_dir: Path | None) -> tuple[str, str]:
    """(text, source label) from exactly one of the inputs."""
    given = [x for x in (logfile, instance, pod) if x is not None]
    if len(given) != 1:
        raise InferplaneError(
            "give exactly one log", field="LOGFILE", value=" ".join(given) or "none",
            fix="a file, - for stdin, --instance NAME or --pod NAMESPACE/POD",
        )
    if instance is not None:
        return _instance_text(instance, state_dir)
    if pod is not None:
        return _pod_text(pod, container)
    assert logfile is not None
    if logfile == "-":
        return sys.stdin.read(), "stdin"
    path = Path(logfile)
    if not path.is_file():
        raise InferplaneError("no such log file", field="LOGFILE", value=logfile,
                              fix="give the path of a saved log, or - to read stdin")
    return path.read_text(encoding="utf-8", errors="replace"), str(path)


def print_diagnosis(result: Diagnosis) -> None:
    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False, soft_wrap=True)
    if result.unknown is not None:
        out.print(f"[yellow]no known failure signature[/] in {escape(result.source)}")
        first = result.unknown.first_error
        if first is None:
            out.print("  no error line found either; is this the engine's log?")
        else:
            out.print(f"  first error line {first.number}: {escape(first.text)}")
        for item in result.unknown.exception_chain:
            out.print(f"  exception (line {item.number}): {escape(item.text)}")
        g = result.generic
        if g is not None:
            out.print(f"\n[bold yellow]generic class[/] [bold]{escape(g.rule.id)}[/] "
                      f"(phase reached: {escape(g.phase)}; by the kind of error, not an exact "
                      "signature)")
            for line in g.evidence:
                out.print(f"  [dim]line {line.number}:[/] {escape(line.text)}")
            out.print(f"  [bold]cause:[/] {escape(g.cause)}")
            out.print(f"  [bold green]next step:[/] {escape(g.next_step)}")
        sim = result.similar
        if sim is not None:
            out.print(f"\n[bold yellow]resembles known reports of[/] [bold]{escape(sim.cls)}[/] "
                      f"(similarity {sim.score:.2f}; by its words, not an exact signature)")
            for fixture, source, score in sim.neighbours:
                out.print(f"  [dim]like {escape(source)} ({escape(fixture)}, "
                          f"{score:.2f})[/]")
            out.print(f"  [bold]cause:[/] {escape(sim.cause)}")
            out.print(f"  [bold green]next step:[/] {escape(sim.next_step)}")
        if g is None and sim is None:
            out.print("  (nothing is guessed; add a signature in "
                      "inferplane/doctor/signatures.yaml)")
    count = len(result.findings)
    if count:
        out.print(f"{count} finding{'s' * (count != 1)} in {escape(result.source)}")
    for f in result.findings:
        sig = f.signature
        out.print(f"\n[bold red]{sig.pitfall}[/] [bold]{escape(sig.title)}[/] "
                  f"({sig.id}, {sig.kind})")
        for line in f.evidence:
            out.print(f"  [dim]line {line.number}:[/] {escape(line.text)}")
        if f.occurrences > len(f.evidence):
            out.print(f"  [dim]({f.occurrences} matching lines in all)[/]")
        out.print(f"  [bold]cause:[/] {escape(f.cause)}")
        out.print(f"  [bold green]fix:[/] {escape(f.fix)}")
        related = f" (also {', '.join(sig.pitfalls[1:])})" if len(sig.pitfalls) > 1 else ""
        out.print(f"  [dim]pitfall {sig.pitfall}{related}; docs/diagnose.md#{sig.id}[/]")
        out.print(f"  [dim]sources: {escape(', '.join(sig.sources))}[/]")
    for note in result.notes:
        out.print(f"[dim]note: {escape(note)}[/]")


@app.command()
def diagnose(
    logfile: str | None = typer.Argument(
        None, help="A saved vLLM (or kubectl/nginx) log; - reads stdin.", show_default=False
    ),
    instance: str | None = typer.Option(
        None, "--instance", help="Read this instance's log from the running fleet's state "
        "directory (see `inferplane status`).", show_default=False,
    ),
    pod: str | None = typer.Option(
        None, "--pod", help="NAMESPACE/POD: read the pod's logs, previous logs and events "
        "through the Kubernetes API.", show_default=False,
    ),
    container: str | None = typer.Option(None, "--container", help="Container of --pod.",
                                         show_default=False),
    model: Path | None = typer.Option(
        None, "--model", help="Model directory (config.json) for computed fixes, when the "
        "log's model is not local.", show_default=False,
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU name for computed fixes, e.g. "
                                   "L40S (default: what the log names).", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/diagnose.md)."),
    state_dir: Path | None = state_dir_option(),
) -> None:
    """Find every known failure in a log: what happened, the evidence lines, the cause, the
    fix with computed numbers, and the pitfall id. Unknown logs show the first error line
    and the exception chain."""
    from inferplane.doctor.diagnose import diagnose_text

    text, source = read_source(logfile, instance, pod, container, state_dir)
    result = diagnose_text(text, source=source, model_dir=model, gpu_name=gpu)
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        print_diagnosis(result)
