"""Read YAML keeping where each value was written, so errors can name file:line:column.

PyYAML's `compose` gives node marks; we check for duplicate keys on the node tree (YAML
itself silently keeps the last one), then construct plain data and an index from each
value's path (`("models", 1, "name")`) to its position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from inferplane.spec.problems import Loc, format_loc

MERGE_KEY = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Position:
    line: int  # 1-based
    column: int  # 1-based


@dataclass
class PositionIndex:
    """Where each path's key and value were written."""

    keys: dict[Loc, Position] = field(default_factory=dict)
    values: dict[Loc, tuple[Position, bool]] = field(default_factory=dict)  # (pos, is_scalar)

    def find(self, loc: Loc, *, prefer_key: bool = False) -> Position:
        """The best position for `loc`: the value (a scalar's own column) or its key; for a
        path that does not exist (a missing key, a shorthand) the closest existing parent."""
        for end in range(len(loc), -1, -1):
            prefix = loc[:end]
            key = self.keys.get(prefix)
            value = self.values.get(prefix)
            if prefer_key and key is not None and end == len(loc):
                return key
            if value is not None and value[1]:
                return value[0]
            if key is not None:
                return key
            if value is not None:
                return value[0]
        return Position(1, 1)


@dataclass(frozen=True)
class YamlIssue:
    """A problem found while reading the YAML itself."""

    position: Position
    field: str
    message: str
    fix: str
    value: Any = None


class YamlReadError(Exception):
    def __init__(self, issues: list[YamlIssue]) -> None:
        super().__init__("; ".join(issue.message for issue in issues))
        self.issues = issues


def read_yaml(text: str) -> tuple[Any, PositionIndex]:
    """Parse one YAML document into plain data and a position index.

    Raises `YamlReadError` for syntax errors, several documents, and duplicate keys.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, PositionIndex()
        duplicates = _duplicate_keys(node, (), set())
        if duplicates:
            raise YamlReadError(duplicates)
        data = loader.construct_document(node)  # also expands `<<` merges in the node tree
    except yaml.MarkedYAMLError as exc:
        raise YamlReadError([_syntax_issue(exc)]) from exc
    except yaml.YAMLError as exc:
        raise YamlReadError(
            [YamlIssue(Position(1, 1), "", f"YAML error: {exc}", "fix the YAML syntax")]
        ) from exc
    finally:
        loader.dispose()
    index = PositionIndex()
    index.values[()] = (_position(node.start_mark), isinstance(node, yaml.ScalarNode))
    _index(node, (), index, set())
    return data, index


def _position(mark: yaml.Mark) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _syntax_issue(exc: yaml.MarkedYAMLError) -> YamlIssue:
    mark = exc.problem_mark or exc.context_mark
    position = _position(mark) if mark is not None else Position(1, 1)
    problem = exc.problem or "invalid YAML"
    if exc.context and exc.context_mark is not None:
        # e.g. "while parsing a flow sequence" that began on an earlier line
        problem += f" ({exc.context} started on line {exc.context_mark.line + 1})"
    if "expected a single document" in str(exc.context or ""):
        return YamlIssue(
            position, "", "the file has more than one YAML document", "keep one fleet per file"
        )
    fix = "check the indentation (spaces, not tabs) and quoting near this line"
    if "'\\t'" in problem:
        fix = "replace tabs with spaces"
    return YamlIssue(position, "", f"YAML syntax error: {problem}", fix)


def _key_text(node: yaml.Node) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _duplicate_keys(node: yaml.Node, loc: Loc, active: set[int]) -> list[YamlIssue]:
    if id(node) in active:  # a recursive alias; construct reports or handles it
        return []
    active = active | {id(node)}
    issues: list[YamlIssue] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = _key_text(key_node)
            if key is not None and key_node.tag != MERGE_KEY:
                if key in seen:
                    first_line = seen[key].start_mark.line + 1
                    issues.append(
                        YamlIssue(
                            _position(key_node.start_mark),
                            format_loc((*loc, key)),
                            f"key {key!r} appears twice (first on line {first_line}); "
                            "YAML would silently keep only the last",
                            f"remove one of the two {key!r} entries",
                        )
                    )
                seen.setdefault(key, key_node)
            child = (*loc, key) if key is not None else loc
            issues += _duplicate_keys(value_node, child, active)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            issues += _duplicate_keys(item, (*loc, position), active)
    return issues


def _index(node: yaml.Node, loc: Loc, index: PositionIndex, active: set[int]) -> None:
    if id(node) in active:
        return
    active = active | {id(node)}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _key_text(key_node)
            if key is None or key_node.tag == MERGE_KEY:
                continue
            child = (*loc, key)
            # After `<<` merges, later entries win here as they do in the constructed data.
            index.keys[child] = _position(key_node.start_mark)
            index.values[child] = (
                _position(value_node.start_mark),
                isinstance(value_node, yaml.ScalarNode),
            )
            _index(value_node, child, index, active)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            index.values[(*loc, position)] = (
                _position(item.start_mark),
                isinstance(item, yaml.ScalarNode),
            )
            _index(item, (*loc, position), index, active)
