"""Every broken fleet file under tests/data/fleets/broken/ gets its precise error:
file:line:column, the field path, the offending value, and a fix that says what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest

from inferplane.spec import FleetValidationError, load_fleet

BROKEN = Path(__file__).parent / "data" / "fleets" / "broken"


class Expected(NamedTuple):
    line: int
    column: int
    field: str
    value: Any
    message: str  # a substring of the message
    fix: str  # a substring of the fix


CASES: dict[str, list[Expected]] = {
    "unknown_key.yaml": [
        Expected(
            5,
            5,
            "models[0].tensor_paralel_size",
            2,
            "unknown key 'tensor_paralel_size'",
            "did you mean 'tensor_parallel_size'?",
        ),
    ],
    "vllm_flag_as_key.yaml": [
        Expected(
            5, 5, "models[0].tp", 2, "unknown key 'tp'", "did you mean 'tensor_parallel_size'?"
        ),
    ],
    "top_level_typo.yaml": [
        Expected(2, 1, "models", None, "missing required key 'models'", "add `models:`"),
        Expected(
            3,
            1,
            "model",
            [{"name": "m", "endpoints": ["http://127.0.0.1:8100"]}],
            "unknown key 'model'",
            "did you mean 'models'?",
        ),
    ],
    "wrong_type.yaml": [
        Expected(
            5,
            19,
            "models[0].max_num_seqs",
            "64",
            "must be a whole number, not a string",
            "remove the quotes: 64",
        ),
    ],
    "negative_replicas.yaml": [
        Expected(4, 15, "models[0].replicas", -1, "must be >= 0", "use a value >= 0"),
    ],
    "utilization_too_high.yaml": [
        Expected(
            5,
            29,
            "models[0].gpu_memory_utilization",
            1.5,
            "must be in (0, 1]",
            "fraction of the whole card",
        ),
    ],
    "utilization_percent.yaml": [
        Expected(
            5,
            29,
            "models[0].gpu_memory_utilization",
            90,
            "must be in (0, 1]",
            "a percentage of 90 is written 0.9",
        ),
    ],
    "tensor_parallel_zero.yaml": [
        Expected(
            4,
            27,
            "models[0].tensor_parallel_size",
            0,
            'positive integer or "auto"',
            "whole number >= 1",
        ),
    ],
    "source_and_endpoints.yaml": [
        Expected(
            4,
            5,
            "models[0].endpoints",
            ["http://10.0.0.5:8000"],
            "both source and endpoints",
            "not both",
        ),
    ],
    "neither_source_nor_endpoints.yaml": [
        Expected(4, 5, "models[1]", None, "neither source nor endpoints", "add source:"),
    ],
    "duplicate_model_name.yaml": [
        Expected(4, 11, "models[1].name", "qwen3-8b", "already used by models[0]", "unique name"),
    ],
    "alias_collides_with_name.yaml": [
        Expected(
            7,
            33,
            "models[1].aliases[1]",
            "qwen3-8b",
            "alias is the name of model 'qwen3-8b'",
            "remove the alias",
        ),
    ],
    "alias_used_twice.yaml": [
        Expected(
            7,
            15,
            "models[1].aliases[0]",
            "chat",
            "already used by model 'qwen3-8b'",
            "exactly one model",
        ),
    ],
    "route_unknown_model.yaml": [
        Expected(
            12,
            17,
            "routes[0].backends[1].target",
            "qwen3-8b-2",
            "route target names an unknown model",
            "did you mean 'qwen3-8b-v2'?",
        ),
    ],
    "colocate_with_unknown.yaml": [
        Expected(
            8,
            23,
            "models[1].placement.colocate_with[0]",
            "qwen3-embeding-0.6b",
            "colocate_with names an unknown model",
            "did you mean 'qwen3-embedding-0.6b'?",
        ),
    ],
    "extra_args_owned_flag.yaml": [
        Expected(
            7,
            22,
            "models[0].extra_args.max-model-len",
            8192,
            "--max-model-len is set by the model field `max_model_len`",
            "set `max_model_len:` on the model",
        ),
    ],
    "bad_model_name.yaml": [
        Expected(3, 11, "models[0].name", "Qwen3-8B", "lowercase", "use name: qwen3-8b"),
    ],
    "duplicate_yaml_key.yaml": [
        Expected(
            7,
            5,
            "models[0].replicas",
            None,
            "key 'replicas' appears twice (first on line 5)",
            "remove one of the two 'replicas' entries",
        ),
    ],
    "invalid_url.yaml": [
        Expected(
            3,
            17,
            "models[0].endpoints[0]",
            "localhost:8000",
            "not an http(s) URL",
            "http://10.0.0.5:8000",
        ),
    ],
    "endpoint_with_v1.yaml": [
        Expected(
            5,
            9,
            "models[0].endpoints[0]",
            "http://10.0.0.5:8000/v1",
            "must not end with /v1",
            "drop /v1: http://10.0.0.5:8000",
        ),
    ],
    "empty_models.yaml": [
        Expected(2, 1, "models", [], "must not be empty", "add at least one"),
    ],
    "bad_engine_kind.yaml": [
        Expected(1, 9, "engine.kind", "vllmm", "must be one of: vllm, sim", "did you mean 'vllm'?"),
    ],
    "version_unquoted.yaml": [
        Expected(4, 12, "engine.version", 0.1, "must be a quoted string", 'version: "0.11.0"'),
    ],
    "endpoint_with_engine_fields.yaml": [
        Expected(
            5,
            27,
            "models[0].tensor_parallel_size",
            2,
            "never places or starts it",
            "remove tensor_parallel_size",
        ),
    ],
    "yaml_syntax_error.yaml": [
        Expected(4, 1, "", None, "flow sequence started on line 3", "quoting"),
    ],
    "empty_file.yaml": [
        Expected(1, 1, "", None, "the fleet file is empty", "models:"),
    ],
    "duplicate_node_name.yaml": [
        Expected(6, 13, "gpus.nodes[1].name", "gpu-1", "already used by nodes[0]", "unique name"),
    ],
    "unknown_gpu_type.yaml": [
        Expected(4, 17, "gpus.nodes[0].gpu_type", "Z9000", "unknown GPU", "from the catalog"),
    ],
    "placement_unknown_node.yaml": [
        Expected(
            10,
            13,
            "models[0].placement.node",
            "gpu-node-2",
            "unknown node",
            "did you mean 'gpu-node-1'?",
        ),
    ],
    "scaling_out_of_bounds.yaml": [
        Expected(
            4,
            15,
            "models[0].replicas",
            6,
            "outside scaling bounds [1, 4]",
            "between min_replicas and max_replicas",
        ),
    ],
    "env_cuda_visible_devices.yaml": [
        Expected(
            6,
            29,
            "models[0].env.CUDA_VISIBLE_DEVICES",
            "0",
            "set by the launcher",
            "placement.node",
        ),
    ],
    "env_value_number.yaml": [
        Expected(
            5, 25, "models[0].env.NCCL_P2P_DISABLE", 1, "must be a string", 'NCCL_P2P_DISABLE: "1"'
        ),
    ],
    "route_all_weights_zero.yaml": [
        Expected(6, 5, "routes[0].backends", [0], "all weights are 0", "weight above 0"),
    ],
    "max_tokens_cap_on_embed.yaml": [
        Expected(
            5,
            5,
            "models[0].max_tokens_cap",
            None,
            "embedding model generates no tokens",
            "remove max_tokens_cap",
        ),
    ],
    "pipeline_parallel_too_few_nodes.yaml": [
        Expected(
            9,
            29,
            "models[0].pipeline_parallel_size",
            2,
            "needs 2 nodes with 2 L40S GPUs each (one node per pipeline stage); the inventory "
            "has 1 (gpu-node-1: 2 x L40S)",
            "add nodes of that GPU type to gpus.nodes, or lower pipeline_parallel_size to 1",
        ),
    ],
    "extra_args_pipeline_flag.yaml": [
        Expected(
            6,
            31,
            "models[0].extra_args.pipeline-parallel-size",
            2,
            "--pipeline-parallel-size is set by the model field `pipeline_parallel_size`",
            "set `pipeline_parallel_size:` on the model",
        ),
    ],
    "pipeline_parallel_pinned_node.yaml": [
        Expected(
            11,
            13,
            "models[0].placement.node",
            "gpu-node-1",
            "spans 2 nodes and cannot be pinned to one",
            "drop placement.node",
        ),
    ],
    "bad_choice.yaml": [
        Expected(
            4,
            19,
            "models[0].quantization",
            "awk",
            "must be one of: fp8, awq",
            "did you mean 'awq'?",
        ),
    ],
}


def test_every_broken_file_has_expectations() -> None:
    on_disk = {path.name for path in BROKEN.glob("*.yaml")}
    assert on_disk == set(CASES)
    assert len(on_disk) >= 15


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_fleet_reports_precise_error(name: str) -> None:
    path = BROKEN / name
    with pytest.raises(FleetValidationError) as caught:
        load_fleet(path)
    problems = caught.value.problems
    expected = CASES[name]
    assert len(problems) == len(expected), [p.render() for p in problems]
    for problem, want in zip(problems, expected, strict=True):
        assert problem.file == str(path)
        assert (problem.line, problem.column) == (want.line, want.column), problem.render()
        assert problem.field == want.field
        assert problem.value == want.value
        assert want.message in problem.message
        assert problem.fix is not None and want.fix in problem.fix
        # The rendered line names file:line:column, the field and the fix.
        rendered = problem.render()
        assert rendered.startswith(f"{path}:{want.line}:{want.column}: ")
        assert "Fix: " in rendered
