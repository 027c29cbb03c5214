"""`inferplane doctor` on recorded hosts (nvidia-smi text, FakeNvml) and a recorded cluster,
and for real on this machine (no GPU): every check reports, nothing raises."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.doctor.checks import Check, DoctorInput, run_checks
from inferplane.doctor.host import (
    CommandResult,
    best_group,
    parse_smi_header,
    parse_smi_list,
    parse_topo_matrix,
    torch_cuda_version,
)
from inferplane.doctor.k8s import RecordedApi
from inferplane.gpus.fake_nvml import FakeDevice, FakeNvml, FakeProcess
from inferplane.gpus.nvml import NvmlApi
from inferplane.spec import load_fleet

_register_commands()
DATA = Path(__file__).parent / "data" / "doctor"
MODELS = Path(__file__).parent / "data" / "models"
GIB = 1024**3
runner = CliRunner()


@dataclass
class RecordedHost:
    """A `Host` replaying one recorded directory."""

    directory: Path | None
    fake_nvml: FakeNvml | None = None
    packages: dict[str, str] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    nofile: tuple[int, int] | None = (1024, 4096)
    shm: int | None = 64 * 2**20
    busy_ports: set[int] = field(default_factory=set)
    unwritable: set[Path] = field(default_factory=set)

    def run(self, argv: list[str]) -> CommandResult | None:
        if self.directory is None:
            return None
        name = {("nvidia-smi",): "nvidia-smi.txt", ("nvidia-smi", "-L"): "nvidia-smi-L.txt",
                ("nvidia-smi", "topo", "-m"): "nvidia-smi-topo.txt",
                ("nvidia-smi", "-q", "-d", "COMPUTE"): "nvidia-smi-q-compute.txt"}[tuple(argv)]
        path = self.directory / name
        if not path.is_file():  # not recorded for this host: the tool failed
            return CommandResult(9, "", "Failed to query: not recorded")
        return CommandResult(0, path.read_text())

    def nvml(self) -> NvmlApi | None:
        return self.fake_nvml

    def env(self) -> Mapping[str, str]:
        return self.environ

    def nofile_limit(self) -> tuple[int, int] | None:
        return self.nofile

    def shm_bytes(self) -> int | None:
        return self.shm

    def package_version(self, name: str) -> str | None:
        return self.packages.get(name)

    def read_speed_mib_s(self, path: Path, limit_bytes: int) -> float | None:
        return 90.0

    def port_free(self, host: str, port: int) -> bool:
        return port not in self.busy_ports

    def dir_unwritable(self, path: Path) -> str | None:
        return "Permission denied" if path in self.unwritable else None


def _by_id(checks: list[Check]) -> dict[str, Check]:
    return {c.id: c for c in checks}


def _fleet(tmp_path: Path, tp: int, gpu: str = "L40S") -> Any:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        "engine": {"version": "0.9.2"},
        "gpus": {"nodes": [{"name": "n1", "gpu_type": gpu, "count": 8}]},
        "models": [{"name": "big", "source": str(MODELS / "Qwen--Qwen3-32B"),
                    "tensor_parallel_size": tp, "max_model_len": 8192,
                    "extra_args": {"swap-space": 4}}],
    }))
    return load_fleet(path)


def test_parsers_read_the_recorded_formats() -> None:
    assert parse_smi_header((DATA / "pcie-8gpu" / "nvidia-smi.txt").read_text()) == (
        "550.54.15", "12.4")
    gpus, migs = parse_smi_list((DATA / "mig-a100" / "nvidia-smi-L.txt").read_text())
    assert [g[0] for g in gpus] == [0, 1, 2, 3] and [(m.gpu, m.profile) for m in migs] == [
        (0, "1g.20gb")] * 4
    pcie = parse_topo_matrix((DATA / "pcie-8gpu" / "nvidia-smi-topo.txt").read_text())
    assert len(pcie) == 28 and pcie[(0, 1)] == "PIX" and pcie[(0, 2)] == "NODE"
    assert pcie[(3, 4)] == "SYS"
    nvlink = parse_topo_matrix((DATA / "nvlink-8gpu" / "nvidia-smi-topo.txt").read_text())
    assert len(nvlink) == 28 and set(nvlink.values()) == {"NV"}
    sys8 = parse_topo_matrix((DATA / "pcie-8gpu-sys" / "nvidia-smi-topo.txt").read_text())
    assert len(sys8) == 28 and set(sys8.values()) == {"SYS"}  # NIC columns and rows ignored
    assert best_group(pcie, list(range(8)), 2) == ([0, 1], "PIX")
    assert best_group(pcie, list(range(8)), 4) == ([0, 1, 2, 3], "NODE")
    assert best_group(pcie, list(range(8)), 8) == (list(range(8)), "SYS")
    assert torch_cuda_version("2.5.1+cu124") == "12.4" and torch_cuda_version("2.5.1") is None


def test_pcie_host_warns_about_tp_over_sockets_and_driver_mismatch(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeDevice("NVIDIA L40S") for _ in range(8)], driver_version="550.54.15")
    host = RecordedHost(DATA / "pcie-8gpu", nvml,
                        packages={"torch": "2.7.1", "vllm": "0.11.0"})
    checks = _by_id(run_checks(DoctorInput(host, _fleet(tmp_path, 8))))
    assert checks["driver-cuda"].status == "fail"  # CUDA 12.4 driver, torch 2.7 wheel = 12.6
    assert checks["topology"].status == "warn" and "SYS" in checks["topology"].summary
    assert checks["gpus"].status == "pass"
    assert checks["mig"].status == "pass"
    assert checks["nofile"].status == "warn" and checks["shm"].status == "warn"
    assert checks["vllm"].status == "warn" and "swap-space" in checks["vllm"].summary
    assert checks["disk"].status == "skip"  # the test model has no weights
    four = _by_id(run_checks(DoctorInput(host, _fleet(tmp_path, 2))))
    assert four["topology"].status == "pass"  # TP 2 fits a PIX pair


def test_pcie_host_with_every_pair_across_sockets_warns_even_for_tp_2(tmp_path: Path) -> None:
    host = RecordedHost(DATA / "pcie-8gpu-sys", None)
    topo = _by_id(run_checks(DoctorInput(host, _fleet(tmp_path, 2))))["topology"]
    assert topo.status == "warn" and "SYS" in topo.summary  # the real 8x 4090 box: no PIX


def test_nvlink_host_passes_topology_and_reports_busy_gpus(tmp_path: Path) -> None:
    devices = [FakeDevice("NVIDIA H100 80GB HBM3") for _ in range(8)]
    devices[3] = FakeDevice("NVIDIA H100 80GB HBM3", used_bytes=40 * GIB,
                            processes=[FakeProcess(4242, 40 * GIB, None)])
    host = RecordedHost(DATA / "nvlink-8gpu", FakeNvml(devices),
                        packages={"torch": "2.5.1+cu124"}, nofile=(65536, 65536), shm=32 * GIB)
    checks = _by_id(run_checks(DoctorInput(host, _fleet(tmp_path, 8, "H100"))))
    assert checks["topology"].status == "pass" and "28 of 28" in checks["topology"].summary
    assert checks["driver-cuda"].status == "pass"
    assert checks["gpus"].status == "warn" and "GPU 3" in checks["gpus"].summary
    assert any("pid 4242" in e for e in checks["gpus"].evidence)
    assert checks["nofile"].status == "pass" and checks["shm"].status == "pass"


def test_mig_host_is_reported() -> None:
    host = RecordedHost(DATA / "mig-a100", FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB")] * 2),
                        environ={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"})
    checks = _by_id(run_checks(DoctorInput(host)))
    mig = checks["mig"]
    assert mig.status == "warn" and mig.evidence == [
        "GPU 0: 4 MIG devices (1g.20gb, 1g.20gb, 1g.20gb, 1g.20gb)"]
    mps = checks["mps"]
    assert mps.status == "warn" and "GPU 00000000:0F:00.0: compute mode Exclusive_Process" in (
        mps.evidence)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in mps.evidence
    pcie = _by_id(run_checks(DoctorInput(RecordedHost(DATA / "pcie-8gpu", None))))["mps"]
    assert pcie.status == "skip" and "not recorded" in pcie.summary


def test_no_gpu_host_skips_with_reasons() -> None:
    host = RecordedHost(None, None, busy_ports={8000})
    checks = _by_id(run_checks(DoctorInput(host), k8s=True))
    for cid in ("driver-cuda", "mig", "mps", "topology"):
        assert checks[cid].status == "skip" and "nvidia-smi is not on PATH" in checks[cid].summary
    assert checks["gpus"].status == "skip" and "NVML" in checks["gpus"].summary
    assert checks["vllm"].status == "skip" and checks["k8s"].status == "skip"
    assert checks["ports"].status == "fail"


def test_cluster_with_a_pending_gpu_pod(tmp_path: Path) -> None:
    host = RecordedHost(None, None)
    fleet = _fleet(tmp_path, 2, "A100-80GB")
    inp = DoctorInput(host, fleet, RecordedApi(DATA / "cluster"))
    checks = _by_id(run_checks(inp, k8s=True))
    plugin = checks["k8s-device-plugin"]
    assert plugin.status == "fail" and "gpu-a100-2" in plugin.summary
    assert checks["k8s-node-labels"].status == "pass"
    pending = checks["k8s-pending-gpu-pods"]
    assert pending.status == "fail"
    assert pending.evidence == ["inference/vllm-70b-6f7d8-abcde (4 GPU): P26 k8s-insufficient-gpu"]
    terminating = checks["k8s-terminating-gpu-pods"]
    assert terminating.status == "warn" and "hold 2 GPUs" in terminating.summary


def test_doctor_runs_on_this_machine_without_a_traceback() -> None:
    result = runner.invoke(app, ["doctor", "--json", "--k8s"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "inferplane.doctor/v1"
    ids = [c["id"] for c in doc["checks"]]
    assert ids[:13] == ["driver-cuda", "gpus", "mig", "mps", "topology", "nofile", "shm",
                        "disk", "vllm", "nccl-env", "ports", "engine-ports", "state-dir"]
    for check in doc["checks"]:
        assert list(check) == ["id", "status", "pitfall", "summary", "evidence", "fix"]
        if check["status"] == "skip":
            assert check["summary"]  # says why
    text = runner.invoke(app, ["doctor"])
    assert "Traceback" not in text.output


def test_engine_ports_of_the_plan_are_checked_and_named_by_instance(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 2)
    free = _by_id(run_checks(DoctorInput(RecordedHost(None, None), fleet)))["engine-ports"]
    assert free.status == "pass" and free.summary == "engine ports 8100 are free (1 instances)"
    assert free.evidence == ["big-0: 127.0.0.1:8100"]
    taken = RecordedHost(None, None, busy_ports={8100})
    busy = _by_id(run_checks(DoctorInput(taken, fleet)))["engine-ports"]
    assert busy.status == "fail" and busy.summary == "engine port(s) taken: big-0 (8100)"
    assert busy.evidence == ["big-0 (node n1): 127.0.0.1:8100 in use"]
    assert busy.fix is not None and "ss -ltnp" in busy.fix
    # the gateway's own port is checked apart, and a clash with an engine port is named
    clash = fleet.model_copy(update={"gateway": fleet.gateway.model_copy(update={"port": 8100})})
    both = _by_id(run_checks(DoctorInput(RecordedHost(None, None), clash)))["engine-ports"]
    assert both.status == "fail" and "= gateway.port" in both.evidence[0]


def test_engine_ports_say_why_they_could_not_be_checked(tmp_path: Path) -> None:
    path = tmp_path / "discover.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"name": "m", "source": str(MODELS / "Qwen--Qwen3-8B"), "max_model_len": 8192}]}))
    checks = _by_id(run_checks(DoctorInput(RecordedHost(None, None), load_fleet(path))))
    skip = checks["engine-ports"]
    assert skip.status == "skip" and skip.summary.startswith(
        "could not check the engine ports because the fleet discovers its GPUs")
    assert _by_id(run_checks(DoctorInput(RecordedHost(None, None))))["engine-ports"].status \
        == "skip"
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"engine": "sim", "models": [
        {"name": "m", "source": "Qwen/Qwen3-0.6B", "max_model_len": 4096}]}))
    assert _by_id(run_checks(DoctorInput(RecordedHost(None, None), load_fleet(sim))))[
        "engine-ports"].status == "pass"


def test_state_dir_must_be_writable(tmp_path: Path) -> None:
    from inferplane.doctor.host import LocalHost

    state = tmp_path / "state"
    ok = _by_id(run_checks(DoctorInput(RecordedHost(None, None), state_dir=state)))
    assert ok["state-dir"].status == "pass"
    bad = RecordedHost(None, None, unwritable={state})
    check = _by_id(run_checks(DoctorInput(bad, state_dir=state)))["state-dir"]
    assert check.status == "fail" and "Permission denied" in check.summary
    assert check.fix is not None and "--state-dir" in check.fix
    assert _by_id(run_checks(DoctorInput(RecordedHost(None, None))))["state-dir"].status \
        == "skip"
    # for real: a missing directory under a writable one is fine (up creates it); a file
    # where the directory should be is not
    host = LocalHost()
    assert host.dir_unwritable(tmp_path / "a" / "b") is None
    (tmp_path / "file").write_text("x")
    assert "not a directory" in (host.dir_unwritable(tmp_path / "file") or "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # doctor wrote nothing
