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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import uvicorn

from inferplane.engines.sim.config import FaultConfig
from inferplane.errors import InferplaneError
from inferplane.gateway import Backend, GatewayApp, build_app
from inferplane.gateway.fleet import gateway_config_from_fleet
from inferplane.gateway.server import uvicorn_config
from inferplane.gpus.nvml import NvmlApi
from inferplane.planner.plan import Plan
from inferplane.runtime import registry
from inferplane.runtime.channel import ControlServer
from inferplane.runtime.drain import DEFAULT_GRACE_PERIOD_S, DrainGate
from inferplane.runtime.instances import Instance, plan_sim_instances, plan_simulated
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
    preflight_host,
)
from inferplane.spec import FleetSpec
from inferplane.tenancy.service import Tenancy

Phase = Literal["starting", "running", "draining", "stopped"]


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
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InferplaneError(
            f"the gateway cannot listen on {host}:{port}: {exc.strerror}",
            field="gateway.port",
            value=port,
            fix="stop what uses that port, or set gateway.port (or --gateway-port) to another",
        ) from exc
    sock.listen(4096)
    sock.setblocking(False)
    return sock


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
            from inferplane.tenancy.wiring import build_tenancy, state_dir_database_url

            self.tenancy = build_tenancy(
                fleet, options.database_url,
                default_db=state_dir_database_url(options.state_dir),
            )
        self.gateway: GatewayApp = build_app(config, self.tenancy)
        self.gate = DrainGate(self.gateway)
        self.backends: dict[str, list[Backend]] = {}
        self._by_instance: dict[str, Backend] = {}
        for inst in self.instances:
            backend = Backend(inst.url, ready=False)
            self.backends.setdefault(inst.model, []).append(backend)
            self._by_instance[inst.name] = backend
        self.supervisor = Supervisor(
            self.instances, self.state_dir.log_dir, options.settings, self._on_change, prepare,
            drain_instance=self._drain_instance,
        )  # fmt: skip
        gw_spec = fleet.gateway  # engines never see the gateway's tokens
        self.supervisor.hidden_env = frozenset(
            name for name in (gw_spec.admin_token_env, gw_spec.metrics_token_env) if name
        )
        self.gateway_url = ""
        self._server: _GatewayServer | None = None
        self._server_task: asyncio.Task[None] | None = None
        self._started_at = time.time()
        self._stop_requested = asyncio.Event()
        self._forced = False
        self.control: ControlServer | None = None
        self._gateway_log: list[tuple[logging.Logger, logging.Handler]] | None = None

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
            # The same server settings as `inferplane gateway`: httptools with the
            # connection bounds (timeouts, head size, cap, TCP_NODELAY on every socket).
            config = uvicorn_config(
                self.gate, host, port, self.gateway.connections, timeout_graceful_shutdown=5
            )
            # after uvicorn's logging config (it replaces the handlers of its loggers)
            self._gateway_log = _open_gateway_log(self.state_dir.log_dir / "gateway.log")
            self._server = _GatewayServer(config)
            self._server_task = asyncio.get_running_loop().create_task(
                self._server.serve(sockets=[sock])
            )
            while not self._server.started:
                if self._server_task.done():
                    self._server_task.result()
                    raise InferplaneError("the gateway stopped while starting")
                await asyncio.sleep(0.01)
            self.supervisor.start()
            if self.options.control:
                self.control = ControlServer(self)
                await self.control.start()
            self._write_state()
            self._write_database_url()
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

    # ---- state -------------------------------------------------------------------------

    def _on_change(self, rec: Supervised) -> None:
        backend = self._by_instance[rec.instance.name]
        ready = rec.state == "ready"
        if backend.ready != ready:
            backend.ready = ready
            # set_backends keeps the same objects and hands free slots to queued requests.
            self.gateway.state.set_backends(rec.instance.model, self.backends[rec.instance.model])
        self._write_state()

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "fleet": self.options.fleet_path,
            "phase": self.phase,
            "started_at": self._started_at,
            "grace_period_s": self.options.grace_period_s,
            "node": self.node,
            "gateway": {"url": self.gateway_url, "in_flight": self.gate.in_flight},
            "endpoint_models": [
                {"model": m.name, "endpoints": list(m.endpoints or [])}
                for m in self.fleet.endpoint_models
            ],
            "instances": [r.to_json() for r in self.supervisor.records.values()],
            "log_dir": str(self.state_dir.log_dir.resolve()),
            "tenancy": self._tenancy_status(),
        }

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

    def _write_state(self) -> None:
        if self.state_dir.path.exists():
            self.state_dir.write(self.status())
