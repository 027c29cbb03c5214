"""The shipped examples validate and say what their scenarios need."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import make_adapter

from inferplane.spec import load_fleet, summarize

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
REQUIRED = {
    "s0-l40s-colocated.yaml",
    "s4-deepseek-qwen-mix.yaml",
    "single-7b-a100.yaml",
    "endpoints-only.yaml",
    "demo-sim.yaml",
}


def test_required_examples_exist() -> None:
    assert {path.name for path in EXAMPLES.glob("*.yaml")} >= REQUIRED


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_validates_and_sources_resolve(path: Path) -> None:
    fleet = load_fleet(path)
    for model in fleet.placed_models:
        assert model.source is not None
        # Relative sources resolve against examples/, onto the committed model configs.
        assert Path(model.source).is_absolute()
        assert (Path(model.source) / "config.json").is_file(), model.source


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_starts_with_a_scenario_comment(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# ")


def test_s0_three_l40s_each_llm_colocated_with_embedding() -> None:
    fleet = load_fleet(EXAMPLES / "s0-l40s-colocated.yaml")
    assert fleet.gpus is not None
    assert [(n.gpu_type, n.count) for n in fleet.gpus.nodes] == [("L40S", 3)]
    embed = [m for m in fleet.models if m.task == "embed"]
    llms = [m for m in fleet.models if m.task == "generate"]
    assert len(embed) == 1 and embed[0].replicas == 3
    assert len(llms) == 3
    for llm in llms:
        assert llm.placement.colocate_with == [embed[0].name]
        assert isinstance(llm.max_model_len, int)  # explicit, never the checkpoint's max (P02)


def test_s4_needs_eleven_gpus_at_peak_coexistence() -> None:
    fleet = load_fleet(EXAMPLES / "s4-deepseek-qwen-mix.yaml")
    by_name = {m.name: m for m in fleet.models}
    assert set(by_name) == {"deepseek-r1", "qwen3-32b", "qwen3-8b"}
    gpus = 0
    for model in fleet.placed_models:
        assert isinstance(model.tensor_parallel_size, int)
        gpus += model.tensor_parallel_size * model.replicas
    assert gpus == 11  # P08: R1 8 + 32B 2 + 8B 1
    assert (by_name["deepseek-r1"].max_model_len, by_name["deepseek-r1"].max_num_seqs) == (
        32768,
        32,
    )
    assert fleet.model("Qwen/Qwen3-32B") is by_name["qwen3-32b"]


def test_minimal_and_demo_summaries() -> None:
    minimal = summarize(load_fleet(EXAMPLES / "endpoints-only.yaml"))
    assert (minimal.models, minimal.endpoints, minimal.replicas, minimal.gpus) == (1, 1, 0, None)
    demo = load_fleet(EXAMPLES / "demo-sim.yaml")
    assert demo.engine.kind == "sim"
    assert summarize(demo).gpus == 2


def _doc_yaml_blocks() -> list[str]:
    text = (ROOT / "docs" / "fleet-file.md").read_text(encoding="utf-8")
    return [block.split("```", 1)[0] for block in text.split("```yaml\n")[1:]]


def test_documented_model_and_section_examples_validate(tmp_path: Path) -> None:
    blocks = _doc_yaml_blocks()
    models = [b for b in blocks if b.startswith("models:")]
    assert len(models) == 2  # the smallest fleet and the full model entry
    sections = [b for b in blocks if b.startswith(("gateway:", "limits:", "scaling:"))]
    assert len(sections) == 3
    full = models[1].replace("../models/Qwen--Qwen3-32B", "Qwen/Qwen3-32B")
    extra_model = "  - {name: qwen3-8b, source: Qwen/Qwen3-8B}\n"
    make_adapter(tmp_path / "adapters" / "sql", "Qwen--Qwen3-32B")  # the entry's lora source
    for block in [models[0], full + extra_model + "".join(sections)]:
        path = tmp_path / "doc.yaml"
        path.write_text(block, encoding="utf-8")
        load_fleet(path)
