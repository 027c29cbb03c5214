"""The simulator (`inferplane sim`, package `inferplane.sim`) as an engine: `engine: sim`."""

from inferplane.engines.simulator.engine import ENGINE, SimEngine
from inferplane.engines.simulator.launch import SIM_EXTRA_FLAGS, SimFaults, SimLaunchArgs, sim_argv

__all__ = ["ENGINE", "SIM_EXTRA_FLAGS", "SimEngine", "SimFaults", "SimLaunchArgs", "sim_argv"]
