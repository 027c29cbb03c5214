"""Reading YAML with positions: duplicate keys, anchors and merges, documents, files."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferplane.spec import FleetValidationError, load_fleet, parse_fleet
from inferplane.spec.yaml_source import Position, YamlReadError, read_yaml


def test_positions_of_keys_and_values() -> None:
    data, index = read_yaml("a:\n  b: [1, 2]\n  c:\n    - d: x\n")
    assert data == {"a": {"b": [1, 2], "c": [{"d": "x"}]}}
    assert index.find(("a", "b", 1)) == Position(2, 10)
    assert index.find(("a", "c", 0, "d")) == Position(4, 10)
    assert index.find(("a", "c")) == Position(3, 3)  # a collection points at its key
    assert index.find(("a", "missing"), prefer_key=True) == Position(1, 1)  # the parent's key
    assert index.find(("a", "c", 0, "d", "kind")) == Position(4, 10)  # a shorthand scalar


def test_nested_duplicate_keys_are_all_found() -> None:
    with pytest.raises(YamlReadError) as caught:
        read_yaml("a:\n  x: 1\n  x: 2\nb:\n  - y: 1\n    y: 2\na: 3\n")
    found = [(i.position.line, i.field) for i in caught.value.issues]
    assert found == [(3, "a.x"), (6, "b[0].y"), (7, "a")]


ANCHORED = """\
x-defaults: &defaults
  source: Qwen/Qwen3-8B
  max_model_len: 8192
models:
  - <<: *defaults
    name: a
  - <<: *defaults
    name: b
    max_model_len: 4096
  - <<: *defaults
    name: c
    replicas: -1
"""


def test_x_keys_hold_anchors_and_merge_keys_work() -> None:
    text = ANCHORED.replace("    replicas: -1\n", "")
    spec = parse_fleet(text, filename="f.yaml")
    assert [(m.name, m.max_model_len, m.source) for m in spec.models] == [
        ("a", 8192, "Qwen/Qwen3-8B"),
        ("b", 4096, "Qwen/Qwen3-8B"),
        ("c", 8192, "Qwen/Qwen3-8B"),
    ]


def test_errors_inside_merged_mappings_point_at_the_entry() -> None:
    with pytest.raises(FleetValidationError) as caught:
        parse_fleet(ANCHORED, filename="f.yaml")
    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (12, "models[2].replicas")


def test_other_unknown_top_level_keys_still_fail() -> None:
    with pytest.raises(FleetValidationError) as caught:
        parse_fleet(ANCHORED.replace("x-defaults", "defaults"), filename="f.yaml")
    assert [p.field for p in caught.value.problems] == ["defaults", "models[2].replicas"]


def test_more_than_one_document() -> None:
    with pytest.raises(FleetValidationError) as caught:
        parse_fleet("models: []\n---\nmodels: []\n", filename="f.yaml")
    assert caught.value.problems[0].message == "the file has more than one YAML document"


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(FleetValidationError) as caught:
        parse_fleet("- name: m\n", filename="f.yaml")
    problem = caught.value.problems[0]
    assert problem.message == "the fleet file must be a mapping"
    assert problem.value == [{"name": "m"}]


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(FleetValidationError) as caught:
        load_fleet(tmp_path / "nope.yaml")
    problem = caught.value.problems[0]
    assert (problem.line, problem.message) == (None, "file not found")
    assert problem.fix == "check the path"
    with pytest.raises(FleetValidationError) as caught:
        load_fleet(tmp_path)
    assert caught.value.problems[0].message == "is a directory"
