"""The DLRover tasks' arguments: the job's launcher id, its ``job_args``, the quota, the faults
to inject, durations — each checked, a user's mistake failing the task without retry.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from contextlib import contextmanager
from typing import Any, Iterator

from airflow.sdk.exceptions import AirflowFailException

from airflow_dlrover.history.identity import JobIdentity

# The optimizer (numpy, scipy, pandas) is imported inside the functions: a DAG file that imports
# the operators must parse fast.

#: ``job_args`` a user may set, with their type; everything else of the job spec keeps its default.
JOB_ARGS = {
    "samples": int, "data": str, "table_size": int, "tables": int, "embedding_dim": int, "batch_size": int,
    "shard_size": int, "eval_samples": int, "zipf_skew": float, "seed": int, "checkpoint_interval_s": float,
    "layout": dict, "model": str, "export": str, "eval_files": int, "eval_fraction": float, "max_bad_rows": int,
    "trainer": dict, "epochs": int, "learning_rate": float, "dense_learning_rate": float,
    "adagrad_initial_accumulator": float, "adam_betas": tuple, "dense_weight_decay": float, "init_from": str,
    "shuffle_window_rows": int,
}
#: ``job_args`` a trainer of the user's takes (``launchers.contract``): the rest are our runtime's.
TRAINER_JOB_ARGS = ("trainer", "samples", "batch_size")
#: What each ``job_args`` value allows; the runtime would fail on the others later, and be retried.
JOB_ARG_RULES: dict[str, tuple[Any, str]] = {
    "samples": (lambda v: v >= 1, "an integer ≥ 1"),
    "table_size": (lambda v: v >= 2, "an integer ≥ 2 (rows per embedding table)"),
    "tables": (lambda v: v >= 1, "an integer ≥ 1"),
    "embedding_dim": (lambda v: v >= 1, "an integer ≥ 1"),
    "batch_size": (lambda v: v >= 1, "an integer ≥ 1"),
    "shard_size": (lambda v: v >= 1, "an integer ≥ 1"),
    "eval_samples": (lambda v: v >= 1, "an integer ≥ 1"),
    "zipf_skew": (lambda v: v >= 0, "a finite number ≥ 0 (0 = uniform ids)"),
    "seed": (lambda v: 0 <= v < 2**32, "an integer in [0, 2**32)"),
    "checkpoint_interval_s": (lambda v: v > 0, "a finite number of seconds > 0"),
    "eval_files": (lambda v: v >= 0, "an integer ≥ 0 (0: hold out eval_fraction of the rows instead)"),
    "eval_fraction": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "max_bad_rows": (lambda v: v >= 0, "an integer ≥ 0"),
    "shuffle_window_rows": (lambda v: v >= 0, "an integer ≥ 0 (rows shuffled together; 0: the data's order)"),
}
QUOTA_FIELDS = ("cpu", "memory", "gpu", "max_nodes")


def launcher_job_id(job: JobIdentity, run_id: str) -> str:
    """A DNS-1123-safe id, the same for every task and retry of one run of one job
    (``job``): ``<name>-<run>``, then ``-<6 hex>`` of the DAG id and
    task group when either is set (two DAGs' jobs of one name and run id never share an id), the
    whole hashed past 52 characters (over all four parts)."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{job.name}-{run_id}".lower()).strip("-")
    if job.dag_id or job.task_group:
        slug = f"{slug}-{_digest(job.dag_id, job.task_group)[:6]}"
    if len(slug) > 52:
        slug = f"{slug[:43].rstrip('-')}-{_digest(job.dag_id, job.task_group, job.name, run_id)[:8]}"
    from airflow_dlrover.runtime.spec import check_job_id

    return check_job_id(slug)


def _digest(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()


@contextmanager
def user_errors() -> Iterator[None]:
    """A user's mistake, or a failure the controller says no retry fixes (``JobFailed``), fails the
    task without retry, with the message that names the field."""
    from airflow_dlrover.optimizer.types import InvalidInputError, JobFailed

    try:
        yield
    except (InvalidInputError, JobFailed) as err:
        raise AirflowFailException(str(err)) from None


def rendered(field: str, value: Any, allowed: str = "a mapping") -> Any:
    """A templated mapping as the template meant it. Without ``render_template_as_native_obj``
    Jinja renders every value as text: a mapping as its ``repr`` (a Python literal) or, from a
    param, as JSON text; ``None`` as ``"None"``. Such text becomes its value again
    (``json.loads``, else ``ast.literal_eval``: literals only, nothing is executed)."""
    import ast

    from airflow_dlrover.optimizer.types import InvalidInputError

    if not isinstance(value, str):
        return value
    text = value.strip()
    if text in ("", "None", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise InvalidInputError(field, value, f"{allowed}, or its JSON text", str(err)) from None


def _coerce(field: str, value: Any, kind: type) -> Any:
    from airflow_dlrover.optimizer.types import InvalidInputError
    if kind is str:
        if not isinstance(value, str):
            raise InvalidInputError(field, value, "a string")
        return value
    if kind is tuple:  # numbers: a list, or its text
        value = rendered(field, value, "a list of numbers")
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (int, float)) for v in value):
            raise InvalidInputError(field, value, "a list of numbers, e.g. [0.9, 0.999]")
        return tuple(float(v) for v in value)
    if kind is dict:  # a layout, a trainer: a mapping, or its text (a templated field renders to a string)
        value = rendered(field, value)
        if not isinstance(value, dict):
            raise InvalidInputError(field, value, "a mapping (label, dense, sparse)")
        return value
    try:
        number = kind(value)
        if kind is int and float(value) != number:
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidInputError(field, value, f"{'an integer' if kind is int else 'a number'}") from None
    return number


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def build_spec(job_id: str, job_args: dict[str, Any] | None):
    """The ``JobSpec`` of ``job_args`` (keys: ``JOB_ARGS``; ``table_size`` × ``tables`` embedding
    tables of the default Criteo layout, or a ``layout``; ``data``: ``synthetic`` or a dataset, which
    is indexed and checked against the layout here, before anything starts: ``runtime.prepare``)."""
    from airflow_dlrover.optimizer.types import InvalidInputError
    from airflow_dlrover.runtime.prepare import prepare
    from airflow_dlrover.runtime.spec import JobSpec

    job_args = rendered("job_args", job_args)
    if not isinstance(job_args or {}, dict):
        raise InvalidInputError("job_args", job_args, "a mapping of " + ", ".join(JOB_ARGS))
    args = {k: None if v in ("None", "") and JOB_ARGS.get(k) is not str else v for k, v in (job_args or {}).items()}
    unknown = sorted(set(args) - set(JOB_ARGS))
    if unknown:
        raise InvalidInputError(f"job_args.{unknown[0]}", args[unknown[0]], "one of the keys " + ", ".join(JOB_ARGS))
    values = {k: _coerce(f"job_args.{k}", v, JOB_ARGS[k]) for k, v in args.items() if v is not None}
    if "trainer" in values:
        return _trainer_spec(job_id, values)
    for key, value in values.items():
        rule = JOB_ARG_RULES.get(key)
        if rule is not None and not (_finite(value) and rule[0](value)):
            raise InvalidInputError(f"job_args.{key}", value, rule[1])
    tables = values.pop("tables", 26)
    table_size = values.pop("table_size", None)
    if "layout" in values and (table_size is not None or "tables" in args or "embedding_dim" in values):
        raise InvalidInputError("job_args.layout", values["layout"], "a layout, or table_size/tables/embedding_dim "
                                "for the default Criteo one, not both")
    if table_size is not None:
        values["table_sizes"] = (table_size,) * tables
    elif "tables" in args:
        values["table_sizes"] = (JobSpec.table_sizes[0],) * tables
    if "embedding_dim" in values:  # the bottom MLP ends in the embedding dimension
        values["bottom_mlp"] = (64, values["embedding_dim"])
    if "layout" in values:
        from airflow_dlrover.runtime.layout import FeatureLayout

        layout = FeatureLayout.from_dict(values["layout"], "job_args.layout")
        dims = set(layout.dims)
        if len(dims) == 1:
            values["bottom_mlp"] = (64, dims.pop())
        values["layout"] = layout
    try:
        return prepare(JobSpec(job_id=job_id, **values), runs_here=False)
    except InvalidInputError as err:
        if err.field.startswith("job_args."):
            raise
        raise InvalidInputError(f"job_args.{err.field}", err.value, err.allowed, err.detail) from None


def _trainer_spec(job_id: str, values: dict[str, Any]):
    """The ``JobSpec`` of a trainer of the user's: ``job_args.trainer`` is a ``TrainerSpec``
    mapping (command, image, kind, log_regex, grace_s, report_timeout_s, checkpoint_dir, workdir)."""
    from airflow_dlrover.launchers.contract import TrainerSpec
    from airflow_dlrover.optimizer.types import InvalidInputError
    from airflow_dlrover.runtime.spec import JobSpec

    ours = sorted(set(values) - set(TRAINER_JOB_ARGS))
    if ours:
        raise InvalidInputError(f"job_args.{ours[0]}", values[ours[0]], "only " + ", ".join(TRAINER_JOB_ARGS) +
                                " with a trainer of your own: its data and model are its command's")
    try:
        trainer = TrainerSpec.from_dict(values["trainer"])
    except InvalidInputError as err:
        raise InvalidInputError(f"job_args.{err.field}", err.value, err.allowed, err.detail) from None
    return JobSpec(job_id=job_id, samples=values.get("samples"), batch_size=values.get("batch_size", 512),
                   trainer=trainer.to_dict())


def parse_quota(quota: dict[str, Any] | None, default: Any):
    """``{"cpu": 2, "memory": "8Gi", "gpu": 0, "max_nodes": null}`` → ``Quota``; the connection's quota when None."""
    from airflow_dlrover.optimizer.types import InvalidInputError, Quota

    quota = rendered("quota", quota)
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
    """Demo faults the job's master injects (``MASTER_FAULTS``): ``kill-worker@30s``,
    ``oom-worker:1@20s`` (comma-separated or a list), as the master's ``/faults`` takes them."""
    from airflow_dlrover.optimizer.types import FaultKind, parse_faults as parse
    from airflow_dlrover.runtime.master import FAULT_COMMANDS

    kinds = tuple(FaultKind(kind) for kind in FAULT_COMMANDS)
    return [fault.to_dict() for fault in parse(inject, allowed=kinds)]


def parse_configuration(field: str, value: Any):
    """A configuration row (``baseline``): a mapping of the vocabulary's columns; None for none."""
    from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, Configuration, InvalidInputError

    value = rendered(field, value)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInputError(field, value, "a mapping of " + ", ".join(CONFIG_COLUMNS))
    unknown = sorted(set(value) - set(CONFIG_COLUMNS))
    if unknown:
        raise InvalidInputError(f"{field}.{unknown[0]}", value[unknown[0]], "one of the keys " + ", ".join(CONFIG_COLUMNS))
    missing = [c for c in ("workers", "ps", "worker_cpu", "ps_cpu") if c not in value]
    if missing:
        raise InvalidInputError(f"{field}.{missing[0]}", None, "a value: workers, ps, worker_cpu and ps_cpu are needed")
    try:
        return Configuration(**value)
    except InvalidInputError as err:
        raise InvalidInputError(f"{field}.{err.field}", err.value, err.allowed) from None


def check_fault_nodes(faults: list[dict[str, Any]], config: Any) -> None:
    """Every fault names a worker the plan has (``worker-N``, N < workers)."""
    from airflow_dlrover.optimizer.types import InvalidInputError

    for fault in faults:
        index = int(fault["node"].rsplit("-", 1)[1])
        if index >= config.workers:
            raise InvalidInputError("inject", f"{fault['kind']}:{index}@{fault['at_s']:g}s",
                                    f"a worker index < {config.workers} (the plan has {config.workers} workers)")


def positive_int(field: str, value: Any) -> int:
    """An integer argument (templated fields may arrive as strings); a user error otherwise."""
    with user_errors():
        return _coerce(field, value, int)


def duration_s(field: str, value: Any) -> float:
    from airflow_dlrover.optimizer.types import parse_duration_s

    with user_errors():
        return parse_duration_s(value, field)
