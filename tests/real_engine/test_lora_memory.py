"""The LoRA reservation against real vLLM (CPU build): with `--enable-lora` at 32 slots of
rank 512 the CPU worker, which sizes its KV cache as requested memory minus what the
process holds, gets a KV cache smaller by what estimator/lora.py computes (within 5 %);
the tiny adapter of scripts/make_tiny_adapter.py loads, is listed with its parent and
changes the output. Two engine starts, one after the other (CPU heavy: ~2 x 1-2 min)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from lora_adapters import make_adapter
from real_vllm import RealEngine, start_vllm

from inferplane.engines.vllm.lora import LoraArgs, LoraModule, lora_argv, lora_env
from inferplane.estimator.lora import LoraSlots, reservation_bytes, wrapped_modules
from inferplane.models import load_profile

KV_TOKENS = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
# requested memory = this x the node's RAM; small so two engines never strain the host
UTILIZATION = ["--gpu-memory-utilization", "0.1"]
SLOTS = LoraSlots(max_loras=32, max_lora_rank=512)


def _kv_tokens(engine: RealEngine) -> int:
    found = KV_TOKENS.findall(engine.log_text())
    assert found, engine.log_text()[-3000:]
    return int(found[-1].replace(",", ""))


def _complete(engine: RealEngine, model: str) -> str:
    body = {"model": model, "prompt": "hello world", "max_tokens": 8, "temperature": 0}
    reply = httpx.post(engine.url + "/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def test_the_kv_cache_gives_up_the_computed_reservation(
    vllm_venv: Path, tiny_models: dict[str, Path], real_vllm: list[RealEngine], tmp_path: Path
) -> None:
    base = tiny_models["tiny-llama"]
    adapter = make_adapter(tmp_path / "tiny-sql", base, rank=8,
                           targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                    "up_proj", "down_proj"), zeros=False)
    plain = start_vllm(vllm_venv, base, "tiny", tmp_path / "plain", kv_cache_bytes=None,
                       extra_args=UTILIZATION)
    real_vllm.append(plain)
    plain_tokens, plain_text = _kv_tokens(plain), _complete(plain, "tiny")
    plain.stop()
    lora = LoraArgs(SLOTS.max_loras, SLOTS.max_lora_rank, SLOTS.max_loras,
                    (LoraModule("tiny-sql", str(adapter)),))
    served = start_vllm(vllm_venv, base, "tiny", tmp_path / "lora", kv_cache_bytes=None,
                        extra_args=[*UTILIZATION, *lora_argv(lora, {})], env=lora_env(lora))
    real_vllm.append(served)
    lora_tokens = _kv_tokens(served)
    profile = load_profile(base)
    per_token = 2 * profile.num_layers * profile.num_kv_heads * profile.head_dim * 2  # K+V bf16
    measured = (plain_tokens - lora_tokens) * per_token
    expected = reservation_bytes(wrapped_modules(profile, 1), SLOTS, 2)
    assert abs(measured - expected) / expected <= 0.05, (measured, expected)
    models = httpx.get(served.url + "/v1/models", timeout=30).json()["data"]
    assert {"id": "tiny-sql", "parent": "tiny"}.items() <= next(
        m for m in models if m["id"] == "tiny-sql").items()
    assert _complete(served, "tiny") == plain_text  # the base is unchanged
    assert _complete(served, "tiny-sql") != plain_text  # the adapter is applied
