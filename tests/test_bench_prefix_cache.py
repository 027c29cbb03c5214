"""A sweep measures prefill, not the prefix cache: every level and every request sends
prompts of its own, and a `random` run the server served from its cache is called out."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from inferplane.bench.datasets import WARMUP_LEVEL, level_seed, random_dataset
from inferplane.cli.main import _register_commands, app
from inferplane.sim import EngineHost, SimEngineConfig

_SMALL = ["--input-len", "64", "--output-len", "2", "--num-requests", "4"]


def test_levels_and_the_warmup_never_share_a_prompt() -> None:
    seeds = [level_seed(0, level) for level in (0, 1, 2, 4, 8, WARMUP_LEVEL)]
    assert len(set(seeds)) == len(seeds)
    prompts = [r.prompt for s in seeds for r in random_dataset(8, 32, 2, seed=s).requests]
    assert len(set(prompts)) == len(prompts)


def test_a_sweep_on_random_prompts_finds_nothing_in_the_prefix_cache() -> None:
    _register_commands()
    with EngineHost([SimEngineConfig(model="m", max_model_len=2048)]) as handles:
        # 8 requests at both levels (at least --num-requests, 4 x concurrency): before, the
        # same seeded 8 prompts twice
        result = CliRunner().invoke(app, ["bench", handles[0].url, "--sweep", "1,2",
                                          *_SMALL, "--num-requests", "8", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    # before: every level re-sent the first level's seeded prompts (hit rate ~66%)
    assert document["sweep"]["server"]["prefix_cache_hit_rate"] < 0.02
    assert "warnings" not in document


def test_a_random_run_served_from_the_cache_is_warned_about_in_plain_output() -> None:
    _register_commands()
    runner = CliRunner()
    with EngineHost([SimEngineConfig(model="m", max_model_len=2048)]) as handles:
        args = ["bench", handles[0].url, "--concurrency", "2", *_SMALL]
        first = runner.invoke(app, args)
        again = runner.invoke(app, args)  # the same seed: the same prompts, now cached
    assert first.exit_code == 0 and again.exit_code == 0, again.output
    assert "prefix-cache hit rate" in first.stdout and "warning" not in first.output
    assert "warning: the server's prefix-cache hit rate was" in again.stderr
    assert "on random prompts" in again.stderr


def test_a_sweep_prints_the_servers_hit_rate() -> None:
    _register_commands()
    with EngineHost([SimEngineConfig(model="m", max_model_len=2048)]) as handles:
        result = CliRunner().invoke(app, ["bench", handles[0].url, "--sweep", "1,2", *_SMALL])
    assert result.exit_code == 0, result.output
    assert "server (/metrics delta over every level): prefix-cache hit rate" in result.stdout
