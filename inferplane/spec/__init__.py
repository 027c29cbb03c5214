"""The fleet file: pydantic models, loading with file:line errors, and cross-checks."""

from inferplane.spec.engine import DEFAULT_VLLM_VERSION, EngineKind, EngineSpec
from inferplane.spec.extra_args import OWNED_FLAGS, extra_args_argv
from inferplane.spec.fleet import FleetSpec
from inferplane.spec.gateway import GatewaySpec, GatewayTimeouts
from inferplane.spec.inventory import GpuInventory, Interconnect, NodeSpec
from inferplane.spec.loader import load_fleet, parse_fleet
from inferplane.spec.model import (
    CapAction,
    Dtype,
    KvCacheDtype,
    MaxTokensCap,
    ModelSpec,
    PlacementSpec,
    Quantization,
    RoutingPolicy,
    RoutingSpec,
    Task,
    TimeoutsSpec,
)
from inferplane.spec.problems import FleetValidationError, Problem
from inferplane.spec.scaling import ModelScaling, ScalingPolicy, ScalingSpec, SleepPolicy
from inferplane.spec.summary import FleetSummary, summarize
from inferplane.spec.traffic import KeyLimits, LimitsSpec, RouteBackend, RouteSpec

__all__ = [
    "DEFAULT_VLLM_VERSION",
    "OWNED_FLAGS",
    "CapAction",
    "Dtype",
    "EngineKind",
    "EngineSpec",
    "FleetSpec",
    "FleetSummary",
    "FleetValidationError",
    "GatewaySpec",
    "GatewayTimeouts",
    "GpuInventory",
    "Interconnect",
    "KeyLimits",
    "KvCacheDtype",
    "LimitsSpec",
    "MaxTokensCap",
    "ModelScaling",
    "ModelSpec",
    "NodeSpec",
    "PlacementSpec",
    "Problem",
    "Quantization",
    "RouteBackend",
    "RouteSpec",
    "RoutingPolicy",
    "RoutingSpec",
    "ScalingPolicy",
    "ScalingSpec",
    "SleepPolicy",
    "Task",
    "TimeoutsSpec",
    "extra_args_argv",
    "load_fleet",
    "parse_fleet",
    "summarize",
]
