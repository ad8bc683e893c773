"""Who a job is: ``JobIdentity(dag_id, task_group, name)``; a run of it is (identity, Airflow run id).

The history store keys jobs by the triple (its priors, samples and models never cross it) and the
launcher's job id is derived from the triple and the run id (``operators.job.launcher_job_id``):
the same job name in two DAGs, or in two task groups of one DAG, is two jobs. Jobs recorded
outside Airflow (``dlrover-rm``, benchmarks) have ``dag_id == ''``; a task outside any task group
has ``task_group == ''``. Importable without pandas, SQLAlchemy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The longest dag id, task group id and job name (Airflow's ``ID_LEN``; the store's columns).
ID_LENGTH = 250


@dataclass(frozen=True)
class JobIdentity:
    dag_id: str
    task_group: str
    name: str

    def __post_init__(self) -> None:
        from airflow_dlrover.optimizer.types import InvalidInputError

        for field in ("dag_id", "task_group", "name"):
            value = getattr(self, field)
            if not isinstance(value, str) or len(value) > ID_LENGTH:
                raise InvalidInputError(field, value, f"a string of at most {ID_LENGTH} characters")
        if not self.name:
            raise InvalidInputError("name", self.name, "a non-empty job name")

    def __str__(self) -> str:
        """``dag_id/task_group/name`` (``//name`` for a job outside any DAG and group)."""
        return f"{self.dag_id}/{self.task_group}/{self.name}"

    @classmethod
    def of(cls, job: JobIdentity | str) -> JobIdentity:
        """``job`` itself, or a bare name as a job outside any DAG (``dag_id == ''``)."""
        return job if isinstance(job, JobIdentity) else cls("", "", job)


def task_group_of(task: Any) -> str:
    """The id of the task group ``task`` belongs to; '' for the DAG's root (or no group)."""
    group = getattr(task, "task_group", None)
    return (getattr(group, "group_id", None) or "") if group is not None else ""
