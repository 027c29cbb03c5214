"""`inferplane bench` from the command line: a URL target, JSON and CSV results, cost."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from inferplane.cli.main import _register_commands, app
from inferplane.errors import InferplaneError
from inferplane.sim import EngineHost, SimEngineConfig


def test_bench_a_url_writes_json_and_csv(tmp_path: Path) -> None:
    _register_commands()
    with EngineHost([SimEngineConfig(model="m", max_model_len=2048)]) as handles:
        result = CliRunner().invoke(app, [
            "bench", handles[0].url, "--num-requests", "6", "--concurrency", "2",
            "--input-len", "32", "--output-len", "4", "--dataset", "prefix",
            "--prefix-len", "64", "--slo", "ttft_ms=5000", "--gpu-hour-usd", "2.0",
            "--api-price", "in=0.1,out=0.4", "--out", str(tmp_path), "--json",
        ])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    run = data["run"]
    assert data["model"] == "m" and run["completed"] == 6 and run["failed"] == 0
    assert run["total_output_tokens"] == 24
    assert run["request_goodput_req_s"] > 0
    assert data["token_counts"].startswith("approximate")
    assert run["server"]["scraped"] and run["server"]["prefix_cache_hit_rate"] > 0
    assert data["cost"]["usd_per_m_output_tokens"] > 0
    with (tmp_path / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 and all(r["success"] == "True" for r in rows)
    sent = sorted(float(r["sent_ms"]) for r in rows)  # when each was sent, from the first
    assert sent[0] == 0.0 and sent[1] < sent[2]  # two clients start together, then refill
    assert json.loads((tmp_path / "bench.json").read_text())["run"]["completed"] == 6


def test_bench_refuses_a_target_that_is_neither_url_nor_file() -> None:
    _register_commands()
    result = CliRunner().invoke(app, ["bench", "no-such-fleet.yaml"])
    assert isinstance(result.exception, InferplaneError)  # main() turns it into exit 2
    assert "not a URL nor a fleet file" in str(result.exception)


def test_sweep_and_mix_on_a_fleet_file(tmp_path: Path) -> None:
    model = Path(__file__).parent / "data" / "models" / "Qwen--Qwen3-8B"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "engine: sim\nmodels:\n"
        f"  - {{name: a, source: {model}, max_model_len: 2048, max_num_seqs: 2}}\n"
        f"  - {{name: b, source: {model}, max_model_len: 2048, max_num_seqs: 2}}\n"
    )
    _register_commands()
    runner = CliRunner()
    swept = runner.invoke(app, ["bench", str(fleet), "--model", "a", "--sweep", "1,2,4",
                                "--num-requests", "4", "--input-len", "16",
                                "--output-len", "4"])
    assert swept.exit_code == 0, swept.output
    assert "saturation sweep" in swept.output
    # The simulator's measured error for the fleet's GPU (H100 SXM) and family is stated.
    assert "a on H100-SXM-80GB: simulated timing: ±" in swept.output
    # wall-clock levels: the knee is 2 (max_num_seqs) or, when 4 still ran faster, not reached
    assert re.search(r"knee \(sweet spot\): (concurrency 2|not reached)", swept.output)
    mixed = runner.invoke(app, ["bench", str(fleet), "--mix", "a=1,b=1", "--num-requests", "8",
                                "--concurrency", "4", "--input-len", "16", "--output-len", "4",
                                "--json"])
    assert mixed.exit_code == 0, mixed.output
    document = json.loads(mixed.output)
    assert any(line.startswith("b on H100-SXM-80GB: simulated timing: ±")
               for line in document["simulator_timing"])
    per_model = document["run"]["per_model"]
    assert set(per_model) == {"a", "b"}
    assert sum(m["completed"] for m in per_model.values()) == 8


def test_a_fleet_model_with_a_tokenizer_counts_exactly(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from inferplane.sim.build import DEFAULT_PROFILE_CONFIG

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(DEFAULT_PROFILE_CONFIG))
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(2000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(model / "tokenizer.json"))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("engine: sim\nmodels:\n"
                     f"  - {{name: a, source: {model}, max_model_len: 2048}}\n")
    _register_commands()
    result = CliRunner().invoke(app, ["bench", str(fleet), "--num-requests", "3",
                                      "--concurrency", "3", "--input-len", "40",
                                      "--output-len", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["token_counts"] == "tokenizer"
    assert data["run"]["total_input_tokens"] == 3 * 40  # the server's count: same tokenizer
