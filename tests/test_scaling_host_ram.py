"""Host RAM for sleep level 1 is checked in the plan: `host_memory_gib` on a node (or the
local host's RAM when the GPUs are discovered) against the weights that replicas asleep
at level 1 keep there."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
from planner_fleets import fleet

from inferplane.errors import InferplaneError
from inferplane.gpus.discovery import discover_gpus
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml
from inferplane.planner import plan_fleet
from inferplane.planner.host_memory import level1_sleepers

FLEET = """\
engine: sim
gpus:
  nodes:
    - {{name: n1, gpu_type: L40S, count: 2{ram}}}
models:
  - name: day
    source: Qwen--Qwen3-8B
    max_model_len: 4096
  - name: night
    source: meta-llama--Llama-3.1-8B-Instruct
    max_model_len: 4096
    replicas: 0
scaling:
  models:
    day: {{min_replicas: 1, max_replicas: {day_max}, sleep: {{level: {day_level}}}}}
    night: {{min_replicas: 0, max_replicas: 1, sleep: {{level: 1}}}}
"""


def _ram_warnings(ram: str = "", day_max: int = 2, day_level: int = 1) -> list[str]:
    spec = fleet(FLEET.format(ram=ram, day_max=day_max, day_level=day_level))
    plan = plan_fleet(spec, time_limit_s=0)
    return [w for w in plan.warnings if w.startswith("host-ram:")]


def test_level_1_sleepers_that_overflow_the_nodes_ram_are_warned_with_a_fix() -> None:
    [warning] = _ram_warnings(", host_memory_gib: 40")
    # day: 2 replicas x its weights, night: 1 (not planned yet: sized from its config)
    assert "day (2 x 15.3 GiB), night (1 x 15.0 GiB)" in warning, warning
    assert "need 50.0 GiB with 10% to spare, the node has 40.0 GiB" in warning
    assert "the runtime sleeps those that do not fit at level 2" in warning
    # the largest moves to level 2 first; then day alone would fit one replica
    assert "Fix: sleep: {level: 2} for day; or max_replicas: 1 for day; or a node with at " \
           "least 51 GiB of RAM" in warning


def test_the_numbers_follow_the_fleet() -> None:
    [three] = _ram_warnings(", host_memory_gib: 40", day_max=3)
    assert "day (3 x 15.3 GiB)" in three and "need 66.8 GiB" in three
    assert _ram_warnings(", host_memory_gib: 64") == []  # 50.0 GiB fits
    # level 2 keeps nothing in host RAM: only night is counted, and it fits
    assert _ram_warnings(", host_memory_gib: 20", day_level=2) == []
    [tight] = _ram_warnings(", host_memory_gib: 16", day_level=2)
    assert "night (1 x 15.0 GiB) need 16.5 GiB" in tight
    assert "sleep: {level: 2} for night" in tight and "max_replicas" not in tight
    assert "a node with at least 17 GiB of RAM" in tight


def test_a_node_without_host_memory_is_named_with_what_its_sleepers_need() -> None:
    [warning] = _ram_warnings()
    assert "node n1" in warning and "need 50.0 GiB" in warning
    assert "set host_memory_gib on node n1" in warning


def test_no_level_1_sleeper_no_check() -> None:
    spec = fleet(FLEET.format(ram="", day_max=2, day_level=2).replace(
        "night: {min_replicas: 0, max_replicas: 1, sleep: {level: 1}}",
        "night: {min_replicas: 0, max_replicas: 1}"))
    plan = plan_fleet(spec, time_limit_s=0)
    assert not [w for w in plan.warnings if w.startswith("host-ram:")]
    assert level1_sleepers(spec, plan) == {}


def test_discovered_gpus_carry_the_hosts_ram_and_the_plan_uses_it() -> None:
    gpus = discover_gpus(FakeNvml([FakeDevice("NVIDIA L40S"), FakeDevice("NVIDIA L40S")]))
    assert gpus[0].host_memory_bytes == psutil.virtual_memory().total
    spec = fleet(FLEET.format(ram="", day_max=2, day_level=1).replace(
        "gpus:\n  nodes:\n    - {name: n1, gpu_type: L40S, count: 2}\n", "gpus: discover\n"))
    small = [dataclasses.replace(g, host_memory_bytes=32 * 2**30) for g in gpus]
    warnings = [w for w in plan_fleet(spec, time_limit_s=0, discovered=small).warnings
                if w.startswith("host-ram:")]
    assert len(warnings) == 1 and "the node has 32.0 GiB" in warnings[0]
    big = [dataclasses.replace(g, host_memory_bytes=2**40) for g in gpus]
    assert not [w for w in plan_fleet(spec, time_limit_s=0, discovered=big).warnings
                if w.startswith("host-ram:")]


def test_host_memory_gib_must_be_positive() -> None:
    with pytest.raises(InferplaneError) as err:
        fleet(FLEET.format(ram=", host_memory_gib: 0", day_max=2, day_level=1))
    text = str(err.value)
    assert "host_memory_gib" in text and "0" in text


def test_a_model_whose_config_is_not_here_is_left_to_placement() -> None:
    spec = fleet(FLEET.format(ram=", host_memory_gib: 30", day_max=2, day_level=1).replace(
        "source: meta-llama--Llama-3.1-8B-Instruct", "source: acme/not-downloaded"))
    [warning] = [w for w in plan_fleet(spec, time_limit_s=0).warnings
                 if w.startswith("host-ram:")]
    assert "day (2 x 15.3 GiB) need 33.6 GiB" in warning and "night" not in warning
