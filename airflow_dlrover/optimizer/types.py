"""The one vocabulary: a configuration is a row; samples, quotas and plans build on it.

A configuration is ``workers, ps, worker_cpu, ps_cpu, worker_memory_mb, ps_memory_mb, worker_gpu,
batch_size``. A job is of one kind for its whole life (:func:`is_allreduce`): a parameter-server job
(``ps ≥ 1``, ``ps_cpu > 0``) or an all-reduce data-parallel job without parameter servers
(``ps = 0``; its ``ps_cpu`` and ``ps_memory_mb`` are 0, and a PS size given for it is an error, not
dropped: it says the user thinks the job has PS). A profile sample is a configuration plus the measured ``throughput`` (samples/s,
whole job) and, where measured, ``worker_cpu_used, ps_cpu_used, worker_memory_used_mb,
ps_memory_used_mb`` (per node, mean) and ``worker_memory_peak_mb, ps_memory_peak_mb`` (the role's
largest node). Sample tables are pandas DataFrames with these columns.

User mistakes raise :class:`InvalidInputError`, which names the field, the value and what is
allowed; the Airflow layer maps it to a non-retryable failure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Mapping

import numpy as np
import pandas as pd

CONFIG_COLUMNS = (
    "workers",
    "ps",
    "worker_cpu",
    "ps_cpu",
    "worker_memory_mb",
    "ps_memory_mb",
    "worker_gpu",
    "batch_size",
)
USAGE_COLUMNS = ("worker_cpu_used", "ps_cpu_used", "worker_memory_used_mb", "ps_memory_used_mb",
                 "worker_memory_peak_mb", "ps_memory_peak_mb")
#: A measured sample's columns beside its configuration's.
SAMPLE_TABLE_COLUMNS = ("throughput", *USAGE_COLUMNS, "samples_seen", "timestamp")
SAMPLE_REQUIRED = ("workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput")
INTEGER_COLUMNS = ("workers", "ps", "worker_gpu", "batch_size")


class InvalidInputError(ValueError):
    """A mistake the user can fix. Names the field, the value and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str, detail: str = ""):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        self.detail = detail
        message = f"{field_name}={value!r} is invalid: allowed {allowed}"
        super().__init__(f"{message}. {detail}".strip() if detail else message)

    def __reduce__(self):  # picklable: it crosses process pools and Airflow's task runner
        return (type(self), (self.field, self.value, self.allowed, self.detail))


class JobFailed(RuntimeError):
    """The controller failed the job on a mistake no retry fixes (``Fail(retryable=False)``)."""


class InfeasibleQuotaError(InvalidInputError):
    """No configuration fits the quota; ``minimum`` says what the smallest one needs."""

    def __init__(self, field_name: str, value: Any, minimum: Mapping[str, float], detail: str = ""):
        self.minimum = dict(minimum)
        need = ", ".join(f"{k}={v:g}" for k, v in self.minimum.items())
        super().__init__(field_name, value, f"a quota of at least {need}", detail)

    def __reduce__(self):
        return (type(self), (self.field, self.value, self.minimum, self.detail))


# ---------------------------------------------------------------------------------------------
# Parsing of human quantities
# ---------------------------------------------------------------------------------------------

_MEMORY_UNITS_MB = {
    "": 1 / 2**20,  # bare number = bytes, as in Kubernetes
    "ki": 1 / 1024, "mi": 1.0, "gi": 1024.0, "ti": 1024.0**2,
    "k": 1e3 / 2**20, "m": 1e6 / 2**20, "g": 1e9 / 2**20, "t": 1e12 / 2**20,
    "mb": 1.0, "gb": 1024.0, "tb": 1024.0**2,
}
_DURATION_UNITS_S = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_memory_mb(value: str | float | int, field_name: str = "memory") -> float:
    """``"256Gi"`` → 262144.0 MB. Kubernetes suffixes (Ki Mi Gi Ti, k M G T) and MB/GB; numbers
    are MB when given as numbers, bytes when given as a bare string (as Kubernetes reads them)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        mb = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if not match or unit not in _MEMORY_UNITS_MB:
            raise InvalidInputError(
                field_name, value, "a quantity like 512Mi, 256Gi, 1Ti, 64GB or a number of MB"
            )
        mb = float(match.group(1)) * _MEMORY_UNITS_MB[unit]
    if not math.isfinite(mb) or mb <= 0:
        raise InvalidInputError(field_name, value, "a positive memory size")
    return mb


def parse_duration_s(value: str | float | int, field_name: str = "deadline") -> float:
    """``"2h"`` → 7200.0. Units s, m/min, h, d; compound ``"1h30m"``; numbers are seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        parts = re.findall(r"([0-9]*\.?[0-9]+)\s*(min|[smhd]?)", text)
        if not parts or re.sub(r"([0-9]*\.?[0-9]+)\s*(min|[smhd]?)", "", text).strip():
            raise InvalidInputError(field_name, value, "a duration like 90s, 45m, 2h, 1h30m, 1d")
        seconds = sum(float(n) * _DURATION_UNITS_S[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidInputError(field_name, value, "a positive duration")
    return seconds


# ---------------------------------------------------------------------------------------------
# Configuration, quota
# ---------------------------------------------------------------------------------------------


def _check_number(name: str, value: Any, *, minimum: float, integer: bool, strict: bool) -> None:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and math.isfinite(float(value))
    ok = ok and (float(value) > minimum if strict else float(value) >= minimum)
    ok = ok and (not integer or float(value).is_integer())
    if not ok:
        kind = "an integer" if integer else "a number"
        bound = f"> {minimum:g}" if strict else f"≥ {minimum:g}"
        raise InvalidInputError(name, value, f"{kind} {bound}")


_NO_PS_SIZE = "0 when ps = 0 (an all-reduce job has no PS)"


@dataclass(frozen=True)
class Configuration:
    """One allocation of a training job (a row of the vocabulary).

    ``worker_cpu`` and ``ps_cpu`` are cores per node (λw, λp); memories are MB per node;
    ``worker_gpu`` GPUs per worker; ``batch_size`` samples per worker step. ``ps = 0``: an
    all-reduce job, whose ``ps_cpu`` and ``ps_memory_mb`` must be 0.
    """

    workers: int
    ps: int
    worker_cpu: float
    ps_cpu: float
    worker_memory_mb: float = 0.0
    ps_memory_mb: float = 0.0
    worker_gpu: int = 0
    batch_size: int = 512

    def __post_init__(self) -> None:
        _check_number("workers", self.workers, minimum=1, integer=True, strict=False)
        _check_number("ps", self.ps, minimum=0, integer=True, strict=False)
        _check_number("worker_cpu", self.worker_cpu, minimum=0, integer=False, strict=True)
        _check_number("ps_cpu", self.ps_cpu, minimum=0, integer=False, strict=self.ps > 0)
        _check_number("worker_memory_mb", self.worker_memory_mb, minimum=0, integer=False, strict=False)
        _check_number("ps_memory_mb", self.ps_memory_mb, minimum=0, integer=False, strict=False)
        if self.ps == 0:
            for name in ("ps_cpu", "ps_memory_mb"):
                if getattr(self, name) != 0:
                    raise InvalidInputError(name, getattr(self, name), _NO_PS_SIZE)
        _check_number("worker_gpu", self.worker_gpu, minimum=0, integer=True, strict=False)
        _check_number("batch_size", self.batch_size, minimum=1, integer=True, strict=False)
        for name in INTEGER_COLUMNS:
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("worker_cpu", "ps_cpu", "worker_memory_mb", "ps_memory_mb"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def cores(self) -> float:
        return self.workers * self.worker_cpu + self.ps * self.ps_cpu

    @property
    def memory_mb(self) -> float:
        return self.workers * self.worker_memory_mb + self.ps * self.ps_memory_mb

    @property
    def gpus(self) -> int:
        return self.workers * self.worker_gpu

    @property
    def nodes(self) -> int:
        return self.workers + self.ps

    def to_row(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in CONFIG_COLUMNS}

    def describe(self) -> str:
        gpu = f" + {self.worker_gpu} GPU" if self.worker_gpu else ""
        ps = (f"{self.ps} PS × {self.ps_cpu:g} CPU / {self.ps_memory_mb:g} MB" if self.ps
              else "no PS (all-reduce)")
        return (
            f"{self.workers} worker × {self.worker_cpu:g} CPU{gpu} / {self.worker_memory_mb:g} MB, "
            f"{ps}, batch {self.batch_size}"
        )


@dataclass(frozen=True)
class Quota:
    """What the job may use in total: cores, memory (MB), GPUs, nodes, and prices.

    Prices are per core-hour and per GB-hour; they only matter to the ``deadline`` (least cost)
    objective and default to :data:`constants.DEFAULT_PRICE_PER_CORE_HOUR` and
    :data:`constants.DEFAULT_PRICE_PER_GB_HOUR`.
    """

    cpu: float
    memory_mb: float
    gpu: int = 0
    max_nodes: int | None = None
    price_per_core_hour: float | None = None
    price_per_gb_hour: float | None = None

    def __post_init__(self) -> None:
        _check_number("cpu", self.cpu, minimum=0, integer=False, strict=True)
        _check_number("memory", self.memory_mb, minimum=0, integer=False, strict=True)
        _check_number("gpu", self.gpu, minimum=0, integer=True, strict=False)
        if self.max_nodes is not None:
            _check_number("max_nodes", self.max_nodes, minimum=2, integer=True, strict=False)
        for name in ("price_per_core_hour", "price_per_gb_hour"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name), minimum=0, integer=False, strict=False)

    def to_dict(self) -> dict[str, Any]:
        """The quota's fields (JSON-able): ``Quota(**quota.to_dict()) == quota``."""
        return dict(self.__dict__)

    @classmethod
    def parse(
        cls,
        cpu: Any,
        memory: Any,
        gpu: Any = 0,
        max_nodes: Any = None,
        price_per_core_hour: Any = None,
        price_per_gb_hour: Any = None,
    ) -> "Quota":
        """Build from user text (``memory="256Gi"``, ``cpu="64"``); errors name the field."""

        def number(name: str, value: Any, kind: type) -> Any:
            if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
                return value
            try:
                return kind(str(value).strip())
            except ValueError:
                raise InvalidInputError(name, value, f"a number ({kind.__name__})") from None

        return cls(
            cpu=number("cpu", cpu, float),
            memory_mb=parse_memory_mb(memory, "memory"),
            gpu=number("gpu", gpu, int),
            max_nodes=number("max_nodes", max_nodes, int),
            price_per_core_hour=number("price_per_core_hour", price_per_core_hour, float),
            price_per_gb_hour=number("price_per_gb_hour", price_per_gb_hour, float),
        )



@dataclass(frozen=True)
class Plan:
    """A configuration plus its prediction and why it was chosen."""

    config: Configuration
    predicted_throughput: float
    lower_throughput: float
    upper_throughput: float
    objective: str
    reason: str
    alternatives: list[dict[str, float]] = field(default_factory=list)
    pareto_front: list[dict[str, float]] = field(default_factory=list)
    #: How far the configuration lies outside the range the model was fitted on, per column
    #: (``workers``: 1.5 = 1.5× the most probed; empty: an interpolation).
    extrapolation: dict[str, float] = field(default_factory=dict)

    def to_dict(self, *, details: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = self.config.to_row()
        out.update(
            predicted_throughput=self.predicted_throughput,
            lower_throughput=self.lower_throughput,
            upper_throughput=self.upper_throughput,
            cores=self.config.cores,
            memory_mb=self.config.memory_mb,
            objective=self.objective,
            reason=self.reason,
            extrapolation=dict(self.extrapolation),
        )
        if details:
            out["alternatives"] = self.alternatives
            out["pareto_front"] = self.pareto_front
        return out


# ---------------------------------------------------------------------------------------------
# Sample tables
# ---------------------------------------------------------------------------------------------


def validate_samples(samples: pd.DataFrame, *, name: str = "samples") -> pd.DataFrame:
    """Check a sample table and return a clean copy with defaults for optional columns.

    Raises :class:`InvalidInputError` naming the column, the first bad row and its value.
    Optional ``worker_gpu`` defaults to 0; memory columns default to 0 (unknown). Every row is of
    one kind of job (:func:`is_allreduce`); rows with ``ps = 0`` have ``ps_cpu`` and
    ``ps_memory_mb`` 0 (empty reads as 0) and no PS usage (empty, or 0).
    """
    if not isinstance(samples, pd.DataFrame):
        raise InvalidInputError(name, type(samples).__name__, "a pandas DataFrame / CSV table")
    missing = [c for c in SAMPLE_REQUIRED if c not in samples.columns]
    if missing:
        raise InvalidInputError(
            f"{name} columns", list(samples.columns),
            f"a table with the columns {', '.join(SAMPLE_REQUIRED)}",
            f"Missing: {', '.join(missing)}.",
        )
    if samples.empty:
        raise InvalidInputError(name, "0 rows", "at least one sample row")
    # Columns are checked as numpy arrays and the clean table is built once: this runs on every
    # fit (the fine-tune refits every few minutes), where per-column DataFrame writes dominated.
    columns = {c: samples[c].to_numpy() for c in samples.columns}
    n = len(samples)
    columns.setdefault("worker_gpu", np.zeros(n, dtype=int))
    for column in ("worker_memory_mb", "ps_memory_mb"):
        columns.setdefault(column, np.zeros(n))
    rules = {  # in this order: ps comes before the PS sizes, which depend on it
        "workers": (1, True, False), "ps": (0, True, False), "batch_size": (1, True, False),
        "worker_gpu": (0, True, False), "worker_cpu": (0, False, True), "ps_cpu": (0, False, True),
        "throughput": (0, False, True), "worker_memory_mb": (0, False, False),
        "ps_memory_mb": (0, False, False),
    }
    no_ps = np.zeros(n, dtype=bool)
    for column, (minimum, integer, strict) in rules.items():
        values = _as_float(columns[column])
        checked = np.ones(n, dtype=bool)
        if column in _PS_SIZE_COLUMNS:
            values = np.where(no_ps & np.isnan(values), 0.0, values)
            _refuse_ps_values(name, column, values, no_ps & (values != 0), _NO_PS_SIZE + ", or empty")
            checked = ~no_ps
        bad = ~np.isfinite(values)
        bad |= values <= minimum if strict else values < minimum
        if integer:
            bad |= np.isfinite(values) & (values != np.round(values))
        bad &= checked
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            kind = "an integer" if integer else "a finite number"
            bound = f"> {minimum:g}" if strict else f"≥ {minimum:g}"
            raise InvalidInputError(
                f"{name}.{column}", columns[column][row], f"{kind} {bound}",
                f"First bad row: {row} ({int(bad.sum())} bad rows).",
            )
        columns[column] = values.astype(int) if integer else values
        if column == "ps":
            _job_kind(columns["ps"], f"{name}.ps")
            no_ps = columns["ps"] == 0
    for column in USAGE_COLUMNS:
        if column in columns:
            values = _as_float(columns[column])
            bad = np.isfinite(values) & (values < 0)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise InvalidInputError(
                    f"{name}.{column}", values[row], "a number ≥ 0 (or empty when not measured)",
                    f"First bad row: {row}.",
                )
            if column in _PS_USAGE_COLUMNS:
                _refuse_ps_values(name, column, values, no_ps & (values > 0),
                                  "empty or 0 where ps = 0 (an all-reduce job has no PS to measure)")
            columns[column] = values
    return pd.DataFrame(columns)


_PS_SIZE_COLUMNS = ("ps_cpu", "ps_memory_mb")
_PS_USAGE_COLUMNS = ("ps_cpu_used", "ps_memory_used_mb", "ps_memory_peak_mb")


def _refuse_ps_values(name: str, column: str, values: np.ndarray, bad: np.ndarray, allowed: str) -> None:
    """A PS size or usage on a row without PS (``bad``) is a user's mistake, named."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InvalidInputError(f"{name}.{column}", values[row], allowed,
                                f"First bad row: {row} ({int(bad.sum())} bad rows).")


def _job_kind(ps: np.ndarray, field_name: str) -> bool:
    """True when every ``ps`` is 0 (all-reduce), False when every one is ≥ 1 (PS); a mix is an
    :class:`InvalidInputError`: a job is one kind for its whole life."""
    no_ps = np.asarray(ps) == 0
    if no_ps.all() or not no_ps.any():
        return bool(no_ps.all()) and len(no_ps) > 0
    first_ar, first_ps = int(np.flatnonzero(no_ps)[0]), int(np.flatnonzero(~no_ps)[0])
    raise InvalidInputError(
        field_name, f"ps={int(ps[first_ps])} in row {first_ps} and ps=0 in row {first_ar}",
        "one kind of job in a table: every row ps = 0 (all-reduce, no PS) or every row ps ≥ 1 (parameter servers)",
        "A job is a PS job or an all-reduce job for its whole life: fit and plan each job on its own samples.",
    )


def not_identifiable(allreduce: bool) -> str:
    """Why a model's terms of the other kind of job are not identifiable (its ``pinned``): the PS
    terms of an all-reduce job, the all-reduce terms of a PS job."""
    return "not identifiable: the job has no PS" if allreduce else "not identifiable: the job has PS (no all-reduce)"


def check_kind(job: Any, allreduce: bool, field_name: str, of: str) -> None:
    """:class:`InvalidInputError` naming ``field_name`` unless ``job`` (what :func:`is_allreduce`
    takes) is of the kind ``allreduce``, which ``of`` is (e.g. "the samples")."""
    if is_allreduce(job) != allreduce:
        kind = {True: "an all-reduce job (ps = 0)", False: "a PS job (ps ≥ 1)"}
        raise InvalidInputError(field_name, f"of {kind[not allreduce]}", f"of {kind[allreduce]}, as {of}",
                                "A job is a PS job or an all-reduce job for its whole life.")


def is_allreduce(job: Any) -> bool:
    """Whether ``job`` is an all-reduce job (``ps = 0``: data-parallel, no parameter servers) or
    a PS job (``ps ≥ 1``). The one test of a job's kind, for everything below.

    ``job``: a :class:`Configuration`, a row (a mapping with ``ps``), a table with a ``ps``
    column (every row of one kind, else :class:`InvalidInputError`), or a fitted model (anything
    with an ``allreduce`` attribute: ``ThroughputModel``, ``MemoryModel``, ``JobModel``).
    """
    if hasattr(job, "allreduce"):
        return bool(job.allreduce)
    if isinstance(job, Configuration):
        return job.ps == 0
    if isinstance(job, pd.DataFrame):
        if "ps" not in job:
            raise InvalidInputError("columns", list(job.columns), "a table with a ps column")
        return _job_kind(job["ps"].to_numpy(), "ps")
    if isinstance(job, Mapping):
        return int(job["ps"]) == 0
    raise InvalidInputError("job", type(job).__name__, "a Configuration, a row, a table or a fitted model")


def _as_float(values: np.ndarray) -> np.ndarray:
    """A column as floats; text that is not a number becomes NaN (flagged by the caller)."""
    if values.dtype.kind in "biuf":
        return values.astype(float)
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)


def configuration_codes(table: pd.DataFrame) -> np.ndarray:
    """An integer per row identifying its configuration (to group repeated windows)."""
    cols = [c for c in ("workers", "ps", "worker_cpu", "ps_cpu", "worker_gpu", "batch_size") if c in table]
    values = np.column_stack([table[c].to_numpy(dtype=float) for c in cols]).round(6)
    return np.unique(values, axis=0, return_inverse=True)[1].ravel()


# ---------------------------------------------------------------------------------------------
# Objectives, node states, faults, events
# ---------------------------------------------------------------------------------------------


class Objective(StrEnum):
    """What a plan (and the fine-tune that keeps to it) optimises (``planner.plan``)."""

    THROUGHPUT = "throughput"  # the highest predicted throughput under the quota
    DEADLINE = "deadline"  # the least cost that finishes by the deadline
    EFFICIENCY = "efficiency"  # the knee of the throughput / cores Pareto front

    @classmethod
    def parse(cls, value: Any, field_name: str = "objective") -> "Objective":
        try:
            return cls(value.value if isinstance(value, cls) else value)
        except ValueError:
            raise InvalidInputError(field_name, value, " | ".join(OBJECTIVES)) from None


OBJECTIVES = tuple(o.value for o in Objective)


class NodeState(StrEnum):
    """A node's state as a launcher reads it. ``FAILED_STATES`` are recovered by relaunching the
    node; ``UNSCHEDULABLE`` is a pod the cluster could not place for longer than a threshold."""

    RUNNING = "running"
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    STOPPED = "stopped"
    FAILED = "failed"
    OOM_KILLED = "oom_killed"
    LOST = "lost"
    UNSCHEDULABLE = "unschedulable"


FAILED_STATES = (NodeState.FAILED, NodeState.OOM_KILLED, NodeState.LOST, NodeState.UNSCHEDULABLE)


@dataclass(frozen=True)
class NodeStatus:
    """One node of a running job, as its launcher sees it. ``oom_kills`` counts the kills since
    the node last (re)started; ``restarts`` counts its relaunches, so ``(name, restarts)`` names
    one incarnation of the node."""

    name: str
    role: str  # master | ps | worker
    index: int
    state: str
    cpu: float | None
    memory_mb: float | None
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    oom_kills: int = 0

    @property
    def failed(self) -> bool:
        return self.state in FAILED_STATES

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in self.__dict__.items()}


class FaultKind(StrEnum):
    """Faults a demo or a test injects (``parse_faults``)."""

    KILL_WORKER = "kill-worker"
    KILL_PS = "kill-ps"
    KILL_MASTER = "kill-master"
    OOM_WORKER = "oom-worker"  # a real OOM kill at the worker's cgroup limit
    SLOW_WORKER = "slow-worker"  # the worker's CPU quota is cut
    HOT_PS = "hot-ps"  # skewed ids from the start: one PS serves most lookups


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at_s: float
    node: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "at_s": self.at_s, "node": self.node}


def parse_faults(inject: str | list[str] | None, allowed: tuple[FaultKind, ...] = tuple(FaultKind)) -> list[Fault]:
    """``kill-worker@30s``, ``oom-worker:1@1m``, ``hot-ps`` (comma-separated or a list): ``:N``
    picks the node, ``@T`` the time after the launch (every kind but ``hot-ps`` needs one).
    ``allowed``: the kinds the caller can inject (the DAG's master injects only some)."""
    if not inject:
        return []
    items = [i.strip() for i in (inject.split(",") if isinstance(inject, str) else inject) if i and str(i).strip()]
    kinds = {k.value for k in allowed}
    usage = " | ".join(f"{k.value}[:N]@<time>" if k != FaultKind.HOT_PS else k.value for k in allowed)
    faults = []
    for item in items:
        match = re.fullmatch(r"([a-z-]+)(?::(\d+))?(?:@(.+))?", str(item))
        if not match or match.group(1) not in kinds:
            raise InvalidInputError("inject", item, f"{usage}, e.g. kill-worker@30s")
        kind, index, when = FaultKind(match.group(1)), match.group(2), match.group(3)
        if kind != FaultKind.HOT_PS and when is None:
            raise InvalidInputError("inject", item, f"{kind.value}[:N]@<time>, e.g. {kind.value}@20s")
        role = kind.value.split("-")[1]
        node = "master" if role == "master" else f"{role}-{index or 0}"
        faults.append(Fault(kind, parse_duration_s(when, "inject") if when else 0.0, node))
    return faults


class EventKind(StrEnum):
    """The kinds of the ``event`` records a run keeps in the history store."""

    PROFILED = "profiled"
    PLAN_CHECKED = "plan_checked"  # the launch measured a plan that extrapolated past the probes
    LAUNCHED = "launched"
    FAULTS_SCHEDULED = "faults_scheduled"
    NODE_FAILED = "node_failed"  # a guard's try saw a failed node (and failed; its retry recovers)
    RECOVERED = "recovered"  # a failed node was relaunched (or removed from the job)
    INSTABILITY = "instability"  # a detector's event and what the controller did about it


class RecordKind(StrEnum):
    """The kinds of records a run keeps in the history store beside samples and models."""

    PLAN = "plan"
    DECISION = "decision"  # the fine-tune's resize / revert / keep (or what else its step returned)
    EVENT = "event"


#: The fine-tune decisions that changed the job's configuration (a decision record's ``action``);
#: any other (keep, or a failure the guard recovers) changed nothing.
RESIZE_ACTIONS = frozenset({"resize", "revert"})


class Phase(StrEnum):
    """Where a job is in its life, as the controller's state carries it: each Airflow task loops
    ``controller.step`` while the phase is its own (profile, fit, launch; then the fine-tune and
    the guard), and so do ``dlrover-rm`` and the simulator."""

    PROFILING = "profiling"
    FITTING = "fitting"
    PLANNING = "planning"
    TRAINING = "training"
    DONE = "done"


class Reason(StrEnum):
    """Why the controller acted (or did not): data, recorded with the numbers it rests on.
    ``describe(numbers)`` renders the sentence for logs and the UI; nothing parses it."""

    NO_SAMPLES_REMAIN = "no_samples_remain"
    NOT_MEASURED = "not_measured"
    MIN_INTERVAL = "min_interval"
    JUDGING = "judging"
    AT_BEST = "at_best"
    NOT_WORTH_IT = "not_worth_it"
    PAYS = "pays"
    PAST_THE_KNEE = "past_the_knee"
    EXPLORE = "explore"
    EXPLORE_KNEE = "explore_knee"
    EXPLORED = "explored"
    DID_NOT_DELIVER = "did_not_deliver"
    HOT_PS = "hot_ps"
    STRAGGLER = "straggler"
    OOM_RISK = "oom_risk"
    PAST_QUOTA = "past_quota"
    NODE_FAILED = "node_failed"
    OOM_KILLED = "oom_killed"
    UNSCHEDULABLE = "unschedulable"
    OOM_PAST_QUOTA = "oom_past_quota"
    USER_ERROR = "user_error"
    PROBE = "probe"
    PROFILED = "profiled"
    NOT_PROFILED = "not_profiled"
    FITTED = "fitted"
    PLAN_CHECK = "plan_check"
    PLANNED = "planned"
    CRASH_LOOP = "crash_loop"
    RESTART_BUDGET = "restart_budget"
    RESTART_BACKOFF = "restart_backoff"

    def describe(self, numbers: Mapping[str, Any] | None = None) -> str:
        values = dict(numbers or {})
        try:
            return _REASON_TEXT[self].format(**values)
        except (KeyError, ValueError, IndexError):
            return f"{self.value} {values}" if values else self.value


_REASON_TEXT = {
    Reason.NO_SAMPLES_REMAIN: "no samples remain",
    Reason.NOT_MEASURED: "no throughput measured on the current configuration yet",
    Reason.MIN_INTERVAL: "last resize {since_s:.0f}s ago, minimum interval {interval_s:.0f}s",
    Reason.JUDGING: "judging the last resize: {windows}/{needed} windows measured",
    Reason.AT_BEST: "the current configuration is the model's best under the quota",
    Reason.NOT_WORTH_IT: ("best alternative ({target}) predicts ×{speedup:.2f} (pessimistic ×{speedup_low:.2f}), saving "
                          "{saving_s:.0f}s against a {cost_s:.0f}s resize: not worth it (needs ×{min_speedup} and "
                          "{gain_multiple:g}× the cost)"),
    Reason.PAYS: ("predicts ×{speedup:.2f} (pessimistic ×{speedup_low:.2f}): saves {saving_s:.0f}s of {keep_s:.0f}s "
                  "for a {cost_s:.0f}s resize"),
    Reason.PAST_THE_KNEE: ("{target}: the knee, {knee_cores:g} of {cores:g} cores; the cores past it add less than "
                           "they would cost even pessimistically (×{speedup_low:.2f} there, above ×{floor:.2f}): "
                           "saves {saving_core_h:.1f} core-hours for a {cost_s:.0f}s resize"),
    Reason.EXPLORE: ("exploring {target}: {source} predicts ×{speedup:.2f} (the model's mean "
                     "×{mean_speedup:.2f}, pessimistic ×{speedup_low:.2f}: it is unsure there, its 90 % band "
                     "{band:.0%} of the prediction); expected to save {expected_saving_s:.0f}s of {keep_s:.0f}s, "
                     "against a {cost_s:.0f}s resize and its revert"),
    Reason.EXPLORE_KNEE: ("exploring {target}: the knee, {knee_cores:g} of {cores:g} cores; the model's mean puts "
                          "it at ×{speedup:.2f} of the current speed, above ×{floor:.2f}, where the cores past it do "
                          "not pay, but it is unsure there (pessimistic ×{speedup_low:.2f}, its 90 % band {band:.0%} "
                          "of the prediction); expected to save {saving_core_h:.1f} core-hours, against a "
                          "{cost_s:.0f}s resize and its revert"),
    Reason.EXPLORED: "the exploration delivered ×{delivered:.2f} of a predicted ×{predicted:.2f}: kept",
    Reason.DID_NOT_DELIVER: ("last resize delivered ×{delivered:.2f} of a predicted ×{predicted:.2f} (needed "
                             "×{needed:.2f}): back to the configuration before it"),
    Reason.HOT_PS: "{node} uses {cpu_used:.2f} of {cpu_limit:g} cores ({utilisation:.0%}), {skew:.1f}× the median PS",
    Reason.STRAGGLER: "{node} runs {throughput:.0f} samples/s, {ratio:.0%} of the other workers' median",
    Reason.OOM_RISK: "{node} uses {memory_used_mb:.0f} of {memory_limit_mb:.0f} MB: limit reached {when}",
    Reason.PAST_QUOTA: "{node} at {value:g} would make {total:g} {unit}, past the quota's {limit:g}: not healed",
    Reason.NODE_FAILED: "{node} {state}: {detail}",
    Reason.USER_ERROR: "{node} stopped on a mistake in the job's input, which no retry fixes: {detail}",
    Reason.OOM_KILLED: "{node} OOM-killed at {memory_limit_mb:g} MB: relaunched with {memory_mb:g} MB",
    Reason.UNSCHEDULABLE: "{node} cannot be placed ({detail}): the job trains on without it",
    Reason.OOM_PAST_QUOTA: ("{node} OOM-killed at {memory_limit_mb:g} MB and the quota leaves it no more "
                            "(at most {cap_mb:g} MB)"),
    Reason.PROBE: "probe {index}/{designed}: measured for up to {window_s:g}s",
    Reason.PROFILED: "the profile ends: {measured} of {designed} probes measured in {elapsed_s:.0f}s ({why})",
    Reason.NOT_PROFILED: "no probe was measured cleanly and the job has no prior to plan from",
    Reason.FITTED: "fitted on {samples} samples{warm}",
    Reason.PLAN_CHECK: ("the plan extrapolates past the probes ({extrapolation}): measured for {window_s:g}s "
                        "before it is launched (check {check} of at most {limit})"),
    Reason.PLANNED: "{reason}",
    Reason.CRASH_LOOP: ("{node} exited {exit_code} again before the job trained any sample more ({samples_done:,.0f} "
                        "done): the same crash on every start, which no restart fixes: {detail}"),
    Reason.RESTART_BUDGET: ("{failures} failures within {window_s:g}s, past the trainer's max_restarts={max_restarts}: "
                            "stopped; the last: {node}: {detail}"),
    Reason.RESTART_BACKOFF: ("{node} is relaunched in {wait_s:.0f}s: failure {failures} within {window_s:g}s "
                             "backs off {backoff_s:g}s"),
}

#: The fine-tune's explorations: resizes judged on their own windows, at most ``EXPLORE_MAX_PER_RUN`` a run.
EXPLORATIONS = frozenset({Reason.EXPLORE, Reason.EXPLORE_KNEE})
