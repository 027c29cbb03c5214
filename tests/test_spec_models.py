"""Behaviour of the fleet-file models: defaults, normalisation, and the rules between fields."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from inferplane.engines.vllm.versions import DEFAULT_VLLM_VERSION
from inferplane.errors import InferplaneError
from inferplane.spec import (
    FleetSpec,
    FleetValidationError,
    ModelSpec,
    Problem,
    extra_args_argv,
    parse_fleet,
)

ENDPOINT_MODEL = '  - name: m\n    endpoints: ["http://127.0.0.1:8100"]\n'


def fleet(text: str, base_dir: Path | None = None) -> FleetSpec:
    return parse_fleet(textwrap.dedent(text), filename="fleet.yaml", base_dir=base_dir)


def problems(text: str) -> list[Problem]:
    with pytest.raises(FleetValidationError) as caught:
        fleet(text)
    return list(caught.value.problems)


def only(text: str) -> Problem:
    found = problems(text)
    assert len(found) == 1, [p.render() for p in found]
    return found[0]


def test_smallest_fleet_gets_every_default() -> None:
    spec = fleet("models:\n" + ENDPOINT_MODEL)
    assert (spec.engine.kind, spec.engine.version) == ("vllm", DEFAULT_VLLM_VERSION)
    # gpus: discover, but nothing to place: planning never asks NVML (issue 13.5)
    assert spec.gpus is None and not spec.discover_gpus
    assert (spec.gateway.host, spec.gateway.port, spec.gateway.max_body_mib) == (
        "127.0.0.1",
        8000,
        32.0,
    )
    model = spec.models[0]
    assert model.is_endpoint and model.engine_model_name == "m"
    assert spec.endpoint_models == [model] and spec.placed_models == []
    assert (spec.routes, spec.scaling.models) == ([], {})


def test_engine_shorthand_and_gpu_name_canonicalised() -> None:
    spec = fleet(
        """
        engine: sim
        gpus:
          nodes:
            - {name: n1, gpu_type: h100, count: 8, interconnect: nvlink}
        models:
          - {name: m, endpoints: ["http://127.0.0.1:8100"]}
        """
    )
    assert spec.engine.kind == "sim"
    assert spec.gpus is not None
    assert spec.gpus.nodes[0].gpu_type == "H100-SXM-80GB"
    assert spec.gpus.total_gpus == 8


def test_gpus_discover_is_explicit_too() -> None:
    assert fleet("gpus: discover\nmodels:\n" + ENDPOINT_MODEL).gpus is None
    problem = only("gpus: all\nmodels:\n" + ENDPOINT_MODEL)
    assert (problem.field, problem.value) == ("gpus", "all")
    assert problem.fix is not None and "gpus: discover" in problem.fix


def test_relative_source_resolves_against_the_fleet_directory(tmp_path: Path) -> None:
    (tmp_path / "models" / "org--m").mkdir(parents=True)
    (tmp_path / "Qwen" / "local").mkdir(parents=True)
    spec = fleet(
        """
        models:
          - {name: a, source: ./models/org--m}
          - {name: b, source: Qwen/Qwen3-8B}
          - {name: c, source: Qwen/local}
          - {name: d, source: /abs/path/../model}
        """,
        base_dir=tmp_path,
    )
    sources = [m.source for m in spec.models]
    assert sources == [
        str(tmp_path / "models" / "org--m"),
        "Qwen/Qwen3-8B",  # a Hugging Face id stays as it is
        str(tmp_path / "Qwen" / "local"),  # an org/name that exists locally is a path
        "/abs/model",
    ]
    assert [m.source_is_hf_id for m in spec.models] == [False, True, False, False]


def test_source_that_is_neither_path_nor_id(tmp_path: Path) -> None:
    problem = only("models:\n  - {name: a, source: qwen3-8b}\n")
    assert problem.field == "models[0].source"
    assert problem.fix is not None and "./dir" in problem.fix


def test_extra_args_are_normalised_and_rendered() -> None:
    spec = fleet(
        """
        models:
          - name: a
            source: Qwen/Qwen3-8B
            extra_args:
              --enable_prefix_caching: true
              enable-chunked-prefill: false
              reasoning-parser: deepseek_r1
              cudagraph-capture-sizes: [1, 2, 4]
              compilation-config: {cudagraph_capture_sizes: [1, 2]}
              swap-space: 0
        """
    )
    args = spec.models[0].extra_args
    assert list(args) == [
        "enable-prefix-caching",
        "enable-chunked-prefill",
        "reasoning-parser",
        "cudagraph-capture-sizes",
        "compilation-config",
        "swap-space",
    ]
    assert extra_args_argv(args) == [
        "--enable-prefix-caching",
        "--no-enable-chunked-prefill",
        "--reasoning-parser",
        "deepseek_r1",
        "--cudagraph-capture-sizes",
        "1",
        "2",
        "4",
        "--compilation-config",
        '{"cudagraph_capture_sizes":[1,2]}',  # one argv item: no shell/Helm quoting (P05)
        "--swap-space",
        "0",
    ]
    assert json.loads(extra_args_argv({"c": {"a": [1]}})[1]) == {"a": [1]}


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("no-enforce-eager", "enforce_eager"),
        ("kv_cache_memory_bytes", "kv_cache_memory_gib"),
        ("served-model-name", "served_model_name"),
        ("model", "source"),
    ],
)
def test_extra_args_owned_by_fields(key: str, field: str) -> None:
    problem = only(
        f"models:\n  - name: a\n    source: Qwen/Qwen3-8B\n    extra_args: {{{key}: 1}}\n"
    )
    assert problem.field == f"models[0].extra_args.{key}"
    assert problem.fix == f"remove it from extra_args and set `{field}:` on the model"


def test_extra_args_port_and_bad_values() -> None:
    found = problems(
        """
        models:
          - name: a
            source: Qwen/Qwen3-8B
            extra_args: {port: 9000, foo: null, bar: [[1]]}
        """
    )
    assert [(p.field, p.message) for p in found] == [
        ("models[0].extra_args.port", "--port cannot be set per model"),
        ("models[0].extra_args.foo", "flag value is empty"),
        ("models[0].extra_args.bar", "list items must be strings, numbers or booleans"),
    ]


def test_endpoints_normalised_and_duplicates_rejected() -> None:
    spec = fleet('models:\n  - {name: a, endpoints: ["https://h.example/qwen/", "http://h:1"]}\n')
    assert spec.models[0].endpoints == ["https://h.example/qwen", "http://h:1"]
    problem = only('models:\n  - {name: a, endpoints: ["http://h:1", "http://h:1/"]}\n')
    assert (problem.field, problem.message) == (
        "models[0].endpoints[1]",
        "endpoint is listed twice",
    )
    problem = only('models:\n  - {name: a, endpoints: ["http://h:99999"]}\n')
    assert "port" in problem.message


def test_strict_types_do_not_coerce() -> None:
    found = problems(
        """
        models:
          - name: a
            source: Qwen/Qwen3-8B
            replicas: true
            enforce_eager: "yes"
            max_model_len: 8192.5
        """
    )
    assert [(p.field, p.message) for p in found] == [
        ("models[0].replicas", "must be a whole number"),
        ("models[0].enforce_eager", "must be true or false"),
        ("models[0].max_model_len", 'must be a positive integer or "auto"'),
    ]


def test_all_problems_are_reported_together_in_file_order() -> None:
    found = problems(
        """
        engine: {kind: vllm, versoin: "0.11.0"}
        models:
          - name: a
            source: Qwen/Qwen3-8B
            replicas: -2
          - name: B
            endpoints: ["http://h:1"]
        gateway: {port: 70000}
        """
    )
    assert [p.field for p in found] == [
        "engine.versoin",
        "models[0].replicas",
        "models[1].name",
        "gateway.port",
    ]
    assert found[0].fix == "did you mean 'version'?"
    assert [p.line for p in found] == sorted(p.line or 0 for p in found)


def test_error_is_an_inferplane_error_that_lists_every_problem() -> None:
    with pytest.raises(InferplaneError) as caught:
        fleet("models:\n  - {name: a, source: Qwen/Qwen3-8B, replicas: -1, dtype: fp4}\n")
    text = caught.value.render()
    assert text.splitlines()[0] == "fleet.yaml: 2 problems"
    assert "fleet.yaml:2:" in text and "models[0].replicas" in text and "models[0].dtype" in text


def test_placement_rules() -> None:
    found = problems(
        """
        gpus:
          nodes:
            - {name: n1, gpu_type: L40S, count: 2}
        models:
          - name: big
            source: Qwen/Qwen3-32B
            placement: {exclusive: true}
          - name: small
            source: Qwen/Qwen3-8B
            placement: {colocate_with: [big, small, remote], node: n1, gpu_type: H100}
          - name: remote
            endpoints: ["http://h:1"]
          - name: other
            source: Qwen/Qwen3-8B
            placement: {gpu_type: A100-80GB}
        """
    )
    assert [(p.field, p.message) for p in found] == [
        (
            "models[1].placement.colocate_with[0]",
            "model 'big' is placement.exclusive and shares no GPU",
        ),
        ("models[1].placement.colocate_with[1]", "a model cannot be co-located with itself"),
        (
            "models[1].placement.colocate_with[2]",
            "model 'remote' is served elsewhere (endpoints): no GPU to share",
        ),
        ("models[1].placement.gpu_type", "node 'n1' has L40S GPUs"),
        ("models[3].placement.gpu_type", "no node in gpus.nodes has this GPU type"),
    ]


def test_exclusive_model_cannot_colocate() -> None:
    problem = only(
        "models:\n  - name: a\n    source: Qwen/Qwen3-8B\n"
        "    placement: {exclusive: true, colocate_with: [b]}\n"
        "  - {name: b, source: Qwen/Qwen3-8B}\n"
    )
    assert problem.field == "models[0].placement.exclusive"


def test_route_rules() -> None:
    found = problems(
        """
        models:
          - {name: chat, source: Qwen/Qwen3-8B, aliases: [gpt]}
          - {name: embed, source: Qwen/Qwen3-Embedding-0.6B, task: embed}
        routes:
          - model: gpt
            backends: [{target: chat, weight: 1}]
          - model: chat
            backends:
              - {target: embed, weight: 1}
              - {target: chat, weight: 1}
              - {target: chat, weight: 2}
        """
    )
    assert [(p.field, p.fix) for p in found] == [
        ("routes[1].backends[2].target", "merge the two entries into one weight"),
    ]
    found = problems(
        """
        models:
          - {name: chat, source: Qwen/Qwen3-8B, aliases: [gpt]}
          - {name: embed, source: Qwen/Qwen3-Embedding-0.6B, task: embed}
        routes:
          - model: gpt
            backends: [{target: chat, weight: 1}]
          - model: chat
            backends: [{target: embed, weight: 1}]
          - model: chat
            backends: [{target: chat, weight: 1}]
        """
    )
    assert [(p.field, p.fix) for p in found] == [
        ("routes[0].model", "route the model's name: model: chat"),
        ("routes[1].backends[0].target", "route only between models of the same task"),
        ("routes[2].model", "merge the backends into one route"),
    ]


def test_route_shares_and_lookups() -> None:
    spec = fleet(
        """
        models:
          - {name: chat, source: Qwen/Qwen3-8B, aliases: [gpt]}
          - {name: chat-v2, source: Qwen/Qwen3-8B}
        routes:
          - model: chat
            backends: [{target: chat, weight: 95}, {target: chat-v2, weight: 5}]
        """
    )
    assert spec.routes[0].shares() == {"chat": 0.95, "chat-v2": 0.05}
    assert spec.model("gpt") is spec.models[0]
    assert spec.model("chat-v2") is spec.models[1]
    assert spec.model("nope") is None
    assert spec.models[0].client_names == ("chat", "gpt")


def test_timeouts_fall_back_field_by_field() -> None:
    spec = fleet(
        """
        models:
          - {name: a, endpoints: ["http://h:1"], timeouts: {first_byte_s: 30}}
          - {name: b, endpoints: ["http://h:2"]}
        gateway:
          timeouts: {total_s: 900}
        """
    )
    a = spec.timeouts_for("a")
    assert (a.first_byte_s, a.total_s, a.connect_s) == (30.0, 900.0, 10.0)
    assert spec.timeouts_for("b") == spec.gateway.timeouts
    problem = only(
        "models:\n  - {name: a, endpoints: ['http://h:1'],"
        " timeouts: {first_byte_s: 60, total_s: 30}}\n"
    )
    assert problem.field == "models[0].timeouts.first_byte_s"


def test_scaling_rules() -> None:
    found = problems(
        """
        models:
          - {name: a, source: Qwen/Qwen3-8B}
          - {name: r, endpoints: ["http://h:1"]}
        scaling:
          models:
            a: {min_replicas: 3, max_replicas: 2}
        """
    )
    assert [(p.field, p.message) for p in found] == [
        ("scaling.models.a.min_replicas", "min_replicas is above max_replicas (2)"),
    ]
    found = problems(
        """
        models:
          - {name: a, source: Qwen/Qwen3-8B}
          - {name: r, endpoints: ["http://h:1"]}
        scaling:
          models:
            b: {max_replicas: 2}
            r: {max_replicas: 2}
        """
    )
    assert [(p.field, p.fix) for p in found] == [
        ("scaling.models.b", "valid model names: a, r"),
        ("scaling.models.r", "remove it from scaling.models"),
    ]
    spec = fleet(
        """
        models:
          - {name: a, source: Qwen/Qwen3-8B, replicas: 2}
        scaling:
          policy: {target_waiting_requests: 10}
          models:
            a: {max_replicas: 4, policy: {scale_down_window_s: 60}}
        """
    )
    assert spec.scaling.policy.target_waiting_requests == 10
    assert spec.scaling.policy_for("a").scale_down_window_s == 60.0
    assert spec.scaling.policy_for("zzz") is spec.scaling.policy


def test_endpoint_model_lists_every_engine_field_it_sets() -> None:
    found = problems(
        """
        models:
          - name: r
            endpoints: ["http://h:1"]
            replicas: 2
            placement: {node: x}
            max_num_seqs: 64
        """
    )
    assert [p.field for p in found] == ["models[0].replicas", "models[0].placement"]
    assert found[1].value == {
        "colocate_with": [],
        "node": "x",
        "gpu_type": None,
        "exclusive": False,
    }


def test_python_construction_validates_the_same_rules() -> None:
    with pytest.raises(ValidationError):
        FleetSpec(models=[ModelSpec(name="a", endpoints=["http://h:1"], aliases=["a"])])
    with pytest.raises(ValidationError):
        ModelSpec(name="a")  # neither source nor endpoints
    spec = FleetSpec(models=[ModelSpec(name="a", endpoints=["http://h:1"])])
    assert spec.models[0].name == "a"


def test_model_name_rules() -> None:
    problem = only("models:\n  - {name: " + "a" * 64 + ", endpoints: ['http://h:1']}\n")
    assert problem.fix is not None and problem.fix.startswith("use name: " + "a" * 63)
    problem = only("models:\n  - {name: 'Qwen/Qwen3-32B', endpoints: ['http://h:1']}\n")
    assert problem.fix is not None and "use name: qwen-qwen3-32b" in problem.fix
    assert fleet("models:\n  - {name: qwen2.5-7b, endpoints: ['http://h:1']}\n")
