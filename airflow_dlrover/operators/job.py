"""What every DLRover task shares: the job's identity, its arguments, the quota, user errors.

A job has a *name* (``job``, stable across days: the history store keys yesterday's model by it)
and, per DAG run, a launcher *job id* derived from the name and the Airflow ``run_id``, so that
every task of one run — and every retry — addresses the same running job.
"""

from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from airflow.sdk.exceptions import AirflowFailException

# The optimizer (numpy, scipy, pandas) is imported inside the functions: a DAG file that imports
# the operators must parse fast.

#: ``job_args`` a user may set, with their type; everything else of the job spec keeps its default.
JOB_ARGS = {
    "samples": int, "data": str, "table_size": int, "tables": int, "embedding_dim": int, "batch_size": int,
    "shard_size": int, "eval_samples": int, "zipf_skew": float, "seed": int, "checkpoint_interval_s": float,
}
QUOTA_FIELDS = ("cpu", "memory", "gpu", "max_nodes")


def launcher_job_id(job: str, run_id: str) -> str:
    """A DNS-1123-safe id, unique per (job, run): ``<job>-<run>``, hashed past 52 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{job}-{run_id}".lower()).strip("-")
    if len(slug) > 52:
        slug = f"{slug[:43].rstrip('-')}-{hashlib.sha1(slug.encode()).hexdigest()[:8]}"
    return slug


@contextmanager
def user_errors() -> Iterator[None]:
    """A user's mistake fails the task without retry, with the message that names the field."""
    from airflow_dlrover.optimizer.types import InvalidInputError

    try:
        yield
    except InvalidInputError as err:
        raise AirflowFailException(str(err)) from None


def _coerce(field: str, value: Any, kind: type) -> Any:
    from airflow_dlrover.optimizer.types import InvalidInputError
    if kind is str:
        if not isinstance(value, str):
            raise InvalidInputError(field, value, "a string")
        return value
    try:
        number = kind(value)
        if kind is int and float(value) != number:
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidInputError(field, value, f"{'an integer' if kind is int else 'a number'}") from None
    return number


def build_spec(job_id: str, job_args: dict[str, Any] | None):
    """The ``JobSpec`` of ``job_args`` (keys: ``JOB_ARGS``; ``table_size`` × ``tables`` embedding tables;
    ``data``: ``synthetic`` or an existing Criteo-format file)."""
    from airflow_dlrover.optimizer.types import InvalidInputError
    from airflow_dlrover.runtime.spec import JobSpec

    if not isinstance(job_args or {}, dict):
        raise InvalidInputError("job_args", job_args, "a mapping of " + ", ".join(JOB_ARGS))
    args = dict(job_args or {})
    unknown = sorted(set(args) - set(JOB_ARGS))
    if unknown:
        raise InvalidInputError(f"job_args.{unknown[0]}", args[unknown[0]], "one of the keys " + ", ".join(JOB_ARGS))
    values = {k: _coerce(f"job_args.{k}", v, JOB_ARGS[k]) for k, v in args.items() if v is not None}
    data = values.get("data", "synthetic")
    if data != "synthetic" and not Path(data).is_file():
        raise InvalidInputError("job_args.data", data, "synthetic or the path of an existing Criteo-format file")
    tables = values.pop("tables", 26)
    if tables < 1:
        raise InvalidInputError("job_args.tables", tables, "≥ 1")
    table_size = values.pop("table_size", None)
    if table_size is not None:
        values["table_sizes"] = (table_size,) * tables
    minimums = {"samples": 1, "table_sizes": 2, "embedding_dim": 1, "batch_size": 1, "shard_size": 1, "eval_samples": 1}
    for key, minimum in minimums.items():
        value = values.get(key)
        if value is not None and min(value if isinstance(value, tuple) else (value,)) < minimum:
            name = "table_size" if key == "table_sizes" else key
            raise InvalidInputError(f"job_args.{name}", table_size if key == "table_sizes" else value, f"≥ {minimum}")
    if "embedding_dim" in values:  # the bottom MLP ends in the embedding dimension
        values["bottom_mlp"] = (64, values["embedding_dim"])
    return JobSpec(job_id=job_id, **values)


def parse_quota(quota: dict[str, Any] | None, default: Any):
    """``{"cpu": 2, "memory": "8Gi", "gpu": 0, "max_nodes": null}`` → ``Quota``; the connection's quota when None."""
    from airflow_dlrover.optimizer.types import InvalidInputError, Quota

    if quota in (None, "", {}):
        if default is None:
            raise InvalidInputError("quota", quota, "a mapping with cpu and memory, here or in the dlrover connection")
        return default
    if not isinstance(quota, dict):
        raise InvalidInputError("quota", quota, "a mapping with cpu and memory (gpu, max_nodes optional)")
    unknown = sorted(set(quota) - set(QUOTA_FIELDS))
    if unknown:
        raise InvalidInputError(f"quota.{unknown[0]}", quota[unknown[0]], "one of the keys " + ", ".join(QUOTA_FIELDS))
    for key in ("cpu", "memory"):
        if quota.get(key) in (None, ""):
            raise InvalidInputError(f"quota.{key}", quota.get(key), "a value (cpu cores; memory like 8Gi)")
    try:
        return Quota.parse(quota["cpu"], quota["memory"], quota.get("gpu") or 0, quota.get("max_nodes"))
    except InvalidInputError as err:
        raise InvalidInputError(f"quota.{err.field}", err.value, err.allowed) from None


def parse_faults(inject: str | list[str] | None) -> list[dict[str, Any]]:
    """Demo fault injection: ``kill-worker@30s``, ``oom-worker:1@20s`` (comma-separated or a list)."""
    from airflow_dlrover.optimizer.types import InvalidInputError, parse_duration_s
    from airflow_dlrover.runtime.master import FAULT_COMMANDS

    if not inject:
        return []
    items = [i.strip() for i in (inject.split(",") if isinstance(inject, str) else inject) if i and i.strip()]
    faults = []
    for item in items:
        match = re.fullmatch(r"([a-z-]+)(?::(\d+))?@(.+)", item)
        if not match or match.group(1) not in FAULT_COMMANDS:
            raise InvalidInputError("inject", item, " | ".join(f"{k}[:N]@<time>" for k in FAULT_COMMANDS) + ", e.g. kill-worker@30s")
        kind, index, when = match.groups()
        faults.append({"kind": kind, "node": f"worker-{index or 0}", "at_s": parse_duration_s(when, "inject")})
    return faults


class DLRoverTaskMixin:
    """The hook, history store and launcher of a task's ``dlrover_conn_id``, and the run's ids."""

    dlrover_conn_id: str
    job: str

    @cached_property
    def hook(self):
        from airflow_dlrover.hooks.dlrover import DLRoverHook

        return DLRoverHook(self.dlrover_conn_id)

    @cached_property
    def history(self):
        return self.hook.get_history()

    @cached_property
    def launcher(self):
        with user_errors():
            return self.hook.get_launcher(getattr(self, "kubernetes", None))

    def run_ids(self, context: Any) -> tuple[int, str]:
        """(history run id, launcher job id) of this DAG run."""
        from airflow_dlrover.optimizer.types import InvalidInputError

        if not self.job or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(self.job)):
            with user_errors():
                raise InvalidInputError("job", self.job, "a name of letters, digits, '_', '.', '-'")
        run_id = context["run_id"]
        self._dlrover_job_id = launcher_job_id(self.job, run_id)
        return self.history.start_run(self.job, run_id), self._dlrover_job_id

    def on_kill(self) -> None:
        """A killed task (marked failed, cleared, timed out) deletes its run's job: no orphan
        pods or processes. The report task stops the job on every other ending."""
        job_id = getattr(self, "_dlrover_job_id", None)
        if job_id and self.launcher.exists(job_id):
            self.log.warning("task killed: stopping job %s", job_id)
            self.launcher.stop(job_id)

    def turn_ends_at(self) -> float | None:
        """When the task's turn ends (``turn``): it spans its re-deferrals, not each one."""
        import time

        turn = getattr(self, "turn", None)
        return time.time() + duration_s("turn", turn) if turn else None

    def trigger_kwargs(self) -> dict[str, Any]:
        settings = self.hook.settings
        with user_errors():
            options = self.hook.launcher_options(getattr(self, "kubernetes", None))
        return {"launcher": settings.launcher, "jobs_dir": settings.jobs_dir, "launcher_options": options}


def positive_int(field: str, value: Any) -> int:
    """An integer argument (templated fields may arrive as strings); a user error otherwise."""
    with user_errors():
        return _coerce(field, value, int)


def duration_s(field: str, value: Any) -> float:
    from airflow_dlrover.optimizer.types import parse_duration_s

    with user_errors():
        return parse_duration_s(value, field)
