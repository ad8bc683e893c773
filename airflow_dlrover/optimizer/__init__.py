"""Pure decision logic of DLRover-RM: data in, decision out. numpy / scipy / pandas only.

The names below load lazily (PEP 562), so that the vocabulary (``optimizer.types``) imports
without scipy: launchers, the runtime and DAG files use it.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "CONFIG_COLUMNS": "types", "Configuration": "types", "InfeasibleQuotaError": "types", "InvalidInputError": "types",
    "Objective": "types", "Plan": "types", "Quota": "types", "is_allreduce": "types", "validate_samples": "types",
    "ControllerState": "controller", "Observation": "controller", "step": "controller",
    "InstabilityEvent": "instability", "detect": "instability",
    "JobModel": "job_model", "fit_job_model": "job_model",
    "MemoryModel": "memory", "fit_memory": "memory", "fit_trend": "memory",
    "ThroughputModel": "model", "fit_throughput": "model",
    "plan": "planner", "design_probes": "probes",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
