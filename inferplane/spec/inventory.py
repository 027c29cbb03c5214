"""`gpus:` — the GPU inventory: "discover" at run time, or nodes listed by hand."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, StrictStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from inferplane.spec.base import SpecModel
from inferplane.spec.gpu_names import canonical_gpu_type
from inferplane.spec.problems import Issue, issues_error
from inferplane.spec.types import Labels, PositiveFloat, PositiveInt

Interconnect = Literal["nvlink", "pcie", "auto"]
GpuSharing = Literal["none", "mig", "hami"]

_NODE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
# NCCL_SOCKET_IFNAME syntax: names or prefixes, comma-separated, optionally `^` (exclude)
# or `=` (exact match) first.
_IFNAME = re.compile(r"^[\^=]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")
# The gpu_type of a CPU node (`{name, cpu_cores, host_memory_gib}`, engine device cpu):
# its `count` is its cores, each one slot of the CPU planner (planner/cpu.py).
CPU_NODE_TYPE = "cpu"
MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")  # e.g. 1g.10gb, 3g.40gb (nvidia.com/mig-<profile>)


class NodeSpec(SpecModel):
    """One host and its GPUs. All GPUs of a node are one type (TP never mixes types, P12)."""

    name: StrictStr
    gpu_type: StrictStr  # a GPU catalog name, matched forgivingly (`h100`, `L40S`)
    count: PositiveInt
    interconnect: Interconnect = "auto"  # auto: read the topology at run time (P13)
    labels: Labels = Field(default_factory=dict)  # Kubernetes node labels (P14)
    # How Kubernetes shares this node's GPUs (S0, P18): whole cards through the device
    # plugin, MIG slices of one profile (mixed strategy, `nvidia.com/mig-<profile>`), or
    # HAMi virtual GPUs (`nvidia.com/gpumem`, `nvidia.com/gpucores`).
    sharing: GpuSharing = "none"
    mig_profile: StrictStr | None = None  # required with sharing: mig, e.g. 3g.40gb
    # The NIC that links this node to the others (e.g. eth0, ib0, or NCCL's `^docker,lo`):
    # replicas spanning nodes get NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME from it (P34).
    # Unset: NCCL and Gloo pick an interface themselves.
    network_interface: StrictStr | None = None
    # The node's RAM in GiB (`free -g`'s total). Replicas asleep at sleep level 1 keep
    # their weights there; `plan` warns when they would not fit. Unset: unchecked (with
    # `gpus: discover`, the local host's RAM is read).
    host_memory_gib: PositiveFloat | None = None
    # A CPU node (engine device cpu): its cores; gpu_type becomes `cpu`, count the cores.
    cpu_cores: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _cpu_node(cls, data: Any) -> Any:
        # `{name: box, cpu_cores: 8, host_memory_gib: 32}` needs no gpu_type or count.
        if isinstance(data, dict) and "cpu_cores" in data and "gpu_type" not in data:
            return {"gpu_type": CPU_NODE_TYPE, "count": data["cpu_cores"], **data}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NODE_NAME.match(value):
            raise PydanticCustomError(
                "node_name",
                "node name must be letters, digits, '.', '_' or '-'",
                {"fix": "use the host name, e.g. gpu-node-1"},
            )
        return value

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, value: str) -> str:
        if value.strip().lower() == CPU_NODE_TYPE:
            return CPU_NODE_TYPE
        return canonical_gpu_type(value)

    @field_validator("mig_profile")
    @classmethod
    def _mig_profile(cls, value: str | None) -> str | None:
        if value is not None and not MIG_PROFILE.match(value):
            raise PydanticCustomError(
                "mig_profile",
                "MIG profile must look like <slices>g.<memory>gb",
                {"fix": "use the profile name nvidia-smi mig -lgip shows, e.g. 3g.40gb"},
            )
        return value

    @field_validator("network_interface")
    @classmethod
    def _network_interface(cls, value: str | None) -> str | None:
        if value is not None and not _IFNAME.match(value):
            raise PydanticCustomError(
                "network_interface",
                "not an interface name or NCCL_SOCKET_IFNAME list",
                {"fix": "give the interface `ip -br addr` shows on the node, e.g. eth0 or "
                        "ib0 (a prefix such as eth matches eth0, eth1, ...)"},
            )
        return value

    @model_validator(mode="after")
    def _cpu_fields(self) -> NodeSpec:
        if self.cpu_cores is not None and self.gpu_type != CPU_NODE_TYPE:
            raise issues_error([Issue(("cpu_cores",), "cpu_cores describes a CPU node; this "
                                      f"node has GPUs ({self.gpu_type})", self.cpu_cores,
                                      "remove cpu_cores, or gpu_type and count for a CPU node")])
        if self.gpu_type == CPU_NODE_TYPE:
            if self.cpu_cores is None:
                raise issues_error([Issue(("cpu_cores",), "a CPU node needs cpu_cores", None,
                                          "add cpu_cores: N (the cores vLLM may use)")])
            if self.count != self.cpu_cores:
                raise issues_error([Issue(("count",), "a CPU node's count is its cpu_cores",
                                          self.count, "remove count")])
            if self.host_memory_gib is None:
                raise issues_error([Issue(("host_memory_gib",), "a CPU node needs its RAM: "
                                          "weights and KV cache live there", None,
                                          "add host_memory_gib: G (`free -g`'s total)")])
            if self.sharing != "none":
                raise issues_error([Issue(("sharing",), "a CPU node has no GPUs to share",
                                          self.sharing, "remove sharing")])
        return self

    @property
    def is_cpu(self) -> bool:
        """A CPU node (engine device cpu): cores and RAM, no GPUs."""
        return self.gpu_type == CPU_NODE_TYPE

    @model_validator(mode="after")
    def _sharing(self) -> NodeSpec:
        if self.sharing == "mig" and self.mig_profile is None:
            raise issues_error([Issue(("mig_profile",), "sharing: mig needs a mig_profile",
                                      None, "add e.g. mig_profile: 3g.40gb")])
        if self.sharing != "mig" and self.mig_profile is not None:
            raise issues_error([Issue(("mig_profile",), "mig_profile is only used with "
                                      "sharing: mig", self.mig_profile,
                                      "set sharing: mig, or remove mig_profile")])
        return self

    @property
    def mig_memory_gib(self) -> float | None:
        """Memory of one MIG slice in GiB, from the profile name (`3g.40gb` -> 40 GB)."""
        match = MIG_PROFILE.match(self.mig_profile or "")
        return int(match.group(2)) * 10**9 / 2**30 if match else None


class GpuInventory(SpecModel):
    """A static inventory. `gpus: discover` (the default) becomes `FleetSpec.gpus = None`."""

    nodes: list[NodeSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> GpuInventory:
        seen: dict[str, int] = {}
        issues: list[Issue] = []
        for index, node in enumerate(self.nodes):
            if node.name in seen:
                issues.append(
                    Issue(
                        ("nodes", index, "name"),
                        f"node name is already used by nodes[{seen[node.name]}]",
                        node.name,
                        "give every node a unique name",
                    )
                )
            seen.setdefault(node.name, index)
        if issues:
            raise issues_error(issues)
        return self

    @property
    def total_gpus(self) -> int:
        return sum(node.count for node in self.nodes)

    def node(self, name: str) -> NodeSpec | None:
        return next((node for node in self.nodes if node.name == name), None)


def parse_gpus_field(value: Any) -> Any:
    """`gpus: discover` (or null) means "discover at run time"; otherwise a mapping."""
    if value is None or value == "discover":
        return None
    if isinstance(value, dict | GpuInventory):
        return value
    raise PydanticCustomError(
        "gpus_form",
        'must be "discover" or a mapping with nodes',
        {
            "fix": "write gpus: discover, or "
            "gpus: {nodes: [{name: node-1, gpu_type: L40S, count: 1}]}"
        },
    )
