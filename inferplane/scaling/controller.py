"""The local autoscaler and swapper of `inferplane up`: observe, decide, act.

Every `interval_s` (and at once when the gateway holds a request for a model with no
awake replica) each scaled model is observed - its awake replicas, the engines'
`vllm:num_requests_waiting` / `num_requests_running` / KV usage (read from each ready
replica's `/metrics`), the gateway's queue and in-flight count - and its
`ModelAutoscaler` decides. Actions run one at a time per model, through the runtime:

- **up**: wake a sleeping replica of the model if it has one, else place a new one
  (`Placer`: the planner's incremental placement) and start it;
- **down**: the replica whose removal frees the most (whole cards first, then the least
  busy, then the newest) is drained - the gateway stops routing to it, its requests in
  flight finish - then put to sleep (`scaling.models.M.sleep`) or stopped;
- **room**: when the model's replica does not fit next to the awake ones, idle replicas
  of other models above their `min_replicas` yield, least recently used first (sleep
  when their model sleeps, else stop). Nothing busy ever yields: the request waits
  (bounded by the queue's wait) and the next tick tries again.

Each action is an event (`EventLog`) with its reason, and the state is exported as
Prometheus metrics (`ScalingMetrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferplane.aio import cancel_and_wait
from inferplane.engines import engine_for, read_metrics
from inferplane.engines import metrics as vocabulary
from inferplane.errors import InferplaneError
from inferplane.gateway.engine_metrics import parse_engine_load
from inferplane.gateway.metrics import GatewayMetrics
from inferplane.scaling.events import EventLog
from inferplane.scaling.metrics import ModelState, ScalingMetrics
from inferplane.scaling.policy import Decision, ModelAutoscaler, Observation
from inferplane.scaling.sla import SlaTracker, replica_model_for

if TYPE_CHECKING:
    from inferplane.runtime.runner import Runtime

log = logging.getLogger("inferplane.scaling")
# The engines the autoscaler reads all speak vLLM's metric names (the simulator too).
_METRICS = engine_for("vllm").metrics
_LATENCIES = (vocabulary.INTER_TOKEN_LATENCY, vocabulary.TIME_TO_FIRST_TOKEN)


def gateway_totals(metrics: GatewayMetrics, model: str) -> tuple[float, float, float]:
    """(finished requests, prompt tokens, completion tokens) the gateway counted for
    `model` so far. The gateway keeps per-request counts pending until its registry is
    collected (gateway/metrics.py); fold them first, or these stay at the last scrape's
    values (none at all when nothing scrapes) and the SLA rate and mix go stale."""
    metrics.fold()
    return (_count(metrics.requests, model),
            _count(metrics.tokens, model, kind="prompt"),
            _count(metrics.tokens, model, kind="completion"))


def _count(counter: Any, model: str, **labels: str) -> float:
    """A prometheus Counter's total over the series of `model` (matching `labels`)."""
    total = 0.0
    for metric in counter.collect():
        for sample in metric.samples:
            if (sample.name.endswith("_total") and sample.labels.get("model") == model
                    and all(sample.labels.get(k) == v for k, v in labels.items())):
                total += sample.value
    return total


@dataclass
class _Busy:
    last_busy: float  # monotonic time the replica last had requests in flight


class ScalingController:
    def __init__(
        self,
        runtime: Runtime,
        events: EventLog,
        *,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime
        self.events = events
        self.clock = clock
        fleet = runtime.fleet
        self.scalers: dict[str, ModelAutoscaler] = {
            name: ModelAutoscaler(name, bounds, fleet.scaling.policy_for(name))
            for name, bounds in fleet.scaling.models.items()
            if name in runtime.gateway.state.pools
        }
        if interval_s is None:
            shortest = min(
                (min(s.policy.scale_up_window_s, s.policy.scale_down_window_s)
                 for s in self.scalers.values()), default=1.0,
            )
            interval_s = max(0.05, min(2.0, shortest / 4))
        self.interval_s = interval_s
        self.metrics = ScalingMetrics(runtime.gateway.metrics.registry, self._states)
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._acting: dict[str, asyncio.Task[None]] = {}
        self._busy: dict[str, _Busy] = {}
        self._refused: dict[str, str] = {}  # model -> the last refusal logged
        self._texts: dict[str, str] = {}  # backend url -> its last engine /metrics text
        self._sla: dict[str, SlaTracker] = {}  # SLA-mode models (built when first needed)
        self.errors = 0
        self.exclusive: list[tuple[str, str]] = []  # models that can only swap
        if runtime.plan is not None and len(self.scalers) > 1:
            from inferplane.scaling.placement import not_awake_together, planner_placer

            try:
                self.exclusive = not_awake_together(
                    fleet, runtime.plan, list(self.scalers),
                    runtime.options.placer or planner_placer(),
                )
            except InferplaneError:
                self.exclusive = []
            for a, b in self.exclusive:
                log.info("%s and %s cannot be awake together on this inventory: they swap",
                         a, b)

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self.check_host_ram()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def check_host_ram(self, total_bytes: int | None = None) -> str | None:
        """Level-1 sleepers keep their weights in host RAM: warn (an event) when every
        replica of the level-1 models asleep at once would not fit. A model that has no
        planned replica yet is counted once it has one."""
        plan = self.runtime.plan
        if plan is None:
            return None
        need = 0
        names = []
        for model, scaler in self.scalers.items():
            sleep = scaler.bounds.sleep
            planned = plan.instances_of(model)
            if sleep is None or sleep.level != 1 or not planned:
                continue
            need += planned[0].weights_bytes * scaler.bounds.max_replicas
            names.append(model)
        if total_bytes is None:
            import psutil

            total_bytes = psutil.virtual_memory().total
        if not names or need <= total_bytes * 0.9:
            return None
        why = (f"sleep level 1 keeps weights in host RAM: {', '.join(names)} asleep at "
               f"max_replicas need {need / 2**30:.1f} GiB, this host has "
               f"{total_bytes / 2**30:.1f} GiB; replicas that do not fit sleep at level 2")
        for model in names:
            self.events.add(model, "warning", why, 0, 0)
        log.warning("%s", why)
        return why

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._acting.values()) if t is not None]
        await cancel_and_wait(*tasks)
        self._task = None
        self._acting.clear()

    def activate(self, model: str) -> bool:
        """The gateway asks for `model`, which has no awake replica: True when a replica
        is starting or waking (or will, now), so the request is held instead of a 503."""
        scaler = self.scalers.get(model)
        if scaler is None or self.runtime.phase in ("draining", "stopped"):
            return False
        rt = self.runtime
        awake = rt.awake_replicas(model)
        # starting, or draining to sleep or stop (yielding its GPU): capacity comes back
        moving = any(rt.supervisor.records[n].state == "starting" or rt.parked(n)
                     for n in awake)
        if awake and not moving and model not in self._acting:
            return False  # replicas exist but none is routable: the supervisor's business
        self._kick.set()
        return True

    def held(self, model: str, seconds: float) -> None:
        self.metrics.hold.labels(model).observe(seconds)

    # ---- the loop -----------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.interval_s)
            self._kick.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop never dies: count, log, go on
                self.errors += 1
                log.warning("autoscaler tick failed: %s: %s", type(exc).__name__, exc)

    async def tick(self) -> list[Decision]:
        if self.runtime.phase in ("draining", "stopped"):
            return []
        decisions: list[Decision] = []
        await self._read_engines()
        now = self.clock()
        for model, scaler in self.scalers.items():
            if model in self._acting:
                continue
            decision = scaler.observe(now, self.observe(model))
            if decision is None:
                continue
            decisions.append(decision)
            self.metrics.decisions.labels(model, decision.action).inc()
            self._acting[model] = asyncio.get_running_loop().create_task(
                self._act(decision)
            )
        return decisions

    async def _read_engines(self) -> None:
        loop = asyncio.get_running_loop()
        session = self.runtime.gateway.session()
        jobs = []
        for model in self.scalers:
            for name in self.runtime.awake_replicas(model):
                backend = self.runtime.backend_of(name)
                if backend.ready:
                    jobs.append(self._read_one(session, backend, loop.time()))
        if jobs:
            await asyncio.gather(*jobs)

    async def _read_one(self, session: Any, backend: Any, now: float) -> None:
        import aiohttp

        try:
            async with session.get(backend.url + "/metrics",
                                   timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                text = await resp.text() if resp.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, OSError):
            text = ""
        if text:
            backend.engine = parse_engine_load(text, now)
            self._texts[backend.url] = text

    def observe(self, model: str) -> Observation:
        rt = self.runtime
        pool = rt.gateway.state.pools[model]
        names = rt.awake_replicas(model)
        now = self.clock()
        waiting = float(len(pool.queue))
        in_flight = 0
        kv: float | None = None
        starting = 0
        for name in names:
            rec = rt.supervisor.records[name]
            backend = rt.backend_of(name)
            if rec.state != "ready":
                starting += rec.state in ("starting", "restarting")
                continue
            in_flight += backend.outstanding
            if backend.outstanding > 0 or name not in self._busy:
                self._busy[name] = _Busy(now)
            load = backend.engine
            if load is not None:
                waiting += load.waiting
                kv = load.kv_usage if kv is None else max(kv, load.kv_usage)
        held = len(pool.queue) if not pool.any_routable() else 0
        needed: int | None = None
        note = ""
        scaler = self.scalers[model]
        if scaler.policy.sla_mode:
            tracker = self._tracker(model)
            loads = [rt.backend_of(n).engine for n in names]
            running = sum(load.running for load in loads if load is not None)
            ready = [n for n in names if rt.supervisor.records[n].state == "ready"]
            texts = [self._texts.get(rt.backend_of(n).url, "") for n in ready]
            readings = [read_metrics(t, _METRICS, _LATENCIES) for t in texts]
            itl = [r.histogram(vocabulary.INTER_TOKEN_LATENCY) for r in readings]
            ttft = [r.histogram(vocabulary.TIME_TO_FIRST_TOKEN) for r in readings]
            buckets: dict[float, float] = {}
            for b, _, _ in ttft:
                for le, v in b.items():
                    buckets[le] = buckets.get(le, 0.0) + v
            finished, prompt_tokens, completion_tokens = gateway_totals(rt.gateway.metrics,
                                                                        model)
            tracker.update(
                now, finished=finished, prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                backlog=in_flight + len(pool.queue),
                itl=(sum(x[1] for x in itl), sum(x[2] for x in itl)), ttft_buckets=buckets,
                running=running / max(1, len(ready)),
            )
            estimate, note = tracker.estimate(scaler.bounds.max_replicas)
            needed = max(scaler.bounds.min_replicas, estimate.replicas)
        return Observation(
            replicas=len(names), starting=starting, waiting=waiting, in_flight=in_flight,
            capacity_per_replica=pool.cap, kv_usage=kv, held=held, needed=needed, sla=note,
        )

    def _tracker(self, model: str) -> SlaTracker:
        tracker = self._sla.get(model)
        if tracker is None:
            rt = self.runtime
            spec = rt.fleet.model(model)
            assert spec is not None
            planned = [i for i in rt.plan.instances if i.model == model] if rt.plan else []
            if planned:
                gpu, tp = planned[0].gpu_type, planned[0].tensor_parallel_size
                max_len: int | None = planned[0].max_model_len
            else:
                from inferplane.runtime.instances import _sim_gpu

                gpu = _sim_gpu(rt.fleet)
                tp = spec.tensor_parallel_size if isinstance(spec.tensor_parallel_size,
                                                             int) else 1
                max_len = spec.max_model_len if isinstance(spec.max_model_len, int) else None
            policy = self.scalers[model].policy
            tracker = self._sla[model] = SlaTracker(
                replica_model_for(spec.source, spec.engine_model_name, gpu=gpu, tp=tp,
                                  max_num_seqs=rt.gateway.state.pools[model].cap,
                                  max_model_len=max_len),
                ttft_target_s=policy.target_ttft_p95_s, itl_target_s=policy.target_itl_p95_s,
                halflife_s=policy.scale_up_window_s / 2,
            )
        return tracker

    # ---- acting -------------------------------------------------------------------------

    async def _act(self, d: Decision) -> None:
        try:
            if d.action == "scale_up":
                await self._scale_up(d)
            else:
                await self._scale_down(d)
        except asyncio.CancelledError:
            raise
        except InferplaneError as exc:
            self._refuse(d, str(exc))
        except Exception as exc:
            self.errors += 1
            self._refuse(d, f"{type(exc).__name__}: {exc}", kind="failed")
        finally:
            self._acting.pop(d.model, None)
            self.runtime.write_state()  # status shows the event
            self._kick.set()  # held requests may be waiting on the next decision

    def _refuse(self, d: Decision, why: str, kind: str = "refused") -> None:
        scaler = self.scalers[d.model]
        scaler.desired = d.current
        if self._refused.get(d.model) != why:  # one event per distinct refusal
            self._refused[d.model] = why
            self.events.add(d.model, kind, f"{d.action} not done: {why}", d.current, d.current)
            log.warning("%s: %s not done: %s", d.model, d.action, why)

    async def _scale_up(self, d: Decision) -> None:
        rt = self.runtime
        from_zero = d.current == 0
        asleep = rt.asleep_replicas(d.model)
        if asleep:
            name = asleep[0]
            await self._make_room(d.model, name)
            level = rt.asleep_level(name)
            seconds = await rt.wake_replica(name)
            self._refused.pop(d.model, None)
            self.events.add(d.model, "wake", f"{d.reason}; woke {name} (sleep level {level}) "
                            f"in {seconds:.2f} s", d.current, d.current + 1, name)
            if from_zero:
                self.metrics.cold_starts.labels(d.model, "wake").inc()
            return
        names = []
        for _ in range(max(1, d.desired - d.current)):
            names.append(await rt.add_replica(d.model, self.yield_candidates(d.model),
                                              self._make_room_for_new))
        self._refused.pop(d.model, None)
        self.events.add(d.model, "scale_up", f"{d.reason}; started {', '.join(names)}",
                        d.current, d.current + len(names), names[0])
        if from_zero:
            self.metrics.cold_starts.labels(d.model, "start").inc()

    async def _scale_down(self, d: Decision) -> None:
        rt = self.runtime
        name = rt.pick_victim(d.model)
        sleep = self.scalers[d.model].bounds.sleep
        if sleep is not None:
            level = await rt.sleep_replica(name, sleep.level)
            self.events.add(d.model, "sleep", f"{d.reason}; {name} asleep (level {level})",
                            d.current, d.current - 1, name)
        else:
            drained = await rt.remove_replica(name)
            note = "" if drained else " (grace period over: requests in flight were cut)"
            self.events.add(d.model, "scale_down", f"{d.reason}; drained and stopped {name}"
                            f"{note}", d.current, d.current - 1, name)
        self._busy.pop(name, None)

    # ---- room on the GPUs ---------------------------------------------------------------

    def yield_candidates(self, model: str) -> list[str]:
        """Awake, idle replicas of other models above their floor, LRU first."""
        rt = self.runtime
        out: list[tuple[float, str]] = []
        for other, scaler in self.scalers.items():
            if other == model or other in self._acting:
                continue
            pool = rt.gateway.state.pools[other]
            names = rt.awake_replicas(other)
            spare = len(names) - scaler.bounds.min_replicas
            if spare <= 0 or len(pool.queue):
                continue
            idle = [n for n in names if rt.backend_of(n).outstanding == 0]
            idle.sort(key=lambda n: self._busy[n].last_busy if n in self._busy else 0.0)
            out += [(self._busy[n].last_busy if n in self._busy else 0.0, n)
                    for n in idle[:spare]]
        return [n for _, n in sorted(out)]

    async def _make_room(self, model: str, name: str) -> None:
        """Make the asleep replica `name` fit next to the awake ones (others yield)."""
        rt = self.runtime
        needed = rt.yielders_for_wake(name, self.yield_candidates(model))
        if needed is None:
            raise InferplaneError(
                f"no room to wake {name}: the replicas on its GPUs are busy or at their "
                "min_replicas", field=f"scaling.models.{model}", value=name,
                fix="it is tried again while requests wait; lower another model's "
                "min_replicas to let it yield",
            )
        for victim in needed:
            await self._yield(victim, f"its GPU is needed to wake {name} ({model})")

    async def _make_room_for_new(self, model: str, victims: list[str]) -> None:
        for victim in victims:
            await self._yield(victim, f"its GPU is needed for a new replica of {model}")

    async def _yield(self, name: str, why: str) -> None:
        rt = self.runtime
        other = rt.model_of(name)
        before = len(rt.awake_replicas(other))
        sleep = self.scalers[other].bounds.sleep
        if sleep is not None:
            level = await rt.sleep_replica(name, sleep.level)
            self.events.add(other, "sleep", f"yields: {why}; {name} asleep (level {level})",
                            before, before - 1, name)
        else:
            await rt.remove_replica(name)
            self.events.add(other, "scale_down", f"yields: {why}; drained and stopped {name}",
                            before, before - 1, name)
        scaler = self.scalers[other]
        scaler.desired = before - 1
        scaler.last_down_at = self.clock()

    # ---- state --------------------------------------------------------------------------

    def _states(self) -> list[ModelState]:
        rt = self.runtime
        out = []
        for model, s in self.scalers.items():
            last = s.last
            current = len(rt.awake_replicas(model))
            out.append(ModelState(
                model, s.desired if s.desired is not None else current, current,
                len(rt.asleep_replicas(model)),
                last.action if last else None, last.reason if last else None,
                time.time() - (self.clock() - last.at) if last else None,
            ))
        return out

    def status(self) -> dict[str, Any]:
        models = {}
        for state in self._states():
            scaler = self.scalers[state.model]
            models[state.model] = {
                "min_replicas": scaler.bounds.min_replicas,
                "max_replicas": scaler.bounds.max_replicas,
                "desired": state.desired,
                "current": state.current,
                "asleep": state.sleeping,
                "signal": scaler.signal,
                "last_decision": (
                    {"action": state.last_action, "reason": state.last_reason,
                     "at": state.last_at} if state.last_action else None
                ),
            }
        return {"models": models, "events": self.events.recent(20), "errors": self.errors,
                "not_awake_together": [list(pair) for pair in self.exclusive]}
