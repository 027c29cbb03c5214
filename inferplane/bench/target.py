"""A fleet file brought up on the simulator for one benchmark: every replica a simulated
engine, the real gateway in front, all in this process (a private event loop in a thread).

A fleet that lists its GPUs is planned first (`plan_fleet`), and each simulated engine
gets its instance's GPU type, TP, utilization, KV pool, max_num_seqs and batch budget -
what `inferplane up` would start - so the engines queue and preempt where vLLM would.
`gpus: discover` fleets run each model as the fleet file says, on the simulator's GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from inferplane.errors import InferplaneError

if TYPE_CHECKING:
    from inferplane.planner.plan import Plan
    from inferplane.sim.config import SimEngineConfig
    from inferplane.sim.host import EngineHandle
    from inferplane.sim.timing import Calibration
    from inferplane.spec import FleetSpec


@dataclass(frozen=True)
class SimReplica:
    model: str  # client-facing fleet model name
    config: SimEngineConfig


@dataclass
class SimTarget:
    url: str  # the gateway
    models: list[str]  # generative models, client-facing names
    engine_urls: list[str] = field(default_factory=list)
    replicas: list[SimReplica] = field(default_factory=list)
    plan: Plan | None = None


def _model_dir(source: str | None) -> Path | None:
    if source is None:
        return None
    path = Path(source)
    return path if (path / "config.json").is_file() else None


def sim_replicas(
    fleet: FleetSpec, plan: Plan | None, calibration: Calibration | None = None
) -> list[SimReplica]:
    """One simulated engine config per replica (per planned instance with a plan)."""
    from dataclasses import replace

    from inferplane.sim.config import DEFAULT_GPU, SimEngineConfig

    out: list[SimReplica] = []
    if plan is not None:
        for inst in plan.instances:
            model = fleet.model(inst.model)
            assert model is not None
            if inst.spans_nodes:
                raise InferplaneError(
                    f"{inst.model} spans {inst.pipeline_parallel_size} nodes; the simulator "
                    "runs one engine per replica", field=f"models.{inst.model}",
                    fix="bench a fleet whose replicas fit one node",
                )
            out.append(SimReplica(inst.model, SimEngineConfig(
                model=inst.served_model_name, model_dir=_model_dir(model.source),
                gpu=inst.gpu_type, tensor_parallel_size=inst.tensor_parallel_size,
                max_model_len=inst.max_model_len, max_num_seqs=inst.max_num_seqs,
                max_num_batched_tokens=inst.max_num_batched_tokens,
                gpu_memory_utilization=inst.gpu_memory_utilization,
                kv_cache_memory_bytes=inst.kv_cache_memory_bytes,
            )))
    else:
        gpu = DEFAULT_GPU
        if fleet.gpus is not None and fleet.gpus.nodes:
            gpu = fleet.gpus.nodes[0].gpu_type
        for model in fleet.placed_models:
            for _ in range(model.replicas):
                out.append(SimReplica(model.name, SimEngineConfig(
                    model=model.engine_model_name, model_dir=_model_dir(model.source), gpu=gpu,
                    tensor_parallel_size=(model.tensor_parallel_size
                                          if isinstance(model.tensor_parallel_size, int)
                                          else 1),
                    max_model_len=(model.max_model_len
                                   if isinstance(model.max_model_len, int) else None),
                    max_num_seqs=model.max_num_seqs,
                    max_num_batched_tokens=model.max_num_batched_tokens,
                )))
    if calibration is not None:
        out = [SimReplica(r.model, replace(r.config, calibration=calibration)) for r in out]
    return out


def timing_band_lines(replicas: list[SimReplica]) -> list[str]:
    """The simulator's measured error band (or what no data backs) per distinct model and
    GPU type of the replicas (inferplane.sim.error_bands)."""
    from inferplane.gpus import lookup_gpu
    from inferplane.sim.build import resolve_profile
    from inferplane.sim.error_bands import band_lines
    from inferplane.sim.formats import weight_format

    lines: list[str] = []
    seen: set[tuple[str, str]] = set()
    for replica in replicas:
        key = (replica.model, replica.config.gpu)
        if key in seen:
            continue
        seen.add(key)
        profile = resolve_profile(replica.config)
        if profile.default_task != "generate":
            continue  # embeddings: no published serving runs are replayed
        method = profile.quantization.method if profile.quantization else None
        lines += band_lines(replica.model, lookup_gpu(replica.config.gpu), profile.is_moe,
                            weight_format(method))
    return lines


class FleetOnSim:
    """`with FleetOnSim(path) as target:` - the fleet's gateway URL and models."""

    def __init__(self, fleet_path: Path, *, calibration: Calibration | None = None) -> None:
        self.fleet_path = fleet_path
        self.calibration = calibration
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._handles: list[EngineHandle] = []
        self._server: Any = None
        self._server_task: asyncio.Task[None] | None = None

    def __enter__(self) -> SimTarget:
        from inferplane.spec import load_fleet

        fleet = load_fleet(self.fleet_path)
        plan = None
        if fleet.gpus is not None and fleet.placed_models:
            from inferplane.planner.build import plan_fleet

            plan = plan_fleet(fleet, fleet_file=str(self.fleet_path))
        replicas = sim_replicas(fleet, plan, self.calibration)
        if not replicas:
            raise InferplaneError("the fleet has no replica to simulate",
                                  location=str(self.fleet_path),
                                  fix="bench a fleet with models that run on engines")
        self._thread.start()
        future: Future[SimTarget] = asyncio.run_coroutine_threadsafe(
            self._start(fleet, plan, replicas), self.loop
        )
        try:
            return future.result(timeout=120)
        except BaseException:
            self._shutdown()
            raise

    async def _start(self, fleet: FleetSpec, plan: Plan | None,
                     replicas: list[SimReplica]) -> SimTarget:
        import uvicorn

        from inferplane.gateway import Backend, build_app
        from inferplane.gateway.fleet import gateway_config_from_fleet
        from inferplane.gateway.server import uvicorn_config
        from inferplane.sim.host import start_engines

        self._handles = await start_engines([r.config for r in replicas])
        from dataclasses import replace

        app = build_app(replace(gateway_config_from_fleet(fleet, plan), access_log=False))
        by_model: dict[str, list[Backend]] = {}
        for replica, handle in zip(replicas, self._handles, strict=True):
            mine = by_model.setdefault(replica.model, [])
            mine.append(Backend(handle.url, ready=True, name=f"{replica.model}-{len(mine)}"))
        for model, backends in by_model.items():
            app.state.set_backends(model, backends)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))

        class _Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        self._server = _Quiet(uvicorn_config(app, "127.0.0.1", 0, timeout_graceful_shutdown=1))
        self._server_task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock])
        )
        while not self._server.started:
            if self._server_task.done():
                self._server_task.result()
            await asyncio.sleep(0.005)
        generative = [m.name for m in fleet.placed_models if m.task != "embed"]
        return SimTarget(
            url=f"http://127.0.0.1:{sock.getsockname()[1]}",
            models=[m for m in generative if m in by_model],
            engine_urls=[h.url for h in self._handles], replicas=replicas, plan=plan,
        )

    async def _stop(self) -> None:
        from inferplane.sim.host import stop_engines

        if self._server is not None and self._server_task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._server_task
        await stop_engines(self._handles)

    def _shutdown(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._shutdown()
