"""Build a tiny PEFT LoRA adapter for a tiny base model (scripts/make_tiny_models.py).

    python scripts/make_tiny_adapter.py OUTDIR --base BASE_DIR [--rank 8] [--alpha 16]
        [--targets q_proj,k_proj,...] [--seed 0] [--base-name NAME] [--zeros]

Pure Python (no torch): the adapter is `adapter_config.json` plus `adapter_model.safetensors`
with the tensor names and shapes vLLM's PEFT loader expects for a Llama/Qwen-style decoder:

    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight  [r, in]
    base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_B.weight  [out, r]

The sizes come from the base's config.json; weights are seeded random bf16 numbers with
standard deviation 0.1 (lora_B too, unlike PEFT's zero init: on a tiny base whose own weights
are ~0.02 the adapter's delta dominates, so its greedy output differs from the base's).
A rebuild with the same arguments writes the same bytes. The directory is written next to
OUTDIR and renamed into place, so a reader never sees half an adapter. Prints OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
DEFAULT_TARGETS = ATTENTION + MLP
PREFIX = "base_model.model.model.layers"
STD = 0.1


def module_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every LoRA-targetable linear layer of one decoder layer."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def tensor_shapes(config: dict[str, Any], rank: int,
                  targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Every tensor of the adapter: name -> shape, in file order."""
    shapes = module_shapes(config)
    unknown = sorted(set(targets) - set(shapes))
    if unknown:
        raise SystemExit(f"error: unknown target modules {unknown}; known: {', '.join(shapes)}")
    out: dict[str, tuple[int, int]] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for name in targets:
            block = "self_attn" if name in ATTENTION else "mlp"
            fan_in, fan_out = shapes[name]
            base = f"{PREFIX}.{layer}.{block}.{name}"
            out[f"{base}.lora_A.weight"] = (rank, fan_in)
            out[f"{base}.lora_B.weight"] = (fan_out, rank)
    return out


def _bf16(values: list[float]) -> bytes:
    # bf16 is the upper half of an IEEE float32 (round toward zero is fine for random data)
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def safetensors_bytes(shapes: dict[str, tuple[int, int]], seed: int, *,
                      zeros: bool = False) -> bytes:
    """A safetensors file of seeded random (or zero) bf16 tensors with these shapes."""
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, shape in shapes.items():
        count = shape[0] * shape[1]
        blob = bytes(2 * count) if zeros else _bf16([rng.gauss(0.0, STD) for _ in range(count)])
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write_adapter(out: Path, base: Path, *, rank: int = 8, alpha: int = 16,
                  targets: tuple[str, ...] = DEFAULT_TARGETS, seed: int = 0,
                  base_name: str | None = None, zeros: bool = False) -> Path:
    """Write the adapter directory `out` for the base model in `base`; returns `out`."""
    config = json.loads((base / "config.json").read_text())
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "base_model_name_or_path": base_name or str(base),
        "inference_mode": True,
    }
    data = safetensors_bytes(tensor_shapes(config, rank, targets), seed, zeros=zeros)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
        (tmp / "adapter_model.safetensors").write_bytes(data)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700: readable like a download instead
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--base", type=Path, required=True, help="the base model directory")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zeros", action="store_true",
                        help="all-zero weights (fast; the adapter changes nothing)")
    parser.add_argument("--base-name", default=None,
                        help="base_model_name_or_path to record (default: --base)")
    args = parser.parse_args()
    if args.rank < 1:
        raise SystemExit(f"error: --rank must be at least 1 (got {args.rank})")
    targets = tuple(t for t in args.targets.split(",") if t)
    print(write_adapter(args.outdir, args.base, rank=args.rank, alpha=args.alpha,
                        targets=targets, seed=args.seed, base_name=args.base_name,
                        zeros=args.zeros))


if __name__ == "__main__":
    main()
