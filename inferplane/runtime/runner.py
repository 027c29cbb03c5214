"""`Runtime`: one host's fleet — engine processes under a supervisor, the gateway in front.

    runtime = Runtime(load_fleet(path), RuntimeOptions(state_dir=Path(".inferplane")))
    await runtime.start()
    await runtime.wait_settled()
    code = await runtime.serve_until_signalled()   # SIGTERM/SIGINT: drain, then stop

The gateway runs in this process and is fed the live set of ready instances: a replica is
routable exactly while its supervisor record says `ready`.

`engine: sim` fleets get simulated engines (planned like real ones when they list their
GPUs: `inferplane.runtime.instances`); `engine: vllm` fleets run the plan's
instances on this host's node (`options.plan`, else planned now), pinned and checked
against NVML before every start (`inferplane.runtime.vllm_fleet`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import uvicorn

from inferplane.errors import InferplaneError
from inferplane.gateway import Backend, GatewayApp, build_app
from inferplane.gateway.connections import ACCEPT_BATCH, listener
from inferplane.gateway.fleet import gateway_config_from_fleet
from inferplane.gateway.h1server import NativeServer
from inferplane.gateway.server import uvicorn_config
from inferplane.gpus.nvml import NvmlApi
from inferplane.monitoring.live import refresh_targets, start_monitoring
from inferplane.monitoring.targets import TargetsWriter
from inferplane.planner.plan import Plan
from inferplane.runtime import registry
from inferplane.runtime.admin_token import admin_token_path, read_generated
from inferplane.runtime.channel import ControlServer
from inferplane.runtime.drain import DEFAULT_GRACE_PERIOD_S, DrainGate
from inferplane.runtime.instances import (
    Instance,
    free_port,
    plan_sim_instances,
    plan_simulated,
    sim_argv,
    sim_lora_env,
)
from inferplane.runtime.process import raise_nofile_limit
from inferplane.runtime.state import StateDir
from inferplane.runtime.supervisor import (
    PrepareStart,
    Supervised,
    Supervisor,
    SupervisorSettings,
)
from inferplane.runtime.vllm_fleet import (
    DEFAULT_DISK_BANDWIDTH_MIB_S,
    GpuPinning,
    check_ports_free,
    local_node,
    plan_for_host,
    plan_vllm_instances,
    preflight_cpu_host,
    preflight_host,
)
from inferplane.sim.config import FaultConfig
from inferplane.spec import FleetSpec
from inferplane.tenancy.service import Tenancy

if TYPE_CHECKING:
    from inferplane.scaling.controller import ScalingController
    from inferplane.scaling.placement import Placer

Phase = Literal["starting", "running", "draining", "stopped"]
MakeRoom = Callable[[str, list[str]], Awaitable[None]]  # (model, instances to yield)


@dataclass(frozen=True)
class RuntimeOptions:
    state_dir: Path
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    gateway_host: str | None = None  # default: the fleet's gateway.host
    gateway_port: int | None = None  # default: the fleet's gateway.port; 0 = any free port
    settings: SupervisorSettings = field(default_factory=SupervisorSettings)
    faults: Mapping[str, FaultConfig] | None = None  # simulated misbehaviour per instance
    access_log: bool = True
    fleet_path: str | None = None
    # engine: vllm fleets
    plan: Plan | None = None  # default: plan the fleet now (gpus: discover reads NVML)
    node: str | None = None  # the inventory node this host is (default: the only one)
    nvml: NvmlApi | None = None  # default: the real NVML; tests pass a FakeNvml
    vllm_binary: str | None = None  # replaces `vllm` (default: $INFERPLANE_VLLM_BINARY)
    disk_bandwidth_mib_s: float = DEFAULT_DISK_BANDWIDTH_MIB_S  # startup deadlines (P24)
    # API keys, limits, usage ledger, DB routes (docs/tenancy.md), as `inferplane gateway`
    tenancy: bool = True
    database_url: str | None = None  # --db; default: $INFERPLANE_DATABASE_URL, the fleet's
    # gateway.database_url, else sqlite in the state directory (STATE/inferplane.db)
    control: bool = True  # the control channel `inferplane restart` talks to
    # the autoscaler (fleet `scaling:`, docs/scaling.md)
    placer: Placer | None = None  # default: the planner's incremental placement
    scaling_interval_s: float | None = None  # default: from the shortest window
    # Prometheus config, alert rules, Grafana dashboard, live scrape targets
    # (docs/monitoring.md); default: STATE/monitoring
    monitoring_dir: Path | None = None


_gateway_log = logging.getLogger("inferplane.gateway.runtime")


def _open_gateway_log(path: Path) -> list[tuple[logging.Logger, logging.Handler]]:
    """STATE/logs/gateway.log (`inferplane logs gateway`): inferplane's messages (INFO and
    up) and uvicorn's, rotated like the engine logs (NAME.log.1, ...). Warnings still reach
    stderr as before (Python's last-resort handler no longer applies once one is attached).
    Call after `uvicorn.Config(...)`: its logging config replaces uvicorn's handlers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=50 * 1024 * 1024, backupCount=3, encoding="utf-8"
    )
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ours = logging.getLogger("inferplane")
    attached: list[tuple[logging.Logger, logging.Handler]] = [
        (ours, handler), (logging.getLogger("uvicorn"), handler)
    ]
    if not ours.handlers and not logging.getLogger().handlers:
        stderr = logging.StreamHandler()
        stderr.setLevel(logging.WARNING)
        attached.append((ours, stderr))
    for logger, h in attached:
        logger.addHandler(h)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)
    return attached


def _close_gateway_log(attached: list[tuple[logging.Logger, logging.Handler]]) -> None:
    for logger, handler in attached:
        logger.removeHandler(handler)
        handler.close()


class _GatewayServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the runtime owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


def _bind(host: str, port: int) -> socket.socket:
    """The gateway's listening socket: a `Listener`, as the runtime serves it on asyncio's
    loop (few accepts per tick, one error at the descriptor limit; connections.py)."""
    try:
        return listener(host, port)
    except OSError as exc:
        raise InferplaneError(
            f"the gateway cannot listen on {host}:{port}: {exc.strerror}",
            field="gateway.port",
            value=port,
            fix="stop what uses that port, or set gateway.port (or --gateway-port) to another",
        ) from exc


class Runtime:
    def __init__(self, fleet: FleetSpec, options: RuntimeOptions) -> None:
        self.fleet = fleet
        self.options = options
        self.state_dir = StateDir(options.state_dir)
        self.phase: Phase = "starting"
        self.plan: Plan | None = None
        self.node: str | None = None
        prepare: PrepareStart | None = None
        if fleet.engine.kind == "vllm" and fleet.placed_models:
            self.plan = plan_for_host(
                fleet, plan=options.plan, nvml=options.nvml,
                fleet_file=options.fleet_path or "",
            )
            self.node = local_node(fleet, self.plan, options.node)
            self.instances: list[Instance] = plan_vllm_instances(
                self.plan, node=self.node, vllm_binary=options.vllm_binary,
                disk_bandwidth_mib_s=options.disk_bandwidth_mib_s,
            )
            if fleet.scaling.models:
                from inferplane.scaling.swap import with_sleep_mode

                self.instances = [with_sleep_mode(fleet, i) for i in self.instances]
            prepare = GpuPinning(options.nvml)
        else:
            self.plan = plan_simulated(fleet, options.plan, options.fleet_path or "")
            self.instances = plan_sim_instances(fleet, faults=options.faults, plan=self.plan)
        config = gateway_config_from_fleet(fleet, self.plan)
        log_path = str(options.state_dir / "logs" / "gateway-access.log")
        config = replace(
            config,
            access_log=options.access_log,
            access_log_path=log_path if options.access_log else None,
        )
        self.tenancy: Tenancy | None = None
        if options.tenancy:
            from inferplane.tenancy.wiring import (
                USAGE_SPILL_FILE,
                build_tenancy,
                state_dir_database_url,
            )

            self.tenancy = build_tenancy(
                fleet, options.database_url,
                default_db=state_dir_database_url(options.state_dir),
                spill_path=options.state_dir / USAGE_SPILL_FILE,
            )
            if fleet.gateway.console:  # what `up` generated when no token was set
                self.tenancy.generated_admin_token = read_generated(options.state_dir)
            self.tenancy.on_auth_change = self._auth_changed
        self.gateway: GatewayApp = build_app(config, self.tenancy)
        if fleet.gateway.console:  # the web console at /ui reads this runtime (docs/console.md)
            from inferplane.console import attach

            attach(self.gateway, self, fleet.gateway.admin_token_env)
        self.gate = DrainGate(self.gateway)
        self.backends: dict[str, list[Backend]] = {}
        self._by_instance: dict[str, Backend] = {}
        for inst in self.instances:
            backend = Backend(inst.url, ready=False, name=inst.name)
            self.backends.setdefault(inst.model, []).append(backend)
            self._by_instance[inst.name] = backend
        self.supervisor = Supervisor(
            self.instances, self.state_dir.log_dir, options.settings, self._on_change, prepare,
            drain_instance=self._drain_instance,
        )  # fmt: skip
        self.supervisor.on_restart = self._end_in_flight
        gw_spec = fleet.gateway  # engines never see the gateway's tokens
        self.supervisor.hidden_env = frozenset(
            name for name in (gw_spec.admin_token_env, gw_spec.metrics_token_env) if name
        )
        if fleet.on_cpu:  # the plan sizes each CPU engine's KV cache (engines/vllm/cpu.py)
            from inferplane.engines.vllm.cpu import INHERITED_ENV_DROP

            self.supervisor.hidden_env |= INHERITED_ENV_DROP
        self._asleep: dict[str, int] = {}  # instance -> sleep level (kept out of routing)
        self._parked: set[str] = set()  # asleep, or draining before a stop: not routed
        self._removing: set[str] = set()
        for model in self.backends:  # a replica (re)starting: hold requests, no 503 (below)
            self.gateway.state.pools[model].activator = (lambda m: lambda: self._activate(m))(
                model)
        self.scaling: ScalingController | None = None
        if fleet.scaling.models and fleet.placed_models:
            from inferplane.scaling.controller import ScalingController
            from inferplane.scaling.events import EVENTS_FILE, EventLog

            self.scaling = ScalingController(
                self, EventLog(self.state_dir.path / EVENTS_FILE),
                interval_s=options.scaling_interval_s,
            )
            for model in self.scaling.scalers:
                pool = self.gateway.state.pools[model]
                pool.activator = (lambda m: lambda: self._activate(m))(model)
                pool.on_held = (lambda m: lambda s: self._held(m, s))(model)
        self.gateway_url = ""
        self._server: _GatewayServer | NativeServer | None = None
        self._server_task: asyncio.Task[None] | None = None
        self._started_at = time.time()
        self._stop_requested = asyncio.Event()
        self._forced = False
        self.control: ControlServer | None = None
        self._gateway_log: list[tuple[logging.Logger, logging.Handler]] | None = None
        self.monitoring_dir = options.monitoring_dir or self.state_dir.path / "monitoring"
        self._targets: TargetsWriter | None = None  # the file_sd files, kept current

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Claim the state dir, start the gateway, then every engine (returns at once)."""
        self.state_dir.claim()
        registry.register(self.state_dir, os.getpid())
        try:
            raise_nofile_limit()  # P30: engines inherit it
            if self.plan is not None and self.fleet.engine.kind == "vllm":
                # Refuse before anything starts: GPUs, their free memory, the plan's ports.
                preflight_host(self.instances, self.options.nvml)
                preflight_cpu_host(self.instances)
                check_ports_free(self.instances)
            if self.plan is not None:
                (self.state_dir.path / "plan.json").write_text(
                    self.plan.model_dump_json(indent=2) + "\n"
                )
            gw = self.fleet.gateway
            host = self.options.gateway_host or gw.host
            port = gw.port if self.options.gateway_port is None else self.options.gateway_port
            sock = _bind(host, port)
            self.gateway_url = f"http://{host}:{sock.getsockname()[1]}"
            for model, backends in self.backends.items():
                self.gateway.state.set_backends(model, backends)
            # The same server as `inferplane gateway` (gateway.server: the gateway's own
            # protocol or uvicorn's), with the connection bounds (timeouts, head size,
            # cap, TCP_NODELAY on every socket).
            settings: dict[str, Any] = dict(
                timeout_graceful_shutdown=5,
                backlog=ACCEPT_BATCH,  # asyncio's accepts per tick; the kernel queue stays
            )
            server: _GatewayServer | NativeServer
            if self.gateway.config.server == "uvicorn":
                server = _GatewayServer(
                    uvicorn_config(self.gate, host, port, self.gateway.connections, **settings)
                )
            else:
                server = NativeServer(self.gate, host, port, self.gateway.connections,
                                      **settings)  # fmt: skip
            # after uvicorn's logging config (it replaces the handlers of its loggers)
            self._gateway_log = _open_gateway_log(self.state_dir.log_dir / "gateway.log")
            from inferplane.gateway import logfilter

            logfilter.install()  # one line per 10 s, not a traceback per failed accept()
            self._server = server
            self._server_task = asyncio.get_running_loop().create_task(
                self._server.serve(sockets=[sock])
            )
            while not self._server.started:
                if self._server_task.done():
                    self._server_task.result()
                    raise InferplaneError("the gateway stopped while starting")
                await asyncio.sleep(0.01)
            self.supervisor.start()
            if self.scaling is not None:
                self.scaling.start()
            if self.options.control:
                self.control = ControlServer(self)
                await self.control.start()
            self._write_state()
            self._write_database_url()
            self._targets = start_monitoring(
                self.monitoring_dir, self.fleet, self.plan, self.status(),
                self.gateway.config.metrics_token,
            )  # fmt: skip
            _gateway_log.info(
                "gateway on %s (%d models, %d engine instances)", self.gateway_url,
                len(self.backends) + len(self.fleet.endpoint_models), len(self.instances),
            )
        except BaseException:
            if self.control is not None:
                await self.control.stop()
            self._release()
            raise

    async def wait_settled(self, timeout_s: float | None = None) -> bool:
        """Wait until every instance is ready (True) or some failed for good (False)."""
        ok = await self.supervisor.wait_settled(timeout_s)
        # What each replica holds (its --lora-modules) before the "running" state that `up`
        # prints, rather than after the gateway's next periodic read.
        await self.gateway.adapters.read_all()
        self.phase = "running"
        self._write_state()
        return ok

    def request_stop(self) -> None:
        """First call: drain gracefully. Second call: force (SIGKILL engines now)."""
        if self._stop_requested.is_set():
            self._forced = True
            self.supervisor.kill_all()
            if self._server is not None:
                self._server.force_exit = True
        self._stop_requested.set()

    async def stop_requested(self) -> None:
        """Return once a stop was requested (signal or `request_stop()`)."""
        await self._stop_requested.wait()

    async def serve_until_signalled(self) -> int:
        """Serve until SIGTERM/SIGINT (or `request_stop()`), then drain and stop."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            await self._stop_requested.wait()
            await self.drain_and_stop()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        return 130 if self._forced else 0

    async def drain_and_stop(self) -> bool:
        """Stop admitting, wait for in-flight requests (up to the grace period; a forced
        stop cuts it short), then stop the engines and the gateway. True if all finished."""
        self.phase = "draining"
        if self.scaling is not None:
            await self.scaling.stop()
        self.gate.close()
        self.gateway.connections.drain()  # idle and slow connections go now, not at the end
        if self.control is not None:
            await self.control.stop()
        self._write_state()
        idle = asyncio.ensure_future(self.gate.wait_idle(self.options.grace_period_s))
        forced = asyncio.ensure_future(self._wait_forced())
        while True:  # state.json follows the in-flight count, for `inferplane down`
            done, _ = await asyncio.wait(
                {idle, forced}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                break
            self._write_state()
        finished = idle in done and idle.result()
        idle.cancel()
        forced.cancel()
        await self.supervisor.stop()
        if self._server is not None and self._server_task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._server_task
        if self.tenancy is not None:
            if self._server is not None and self._server.force_exit:
                # uvicorn skips the lifespan shutdown when forced: write the ledger anyway.
                await self.tenancy.stop()
            if self.tenancy.store is not None:
                await self.tenancy.store.close()
        self.phase = "stopped"
        self._write_state()
        _gateway_log.info("gateway stopped (drained: %s)", "yes" if finished else "no")
        self._release()
        return finished

    def _release(self) -> None:
        registry.unregister(self.state_dir)
        self.state_dir.release()
        if self._gateway_log is not None:
            _close_gateway_log(self._gateway_log)
            self._gateway_log = None

    def _end_in_flight(self, rec: Supervised, reason: str) -> None:
        """The supervisor restarts a failed instance: its streams end now, with the SSE
        error event, instead of waiting for the kill (issue 19.5)."""
        self.gateway.end_in_flight(rec.instance.url, f"{rec.instance.name} restarting: {reason}")

    async def _drain_instance(self, rec: Supervised) -> None:
        """Before a manual restart: the gateway no longer routes to the instance (it left
        `ready`); wait until its requests in flight finish, up to the grace period."""
        backend = self._by_instance[rec.instance.name]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.grace_period_s
        while backend.outstanding > 0 and loop.time() < deadline and not self._forced:
            await asyncio.sleep(0.05)

    async def _wait_forced(self) -> None:
        while not self._forced:
            await asyncio.sleep(0.05)


    # ---- the elastic fleet (inferplane.scaling calls these) -------------------------------

    def _activate(self, model: str) -> bool:
        """No replica of `model` is routable: True holds the request in the admission
        queue (its max_queue_wait_s and depth apply) until one is - the autoscaler wakes
        or starts one, or the supervisor is (re)starting one (a killed single replica)."""
        if self.scaling is not None and self.scaling.activate(model):
            return True
        return self.phase == "running" and any(
            rec.instance.model == model and rec.state in ("starting", "restarting")
            and name not in self._parked and name not in self._removing
            for name, rec in self.supervisor.records.items()
        )

    def _held(self, model: str, seconds: float) -> None:
        if self.scaling is not None:
            self.scaling.held(model, seconds)

    def backend_of(self, name: str) -> Backend:
        return self._by_instance[name]

    def model_of(self, name: str) -> str:
        return self.supervisor.records[name].instance.model

    def awake_replicas(self, model: str) -> list[str]:
        """Instances of `model` running or starting, not asleep and not being removed."""
        return [
            name for name, rec in self.supervisor.records.items()
            if rec.instance.model == model and name not in self._asleep
            and name not in self._removing
        ]

    def asleep_replicas(self, model: str) -> list[str]:
        """Sleeping instances of `model`, the longest asleep first."""
        return [n for n in self._asleep if self.supervisor.records[n].instance.model == model]

    def parked(self, name: str) -> bool:
        """Not routed on purpose: asleep, or draining before it sleeps or stops."""
        return name in self._parked

    def asleep_level(self, name: str) -> int:
        return self._asleep[name]

    def _park(self, name: str) -> None:
        """The gateway stops routing to the instance now (asleep, or going away)."""
        self._parked.add(name)
        backend = self._by_instance[name]
        if backend.ready:
            backend.ready = False
            model = self.model_of(name)
            self.gateway.state.set_backends(model, self.backends[model])

    def _unpark(self, name: str) -> None:
        self._parked.discard(name)
        backend = self._by_instance[name]
        backend.engine = None  # a reading from before the sleep says "asleep"
        self._on_change(self.supervisor.records[name])

    async def _drain(self, name: str) -> bool:
        """Park the instance and wait for its requests in flight (up to the grace period)."""
        self._park(name)
        backend = self._by_instance[name]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.grace_period_s
        while backend.outstanding > 0 and loop.time() < deadline and not self._forced:
            await asyncio.sleep(0.05)
        return backend.outstanding == 0

    def pick_victim(self, model: str) -> str:
        """The replica of `model` whose removal frees the most: not yet ready first, then
        the one that empties the most cards, then the least busy, then the newest."""
        from inferplane.scaling.ledger import freed_cards

        names = self.awake_replicas(model)
        if not names:
            raise InferplaneError(f"{model} has no awake replica to remove", field="model",
                                  value=model)
        planned = {i.id: i for i in self.plan.instances} if self.plan is not None else {}
        awake = [planned[n] for n in self._awake_ids() if n in planned]

        def key(name: str) -> tuple[int, int, int, int]:
            rec = self.supervisor.records[name]
            inst = planned.get(name)
            freed = freed_cards(awake, inst) if inst is not None else 0
            return (int(rec.state == "ready"), -freed, self._by_instance[name].outstanding,
                    -rec.instance.replica)

        return min(names, key=key)

    def _awake_ids(self) -> list[str]:
        return [n for n in self.supervisor.records if n not in self._asleep]

    def _awake_plan(self) -> Plan:
        from inferplane.scaling.placement import without

        assert self.plan is not None
        return without(self.plan, set(self._asleep) | self._removing)

    async def add_replica(self, model: str, candidates: list[str], make_room: MakeRoom) -> str:
        """Place one more replica of `model` and start it; instances in `candidates` (idle,
        least recently used first) may be made to yield their GPUs by `make_room`."""
        spec = self.fleet.model(model)
        assert spec is not None
        if self.plan is None:  # a simulated fleet without GPUs: nothing to place on
            taken = {r.instance.replica for r in self.supervisor.records.values()
                     if r.instance.model == model}
            replica = next(i for i in range(len(taken) + 1) if i not in taken)
            port = free_port()
            faults = self.options.faults or {}
            fault = faults.get(f"{model}-{replica}") or faults.get(model)
            inst = Instance(
                name=f"{model}-{replica}", model=model, served_name=spec.engine_model_name,
                replica=replica, port=port, engine="sim",
                argv=sim_argv(spec, port=port, gpu=self._sim_gpu(), faults=fault),
                env={**self.fleet.engine.extra_env, **sim_lora_env(spec), **spec.env},
            )
        else:
            inst = await self._place(model, candidates, make_room)
        backend = Backend(inst.url, ready=False, name=inst.name)
        self.backends.setdefault(model, []).append(backend)
        self._by_instance[inst.name] = backend
        self.gateway.state.set_backends(model, self.backends[model])
        self.instances.append(inst)
        self.supervisor.add(inst)
        self._write_state()
        return inst.name

    def _sim_gpu(self) -> str:
        from inferplane.runtime.instances import _sim_gpu

        return _sim_gpu(self.fleet)

    async def _place(self, model: str, candidates: list[str], make_room: MakeRoom) -> Instance:
        from inferplane.scaling.ledger import fits, overlaps
        from inferplane.scaling.placement import added_instances, planner_placer, without

        assert self.plan is not None
        place = self.options.placer or planner_placer()
        awake = self._awake_plan()
        planned = {i.id: i for i in awake.instances}
        yielders: list[str] = []
        first_error: InferplaneError | None = None
        for k in range(len(candidates) + 1):
            trial = without(awake, set(candidates[:k]))
            try:
                new_plan = place(self.fleet, trial, model, 1)
            except InferplaneError as exc:
                first_error = first_error or exc
                continue
            [new] = added_instances(trial, new_plan)
            yielders = [c for c in candidates[:k] if c in planned and overlaps(planned[c], new)]
            rest = [i for i in awake.instances if i.id not in yielders]
            if fits(rest, new, awake.card_budget_fraction):
                break
        else:
            assert first_error is not None
            raise first_error
        if yielders:
            await make_room(model, yielders)
        self.plan = self.plan.model_copy(update={"instances": [*self.plan.instances, new]})
        one = self.plan.model_copy(update={"instances": [new]})
        if self.fleet.engine.kind == "vllm":
            from inferplane.scaling.swap import with_sleep_mode

            assert self.node is not None
            [inst] = plan_vllm_instances(
                one, node=self.node, vllm_binary=self.options.vllm_binary,
                disk_bandwidth_mib_s=self.options.disk_bandwidth_mib_s,
            )
            inst = with_sleep_mode(self.fleet, inst)
            check_ports_free([inst])  # the plan's next port may be taken on this host
        else:
            [inst] = plan_sim_instances(self.fleet, plan=one, faults=self.options.faults)
        self._write_plan()
        return inst

    def _write_plan(self) -> None:
        if self.plan is not None and self.state_dir.path.exists():
            (self.state_dir.path / "plan.json").write_text(
                self.plan.model_dump_json(indent=2) + "\n"
            )

    async def remove_replica(self, name: str) -> bool:
        """Drain the instance (stop routing, finish in flight), then stop and forget it."""
        self._removing.add(name)
        try:
            drained = await self._drain(name)
            model = self.model_of(name)
            await self.supervisor.remove(name)
            backend = self._by_instance.pop(name)
            self.backends[model] = [b for b in self.backends[model] if b is not backend]
            self.gateway.state.set_backends(model, self.backends[model])
            self.instances = [i for i in self.instances if i.name != name]
            self._asleep.pop(name, None)
            if self.plan is not None and any(i.id == name for i in self.plan.instances):
                from inferplane.planner.incremental import remove_replicas

                self.plan = remove_replicas(self.fleet, self.plan, [name])
                self._write_plan()
        finally:
            self._removing.discard(name)
            self._parked.discard(name)
        self._write_state()
        return drained

    async def sleep_replica(self, name: str, level: int) -> int:
        """Drain the instance, then put its engine to sleep (vLLM `POST /sleep?level=`);
        returns the level used. An engine without sleep mode is stopped instead."""
        from inferplane.scaling.swap import engine_sleep, host_ram_ok, sleep_supported

        if not sleep_supported(self.fleet):
            await self.remove_replica(name)
            return 0
        await self._drain(name)
        backend = self._by_instance[name]
        if level == 1 and self.plan is not None:
            planned = {i.id: i for i in self.plan.instances}.get(name)
            if planned is not None and not host_ram_ok(planned.weights_bytes):
                level = 2  # host RAM cannot hold its weights: discard them instead
        await engine_sleep(self.gateway.session(), backend.url, level)
        self._asleep[name] = level
        self._write_state()
        return level

    def yielders_for_wake(self, name: str, candidates: list[str]) -> list[str] | None:
        """Which of `candidates` must yield so the asleep `name` fits again (None: none
        suffice). Without a plan nothing is placed, so nothing needs to yield."""
        from inferplane.scaling.ledger import fits, overlaps

        if self.plan is None:
            return []
        planned = {i.id: i for i in self.plan.instances}
        me = planned.get(name)
        if me is None:
            return []
        awake = [planned[n] for n in self._awake_ids() if n in planned and n != name
                 and n not in self._removing]
        budget = self.plan.card_budget_fraction
        chosen: list[str] = []
        for cand in [None, *candidates]:
            if cand is not None:
                if cand not in planned or not overlaps(planned[cand], me):
                    continue
                chosen.append(cand)
            rest = [i for i in awake if i.id not in chosen]
            if fits(rest, me, budget):
                return chosen
        return None

    async def wake_replica(self, name: str) -> float:
        """Wake a sleeping instance (level 2: reallocate, reload the weights, then the KV
        cache) and route to it again; returns the seconds it took."""
        from inferplane.scaling.swap import engine_wake

        level = self._asleep[name]
        backend = self._by_instance[name]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await engine_wake(self.gateway.session(), backend.url, level)
        del self._asleep[name]
        self._unpark(name)
        self._write_state()
        return loop.time() - t0

    def _instance_json(self, rec: Supervised) -> dict[str, Any]:
        out = rec.to_json()
        name = rec.instance.name
        if name in self._asleep:
            out["sleep_level"] = self._asleep[name]
        if name in self._removing:
            out["scaling"] = "draining"
        spec = self.fleet.model(rec.instance.model)
        if spec is not None and spec.lora is not None:  # what the gateway knows it holds
            out["adapters"] = self.gateway.adapters.table().get(rec.instance.url, [])
        return out

    # ---- state -------------------------------------------------------------------------

    def _on_change(self, rec: Supervised) -> None:
        backend = self._by_instance[rec.instance.name]
        name = rec.instance.name
        if rec.state == "restarting" and name in self._asleep:
            # a sleeping engine that died (or was restarted) comes back awake
            del self._asleep[name]
            if name not in self._removing:
                self._parked.discard(name)
        ready = rec.state == "ready" and name not in self._parked
        if backend.ready != ready:
            backend.ready = ready
            # set_backends keeps the same objects and hands free slots to queued requests.
            self.gateway.state.set_backends(rec.instance.model, self.backends[rec.instance.model])
        if not self._write_state():
            # The supervisor marks the instance stale and publishes it again after its next
            # answered probe: state.json catches up once the disk has room, not at the next
            # transition (a restart during a full disk left `status` naming the dead pid).
            raise OSError(f"{self.state_dir.state_file} not written")

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "fleet": self.options.fleet_path,
            "phase": self.phase,
            "started_at": self._started_at,
            "grace_period_s": self.options.grace_period_s,
            "node": self.node,
            "gateway": {
                "url": self.gateway_url, "in_flight": self.gate.in_flight,
                "console": self.fleet.gateway.console,
            },
            "endpoint_models": [
                {"model": m.name, "endpoints": list(m.endpoints or [])}
                for m in self.fleet.endpoint_models
            ],
            "instances": [self._instance_json(r) for r in self.supervisor.records.values()],
            "scaling": self.scaling.status() if self.scaling is not None else None,
            "log_dir": str(self.state_dir.log_dir.resolve()),
            "monitoring_dir": str(self.monitoring_dir.resolve()),
            "tenancy": self._tenancy_status(),
        }

    def _auth_changed(self) -> None:
        """The first key turned `auth: auto` on: `status` says so from now on."""
        if self.gateway_url:
            self._write_state()

    def _tenancy_status(self) -> dict[str, Any] | None:
        t = self.tenancy
        if t is None:
            return None
        from sqlalchemy.engine import make_url

        return {
            "database": make_url(t.store.url).render_as_string(hide_password=True)
            if t.store is not None else None,
            "auth": t.auth_mode,
            "auth_required": t.auth_required,
            # whether an admin token is set (never the token): who may open the console
            "admin_token": bool(t.admin_token),
            "admin_token_env": self.fleet.gateway.admin_token_env,
            # `up` generated one (no token was set): where it is kept, mode 0600
            "admin_token_file": str(admin_token_path(self.state_dir.path))
            if t.generated_admin_token else None,
        }

    def _write_database_url(self) -> None:
        """STATE/database_url (mode 0600): `keys` and `usage` from another shell open the
        same database, also one given with --db (it may hold a password)."""
        path = self.state_dir.path / "database_url"
        if self.tenancy is None or self.tenancy.store is None:
            path.unlink(missing_ok=True)
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.tenancy.store.url + "\n")

    def write_state(self) -> None:
        """STATE/state.json now (the autoscaler calls it after each event)."""
        self._write_state()

    def _write_state(self) -> bool:
        """Write state.json; False when it could not be written (a full state disk)."""
        if self.state_dir.path.exists():
            status = self.status()
            try:
                self.state_dir.write(status)
                if self._targets is not None:  # replicas started, stopped, added or removed
                    refresh_targets(self._targets, status)
            except OSError as exc:  # a full state disk must not stop supervision (restarts)
                _gateway_log.warning("cannot write %s: %s", self.state_dir.state_file, exc)
                return False
        return True
