"""The API server's input processing as processor sharing (inferplane/sim/frontend.py)."""

from __future__ import annotations

import pytest

from inferplane.sim.build import build_parts
from inferplane.sim.config import SimEngineConfig
from inferplane.sim.core import EngineCore, KvCapacity
from inferplane.sim.frontend import ProcessorSharing, api_server_work_s, coded_renderer
from inferplane.sim.offline import WorkItem, run_workload, synthetic_prompt
from inferplane.sim.timing import Calibration

PARTS = build_parts(SimEngineConfig(model="t", max_model_len=4096))


def _core() -> EngineCore:
    return EngineCore(KvCapacity(4000, 16, 256, 2048), PARTS.timing)


def test_a_burst_finishes_together_after_all_its_work() -> None:
    ps: ProcessorSharing[int] = ProcessorSharing(0.01)
    for i in range(5):
        ps.submit(i, 0.0)
    assert ps.advance(0.0499) == []
    done = ps.advance(1.0)
    assert [job for job, _ in done] == [0, 1, 2, 3, 4]
    assert all(t == pytest.approx(0.05) for _, t in done)


def test_a_lone_job_takes_its_work_and_a_later_one_shares() -> None:
    ps: ProcessorSharing[str] = ProcessorSharing(0.01)
    ps.submit("a", 0.0)
    assert ps.next_done_s() == pytest.approx(0.01)
    ps.submit("b", 0.005)  # a has 5 ms left, now at half speed
    done = ps.advance(1.0)
    assert done[0][0] == "a" and done[0][1] == pytest.approx(0.015)
    assert done[1][0] == "b" and done[1][1] == pytest.approx(0.02)
    assert ps.next_done_s() is None and len(ps) == 0


def test_a_job_finished_before_an_arrival_is_handed_out_once() -> None:
    ps: ProcessorSharing[str] = ProcessorSharing(0.01)
    ps.submit("a", 0.0)
    ps.submit("b", 0.02)  # a finished at 10 ms, before b came
    assert len(ps) == 2 and ps.next_done_s() == pytest.approx(0.01)
    done = ps.advance(0.02)
    assert [(job, round(t, 6)) for job, t in done] == [("a", 0.01)]
    assert [job for job, _ in ps.advance(1.0)] == ["b"] and len(ps) == 0


def test_burst_reaches_the_engine_late_and_ttft_grows_by_its_work() -> None:
    items = [WorkItem(synthetic_prompt(128, i), 4) for i in range(200)]
    plain = run_workload(_core(), items)
    queued = run_workload(_core(), items, frontend_s=0.005)
    # 200 requests x 5 ms of one event loop: all reach the engine at 1 s.
    assert queued.mean_ttft_s == pytest.approx(plain.mean_ttft_s + 1.0, abs=0.01)
    assert queued.duration_s == pytest.approx(plain.duration_s + 1.0, abs=0.01)
    assert queued.completed == 200


def test_paced_requests_pay_about_their_own_work() -> None:
    items = [WorkItem(synthetic_prompt(128, i), 8) for i in range(20)]
    plain = run_workload(_core(), items, request_rate=2.0)
    queued = run_workload(_core(), items, request_rate=2.0, frontend_s=0.004)
    # 2 requests/s never overlap in the front end: each waits its 4 ms, plus at most
    # the step in flight when it gets through.
    extra = queued.mean_ttft_s - plain.mean_ttft_s
    assert 0.004 - 1e-9 <= extra < 0.004 + 0.05


def test_closed_loop_clients_with_a_front_end_finish() -> None:
    items = [WorkItem(synthetic_prompt(64, i), 16) for i in range(30)]
    plain = run_workload(_core(), items, max_concurrency=4)
    result = run_workload(_core(), items, max_concurrency=4, frontend_s=0.002)
    assert result.completed == 30 and result.total_output_tokens == 30 * 16
    # Each of the 8 rounds of 4 clients waits for the front end, at worst all 4 requests
    # sharing it (4 x 2 ms) plus the step in flight; none is lost on the way.
    assert plain.duration_s < result.duration_s < plain.duration_s + 8 * (4 * 0.002 + 0.002)


def test_only_chat_pays_and_coded_renderers_cost_their_own() -> None:
    cal = Calibration(0.8, 0.4, 0.001, 2e-5, chat_template_s=0.006, chat_renderer_s=0.001)
    assert api_server_work_s(cal, "chat", coded=False) == 0.006
    assert api_server_work_s(cal, "chat", coded=True) == 0.001
    assert api_server_work_s(cal, "completions", coded=False) == 0.0  # tokenize_s as fitted
    tokenizing = Calibration(0.8, 0.4, 0.001, 2e-5, chat_template_s=0.006, tokenize_s=0.002)
    assert api_server_work_s(tokenizing, "completions", coded=False) == 0.002
    assert api_server_work_s(tokenizing, None, coded=False) == 0.0  # embeddings, in process
    fixed = Calibration(0.8, 0.4, 0.001, 2e-5, fixed_decode_step_s=0.01, chat_template_s=0.006)
    assert api_server_work_s(fixed, "chat", coded=False) == 0.0
    # gpt-oss always takes Harmony; DeepSeek-V3.2 only with its tokenizer mode.
    assert coded_renderer("gpt_oss") and coded_renderer("gpt_oss", "auto")
    assert coded_renderer("deepseek_v32", "deepseek_v32") and not coded_renderer("deepseek_v32")
    assert not coded_renderer("qwen3_moe")
