"""`doctor`: host and cluster checks, each pass / warn / fail / skip with evidence and fix.

A check that cannot run here (no nvidia-smi, no NVML, no vLLM, no cluster) is `skip` with
the reason; it never raises. Everything is read through `inferplane.doctor.host.Host` and
`inferplane.doctor.k8s.ClusterApi`, so tests replay recorded outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferplane.doctor.host import (
    GOOD_FOR_TP,
    MIB,
    Host,
    best_group,
    parse_compute_modes,
    parse_smi_header,
    parse_smi_list,
    parse_topo_matrix,
    torch_cuda_version,
)

if TYPE_CHECKING:
    from inferplane.doctor.k8s import ClusterApi
    from inferplane.spec import FleetSpec

SCHEMA = "inferplane.doctor/v1"
GIB = 1024**3
NOFILE_WANTED = 65536
SHM_WANTED_BYTES = 1 * GIB
DISK_WANTED_MIB_S = 200.0
DISK_PROBE_BYTES = 256 * MIB
BUSY_GPU_BYTES = 1 * GIB
# The pip packages that carry the CUDA runtime torch was built against.
CUDA_RUNTIME_PACKAGES = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13",
                         "nvidia-cuda-runtime")
# CUDA runtime of torch's default PyPI wheels, by torch minor release.
TORCH_DEFAULT_CUDA = {"2.1": "12.1", "2.2": "12.1", "2.3": "12.1", "2.4": "12.1",
                      "2.5": "12.4", "2.6": "12.4", "2.7": "12.6", "2.8": "12.8",
                      "2.9": "12.8"}


@dataclass
class Check:
    id: str
    status: str  # pass | warn | fail | skip
    summary: str
    pitfall: str | None = None
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "pitfall": self.pitfall,
                "summary": self.summary, "evidence": list(self.evidence), "fix": self.fix}


@dataclass
class DoctorInput:
    host: Host
    fleet: FleetSpec | None = None
    cluster: ClusterApi | None = None
    cluster_error: str | None = None  # why no cluster is available, when --k8s was asked
    state_dir: Path | None = None  # the state directory `up` would use (instance logs, pid)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def _smi(inp: DoctorInput, *args: str) -> tuple[str | None, str | None]:
    """(stdout, why not) of nvidia-smi with `args`."""
    result = inp.host.run(["nvidia-smi", *args])
    if result is None:
        return None, "nvidia-smi is not on PATH (no NVIDIA driver on this host, or not in PATH)"
    if result.returncode != 0:
        first = (result.stderr or result.stdout).strip().splitlines()
        return None, f"nvidia-smi failed: {first[0] if first else 'exit ' + str(result.returncode)}"
    return result.stdout, None


def _fleet_tps(fleet: FleetSpec | None) -> list[tuple[str, int]]:
    if fleet is None:
        return []
    return [(m.name, m.tensor_parallel_size) for m in fleet.models
            if isinstance(m.tensor_parallel_size, int) and not m.is_endpoint]


def check_driver(inp: DoctorInput) -> Check:
    out, why = _smi(inp)
    if out is None:
        return Check("driver-cuda", "skip", f"could not read the driver: {why}", "P31")
    driver, cuda = parse_smi_header(out)
    evidence = [f"driver {driver}, supports CUDA {cuda}"]
    runtime = next((v for v in map(inp.host.package_version, CUDA_RUNTIME_PACKAGES) if v),
                   None)
    torch = inp.host.package_version("torch")
    wheel = ".".join(runtime.split(".")[:2]) if runtime else torch_cuda_version(torch)
    if wheel is None and torch:
        wheel = TORCH_DEFAULT_CUDA.get(".".join(torch.split(".")[:2]))
    if torch:
        evidence.append(f"torch {torch}" + (f" built for CUDA {wheel}" if wheel else ""))
    if cuda is None or wheel is None:
        return Check("driver-cuda", "skip" if cuda is None else "pass",
                     f"driver {driver}; " + ("torch is not installed here, so the wheel's CUDA "
                                             "cannot be compared" if not torch else
                                             "the wheel's CUDA version is unknown"),
                     "P31", evidence)
    if _version(cuda) < _version(wheel):
        return Check("driver-cuda", "fail",
                     f"driver {driver} supports CUDA {cuda}, the installed wheels need {wheel}: "
                     "'driver version is insufficient' / 'no kernel image' at startup", "P31",
                     evidence, f"upgrade the driver, or install wheels for CUDA {cuda} "
                     f"(pip install vllm --extra-index-url https://download.pytorch.org/whl/"
                     f"cu{cuda.replace('.', '')})")
    return Check("driver-cuda", "pass", f"driver {driver} (CUDA {cuda}) runs wheels for CUDA "
                 f"{wheel}", "P31", evidence)


def check_gpus(inp: DoctorInput) -> Check:
    from inferplane.errors import InferplaneError
    from inferplane.gpus.discovery import discover_gpus

    api = inp.host.nvml()
    if api is None:
        why = getattr(inp.host, "nvml_error", None)
        return Check("gpus", "skip", "could not load NVML (libnvidia-ml.so"
                     + (f": {why}" if why else "") + "): no NVIDIA driver here, so GPUs, free "
                     "memory and processes cannot be read", "P19")
    try:
        gpus = discover_gpus(api)
    except InferplaneError as exc:
        return Check("gpus", "skip", f"NVML did not answer: {exc.render()}", "P19")
    if not gpus:
        return Check("gpus", "fail", "NVML sees no GPU", "P19",
                     fix="check CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES and the driver")
    evidence = []
    busy = []
    for gpu in gpus:
        procs = ", ".join(f"pid {p.pid} {p.process_name or '(other container)'} "
                          f"{(p.used_bytes or 0) / GIB:.1f} GiB" for p in gpu.processes)
        evidence.append(f"GPU {gpu.index} {gpu.name}: {gpu.free_bytes / GIB:.1f} of "
                        f"{gpu.total_bytes / GIB:.1f} GiB free" + (f"; {procs}" if procs else ""))
        if gpu.used_bytes > BUSY_GPU_BYTES or gpu.processes:
            busy.append(gpu.index)
    if busy:
        return Check("gpus", "warn", f"{len(gpus)} GPUs; GPU {', '.join(map(str, busy))} already "
                     "hold memory: a new vLLM there gets only what is free (P01, P22)", "P19",
                     evidence, "stop the holders (nvidia-smi shows their pids) or place new "
                     "engines on idle GPUs; inferplane checks free memory before launching")
    return Check("gpus", "pass", f"{len(gpus)} GPUs, all idle", "P19", evidence)


def check_mig(inp: DoctorInput) -> Check:
    out, why = _smi(inp, "-L")
    if out is None:
        return Check("mig", "skip", f"could not list GPUs: {why}", "P17")
    gpus, migs = parse_smi_list(out)
    if not migs:
        return Check("mig", "pass", f"MIG is off on all {len(gpus)} GPUs", "P17")
    by_gpu: dict[int, list[str]] = {}
    for mig in migs:
        by_gpu.setdefault(mig.gpu, []).append(mig.profile)
    evidence = [f"GPU {g}: {len(p)} MIG devices ({', '.join(p)})" for g, p in by_gpu.items()]
    return Check("mig", "warn", f"MIG is on for GPU {', '.join(map(str, by_gpu))}: each MIG "
                 "device is a separate, smaller GPU; tensor parallelism across MIG devices is "
                 "not possible", "P17", evidence,
                 "address MIG devices by index in CUDA_VISIBLE_DEVICES (not UUID, P20), and size "
                 "models for the slice's memory")


def check_mps(inp: DoctorInput) -> Check:
    out, why = _smi(inp, "-q", "-d", "COMPUTE")
    if out is None:
        return Check("mps", "skip", f"could not read the compute modes: {why}", "P17")
    modes = parse_compute_modes(out)
    env = inp.host.env()
    share = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    evidence = [f"GPU {bus}: compute mode {mode}" for bus, mode in modes]
    if env.get("CUDA_MPS_PIPE_DIRECTORY"):
        evidence.append(f"CUDA_MPS_PIPE_DIRECTORY={env['CUDA_MPS_PIPE_DIRECTORY']}")
    if share:
        evidence.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share}")
    exclusive = [bus for bus, mode in modes if mode.startswith("Exclusive")]
    if exclusive:
        return Check("mps", "warn", f"{len(exclusive)} GPUs in exclusive-process mode: only one "
                     "process (or the MPS server) may use each, so co-located models fail to "
                     "start unless the MPS daemon runs", "P17", evidence,
                     "start nvidia-cuda-mps-control -d for MPS sharing, or set the Default "
                     "compute mode (nvidia-smi -c DEFAULT) to co-locate without MPS")
    return Check("mps", "pass", "compute mode Default on all GPUs"
                 + (f"; MPS thread share {share}%" if share else ""), "P17", evidence)


def check_topology(inp: DoctorInput) -> Check:
    out, why = _smi(inp, "topo", "-m")
    if out is None:
        return Check("topology", "skip", f"could not read the topology: {why}", "P13")
    pairs = parse_topo_matrix(out)
    gpus = sorted({g for pair in pairs for g in pair})
    if not pairs:
        return Check("topology", "pass", "one GPU (no pairs to connect)", "P13")
    counts: dict[str, int] = {}
    for kind in pairs.values():
        counts[kind] = counts.get(kind, 0) + 1
    evidence = [f"{len(gpus)} GPUs: " + ", ".join(f"{n} {k} pairs" for k, n in
                                                 sorted(counts.items()))]
    problems = []
    for name, tp in _fleet_tps(inp.fleet):
        if tp <= 1:
            continue
        group = best_group(pairs, gpus, tp)
        if group is None:
            problems.append(f"{name}: TP {tp} needs more GPUs than the {len(gpus)} here")
            continue
        members, worst = group
        evidence.append(f"{name}: TP {tp} best on GPUs {members} (worst link {worst})")
        if worst not in GOOD_FOR_TP:
            problems.append(f"{name}: TP {tp} only over {worst} links (GPUs {members})")
    if problems:
        return Check("topology", "warn", "; ".join(problems) + ": all-reduce over PCIe host "
                     "bridges / sockets collapses tokens/s (70 -> 20 in S2)", "P13", evidence,
                     "use TP sizes that fit inside an NVLink/PIX island, replicas instead of "
                     "TP, or set NCCL_P2P_DISABLE=1 where P2P is broken (P34)")
    nvlink = counts.get("NV", 0)
    return Check("topology", "pass", f"{nvlink} of {len(pairs)} GPU pairs on NVLink"
                 + ("" if inp.fleet else "; pass --fleet to check the plan's TP groups"),
                 "P13", evidence)


def check_nofile(inp: DoctorInput) -> Check:
    limit = inp.host.nofile_limit()
    if limit is None:
        return Check("nofile", "skip", "this platform has no rlimits", "P30")
    soft, hard = limit
    if soft < NOFILE_WANTED:
        return Check("nofile", "warn", f"ulimit -n is {soft} (hard {hard}): 'Too many open "
                     "files' under load", "P30", [f"soft {soft}, hard {hard}"],
                     f"ulimit -n {NOFILE_WANTED} (LimitNOFILE in systemd, --ulimit nofile="
                     f"{NOFILE_WANTED}:{NOFILE_WANTED} in docker); inferplane's launcher raises "
                     "it up to the hard limit")
    return Check("nofile", "pass", f"ulimit -n {soft}", "P30")


def check_shm(inp: DoctorInput) -> Check:
    size = inp.host.shm_bytes()
    if size is None:
        return Check("shm", "skip", "/dev/shm does not exist here", "P34")
    if size < SHM_WANTED_BYTES:
        return Check("shm", "warn", f"/dev/shm is {size / MIB:.0f} MiB: NCCL needs more for "
                     "tensor parallelism ('Error while creating shared memory segment')", "P34",
                     [f"{size} bytes"], "docker run --ipc=host or --shm-size=16g; in "
                     "Kubernetes an emptyDir {medium: Memory} at /dev/shm")
    return Check("shm", "pass", f"/dev/shm is {size / GIB:.1f} GiB", "P34")


def _model_dirs(fleet: FleetSpec | None) -> list[tuple[str, Path]]:
    from inferplane.doctor.diagnose import find_model_dir

    found = []
    for model in fleet.models if fleet else []:
        if model.source:
            directory = find_model_dir(model.source)
            if directory is not None:
                found.append((model.name, directory))
    return found


def check_disk(inp: DoctorInput) -> Check:
    if inp.fleet is None:
        return Check("disk", "skip", "pass --fleet to time reads of the fleet's model "
                     "directories", "P35")
    evidence = []
    slow = []
    measured = 0
    for name, directory in _model_dirs(inp.fleet):
        files = sorted(directory.glob("*.safetensors"), key=lambda p: p.stat().st_size)
        if not files:
            evidence.append(f"{name}: no *.safetensors in {directory} (config only)")
            continue
        speed = inp.host.read_speed_mib_s(files[-1], DISK_PROBE_BYTES)
        if speed is None:
            evidence.append(f"{name}: could not read {files[-1]}")
            continue
        measured += 1
        evidence.append(f"{name}: {speed:.0f} MiB/s reading {files[-1].name}")
        if speed < DISK_WANTED_MIB_S:
            slow.append(name)
    if not measured:
        return Check("disk", "skip", "no local weights to time: " + ("; ".join(evidence) or
                     "no model directory of the fleet is local"), "P35", evidence)
    if slow:
        return Check("disk", "warn", f"slow model storage for {', '.join(slow)} (< "
                     f"{DISK_WANTED_MIB_S:.0f} MiB/s; page cache may flatter repeated runs)",
                     "P35", evidence, "pre-warm weights to local SSD (render's pre-warm job) "
                     "and size startup probes from this speed (P24)")
    return Check("disk", "pass", "model storage reads fast enough", "P35", evidence)


def check_vllm(inp: DoctorInput) -> Check:
    from inferplane.engines.vllm.flags import flag_problem
    from inferplane.errors import InferplaneError

    installed = inp.host.package_version("vllm")
    if installed is None:
        return Check("vllm", "skip", "vLLM is not installed in this Python environment "
                     "(engines may run from an image)", "P32")
    evidence = [f"vllm {installed}"]
    problems = []
    if inp.fleet is not None:
        wanted = str(inp.fleet.engine.version)
        if wanted != installed.split("+")[0]:
            problems.append(f"the fleet pins vLLM {wanted}, this host has {installed}")
        for model in inp.fleet.models:
            for flag in model.extra_args:
                try:
                    found = flag_problem(flag, installed.split("+")[0])
                except InferplaneError:  # a development build's version string
                    found = None
                if found is not None:
                    problems.append(f"{model.name}: {found[0]}; {found[1]}")
    if problems:
        return Check("vllm", "warn", "; ".join(problems), "P32", evidence,
                     "install the pinned version (pip install vllm==VERSION) or update "
                     "engine.version and the flags")
    return Check("vllm", "pass", f"vLLM {installed}", "P32", evidence)


def check_nccl_env(inp: DoctorInput) -> Check:
    env = inp.host.env()
    nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    evidence = [f"{k}={v}" for k, v in sorted(nccl.items())] or ["no NCCL_* variables set"]
    if "NCCL_P2P_DISABLE" in nccl and nccl["NCCL_P2P_DISABLE"] not in ("0", ""):
        return Check("nccl-env", "warn", "NCCL_P2P_DISABLE is set: fine on PCIe cards without "
                     "P2P, but it disables NVLink too", "P34", evidence,
                     "unset it on NVLink hosts (inferplane sets NCCL env per topology)")
    return Check("nccl-env", "pass", "NCCL environment: " + ", ".join(evidence), "P34")


def check_ports(inp: DoctorInput) -> Check:
    host, port = ("127.0.0.1", 8000)
    if inp.fleet is not None:
        host, port = inp.fleet.gateway.host, inp.fleet.gateway.port
    if inp.host.port_free(host, port):
        return Check("ports", "pass", f"gateway port {host}:{port} is free", None)
    return Check("ports", "fail", f"gateway port {host}:{port} is in use", None,
                 [f"{host}:{port}"], "stop what listens there (ss -ltnp) or change "
                 "gateway.port")


def _planned_ports(inp: DoctorInput) -> tuple[list[tuple[str, str, int]], str | None]:
    """(instance, node, port) of every engine the fleet's plan starts, or why not known."""
    from inferplane.errors import InferplaneError
    from inferplane.gpus.discovery import discover_gpus
    from inferplane.planner import plan_fleet

    fleet = inp.fleet
    assert fleet is not None
    try:
        discovered = None
        if fleet.discover_gpus:
            api = inp.host.nvml()
            if api is None:
                return [], ("the fleet discovers its GPUs (gpus: discover) and NVML cannot "
                            "be loaded here")
            discovered = discover_gpus(api)
        plan = plan_fleet(fleet, time_limit_s=0, discovered=discovered, check_fixes=False)
    except InferplaneError as exc:
        return [], f"the fleet does not plan here: {exc.message}"
    return [(i.id, i.node, i.port) for i in plan.instances], None


def check_engine_ports(inp: DoctorInput) -> Check:
    """The fixed ports the plan gives vLLM engines (`up` refuses when one is taken)."""
    from inferplane.runtime.instances import ENGINE_HOST

    if inp.fleet is None:
        return Check("engine-ports", "skip", "pass --fleet to check the ports its engines "
                     "will use")
    if inp.fleet.engine.kind == "sim":
        return Check("engine-ports", "pass", "simulated engines take any free port when they "
                     "start: no fixed port to check")
    planned, why = _planned_ports(inp)
    if why is not None:
        return Check("engine-ports", "skip", f"could not check the engine ports because {why}")
    if not planned:
        return Check("engine-ports", "pass", "the fleet starts no engine here (endpoints only)")
    gateway = inp.fleet.gateway.port
    busy = [(name, node, port) for name, node, port in planned
            if port == gateway or not inp.host.port_free(ENGINE_HOST, port)]
    evidence = [f"{name} (node {node}): {ENGINE_HOST}:{port}"
                + (" = gateway.port" if port == gateway else " in use")
                for name, node, port in busy]
    if busy:
        names = ", ".join(f"{name} ({port})" for name, _, port in busy)
        return Check("engine-ports", "fail", f"engine port(s) taken: {names}", None, evidence,
                     "stop what listens there (ss -ltnp), or change gateway.port; `up` "
                     "refuses to start an instance whose planned port is in use")
    ports = sorted(port for _, _, port in planned)
    span = f"{ports[0]}" if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"
    return Check("engine-ports", "pass", f"engine ports {span} are free ({len(planned)} "
                 "instances)", None, [f"{n}: {ENGINE_HOST}:{p}" for n, _, p in planned])


def check_state_dir(inp: DoctorInput) -> Check:
    if inp.state_dir is None:
        return Check("state-dir", "skip", "no state directory given (`up` uses --state-dir, "
                     "$INFERPLANE_STATE_DIR or ./.inferplane)")
    why = inp.host.dir_unwritable(inp.state_dir)
    if why is None:
        from inferplane.runtime.state import StateDir  # reads the pid file, writes nothing

        pid = StateDir(inp.state_dir).running_pid()
        if pid is not None:  # writable, but `up` refuses a directory another `up` holds
            return Check("state-dir", "warn", f"a fleet is already running from state "
                         f"directory {inp.state_dir} (pid {pid}): `up` refuses it",
                         None, [f"{inp.state_dir / 'up.pid'}: {pid}"],
                         "stop it with `inferplane down --state-dir "
                         f"{inp.state_dir}`, or give `up` another --state-dir")  # fmt: skip
        return Check("state-dir", "pass", f"state directory {inp.state_dir} is writable")
    return Check("state-dir", "fail", f"state directory {inp.state_dir} is not writable: "
                 f"{why}", None, [why], "fix its permissions, or give `up` another one "
                 "with --state-dir DIR (or $INFERPLANE_STATE_DIR)")


HOST_CHECKS: tuple[Callable[[DoctorInput], Check], ...] = (
    check_driver, check_gpus, check_mig, check_mps, check_topology, check_nofile, check_shm,
    check_disk, check_vllm, check_nccl_env, check_ports, check_engine_ports, check_state_dir,
)


# --- Kubernetes ---------------------------------------------------------------------------

GPU_RESOURCE = "nvidia.com/gpu"


def _gpus_of(pod: dict[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(
            GPU_RESOURCE)
        total += int(value or 0)
    return total


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def check_k8s_capacity(api: ClusterApi, fleet: FleetSpec | None) -> list[Check]:
    nodes = api.nodes()
    evidence = []
    no_plugin = []
    total = 0
    for node in nodes:
        status = node.get("status") or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        cap = int((status.get("capacity") or {}).get(GPU_RESOURCE, 0) or 0)
        alloc = int((status.get("allocatable") or {}).get(GPU_RESOURCE, 0) or 0)
        total += alloc
        product = labels.get("nvidia.com/gpu.product", "")
        evidence.append(f"{_name(node)}: {GPU_RESOURCE} capacity {cap}, allocatable {alloc}"
                        + (f" ({product})" if product else ""))
        gpu_node = any(k.startswith(("nvidia.com/gpu", "inferplane.io/gpu")) for k in labels)
        if gpu_node and cap == 0:
            no_plugin.append(_name(node))
    checks = []
    if no_plugin:
        checks.append(Check("k8s-device-plugin", "fail", f"GPU nodes advertise 0 {GPU_RESOURCE}: "
                            f"{', '.join(no_plugin)} (device plugin missing or not reaching "
                            "the driver)", "P14", evidence,
                            "install/restart the NVIDIA device plugin (or GPU Operator) and "
                            "make the NVIDIA runtime the default"))
    else:
        checks.append(Check("k8s-device-plugin", "pass" if total else "warn",
                            f"{total} allocatable GPUs on {len(nodes)} nodes", "P14", evidence))
    if fleet is not None and fleet.gpus is not None:
        missing = []
        for spec_node in fleet.gpus.nodes:
            wanted = dict(spec_node.labels) or {"inferplane.io/gpu-type": spec_node.gpu_type}
            if not any(all(((n.get("metadata") or {}).get("labels") or {}).get(k) == v
                           for k, v in wanted.items()) for n in nodes):
                missing.append(", ".join(f"{k}={v}" for k, v in wanted.items()))
        if missing:
            checks.append(Check("k8s-node-labels", "fail", "no node carries the labels the "
                                f"plan's nodeSelectors need: {'; '.join(missing)}", "P14",
                                fix="kubectl label node NODE " + missing[0].replace(", ", " ")))
        else:
            checks.append(Check("k8s-node-labels", "pass", "every GPU type of the fleet has "
                                "labelled nodes", "P14"))
    return checks


def check_k8s_pods(api: ClusterApi) -> list[Check]:
    from inferplane.doctor.diagnose import diagnose
    from inferplane.doctor.k8s import pod_text

    pods = api.pods()
    pending = [p for p in pods if (p.get("status") or {}).get("phase") == "Pending"
               and _gpus_of(p)]
    terminating = [p for p in pods if (p.get("metadata") or {}).get("deletionTimestamp")
                   and _gpus_of(p)]
    checks = []
    if pending:
        evidence = []
        for pod in pending:
            meta = pod.get("metadata") or {}
            text = pod_text(api, meta.get("namespace", "default"), meta.get("name", ""))
            found = diagnose(text, source=_name(pod)).findings
            causes = ", ".join(f"{f.signature.pitfall} {f.signature.id}" for f in found)
            evidence.append(f"{_name(pod)} ({_gpus_of(pod)} GPU): {causes or 'no known cause'}")
        checks.append(Check("k8s-pending-gpu-pods", "fail", f"{len(pending)} GPU pods Pending",
                            "P26", evidence, "`inferplane diagnose --pod NS/POD` explains each"))
    else:
        checks.append(Check("k8s-pending-gpu-pods", "pass", "no GPU pod is Pending", "P26"))
    if terminating:
        held = sum(_gpus_of(p) for p in terminating)
        checks.append(Check("k8s-terminating-gpu-pods", "warn", f"{len(terminating)} Terminating "
                            f"pods still hold {held} GPUs (S1 7.1)", "P26",
                            [f"{_name(p)}: {_gpus_of(p)} GPU" for p in terminating],
                            "wait for them, or kubectl delete pod --grace-period=0 --force"))
    else:
        checks.append(Check("k8s-terminating-gpu-pods", "pass", "no Terminating pod holds GPUs",
                            "P26"))
    return checks


def run_checks(inp: DoctorInput, *, k8s: bool = False) -> list[Check]:
    checks = [check(inp) for check in HOST_CHECKS]
    if k8s:
        if inp.cluster is None:
            checks.append(Check("k8s", "skip", f"no cluster: {inp.cluster_error or 'unknown'}"))
        else:
            try:
                checks += check_k8s_capacity(inp.cluster, inp.fleet)
                checks += check_k8s_pods(inp.cluster)
            except Exception as exc:  # API errors: the check is skipped, never a traceback
                checks.append(Check("k8s", "skip", f"the Kubernetes API failed: "
                                    f"{str(exc).splitlines()[0] if str(exc) else type(exc)}"))
    return checks
