"""Pure decision logic of DLRover-RM: data in, decision out. numpy / scipy / pandas only."""

from airflow_dlrover.optimizer.finetune import Decision, ResizeRecord, decide
from airflow_dlrover.optimizer.instability import InstabilityEvent, detect
from airflow_dlrover.optimizer.job_model import JobModel, fit_job_model
from airflow_dlrover.optimizer.memory import MemoryModel, fit_memory, fit_trend
from airflow_dlrover.optimizer.model import ThroughputModel, fit_throughput
from airflow_dlrover.optimizer.planner import plan
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import (
    CONFIG_COLUMNS,
    Configuration,
    InfeasibleQuotaError,
    InvalidInputError,
    Plan,
    Quota,
    validate_samples,
)

__all__ = [
    "CONFIG_COLUMNS", "Configuration", "Decision", "InfeasibleQuotaError", "InstabilityEvent",
    "InvalidInputError", "JobModel", "MemoryModel", "Plan", "Quota", "ResizeRecord",
    "ThroughputModel", "decide", "design_probes", "detect", "fit_job_model", "fit_memory",
    "fit_throughput", "fit_trend", "plan", "validate_samples",
]
