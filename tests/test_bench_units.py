"""The pieces of `inferplane bench`: vLLM's metric definitions, datasets, cost, prices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferplane.bench import datasets as ds
from inferplane.bench.client import RequestResult
from inferplane.bench.cost import (
    PRICES_FILE,
    cost_report,
    load_prices,
    parse_api_price,
    parse_price_overrides,
    per_million,
)
from inferplane.bench.load import LoadSpec, arrival_offsets
from inferplane.bench.metrics import parse_slo, percentile, summarize
from inferplane.bench.scrape import server_delta
from inferplane.bench.traffic import parse_traffic
from inferplane.errors import InferplaneError
from inferplane.gpus import find_gpu
from inferplane.sim.tokens import ApproxTokenizer


def _result(ttft: float, latency: float, tokens: int, itl: list[float]) -> RequestResult:
    return RequestResult("m", 10, tokens, True, "", 0.0, ttft, latency, itl, True)


def test_metrics_follow_vllm_definitions() -> None:
    a = _result(0.1, 1.0, 10, [0.1] * 9)  # TPOT (1.0 - 0.1) / 9 = 0.1
    b = _result(0.3, 0.3, 1, [])  # one token: no TPOT, no ITL
    failed = RequestResult("m", 10, error="HTTP 500")
    s = summarize([a, b, failed], 2.0, {"ttft_ms": 200, "tpot_ms": 150})
    assert (s.completed, s.failed) == (2, 1)
    assert s.tpot_ms["mean"] == pytest.approx(100.0)  # only the multi-token request
    assert s.ttft_ms["mean"] == pytest.approx(200.0)
    assert s.itl_ms["p99"] == pytest.approx(100.0)
    assert s.output_throughput == pytest.approx(11 / 2.0)
    assert s.total_token_throughput == pytest.approx(31 / 2.0)
    assert s.request_goodput == pytest.approx(0.5)  # b misses the TTFT target
    assert summarize([a], 1.0).request_goodput is None


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(7.6)
    assert percentile(values, 99) == pytest.approx(9.76)


def test_slo_parsing_names_the_bad_part() -> None:
    assert parse_slo("ttft_ms=500, tpot_ms=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    with pytest.raises(InferplaneError, match="unknown SLO"):
        parse_slo("latency=5")
    with pytest.raises(InferplaneError, match="not a number"):
        parse_slo("ttft_ms=fast")


def test_random_prompts_have_the_token_counts_they_claim() -> None:
    data = ds.random_dataset(20, 100, 10, range_ratio=0.5, seed=2)
    assert data.approximate_counts
    counter = ApproxTokenizer()
    for request in data.requests:
        assert len(counter.encode(request.prompt)) == request.prompt_tokens
        assert 50 <= request.prompt_tokens <= 150 and 5 <= request.output_tokens <= 15


def test_prefix_dataset_shares_its_prefixes() -> None:
    data = ds.prefix_dataset(6, prefix_len=40, suffix_len=8, output_len=4, num_prefixes=2)
    heads = [" ".join(r.prompt.split()[:40]) for r in data.requests]
    assert heads[0] == heads[2] == heads[4] != heads[1] == heads[3]
    assert all(r.prompt_tokens == 48 for r in data.requests)


def test_sharegpt_and_trace_files(tmp_path: Path) -> None:
    conv = [{"conversations": [{"from": "human", "value": "tell me a story " * 3},
                               {"from": "gpt", "value": "once upon a time " * 5}]},
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conv))
    (req,) = ds.sharegpt_dataset(path, 10).requests  # the short one is filtered (vLLM)
    assert req.output_tokens == 20
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 1000, "input_length": 600, "output_length": 5, '
                     '"hash_ids": [1, 2]}\n'
                     '{"timestamp": 3000, "input_length": 512, "output_length": 7, '
                     '"hash_ids": [1]}\n')
    first, second = ds.trace_dataset(trace, time_scale=0.5).requests
    assert (first.arrival_s, second.arrival_s) == (0.0, 1.0)
    assert first.prompt_tokens == 600 and second.prompt.split() == first.prompt.split()[:512]
    assert arrival_offsets([first, second], LoadSpec("trace")) == [0.0, 1.0]
    with pytest.raises(InferplaneError, match="bad trace row"):
        trace.write_text('{"timestamp": 1}\n')
        ds.trace_dataset(trace)


def test_gamma_arrivals_average_the_rate() -> None:
    requests = ds.random_dataset(2000, 4, 4).requests
    for mode, burst in (("poisson", 1.0), ("gamma", 0.5)):
        offsets = arrival_offsets(requests, LoadSpec(mode, rate=10.0, burstiness=burst))  # type: ignore[arg-type]
        assert offsets[-1] / len(offsets) == pytest.approx(0.1, rel=0.1)


def test_cost_per_million_and_break_even() -> None:
    # 2 GPUs at $2/h = $4/h; 1,000 output tok/s = 3.6M tokens/h -> $1.11 per 1M.
    assert per_million(4.0, 1000.0) == pytest.approx(4.0 / 3.6)
    report = cost_report(4.0, 3000.0, 1000.0, parse_api_price("in=0.1,out=0.4"))
    # The API charges 3 x 0.1 + 0.4 = $0.70 per 1M output tokens (inputs ride along):
    # $96/day / $0.70e-6 = 137.1M output tokens/day.
    assert report["breakeven_output_tokens_per_day"] == pytest.approx(96 / 0.7e-6)
    assert report["self_host_cheaper_at_full_load"] is False  # 86.4M/day at most
    assert parse_api_price("0.5") is not None
    with pytest.raises(InferplaneError, match="USD per 1M"):
        parse_api_price("cheap")


def test_price_list_has_sources_and_catalog_names(tmp_path: Path) -> None:
    prices = load_prices()
    assert prices and all(p.source.startswith("https://") for p in prices.values())
    assert all(find_gpu(name) is not None for name in prices)
    assert PRICES_FILE.is_file()
    mine = tmp_path / "prices.yaml"
    mine.write_text("prices:\n  h100: {usd_per_gpu_hour: 2.0, source: my quote}\n")
    merged = load_prices(mine, parse_price_overrides("L40S=0.9"))
    assert merged["H100-SXM-80GB"].usd_per_gpu_hour == 2.0
    assert merged["L40S"].usd_per_gpu_hour == 0.9 and merged["L40S"].source == "--price"
    with pytest.raises(InferplaneError, match="unknown GPU"):
        parse_price_overrides("Z9000=1")


def test_traffic_file_errors_name_the_field() -> None:
    ok = parse_traffic({"slo": {"ttft_ms": 900}, "models": {"m": {
        "daily_rps": [1] * 23 + [5], "input_tokens": 10, "output_tokens": {"mean": 5}}}}, "t")
    assert ok.slo == {"ttft_ms": 900.0} and ok.models["m"].peak_rps == 5
    assert ok.models["m"].daily_requests == (23 + 5) * 3600
    with pytest.raises(InferplaneError, match="unknown keys"):
        parse_traffic({"models": {"m": {"rps": 1}}}, "t")
    with pytest.raises(InferplaneError, match="peak_rps or daily_rps"):
        parse_traffic({"models": {"m": {"input_tokens": 1, "output_tokens": 1}}}, "t")


def test_server_delta_derives_hit_rate_and_queue_time() -> None:
    before = ("vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 10\n"
              "vllm:num_preemptions_total 1\n")
    after = ("vllm:prefix_cache_queries_total 300\nvllm:prefix_cache_hits_total 110\n"
             "vllm:num_preemptions_total 3\n")
    delta = server_delta(before, after)
    assert delta["prefix_cache_hit_rate"] == pytest.approx(0.5)
    assert delta["preemptions"] == 2
    assert server_delta(None, after) == {"scraped": False}
