"""Build tiny random-weight model directories that real vLLM (its CPU build) can serve.

    python scripts/make_tiny_models.py OUTDIR [--only tiny-llama,tiny-qwen3]

Run it with the vLLM venv's Python (it needs torch, safetensors and tokenizers, which vLLM
brings). Nothing is downloaded: the tokenizer is a byte-level BPE trained here on generated
text, the weights are seeded random numbers, so a rebuild gives the same files.

- tiny-llama: LlamaForCausalLM, hidden 128, 2 layers, 4 heads / 2 KV heads (head_dim 32),
  max_position_embeddings 512, bf16, tied embeddings. A chat model (ChatML template with tools).
- tiny-qwen3: Qwen3ForCausalLM of the same size; serve it with `--runner pooling` for
  embeddings (as Qwen3-Embedding is served).

Head dim 32 is one of the sizes vLLM's CPU attention backend accepts. Each directory gets
config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json
and chat_template.jinja. A `.complete` file marks a finished directory (rebuilds are skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 256
MAX_POSITIONS = 512
VOCAB_TARGET = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# the hermes tool parser looks these up in the vocabulary and refuses to start without them
ADDED = ["<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call functions. Signatures:\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    'Answer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and tools %}{# folded into the tools block #}"
    "{%- else %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{%- for part in message.content %}"
    "{%- if part.type == 'text' %}{{ part.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    '\n<tool_call>{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments if call.function.arguments is string "
    "else call.function.arguments | tojson }}}</tool_call>"
    "{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

_WORDS_TEXT = (
    "the a of to and in is it for on with as at by from that this be are was city weather "
    "paris tokyo london berlin temp model engine token request server answer question hello "
    "world json name arguments value true false null get_weather function call tool result "
    "one two three four five six seven eight nine ten zero user assistant system data test"
)
_WORDS = _WORDS_TEXT.split()


def _corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """Generated text with words, numbers, punctuation and JSON, so BPE learns useful merges."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        line = " ".join(words)
        if rng.random() < 0.2:
            line = json.dumps({rng.choice(_WORDS): rng.choice(_WORDS), "n": rng.randint(0, 999)})
        out.append(line + rng.choice([".", "?", "!", ",", ":", ""]))
    return out


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens(ADDED)
    return tok


def _normal(shape: tuple[int, ...], gen: Any) -> Any:
    import torch

    return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)


def _decoder_weights(vocab: int, qk_norm: bool) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    ones = torch.ones(HIDDEN, dtype=torch.bfloat16)
    weights: dict[str, Any] = {"model.embed_tokens.weight": _normal((vocab, HIDDEN), gen)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = _normal((HEADS * HEAD_DIM, HIDDEN), gen)
        weights[p + "self_attn.k_proj.weight"] = _normal((KV_HEADS * HEAD_DIM, HIDDEN), gen)
        weights[p + "self_attn.v_proj.weight"] = _normal((KV_HEADS * HEAD_DIM, HIDDEN), gen)
        weights[p + "self_attn.o_proj.weight"] = _normal((HIDDEN, HEADS * HEAD_DIM), gen)
        if qk_norm:
            weights[p + "self_attn.q_norm.weight"] = torch.ones(HEAD_DIM, dtype=torch.bfloat16)
            weights[p + "self_attn.k_norm.weight"] = torch.ones(HEAD_DIM, dtype=torch.bfloat16)
        weights[p + "mlp.gate_proj.weight"] = _normal((INTERMEDIATE, HIDDEN), gen)
        weights[p + "mlp.up_proj.weight"] = _normal((INTERMEDIATE, HIDDEN), gen)
        weights[p + "mlp.down_proj.weight"] = _normal((HIDDEN, INTERMEDIATE), gen)
        weights[p + "input_layernorm.weight"] = ones.clone()
        weights[p + "post_attention_layernorm.weight"] = ones.clone()
    weights["model.norm.weight"] = ones.clone()
    return weights


def _config(arch: str, model_type: str, vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    if model_type == "qwen3":
        config["attention_bias"] = False
    return config


def _write_model(out: Path, name: str, arch: str, model_type: str) -> Path:
    from safetensors.torch import save_file

    target = out / name
    if (target / ".complete").exists():
        return target
    tok = _tokenizer()
    vocab = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in SPECIALS + ADDED}
    # build in a scratch directory beside the target, then rename: never a half-written model
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
    try:
        save_file(
            _decoder_weights(vocab, qk_norm=model_type == "qwen3"),
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        tok.save(str(tmp / "tokenizer.json"))
        _dump(tmp / "config.json", _config(arch, model_type, vocab, ids))
        _dump(
            tmp / "generation_config.json",
            {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]},
        )
        _dump(
            tmp / "tokenizer_config.json",
            {
                # transformers 4.x and 5.x both read this class and the template field
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "model_max_length": MAX_POSITIONS,
                "chat_template": CHAT_TEMPLATE,
                "clean_up_tokenization_spaces": False,
            },
        )
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        (tmp / ".complete").write_text("")
        # mkdtemp makes the directory 0700 and safetensors writes 0600: readable like a download
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def _dump(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


MODELS = {
    "tiny-llama": ("LlamaForCausalLM", "llama"),
    "tiny-qwen3": ("Qwen3ForCausalLM", "qwen3"),
}


def build(out: Path, only: list[str] | None = None) -> dict[str, Path]:
    """Build (or reuse) the tiny models under OUT; returns name -> directory."""
    out.mkdir(parents=True, exist_ok=True)
    names = only or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise SystemExit(f"error: unknown tiny model {unknown}; known: {', '.join(MODELS)}")
    return {n: _write_model(out, n, *MODELS[n]) for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--only", default="", help="comma-separated subset of " + ",".join(MODELS))
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n] or None
    for name, path in build(args.outdir, only).items():
        print(f"{name}\t{path}")


if __name__ == "__main__":
    main()
