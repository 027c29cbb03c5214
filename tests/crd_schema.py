"""A CRD's openAPIV3Schema as the strict draft-07 JSON schema `render --check` uses.

The same rewrite as the vendored PodGroup and LeaderWorkerSet schemas
(inferplane/deploy/schemas/README.md): descriptions, defaults and `x-kubernetes-*`
extensions dropped (the CEL rules are checked by `checks.py` itself), `additionalProperties:
false` wherever properties are listed (the API server would prune an unknown field
silently; the check must catch it), apiVersion and kind pinned, `metadata` narrowed to the
ObjectMeta fields inferplane writes, no `status`.
"""

from __future__ import annotations

from typing import Any

DROP = ("description", "default")
METADATA = {
    "type": "object", "additionalProperties": False, "required": ["name"],
    "properties": {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()
           if k not in DROP and not k.startswith("x-kubernetes-")}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_schema(crd: dict[str, Any], version: str, source: str) -> dict[str, Any]:
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(served["schema"]["openAPIV3Schema"])
    props = schema["properties"]
    props.pop("status", None)
    props["apiVersion"] = {"const": f"{group}/{version}"}
    props["kind"] = {"const": kind}
    props["metadata"] = METADATA
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "$comment": f"openAPIV3Schema of {crd['metadata']['name']} {version} ({source}), "
                        "rewritten by tests/crd_schema.py (see its docstring)",
            "title": f"{kind} {group}/{version}", **schema}
