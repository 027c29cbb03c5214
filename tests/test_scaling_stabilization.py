"""Stabilization under an oscillating load, for real: simulated engine processes, the
gateway and the autoscaler on 127.0.0.1 (the policy's own rules are unit-tested on a fake
clock in test_scaling_policy.py).

The load alternates bursts that keep requests waiting with idle gaps, each phase longer
than both windows, so without `stabilization_s` every burst would add a replica and every
gap remove it. The test records what the autoscaler observed to show the signal really
flipped that often, and that the replica count moved at most once each way.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import httpx
from sim_runtime import CHAT_FLEET, start_runtime

from inferplane.scaling.events import read_events
from inferplane.scaling.policy import Decision, ModelAutoscaler, Observation

WINDOW_S = 0.3
FLEET = CHAT_FLEET + f"""\
    replicas: 1
scaling:
  policy: {{target_waiting_requests: 1, scale_up_window_s: {WINDOW_S},
           scale_down_window_s: {WINDOW_S}, stabilization_s: 60}}
  models:
    chat: {{min_replicas: 1, max_replicas: 2}}
"""
PHASE_S = 1.2  # each burst and each gap: four times either window
CYCLES = 4
USERS = 12  # 4 run on two replicas (max_num_seqs 2), 8 wait: 4 per replica


def _episodes(seen: list[tuple[float, Observation]]) -> int:
    """How often the signal held high, then idle, for a whole window, alternating: each
    is a move the autoscaler would make if stabilization did not stop it."""
    flips = 0
    state, since = "", 0.0
    last = ""
    for at, obs in seen:
        n = max(obs.replicas, 1)
        now = ("high" if obs.waiting / n > 1
               else "idle" if obs.waiting == 0 and obs.in_flight == 0 else "busy")
        if now != state:
            state, since = now, at
        if state in ("high", "idle") and at - since >= WINDOW_S and state != last:
            flips += 1
            last = state
    return flips


async def test_an_oscillating_load_does_not_flap_the_replica_count(tmp_path: Path) -> None:
    rt = await start_runtime(tmp_path, FLEET)
    try:
        assert rt.scaling is not None
        scaler: ModelAutoscaler = rt.scaling.scalers["chat"]
        seen: list[tuple[float, Observation]] = []
        decide = scaler.observe

        def recording(now: float, obs: Observation) -> Decision | None:
            seen.append((now, obs))
            return decide(now, obs)

        scaler.observe = recording  # type: ignore[method-assign]
        counts: list[int] = []
        statuses: list[int] = []
        loop = asyncio.get_running_loop()

        async def user(client: httpx.AsyncClient, until: float) -> None:
            while loop.time() < until:
                r = await client.post(rt.gateway_url + "/v1/chat/completions", json={
                    "model": "chat", "max_tokens": 40, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "hello"}]})
                statuses.append(r.status_code)

        async def sample(until: float) -> None:
            while loop.time() < until:
                counts.append(len(rt.awake_replicas("chat")))
                await asyncio.sleep(0.05)

        async with httpx.AsyncClient(timeout=30) as client:
            end = loop.time() + CYCLES * 2 * PHASE_S
            sampler = asyncio.create_task(sample(end))
            for _ in range(CYCLES):
                burst = loop.time() + PHASE_S
                await asyncio.gather(*(user(client, burst) for _ in range(USERS)))  # burst
                await asyncio.sleep(PHASE_S)  # gap: nothing sent
            await sampler
        moves = [e["kind"] for e in read_events(rt.state_dir.path)
                 if e["kind"] in ("scale_up", "scale_down")]
        # the load did oscillate: high and idle each held a whole window, alternating -
        # without stabilization at least up, down, up, down (8 on an unloaded machine)
        assert _episodes(seen) >= 4, _episodes(seen)
        # ... and the replica count moved up once (the first burst) and never back
        assert moves == ["scale_up"], moves
        changes = sum(1 for a, b in itertools.pairwise(counts) if a != b)
        assert changes <= 1, counts
        assert statuses and set(statuses) == {200}
    finally:
        await rt.drain_and_stop()
