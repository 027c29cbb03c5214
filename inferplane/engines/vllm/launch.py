"""A `vllm serve` launch: the argv/env `build_vllm_argv` (or `multinode_argvs`) made, and
the variations downstream sites need, derived here instead of by editing argv strings.

The planner builds the command once and stores it in the Plan; `inferplane up`, the
autoscaler and the deploy targets wrap that stored command with `VllmLaunch` and ask for
another host, port, utilization, drain time or sleep mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from inferplane.engines.options import option_value, with_option
from inferplane.engines.vllm.lora import modules_in, with_module_paths
from inferplane.engines.vllm.versions import parse_version

# vLLM drains in-flight requests on SIGTERM for --shutdown-timeout seconds (P27).
SHUTDOWN_TIMEOUT_SINCE = (0, 14, 0)
SLEEP_MODE_SINCE = (0, 8, 0)  # /sleep, /wake_up, /is_sleeping in the OpenAI server
# The sleep endpoints exist only with this variable set (vLLM's dev-mode routes).
SLEEP_ENDPOINTS_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
RANK_OPTION = "node-rank"  # the native multi-node rank flag


def supports_shutdown_timeout(version: str) -> bool:
    return parse_version(version) >= SHUTDOWN_TIMEOUT_SINCE


def supports_sleep(version: str) -> bool:
    return parse_version(version) >= SLEEP_MODE_SINCE


def is_direct_vllm(argv: Sequence[str]) -> bool:
    """`vllm serve ...` itself (not wrapped in a shell, e.g. the Ray form): safe to amend."""
    if not argv:
        return False
    if PurePosixPath(argv[0]).name == "vllm":
        return True
    return len(argv) > 2 and PurePosixPath(argv[0]).name.startswith("python") and (
        argv[1] == "-m" and argv[2].startswith("vllm"))


def _is_shell_line(argv: Sequence[str]) -> bool:
    return len(argv) > 1 and PurePosixPath(argv[0]).name in ("bash", "sh") and argv[1] == "-c"


@dataclass(frozen=True)
class VllmLaunch:
    """One vLLM process's command (see engines/base.py `LaunchSpec`)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def flag(self, name: str) -> str | None:
        return option_value(self.argv, name)

    def is_direct(self) -> bool:
        return is_direct_vllm(self.argv)

    def _set(self, name: str, value: str | None, *, add: bool = True) -> VllmLaunch:
        if _is_shell_line(self.argv):  # the Ray form: options live inside the line
            return self
        return replace(self, argv=with_option(self.argv, name, value, add=add))

    def with_command(self, command: Sequence[str]) -> VllmLaunch:
        """`vllm` replaced by `command` (e.g. `[python, -m, vllm.entrypoints.cli.main]`)."""
        if not self.argv or self.argv[0] != "vllm":
            return self
        return replace(self, argv=(*command, *self.argv[1:]))

    def with_host(self, host: str, *, add: bool = False) -> VllmLaunch:
        return self._set("host", host, add=add)

    def with_port(self, port: int) -> VllmLaunch:
        return self._set("port", str(port))

    def with_gpu_memory_utilization(self, fraction: float) -> VllmLaunch:
        return self._set("gpu-memory-utilization", f"{fraction}")

    def with_kv_cache_bytes(self, size: int) -> VllmLaunch:
        return self._set("kv-cache-memory-bytes", str(size))

    def with_drain_timeout(self, seconds: int) -> VllmLaunch:
        if self.flag("shutdown-timeout") is not None:
            return self
        return self._set("shutdown-timeout", str(seconds))

    def lora_paths(self) -> dict[str, str]:
        return {module.name: module.path for _, module in modules_in(self.argv)}

    def with_lora_paths(self, paths: Mapping[str, str]) -> VllmLaunch:
        return replace(self, argv=with_module_paths(self.argv, paths))

    def with_sleep_mode(self) -> VllmLaunch:
        if self.flag("enable-sleep-mode") is not None:
            return self
        return replace(self._set("enable-sleep-mode", None),
                       env={**self.env, **SLEEP_ENDPOINTS_ENV})
