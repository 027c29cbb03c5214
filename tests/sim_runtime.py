"""Shared setup of the tests that run a Runtime on real simulated engine processes on
127.0.0.1: fast supervisor settings, and for the autoscaler tests the one-model fleet they
vary and a started, settled Runtime."""

from __future__ import annotations

from pathlib import Path

from inferplane.runtime import Runtime, RuntimeOptions, SupervisorSettings
from inferplane.sim.config import FaultConfig
from inferplane.spec import load_fleet

# probe and restart quickly: a test waits seconds, not the production minutes
FAST = SupervisorSettings(
    probe_interval_s=0.2, probe_timeout_s=0.5, failure_threshold=3, startup_deadline_s=30,
    backoff_initial_s=0.2, backoff_max_s=1.0, stop_timeout_s=5,
)
# one `chat` model on the simulator, two sequences a replica so a few users make a queue;
# each test appends the model's remaining keys and its `scaling:` block
CHAT_FLEET = """\
engine: sim
models:
  - name: chat
    source: Qwen/Qwen3-0.6B
    max_model_len: 4096
    max_num_seqs: 2
"""


async def start_runtime(
    tmp_path: Path, fleet_yaml: str, faults: dict[str, FaultConfig] | None = None
) -> Runtime:
    """Write `fleet_yaml` to tmp_path, start its Runtime (gateway on a free port, the
    autoscaler every 50 ms, no tenancy or control socket) and wait until it settles; a
    Runtime that does not settle is stopped before the assertion fails."""
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml)
    rt = Runtime(load_fleet(path), RuntimeOptions(
        state_dir=tmp_path / "state", gateway_port=0, settings=FAST, grace_period_s=10,
        tenancy=False, control=False, scaling_interval_s=0.05, faults=faults,
    ))  # fmt: skip
    await rt.start()
    try:
        assert await rt.wait_settled(30)
    except BaseException:
        await rt.drain_and_stop()
        raise
    return rt
