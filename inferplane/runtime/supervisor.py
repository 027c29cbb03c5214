"""Supervision of engine processes: readiness, liveness watchdog, restarts with backoff.

Readiness (P24, P36): the port accepts, `GET /health` answers 200 and a first `GET
/v1/models` succeeds and lists the served name (paths from the engine boundary,
`Engine.endpoints`). Liveness (P25): `GET /health` every `probe_interval_s`; a failure
or a hang (no answer within `probe_timeout_s`) marks the instance unhealthy at once (the
gateway stops routing to it), `failure_threshold` consecutive failures restart it. A dead
process is restarted. Restarts back off exponentially; more than `crash_loop_limit`
restarts within `crash_loop_window_s` mark the instance `failed` and stop trying.
An engine that exits on its own is a crash whatever its exit code: real vLLM answers
`/health` 503 when its engine core dies and then exits with code 0, so a code 0 after a
503 is reported as the engine's death (restarted and counted, never a clean stop).

Supervision itself never dies: an exception anywhere in a health check, a start or a state
callback is logged, counted (`supervisor_errors`) and retried with backoff, and a check the
supervisor could not make (no file descriptors left, P30) is not an engine failure: the
record says `check_error` until a probe answers again, and `checked_at` says when one last
did, so `status` shows that it cannot check instead of a stale `ready`.

A manual restart drains first (`drain_instance`, as `down` does): the instance leaves
`ready` (the gateway stops routing to it) and is stopped once its requests in flight are
done or the drain hook gives up.

Start order (vLLM sizes its memory from whole-device deltas, so concurrent starts on one
card mis-size each other): an instance waits until every instance in its `start_after` is
ready (or failed for good); instances on a common GPU hold that GPU from spawn until ready,
so they start strictly one after another; at most `max_parallel_starts` start at once.
`prepare` runs right before every start (GPU pinning and free-memory checks for vLLM);
when it refuses (InferplaneError), the refusal counts as a failed start.
An instance's own `startup_deadline_s` (sized from its weights) overrides the default.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp

from inferplane.aio import cancel_and_wait, error_text
from inferplane.engines import Endpoints, engine_for
from inferplane.errors import InferplaneError
from inferplane.runtime.instances import Instance
from inferplane.runtime.process import EngineProcess, RotatingLog, spawn, stopped

InstanceState = Literal["starting", "ready", "unhealthy", "restarting", "stopped", "failed"]

log = logging.getLogger("inferplane.runtime.supervisor")

# Errors that mean this process could not make the check, not that the engine failed it.
_LOCAL_EXHAUSTION = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class CannotCheck(Exception):
    """The supervisor could not run a probe (e.g. out of file descriptors)."""


def _local_exhaustion(exc: BaseException) -> bool:
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _LOCAL_EXHAUSTION:
            return True
        stack += [e.__cause__, e.__context__, getattr(e, "os_error", None)]
    return False


@dataclass(frozen=True)
class SupervisorSettings:
    probe_interval_s: float = 2.0
    probe_timeout_s: float = 5.0
    failure_threshold: int = 3
    startup_deadline_s: float = 300.0  # how long a starting engine may take to be ready
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    crash_loop_limit: int = 5
    crash_loop_window_s: float = 600.0
    stop_timeout_s: float = 15.0  # SIGTERM -> SIGKILL
    max_parallel_starts: int = 4  # instances starting (spawned, not yet ready) at once


@dataclass
class Supervised:
    """The live record of one instance (what `inferplane status` shows)."""

    instance: Instance
    state: InstanceState = "starting"
    restarts: int = 0
    pid: int | None = None
    ready_since: float | None = None  # time.time() of the last transition to ready
    last_error: str | None = None
    process: EngineProcess | None = None
    restart_times: deque[float] = field(default_factory=deque)
    checked_at: float | None = None  # time.time() of the last probe that got an answer
    check_error: str | None = None  # why the supervisor cannot check now (None: it can)
    supervisor_errors: int = 0  # exceptions supervision survived

    def to_json(self) -> dict[str, object]:
        inst = self.instance
        return {
            "name": inst.name,
            "model": inst.model,
            "served_name": inst.served_name,
            "engine": inst.engine,
            "pid": self.pid,
            "port": inst.port,
            "url": inst.url,
            "gpus": list(inst.gpu_indices),
            "node": inst.node or None,
            "cpus": list(inst.cpu_cores),  # cores a CPU engine binds (engine device cpu)
            "startup_deadline_s": inst.startup_deadline_s,
            "state": self.state,
            "restarts": self.restarts,
            "ready_since": self.ready_since,
            "last_error": self.last_error,
            "checked_at": self.checked_at,
            "check_error": self.check_error,
            "supervisor_errors": self.supervisor_errors,
        }


OnChange = Callable[[Supervised], None]
PrepareStart = Callable[[Instance], Instance]  # may raise InferplaneError to refuse
DrainInstance = Callable[[Supervised], Awaitable[None]]  # until its requests are done


def _endpoints(inst: Instance) -> Endpoints:
    return engine_for(inst.engine).endpoints


def exit_reason(returncode: int | None, last_health: str | None) -> str:
    """Why an engine that ended by itself must restart; `last_health` is the first failed
    liveness answer since the last one that passed (None: the last probe passed)."""
    if returncode == 0:
        after = f" after {last_health}" if last_health else ""
        return (f"exited with code 0{after} without being asked to stop: the engine died "
                "(vLLM exits 0 once its engine core is gone); counted as a crash")
    return f"exited with code {returncode}"


async def probe_ready(
    session: aiohttp.ClientSession, inst: Instance, timeout_s: float
) -> str | None:
    """None when the instance is ready, else why not."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    paths = _endpoints(inst)
    try:
        async with session.get(inst.url + paths.health, timeout=timeout) as resp:
            if resp.status != 200:
                return f"{paths.health} answered {resp.status}"
        async with session.get(inst.url + paths.models, timeout=timeout) as resp:
            if resp.status != 200:
                return f"{paths.models} answered {resp.status}"
            data = await resp.json(content_type=None)
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        if _local_exhaustion(exc):
            raise CannotCheck(f"{type(exc).__name__}: {exc}") from exc
        return error_text(exc)  # no address: restart reasons reach clients
    names = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
    if inst.served_name not in names:
        return f"/v1/models lists {names}, not the served name {inst.served_name!r} (P36)"
    return None


async def probe_live(
    session: aiohttp.ClientSession, inst: Instance, timeout_s: float
) -> str | None:
    """None when `/health` answers 200 in time, else why not (a hang is a timeout)."""
    health = _endpoints(inst).health
    try:
        async with session.get(
            inst.url + health, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            return None if resp.status == 200 else f"{health} answered {resp.status}"
    except TimeoutError:
        return f"{health} did not answer within {timeout_s:g} s (hung)"
    except (aiohttp.ClientError, OSError) as exc:
        if _local_exhaustion(exc):
            raise CannotCheck(f"{type(exc).__name__}: {exc}") from exc
        return error_text(exc)  # no address: restart reasons reach clients (issue 30.17)


class Supervisor:
    """Runs and watches every instance; `on_change` hears every state transition."""

    def __init__(
        self,
        instances: list[Instance],
        log_dir: Path,
        settings: SupervisorSettings = SupervisorSettings(),
        on_change: OnChange | None = None,
        prepare: PrepareStart | None = None,
        drain_instance: DrainInstance | None = None,
    ) -> None:
        self.settings = settings
        self._prepare = prepare
        self.drain_instance = drain_instance  # before a manual restart stops the process
        self.hidden_env: frozenset[str] = frozenset()  # never passed to engines (secrets)
        self._stale: set[str] = set()  # instances whose last on_change failed
        # Told why an instance is about to be stopped for a restart (not a manual one,
        # which drains): the runtime ends its requests in flight instead of letting them
        # wait for the kill (a stopped process ignores SIGTERM until `stop_timeout_s`).
        self.on_restart: Callable[[Supervised, str], None] | None = None
        self._gpu_locks: dict[str, asyncio.Lock] = {}
        self._start_slots: asyncio.Semaphore | None = None
        self.log_dir = log_dir
        self.records: dict[str, Supervised] = {i.name: Supervised(i) for i in instances}
        self._on_change = on_change
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False  # set by stop(): nothing restarts after it
        self._session: aiohttp.ClientSession | None = None
        self._logs: dict[str, RotatingLog] = {}
        self._changed = asyncio.Event()
        self._kick: dict[str, asyncio.Event] = {}

    # ---- public ------------------------------------------------------------------------

    def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True)
        )
        self._start_slots = asyncio.Semaphore(max(1, self.settings.max_parallel_starts))
        for name, rec in self.records.items():
            self._kick[name] = asyncio.Event()
            self._tasks[name] = asyncio.get_running_loop().create_task(self._run(rec))

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    async def wait_settled(self, timeout_s: float | None = None) -> bool:
        """Wait until every instance is ready or failed; True when all are ready."""

        async def settled() -> None:
            while not all(r.state in ("ready", "failed") for r in self.records.values()):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(settled(), timeout_s)
        return all(r.state == "ready" for r in self.records.values())

    def restart(self, name: str) -> None:
        """Restart one instance now (counts as a restart; resets `failed`)."""
        rec = self.records[name]
        task = self._tasks.get(name)
        if task is not None and not task.done():
            self._kick[name].set()
            return
        rec.restart_times.clear()
        self._set(rec, "starting")  # a `failed` instance starts over
        self._tasks[name] = asyncio.get_running_loop().create_task(self._run(rec))

    def add(self, instance: Instance) -> Supervised:
        """Supervise one more instance (a replica the autoscaler adds) and start it now."""
        if instance.name in self.records:
            raise InferplaneError(f"instance {instance.name} is already supervised",
                                  field="instance", value=instance.name)
        rec = Supervised(instance)
        self.records[instance.name] = rec
        self._kick[instance.name] = asyncio.Event()
        self._tasks[instance.name] = asyncio.get_running_loop().create_task(self._run(rec))
        self._notify(rec)
        return rec

    async def remove(self, name: str) -> None:
        """Stop supervising one instance and stop its engine (the caller drains it first).
        Its record is `stopped` for the last callback, then forgotten."""
        rec = self.records[name]
        await cancel_and_wait(self._tasks.pop(name, None))
        await self._stop_process(rec)
        rec.state = "stopped"
        self._notify(rec)
        del self.records[name]
        self._kick.pop(name, None)
        rotating = self._logs.pop(name, None)
        if rotating is not None:
            rotating.close()

    async def stop(self) -> None:
        """Stop supervising and stop every engine (SIGTERM, then SIGKILL), in parallel."""
        self._stopping = True  # no restart begins from here on, whatever a task was doing
        await cancel_and_wait(*self._tasks.values())
        await asyncio.gather(*(self._stop_process(r) for r in self.records.values()))
        for rec in self.records.values():
            rec.state = "stopped"
            self._notify(rec)
        if self._session is not None:
            await self._session.close()
        for log in self._logs.values():
            log.close()

    def kill_all(self) -> None:
        """SIGKILL every engine group now (the forced path of a second Ctrl-C)."""
        import signal

        for rec in self.records.values():
            if rec.process is not None:
                rec.process.signal_group(signal.SIGKILL)

    # ---- internals ---------------------------------------------------------------------

    def _notify(self, rec: Supervised) -> None:
        self._changed.set()
        if self._on_change is not None:
            try:
                self._on_change(rec)
            except Exception as exc:  # e.g. the state file cannot be written (EMFILE)
                self._stale.add(rec.instance.name)
                self._survived(rec, "state callback", exc)
            else:
                self._stale.discard(rec.instance.name)

    def _survived(self, rec: Supervised, where: str, exc: BaseException) -> None:
        """Count and log an exception supervision goes on after, and publish it (status
        then says the supervisor cannot check)."""
        rec.supervisor_errors += 1
        rec.check_error = f"{where}: {type(exc).__name__}: {exc}"
        log.warning("%s: supervision survived %s", rec.instance.name, rec.check_error)
        self._publish(rec)

    def _publish(self, rec: Supervised) -> None:
        """Best effort: tell `on_change` (the state file) without a state transition; one
        that fails is retried after the next probe that gets an answer."""
        if self._on_change is not None:
            try:
                self._on_change(rec)
            except Exception:
                self._stale.add(rec.instance.name)
            else:
                self._stale.discard(rec.instance.name)

    def _checked(self, rec: Supervised) -> None:
        """A probe got an answer: the supervisor can check again."""
        rec.checked_at = time.time()
        if rec.check_error is not None or rec.instance.name in self._stale:
            rec.check_error = None
            self._publish(rec)

    def _set(self, rec: Supervised, state: InstanceState, error: str | None = None) -> None:
        if error is not None:
            rec.last_error = error
        if state == "ready" and rec.state != "ready":
            rec.ready_since = time.time()
        elif state != "ready":
            rec.ready_since = None
        rec.state = state
        self._notify(rec)

    async def _stop_process(self, rec: Supervised) -> None:
        proc = rec.process
        if proc is not None:
            await proc.stop(self.settings.stop_timeout_s)
            rec.process = None
            rec.pid = None

    def _log(self, name: str) -> RotatingLog:
        if name not in self._logs:
            self._logs[name] = RotatingLog(self.log_path(name))
        return self._logs[name]

    async def _run(self, rec: Supervised) -> None:
        """Supervise one instance until it fails for good; survives any exception."""
        s = self.settings
        delay = s.backoff_initial_s
        while True:
            try:
                if await self._cycle(rec):
                    return
                delay = s.backoff_initial_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._survived(rec, "supervisor", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, s.backoff_max_s)

    async def _cycle(self, rec: Supervised) -> bool:
        """Start (or go on watching) the instance until it must restart; True when it
        failed for good (crash loop)."""
        s = self.settings
        loop = asyncio.get_running_loop()
        proc = rec.process
        if proc is not None and proc.returncode is None:
            reason: str | None = await self._watch(rec, proc)  # after a survived exception
        else:
            self._kick[rec.instance.name].clear()
            proc, reason = await self._start(rec)
            if reason is None and proc is not None:
                self._set(rec, "ready")
                reason = await self._watch(rec, proc)
        reason = reason or "not started"
        self._set(rec, "unhealthy", reason)
        if reason == "restart requested" and self.drain_instance is not None:
            self._log(rec.instance.name).write("--- draining before the restart\n")
            await self.drain_instance(rec)  # the gateway stopped routing to it above
        elif reason != "restart requested" and self.on_restart is not None:
            try:
                self.on_restart(rec, reason)
            except Exception as exc:
                self._survived(rec, "restart callback", exc)
        self._log(rec.instance.name).write(f"--- restarting: {reason}\n")
        await self._stop_process(rec)
        now = loop.time()
        rec.restart_times.append(now)
        while rec.restart_times and now - rec.restart_times[0] > s.crash_loop_window_s:
            rec.restart_times.popleft()
        if len(rec.restart_times) > s.crash_loop_limit:
            self._set(
                rec,
                "failed",
                f"crash loop: {len(rec.restart_times)} restarts within "
                f"{s.crash_loop_window_s:g} s; last: {reason}",
            )
            return True
        if self._stopping:
            return True  # shutting down: the engine stays stopped
        rec.restarts += 1
        self._set(rec, "restarting")
        delay = min(s.backoff_initial_s * 2 ** (len(rec.restart_times) - 1), s.backoff_max_s)
        await asyncio.sleep(delay)
        self._set(rec, "starting")
        return False

    async def _wait_for_predecessors(self, rec: Supervised) -> None:
        """Until every instance in `start_after` is ready (or failed for good)."""
        waits = [self.records[n] for n in rec.instance.start_after if n in self.records]
        while not all(other.state in ("ready", "failed") for other in waits):
            if self._kick[rec.instance.name].is_set():
                return
            await asyncio.sleep(0.05)

    def _gpu_keys(self, inst: Instance) -> list[str]:
        keys = list(inst.gpu_uuids) or [str(i) for i in inst.gpu_indices]
        return sorted(set(keys))  # one global order: no two starts wait on each other

    async def _start(self, rec: Supervised) -> tuple[EngineProcess | None, str | None]:
        """Spawn the instance and wait until it is ready; (process, why it is not ready)."""
        await self._wait_for_predecessors(rec)
        assert self._start_slots is not None
        held: list[asyncio.Lock] = []
        try:
            for key in self._gpu_keys(rec.instance):
                lock = self._gpu_locks.setdefault(key, asyncio.Lock())
                await lock.acquire()
                held.append(lock)
            async with self._start_slots:
                if self._prepare is not None:
                    try:
                        rec.instance = self._prepare(rec.instance)
                    except InferplaneError as exc:
                        self._log(rec.instance.name).write(f"--- refused to start: {exc}\n")
                        return None, f"refused to start: {exc}"
                proc = await spawn(
                    rec.instance.argv, rec.instance.env, self._log(rec.instance.name),
                    hidden=self.hidden_env,
                )  # fmt: skip
                rec.process, rec.pid = proc, proc.pid
                self._notify(rec)
                return proc, await self._until_ready(rec, proc)
        finally:
            for lock in reversed(held):
                lock.release()

    async def _until_ready(self, rec: Supervised, proc: EngineProcess) -> str | None:
        s = self.settings
        assert self._session is not None
        loop = asyncio.get_running_loop()
        limit_s = rec.instance.startup_deadline_s or s.startup_deadline_s
        deadline = loop.time() + limit_s
        interval = min(0.1, s.probe_interval_s)
        why = "not probed yet"
        while loop.time() < deadline:
            if proc.returncode is not None:
                probed = why if why != "not probed yet" else None
                return exit_reason(proc.returncode, probed or None) + " while starting"
            if self._kick[rec.instance.name].is_set():
                return "restart requested"
            try:
                why = await probe_ready(self._session, rec.instance, s.probe_timeout_s) or ""
            except CannotCheck as exc:
                self._survived(rec, "readiness check", exc)
                why = f"cannot check: {exc}"
            else:
                self._checked(rec)
                if not why:
                    return None
            await asyncio.sleep(interval)
            interval = min(interval * 1.5, s.probe_interval_s)
        return f"not ready within the startup deadline of {limit_s:g} s ({why})"

    async def _watch(self, rec: Supervised, proc: EngineProcess) -> str:
        """Return why the instance must restart (process gone, failures, manual)."""
        s = self.settings
        assert self._session is not None
        # the process itself, not its pipe: vLLM's children keep that open (kill -9)
        exited = asyncio.ensure_future(proc.exited())
        kicked = asyncio.ensure_future(self._kick[rec.instance.name].wait())
        failures = 0
        last_failed: str | None = None  # the first failed liveness answer since one passed
        interval = s.probe_interval_s  # grows while the supervisor cannot check
        try:
            while True:
                done, _ = await asyncio.wait(
                    {exited, kicked}, timeout=interval,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if exited in done:
                    return exit_reason(proc.returncode, last_failed)
                if kicked in done:
                    return "restart requested"
                probe = asyncio.ensure_future(
                    probe_live(self._session, rec.instance, s.probe_timeout_s)
                )
                await asyncio.wait([probe, exited], return_when=asyncio.FIRST_COMPLETED)
                if not probe.done():
                    probe.cancel()
                    return exit_reason(proc.returncode, last_failed)
                try:
                    why = probe.result()
                except Exception as exc:  # CannotCheck, or anything a probe can raise
                    self._survived(rec, "health check", exc)
                    interval = min(interval * 2, s.backoff_max_s)
                    continue
                interval = s.probe_interval_s
                self._checked(rec)
                last_failed = None if why is None else last_failed or why
                if why is None:
                    if failures or rec.state != "ready":
                        failures = 0
                        self._set(rec, "ready")
                    continue
                failures += 1
                if rec.state == "ready":
                    self._set(rec, "unhealthy", why)  # the gateway stops routing now
                if stopped(proc.pid):  # SIGSTOPped: it cannot recover by itself, and its
                    # streams would wait out the failure threshold (issue 30 item 14)
                    return f"the engine process is stopped (SIGSTOP); last check: {why}"
                if failures >= s.failure_threshold:
                    return f"{failures} consecutive failed health checks; last: {why}"
        finally:
            exited.cancel()
            kicked.cancel()
