"""The autoscaler's decisions on a fake clock: windows, stabilization, bounds, zero."""

from __future__ import annotations

import itertools

from inferplane.scaling.policy import ModelAutoscaler, Observation
from inferplane.spec import ModelScaling, ScalingPolicy

POLICY = ScalingPolicy(target_waiting_requests=2, scale_up_window_s=10,
                       scale_down_window_s=30, stabilization_s=60)


def _scaler(min_r: int = 1, max_r: int = 4, policy: ScalingPolicy = POLICY) -> ModelAutoscaler:
    return ModelAutoscaler("chat", ModelScaling(min_replicas=min_r, max_replicas=max_r), policy)


def busy(n: int, waiting: float) -> Observation:
    return Observation(replicas=n, waiting=waiting, in_flight=8 * n, capacity_per_replica=8)


def idle(n: int) -> Observation:
    return Observation(replicas=n, waiting=0, in_flight=0, capacity_per_replica=8)


def test_scale_up_only_after_the_signal_holds_for_the_window() -> None:
    s = _scaler()
    assert s.observe(0, busy(1, 5)) is None
    assert s.observe(9.9, busy(1, 5)) is None
    d = s.observe(10, busy(1, 5))
    assert d is not None and d.action == "scale_up" and (d.current, d.desired) == (1, 2)
    assert "5 waiting per replica (target 2)" in d.reason and "window 10 s" in d.reason


def test_a_dip_does_not_restart_the_window_while_the_mean_stays_above_target() -> None:
    s = _scaler()
    assert s.observe(0, busy(1, 5)) is None
    assert s.observe(6, busy(1, 1)) is None  # below target, but the window's mean is 3
    d = s.observe(10, busy(1, 5))
    assert d is not None and d.action == "scale_up" and "mean 3.67" in d.reason


def test_one_spike_in_a_quiet_window_does_not_scale_up() -> None:
    s = _scaler()
    for t in range(0, 30):
        assert s.observe(float(t), busy(1, 12 if t == 15 else 0)) is None


def test_a_bursty_load_scales_up_within_two_windows() -> None:
    """Bursts of 16 requests with short gaps (on/off well under the window): 8 waiting per
    replica on average against a target of 5. The old rule (above target at every sample
    of the window) never moved; the window's mean does."""
    policy = ScalingPolicy(target_waiting_requests=5, scale_up_window_s=60,
                           scale_down_window_s=600, stabilization_s=300)
    s = _scaler(policy=policy)
    decision = None
    t = 0.0
    while t <= 120 and decision is None:
        waiting = 16 if int(t) % 10 < 5 else 0  # 5 s bursts, 5 s gaps
        decision = s.observe(t, busy(1, waiting))
        t += 1.0
    assert decision is not None and decision.action == "scale_up", decision
    assert decision.at <= 2 * policy.scale_up_window_s


def test_a_window_is_observed_again_at_the_new_replica_count() -> None:
    s = _scaler(policy=ScalingPolicy(target_waiting_requests=2, scale_up_window_s=10,
                                     scale_down_window_s=30, stabilization_s=1))
    s.observe(0, busy(1, 9))
    assert s.observe(10, busy(1, 9)) is not None
    assert s.observe(11, busy(2, 9)) is None  # two replicas now: a fresh window
    assert s.observe(20.9, busy(2, 9)) is None
    assert s.observe(21, busy(2, 9)) is not None


def test_no_second_replica_while_one_is_starting_and_never_above_max() -> None:
    s = _scaler(max_r=2)
    s.observe(0, busy(1, 9))
    assert s.observe(10, busy(1, 9)) is not None
    starting = Observation(replicas=2, starting=1, waiting=20, in_flight=8, capacity_per_replica=8)
    assert s.observe(30, starting) is None
    assert s.observe(50, busy(2, 20)) is None and s.observe(100, busy(2, 20)) is None  # at max


def test_scale_down_after_the_idle_window_one_at_a_time_to_the_floor() -> None:
    s = _scaler(min_r=1, policy=ScalingPolicy(target_waiting_requests=2, scale_up_window_s=10,
                                               scale_down_window_s=30, stabilization_s=5))
    assert s.observe(0, idle(3)) is None
    d = s.observe(30, idle(3))
    assert d is not None and d.action == "scale_down" and d.desired == 2
    assert "idle for 30 s" in d.reason
    assert s.observe(45, idle(2)) is None  # a new window for the next one
    assert s.observe(74, idle(2)) is None
    assert s.observe(75, idle(2)) is not None
    assert s.observe(200, idle(1)) is None  # the floor


def test_in_flight_that_needs_every_replica_is_not_idle() -> None:
    s = _scaler()
    # 2 replicas, cap 8: 5 in flight do not fit on one replica at half its cap
    obs = Observation(replicas=2, waiting=0, in_flight=5, capacity_per_replica=8)
    assert s.observe(0, obs) is None and s.observe(100, obs) is None


def test_stabilization_prevents_flapping_under_an_oscillating_load() -> None:
    s = _scaler(policy=ScalingPolicy(target_waiting_requests=2, scale_up_window_s=1,
                                     scale_down_window_s=1, stabilization_s=60))
    moves = []
    n = 1
    for t in range(0, 120):  # load flips every 2 s
        obs = busy(n, 10) if (t // 2) % 2 == 0 else idle(n)
        d = s.observe(float(t), obs)
        if d is not None:
            moves.append((t, d.action))
            n = d.desired
    # up once at t=1, then no down before t=61, and never two opposite moves within 60 s
    assert moves[0] == (1, "scale_up")
    for (t1, a1), (t2, a2) in itertools.pairwise(moves):
        if a1 != a2:
            assert t2 - t1 >= 60, moves
    flips = sum(1 for (_, a1), (_, a2) in itertools.pairwise(moves) if a1 != a2)
    assert flips <= 120 // 60, moves  # without stabilization: a flip every 2 s


def test_bounds_apply_at_once() -> None:
    s = _scaler(min_r=2, max_r=3)
    d = s.observe(0, idle(1))
    assert d is not None and d.action == "scale_up" and d.desired == 2 and "below min" in d.reason
    d = s.observe(1, idle(5))
    assert d is not None and d.action == "scale_down" and d.desired == 3


def test_a_held_request_at_zero_replicas_scales_up_at_once() -> None:
    s = _scaler(min_r=0)
    assert s.observe(0, Observation(replicas=0)) is None
    d = s.observe(0.1, Observation(replicas=0, held=1, waiting=1))
    assert d is not None and d.action == "scale_up" and d.desired == 1
    assert "scale from zero" in d.reason


def test_scale_from_zero_ignores_stabilization_after_a_down_to_zero() -> None:
    s = _scaler(min_r=0)
    s.observe(0, idle(1))
    assert s.observe(30, idle(1)) is not None  # down to 0
    assert s.observe(31, Observation(replicas=0, held=2, waiting=2)) is not None


def test_kv_cache_usage_is_a_second_up_signal() -> None:
    policy = ScalingPolicy(target_waiting_requests=100, target_kv_cache_usage=0.8,
                           scale_up_window_s=1, scale_down_window_s=30, stabilization_s=1)
    s = _scaler(policy=policy)
    full = Observation(replicas=1, waiting=0, in_flight=8, capacity_per_replica=8, kv_usage=0.95)
    assert s.observe(0, full) is None
    d = s.observe(1, full)
    assert d is not None and "KV 95% (target 80%)" in d.reason
