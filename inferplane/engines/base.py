"""What every engine tells the rest of inferplane: the `Engine` protocol and its parts.

An engine (one kind of server on one device) owns its launch command, its image, its HTTP
endpoints, its metric names and its version rules. Everything outside `inferplane/engines/`
asks the engine instead of writing flags or metric names itself (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferplane.engines.metrics import MetricNames

# Stands in for the leader's address inside a multi-node replica's argv/env: only the
# deployment target knows it (Kubernetes: $(LWS_LEADER_ADDRESS); systemd: the leader host).
LEADER_ADDRESS_TOKEN = "{leader_address}"


@dataclass(frozen=True)
class Endpoints:
    """The engine's HTTP paths (relative to its base URL). `None`: the engine has none."""

    health: str = "/health"  # 200 while the engine lives; real vLLM turns it 503 on death
    models: str = "/v1/models"  # answers once the model is loaded: the readiness probe
    metrics: str = "/metrics"  # Prometheus text, read with `engines.metrics.read_metrics`
    sleep: str | None = "/sleep"  # POST ?level=1|2
    wake: str | None = "/wake_up"  # POST [?tags=weights|kv_cache]
    is_sleeping: str | None = "/is_sleeping"
    rpc: str | None = "/collective_rpc"  # POST {"method": "reload_weights"} after level-2 sleep


class LaunchSpec(Protocol):
    """One engine process's command, built once by its engine. Deploy targets and the
    runtime derive the variations they need through these methods, never by editing argv."""

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    def flag(self, name: str) -> str | None:
        """The value given for the engine option `name` (without dashes), if any."""
        ...

    def with_command(self, command: Sequence[str]) -> LaunchSpec:
        """The same launch run by another executable (e.g. a venv's vLLM)."""
        ...

    def with_host(self, host: str, *, add: bool = False) -> LaunchSpec:
        """Listening on `host`: replaced when set; added only when `add`."""
        ...

    def with_port(self, port: int) -> LaunchSpec: ...

    def with_gpu_memory_utilization(self, fraction: float) -> LaunchSpec: ...

    def with_kv_cache_bytes(self, size: int) -> LaunchSpec:
        """An explicit KV-cache pool of `size` bytes (co-located or CPU instances)."""
        ...

    def with_drain_timeout(self, seconds: int) -> LaunchSpec:
        """Draining in-flight requests for `seconds` on SIGTERM (kept when already set;
        ask `Engine.supports_drain_timeout(version)` first)."""
        ...

    def lora_paths(self) -> dict[str, str]:
        """Adapter name -> the directory the engine loads it from at start (none: {})."""
        ...

    def with_lora_paths(self, paths: Mapping[str, str]) -> LaunchSpec:
        """The same launch reading each adapter directory in `paths` (old -> new path)
        from its new path (a container's mount point)."""
        ...

    def with_sleep_mode(self) -> LaunchSpec:
        """Started so that the sleep endpoints work (a no-op where already so)."""
        ...

    def is_direct(self) -> bool:
        """The engine itself (not wrapped in a shell line): its options can be amended."""
        ...


class Engine(Protocol):
    """One engine kind on one device; found with `engines.engine_for(kind, device)`."""

    @property
    def kind(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def endpoints(self) -> Endpoints: ...

    @property
    def metrics(self) -> MetricNames:
        """Neutral metric name -> the engine's names (engines/metrics.py)."""
        ...

    def planned(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> LaunchSpec:
        """The launch spec of a command this engine built (a Plan's stored argv/env)."""
        ...

    def image(self, version: str, *, fallback: str) -> str:
        """The container image for `version` (`fallback`: the project's image)."""
        ...

    def supports_drain_timeout(self, version: str) -> bool: ...

    def supports_sleep(self, version: str) -> bool: ...

    def batch_defaults(
        self, total_memory_bytes: int, device_name: str | None, max_model_len: int, version: str
    ) -> tuple[int, int]:
        """(max_num_seqs, max_num_batched_tokens) the engine picks when neither is set."""
        ...

    def default_memory_fraction(self, version: str) -> float:
        """The share of the device the engine takes when the fleet file does not say."""
        ...

    def check_argv(self, argv: Sequence[str], version: str) -> None:
        """Raise InferplaneError for the first option `version` does not accept."""
        ...
