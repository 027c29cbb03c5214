"""The README and docs/ agree with the code (issue 18, item 13).

- Every `inferplane ...` command they quote (code blocks, `$ inferplane ...` transcripts,
  inline code) names a real command, and every option it uses exists on that command.
- The README's estimator transcripts are re-run and compared line by line ("..." marks
  lines left out), so a changed estimate or table fails here until the README follows.
- The demo's quoted facts: the fleet file, its port, its five engines, the model names the
  curl and OpenAI samples send, the scripts the two set-up commands run.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README = (REPO / "README.md").read_text()


def _root() -> Any:
    """The click group behind the Typer app (typer vendors click: duck-typed here)."""
    _register_commands()
    root = typer.main.get_command(app)
    assert hasattr(root, "commands")
    return root


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced code block."""
    out: list[tuple[str, list[str]]] = []
    lang: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                out.append((lang, lines))
                lang = None
        elif lang is not None:
            lines.append(line)
    return out


def quoted_commands(text: str) -> list[str]:
    """Every `inferplane ...` command line in code blocks (with indented continuation
    lines, comments cut) and in inline code."""
    commands: list[str] = []
    for _, lines in _blocks(text):
        current: str | None = None
        for line in lines:
            if current is not None and line[:1].isspace() and line.strip().startswith("["):
                current += " " + line.strip()
                continue
            if current is not None:
                commands.append(current)
                current = None
            stripped = re.sub(r"^(\$ |\.venv/bin/)", "", line.strip())
            if stripped.startswith("inferplane "):
                current = re.split(r"\s+#", stripped)[0]
        if current is not None:
            commands.append(current)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += re.findall(r"`(inferplane [a-z][^`]*)`", prose)
    return commands


def check_command(root: Any, command: str) -> list[str]:
    """Problems with one quoted command: unknown command or option."""
    words = command.split()[1:]
    alternatives = [w for w in words if w != "/"]
    if "/" in words:  # "inferplane up / down / status": each must be a command
        return [f"{command}: no command {w!r}" for w in alternatives if w not in root.commands]
    cmd = root
    for word in words:
        if hasattr(cmd, "commands") and word in cmd.commands:
            cmd = cmd.commands[word]
        else:
            break
    if cmd is root:
        return [f"{command}: no command {words[0]!r}"] if words else []
    known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    options = re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", command)
    return [f"{command}: {cmd.name} has no option {opt}" for opt in options if opt not in known]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_quoted_command_and_option_exists(doc: Path) -> None:
    root = _root()
    commands = quoted_commands(doc.read_text())
    problems = [p for c in commands for p in check_command(root, c)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_a_wrong_option() -> None:
    root = _root()
    assert check_command(root, "inferplane status --state-dir X --json") == []
    assert check_command(root, "inferplane status --nope") != []
    assert check_command(root, "inferplane frobnicate") != []
    assert check_command(root, "inferplane keys create team-a --rpm 5") == []


def _transcripts() -> list[tuple[list[str], list[str]]]:
    """(argv, expected output lines) of every `$ inferplane estimate ...` transcript."""
    found = []
    for lang, lines in _blocks(README):
        if lang == "text" and lines and lines[0].startswith("$ inferplane estimate "):
            found.append((shlex.split(lines[0][2:])[1:], lines[1:]))
    return found


def _matches(expected: list[str], got: list[str]) -> bool:
    """`expected` in order within `got`; a "..." line stands for any number of lines."""
    chunks: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == "...":
            chunks.append([])
        else:
            chunks[-1].append(line.rstrip())
    pos = 0
    for chunk in chunks:
        if not chunk:
            continue
        for start in range(pos, len(got) - len(chunk) + 1):
            if got[start:start + len(chunk)] == chunk:
                pos = start + len(chunk)
                break
        else:
            return False
    return True


@pytest.mark.parametrize("index", range(3))
def test_readme_estimator_transcripts_match_the_code(index: int) -> None:
    transcripts = _transcripts()
    assert len(transcripts) == 3
    argv, expected = transcripts[index]
    _register_commands()
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200", "NO_COLOR": "1"})
    output = result.output
    if "--json" in argv:
        data = json.loads(output)
        for line in expected:
            m = re.match(r'\s*"(\w+)": (.+?),?$', line)
            if m and not m.group(2).endswith(("{", "[")):
                assert data[m.group(1)] == json.loads(m.group(2)), line
        return
    if any(line.startswith("error:") for line in expected):  # the message wraps in the README
        want = " ".join(" ".join(line for line in expected if line.strip() != "...").split())
        assert result.exit_code == 2
        assert want in " ".join(output.split()), output
        return
    got = [line.rstrip() for line in output.splitlines()]
    assert _matches(expected, got), output


def test_demo_facts_quoted_in_the_readme() -> None:
    from inferplane.runtime.instances import plan_sim_instances
    from inferplane.spec import load_fleet

    demo_script = (REPO / "scripts" / "demo.sh").read_text()
    assert "up examples/demo.yaml --detach" in demo_script
    assert "`inferplane up examples/demo.yaml --detach`" in README
    for _, lines in _blocks(README):
        for line in lines:
            m = re.match(r"bash (scripts/\S+)", line)
            if m:
                assert (REPO / m.group(1)).is_file(), line
    fleet = load_fleet(REPO / "examples" / "demo.yaml")
    assert f"127.0.0.1:{fleet.gateway.port}" in README and fleet.gateway.host == "127.0.0.1"
    assert len(plan_sim_instances(fleet)) == 5 and "five engines" in README
    served = {m.name for m in fleet.models} | {a for m in fleet.models for a in m.aliases}
    # the CPU fleet the README writes itself ("A real engine without a GPU")
    cpu = README.split("## A real engine without a GPU", 1)[1].split("\n## ", 1)[0]
    served |= set(re.findall(r"name: ([a-z0-9.-]+)", cpu))
    sent = set(re.findall(r'model="([^"]+)"', README)) | set(
        re.findall(r'\\?"model\\?": \\?"([^"\\]+)', README))
    assert sent and sent <= served, sent - served
    assert f"http://127.0.0.1:{fleet.gateway.port}/v1" in README
    assert (REPO / ".ci" / "run").is_file()


def test_planning_default_quoted_in_the_readme() -> None:
    root = _root()
    plan = root.commands["plan"]
    budget = next(p for p in plan.params if p.name == "card_budget")
    assert f"<= {budget.default:g}" in README


def test_defaults_shown_in_synopses_are_the_code_defaults() -> None:
    """`[--grace-period-s 300]` in a synopsis means 300 is the default: it must be."""
    root = _root()
    problems, checked = [], 0
    for doc in DOCS:
        for command in quoted_commands(doc.read_text()):
            words = command.split()
            cmd = root.commands.get(words[1]) if len(words) > 1 else None
            if cmd is None:
                continue
            for opt, value in re.findall(r"\[(--[a-z0-9-]+) ([0-9][0-9.]*)\]", command):
                param = next((p for p in cmd.params if opt in p.opts), None)
                if param is None:
                    continue  # reported by the option test
                checked += 1
                default = param.default
                same = (str(default) == value if isinstance(default, str)
                        else default is not None and float(default) == float(value))
                if not same:
                    problems.append(f"{doc.name}: {command}: {opt} defaults to {default!r}")
    assert checked >= 3
    assert not problems, "\n".join(problems)
