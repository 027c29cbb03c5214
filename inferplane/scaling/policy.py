"""Replica decisions for one model from what the fleet shows (pure: no I/O, no clock).

Signals (P46): requests waiting per replica - the engines' `vllm:num_requests_waiting`
plus the gateway's own admission queue for the model - against `target_waiting_requests`;
optionally the KV-cache usage against `target_kv_cache_usage`. The rules (P50):

- **up** when the *mean* of the signal over the last `scale_up_window_s` is above its
  target (as HPA/KEDA average a metric over their window), with a whole window observed at
  this replica count; one replica at a time, never while a replica is still starting (its
  capacity is on the way). A bursty load - bursts of requests with short gaps, more waiting
  than the target on average - scales up within a window although the signal dips between
  bursts; one short spike does not (its mean over the window stays low);
- **down** after `scale_down_window_s` *idle* - nothing waiting and what is in flight
  would fit on one replica fewer at half their concurrency cap - one replica at a time;
- **no opposite move within `stabilization_s`** of the last move;
- **bounds** at once: below `min_replicas` up, above `max_replicas` down;
- **scale from zero** at once: a request held for a model with no replica starts one
  (the window would only make the held request wait longer).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from inferplane.spec import ModelScaling, ScalingPolicy

Action = Literal["scale_up", "scale_down"]


@dataclass(frozen=True)
class Observation:
    """One model at one moment."""

    replicas: int  # running or starting, awake (not draining, not asleep)
    starting: int = 0  # of those, not ready yet
    waiting: float = 0.0  # engine queues summed + the gateway's queue for the model
    in_flight: int = 0  # requests the gateway has sent to the model's replicas
    capacity_per_replica: int = 256  # the gateway's concurrency cap (max_num_seqs)
    kv_usage: float | None = None  # highest over ready replicas; None: unknown
    held: int = 0  # requests waiting because no replica is awake (scale from zero)
    needed: int | None = None  # SLA mode: replicas the performance model asks for
    sla: str = ""  # SLA mode: predicted vs observed latency, for the reason


@dataclass(frozen=True)
class Decision:
    model: str
    action: Action
    current: int
    desired: int
    reason: str
    at: float


class ModelAutoscaler:
    """The state one model's decisions need: since when the signal is high or idle, and
    when the last move was."""

    def __init__(self, model: str, bounds: ModelScaling, policy: ScalingPolicy) -> None:
        self.model = model
        self.bounds = bounds
        self.policy = policy
        self.high_since: float | None = None  # since when the window's mean is above target
        self.idle_since: float | None = None
        # (time, waiting per replica, KV usage) at this replica count, the last window's
        self.samples: deque[tuple[float, float, float | None]] = deque()
        self.samples_since: float | None = None  # first sample at this replica count
        self.samples_replicas: int | None = None
        self.last_up_at: float | None = None
        self.last_down_at: float | None = None
        self.desired: int | None = None
        self.last: Decision | None = None
        self.signal = ""  # what the last observation showed, for status

    def _decide(self, now: float, obs: Observation, action: Action, desired: int,
                reason: str) -> Decision:
        d = Decision(self.model, action, obs.replicas, desired, reason, now)
        self._reset_samples()
        if action == "scale_up":
            self.last_up_at = now
            self.high_since = None
        else:
            self.last_down_at = now
            self.idle_since = None
        self.desired = desired
        self.last = d
        return d

    def _reset_samples(self) -> None:
        self.samples.clear()
        self.samples_since = self.samples_replicas = None

    def _window_mean(self, now: float, obs: Observation, per_replica: float
                     ) -> tuple[float, float | None, bool]:
        """The mean waiting per replica (and KV usage) over the last `scale_up_window_s`
        at this replica count, and whether a whole window has been observed."""
        window = self.policy.scale_up_window_s
        if self.samples_replicas != obs.replicas:
            self._reset_samples()
            self.samples_replicas = obs.replicas
        if self.samples_since is None:
            self.samples_since = now
        self.samples.append((now, per_replica, obs.kv_usage))
        while self.samples and self.samples[0][0] < now - window:
            self.samples.popleft()
        waiting = sum(s[1] for s in self.samples) / len(self.samples)
        kv = [s[2] for s in self.samples if s[2] is not None]
        return waiting, (sum(kv) / len(kv) if kv else None), now - self.samples_since >= window

    def _stable(self, now: float, last_opposite: float | None) -> bool:
        return last_opposite is None or now - last_opposite >= self.policy.stabilization_s

    def observe(self, now: float, obs: Observation) -> Decision | None:
        """The decision this observation calls for, or None (hold)."""
        p, b, n = self.policy, self.bounds, obs.replicas
        per_replica = obs.waiting / max(n, 1)
        self.signal = f"{per_replica:g} waiting per replica (target {p.target_waiting_requests})"
        if obs.kv_usage is not None and p.target_kv_cache_usage is not None:
            self.signal += f", KV {obs.kv_usage:.0%} (target {p.target_kv_cache_usage:.0%})"
        if self.desired is None:
            self.desired = n
        if n < b.min_replicas and obs.starting == 0:
            return self._decide(now, obs, "scale_up", b.min_replicas,
                                f"{n} replicas is below min_replicas {b.min_replicas}")
        if n > b.max_replicas:
            return self._decide(now, obs, "scale_down", b.max_replicas,
                                f"{n} replicas is above max_replicas {b.max_replicas}")
        if n == 0:
            if obs.held > 0 or obs.waiting > 0:
                held = max(obs.held, int(obs.waiting))
                return self._decide(now, obs, "scale_up", 1,
                                    f"{held} request(s) held at zero replicas (scale from zero)")
            self.high_since = self.idle_since = None
            return None
        mean, mean_kv, whole = self._window_mean(now, obs, per_replica)
        high = mean > p.target_waiting_requests
        if p.target_kv_cache_usage is not None and mean_kv is not None:
            high = high or mean_kv > p.target_kv_cache_usage
        idle = obs.waiting == 0 and obs.in_flight <= (n - 1) * obs.capacity_per_replica / 2
        step = n + 1
        if obs.needed is not None:  # SLA mode: the model's count, besides the queue
            self.signal += f"; SLA: {obs.needed} needed ({obs.sla})"
            high = high or obs.needed > n
            idle = obs.waiting == 0 and obs.needed < n
            step = max(step, min(obs.needed, b.max_replicas))
        if high:
            self.idle_since = None
            if self.high_since is None:
                self.high_since = now
            if (
                (whole or (obs.needed is not None and obs.needed > n
                 and now - self.high_since >= p.scale_up_window_s))
                and n < b.max_replicas
                and obs.starting == 0
                and self._stable(now, self.last_down_at)
            ):
                return self._decide(
                    now, obs, "scale_up", step,
                    f"{self.signal}; mean {mean:.3g} waiting per replica over the last "
                    f"window {p.scale_up_window_s:g} s",
                )
            return None
        self.high_since = None
        if not idle or n <= b.min_replicas:
            self.idle_since = None
            return None
        if self.idle_since is None:
            self.idle_since = now
        idle_s = now - self.idle_since
        if idle_s >= p.scale_down_window_s and self._stable(now, self.last_up_at):
            return self._decide(
                now, obs, "scale_down", n - 1,
                f"idle for {idle_s:.3g} s (window {p.scale_down_window_s:g} s): nothing "
                f"waiting, {obs.in_flight} in flight fit on {n - 1} replica(s)",
            )
        return None
