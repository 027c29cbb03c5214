"""Model profiles: what the planner needs to know about a checkpoint (`load_profile`)."""

from inferplane.models.loader import load_profile, profile_from_config
from inferplane.models.profile import ModelProfile, ParamCounts, QuantizationInfo

__all__ = [
    "ModelProfile",
    "ParamCounts",
    "QuantizationInfo",
    "load_profile",
    "profile_from_config",
]
