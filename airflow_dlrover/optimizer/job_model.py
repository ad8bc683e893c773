"""A job's fitted models together — throughput and memory — as one JSON document."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from airflow_dlrover.optimizer.memory import MemoryModel, fit_memory, has_memory_usage
from airflow_dlrover.optimizer.model import ThroughputModel, fit_throughput
from airflow_dlrover.optimizer.types import InvalidInputError, check_kind, validate_samples

FORMAT = "airflow-dlrover/job-model"
VERSION = 1


@dataclass(frozen=True)
class JobModel:
    """The throughput and memory models of one job, of one kind (``types.is_allreduce``)."""

    throughput: ThroughputModel
    memory: MemoryModel | None

    def __post_init__(self) -> None:
        if self.memory is not None:
            check_kind(self.memory, self.throughput.allreduce, "model.memory", "the throughput model is")

    @property
    def allreduce(self) -> bool:
        return self.throughput.allreduce

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "throughput": self.throughput.to_dict(),
            "memory": self.memory.to_dict() if self.memory else None,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "JobModel":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InvalidInputError("model", str(data)[:60], f'a JSON document with "format": "{FORMAT}"')
        if data.get("version") != VERSION:
            raise InvalidInputError("model.version", data.get("version"), str(VERSION))
        memory = MemoryModel.from_dict(data["memory"]) if data.get("memory") else None
        return cls(ThroughputModel.from_dict(data["throughput"]), memory)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> "JobModel":
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise InvalidInputError("model", str(path), "an existing model file") from None
        except json.JSONDecodeError as err:
            raise InvalidInputError("model", str(path), f"a JSON file ({err})") from None
        return cls.from_dict(data)


def fit_job_model(samples: pd.DataFrame, prior: JobModel | None = None, *, table_capacity_mb: float | None = None,
                  largest_table_mb: float | None = None, memory_samples: pd.DataFrame | None = None,
                  **kwargs: Any) -> JobModel:
    """Fit throughput (warm-started from ``prior``) and, when memory was measured, memory (its
    tables bounded by ``table_capacity_mb``, the job's layout, when given, whose largest table is
    ``largest_table_mb``) on ``memory_samples`` (default: ``samples``), the PS base the prior's
    where the PS count never varies (``memory.fit_memory``'s ``base_from``)."""
    table = validate_samples(samples)
    throughput = fit_throughput(table, prior.throughput if prior else None, validated=True, **kwargs)
    memory_table = table if memory_samples is None else validate_samples(memory_samples)
    memory = (fit_memory(memory_table, validated=True, table_capacity_mb=table_capacity_mb,
                         largest_table_mb=largest_table_mb, base_from=prior.memory if prior else None)
              if has_memory_usage(memory_table) else (prior.memory if prior else None))
    return JobModel(throughput, memory)


def choose_prior(models: Iterable[JobModel]) -> JobModel | None:
    """The prior that warm-starts a run, from the job's earlier models (newest first): the
    throughput model of the newest *cold* fit (one without a prior, on a full profile) with the
    newest memory model; None for a job never fitted, or fitted only on partial profiles.

    Warm-started fits never become priors: each is pulled toward its own prior, so a chain of them
    compounds the errors of a few probes run after run (measured in the cluster simulation:
    ``benchmarks/simulate.py``). Nor do partial fits (``FitReport.partial``): a term their
    profile did not identify is pinned at 0, a bottleneck every later plan would take for absent."""
    newest = cold = None
    for model in models:
        report = model.throughput.report
        if report is not None and report.partial:
            continue
        newest = newest or model
        if report is None or not report.warm_start:
            cold = model
            break
    if newest is None:
        return None
    return JobModel((cold or newest).throughput, newest.memory)
