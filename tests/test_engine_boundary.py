"""The engine boundary holds (issue 23 item 1): `inferplane/engines/` imports only the ground
floor, no package cycle runs through it, and no module outside an engine's folder assembles
vLLM's command-line flags."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferplane.engines import engine_for, engines, read_metrics
from inferplane.engines import metrics as m
from inferplane.errors import InferplaneError

ROOT = Path(__file__).resolve().parents[1] / "inferplane"
GROUND_FLOOR = {"engines", "errors", "models", "gpus"}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _package(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0].removesuffix(".py")


def _imported_packages(tree: ast.Module) -> set[str]:
    """The inferplane top-level packages a module imports (anywhere in it, lazily too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "inferplane" and len(parts) > 1:
                found.add(parts[1])
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path, tree in _modules():
        pkg = _package(path)
        graph.setdefault(pkg, set()).update(_imported_packages(tree) - {pkg})
    return graph


def test_engines_import_only_the_ground_floor() -> None:
    bad = {
        str(path.relative_to(ROOT)): sorted(_imported_packages(tree) - GROUND_FLOOR)
        for path, tree in _modules()
        if _package(path) == "engines" and _imported_packages(tree) - GROUND_FLOOR
    }
    assert bad == {}


def test_no_package_cycle_runs_through_engines() -> None:
    graph = _graph()
    seen: set[str] = set()
    stack = ["engines"]
    while stack:  # everything engines reaches ...
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    assert "engines" not in seen, f"engines reaches itself through {sorted(seen)}"


# The flags a vLLM launch is made of (those an engine builds or amends). Generic names that
# inferplane's own commands share (--host, --port, --model, --dtype) are left out.
VLLM_FLAGS = (
    "served-model-name", "max-model-len", "tensor-parallel-size", "pipeline-parallel-size",
    "gpu-memory-utilization", "max-num-seqs", "max-num-batched-tokens", "kv-cache-dtype",
    "kv-cache-memory-bytes", "enforce-eager", "enable-sleep-mode", "shutdown-timeout",
    "nnodes", "node-rank", "master-addr", "master-port", "headless",
    "distributed-executor-backend", "runner", "quantization", "enable-prefix-caching",
    "compilation-config", "enable-lora", "max-loras", "max-lora-rank", "max-cpu-loras",
    "lora-modules",
)
_FLAG = re.compile(r"--(?:no-)?(?:" + "|".join(map(re.escape, VLLM_FLAGS)) + r")")

# Where a vLLM flag literal is legitimate outside `inferplane/engines/`, and why:
ALLOWED = {
    # the simulator's server accepts vLLM's own command line, as vLLM does
    "sim",
    # `diagnose`/`doctor` read users' vLLM command lines and logs and write advice
    "doctor",
}


def _assembled_flags(tree: ast.Module) -> list[tuple[int, str]]:
    """String literals that are exactly a vLLM flag (an argv item: `--flag` or `--flag=`),
    except where inferplane's own CLI declares an option of that name (typer/argparse)
    or names the option in an error's `field=`. Prose (help, messages, docs) never counts."""
    declared: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("Option", "Argument", "add_argument"):
                declared.update(id(a) for a in node.args)
            declared.update(id(k.value) for k in node.keywords if k.arg == "field")
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in declared and _FLAG.fullmatch(node.value.split("=", 1)[0])
    ]


def test_only_engines_assemble_vllm_flags() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{line}": value
        for path, tree in _modules()
        if _package(path) not in ("engines", *ALLOWED)
        for line, value in _assembled_flags(tree)
    }
    assert found == {}, "ask the engine (engines/base.py LaunchSpec) instead of writing flags"


def test_the_flag_rule_catches_an_argv_and_spares_prose() -> None:
    tree = ast.parse(
        'argv = ["vllm", "serve", "--max-num-seqs", "8", "--shutdown-timeout=5"]\n'
        'help = "set --max-num-seqs lower"\n'
        'opt = typer.Option(None, "--max-num-seqs")\n'
    )
    assert [v for _, v in _assembled_flags(tree)] == ["--max-num-seqs", "--shutdown-timeout=5"]


def test_registry_is_keyed_by_kind_and_device() -> None:
    assert ("vllm", "gpu") in engines() and ("sim", "gpu") in engines()
    assert engine_for("vllm").device == "gpu" and engine_for("sim").kind == "sim"
    with pytest.raises(InferplaneError, match="no engine 'vllm' for device 'tpu'") as err:
        engine_for("vllm", "tpu")
    assert "vllm/gpu" in (err.value.fix or "")


def test_launch_variations_come_from_the_engine() -> None:
    engine = engine_for("vllm")
    launch = engine.planned(["vllm", "serve", "m", "--host", "127.0.0.1", "--port", "8100"])
    out = (launch.with_host("0.0.0.0").with_port(9000).with_gpu_memory_utilization(0.5)
           .with_drain_timeout(30).with_drain_timeout(99).with_sleep_mode())
    assert out.argv == ("vllm", "serve", "m", "--host", "0.0.0.0", "--port", "9000",
                        "--gpu-memory-utilization", "0.5", "--shutdown-timeout", "30",
                        "--enable-sleep-mode")
    assert out.env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert launch.with_host("::", add=False).flag("host") == "::"
    assert launch.with_kv_cache_bytes(2**30).flag("kv-cache-memory-bytes") == str(2**30)
    assert engine.planned(["vllm", "serve", "m"]).with_host("h").flag("host") is None
    ray = engine.planned(["bash", "-c", "ray start --head && exec vllm serve m"])
    assert ray.with_port(1).argv == ray.argv and not ray.is_direct()
    assert engine.supports_drain_timeout("0.14.0") and not engine.supports_drain_timeout("0.13.0")
    assert not engine_for("sim").supports_drain_timeout("0.33.0")


def test_one_reader_in_neutral_names_with_aliases() -> None:
    text = "\n".join([
        "# HELP vllm:num_requests_waiting x",
        'vllm:num_requests_waiting{engine="0"} 2',
        'vllm:num_requests_waiting{engine="1"} 3',
        'vllm:gpu_cache_usage_perc{engine="0"} 0.25',  # the V0 alias
        'vllm:gpu_cache_usage_perc{engine="1"} 0.75',
        'vllm:prefix_cache_hits_total{model_name="m"} 7',
        'vllm:engine_sleep_state{sleep_state="awake"} 0',
        'vllm:time_to_first_token_seconds_bucket{le="0.1"} 4',
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 5',
        "vllm:time_to_first_token_seconds_sum 0.9",
        "vllm:time_to_first_token_seconds_count 5",
    ])
    reading = read_metrics(text, engine_for("vllm").metrics)
    assert reading.total(m.REQUESTS_WAITING) == 5
    assert reading.total(m.REQUESTS_RUNNING) is None  # not reported: unknown, never 0
    assert reading.highest(m.KV_CACHE_USAGE) == 0.75
    assert reading.total(m.PREFIX_CACHE_HITS) == 7
    assert reading.asleep()
    assert reading.histogram(m.TIME_TO_FIRST_TOKEN) == ({0.1: 4, float("inf"): 5}, 0.9, 5)
    assert set(engine_for("vllm").metrics) == set(m.VOCABULARY)
