"""The one vocabulary: a configuration is a row; samples, quotas and plans build on it.

A configuration is ``workers, ps, worker_cpu, ps_cpu, worker_memory_mb, ps_memory_mb, worker_gpu,
batch_size``. A profile sample is a configuration plus the measured ``throughput`` (samples/s,
whole job) and, where measured, ``worker_cpu_used, ps_cpu_used, worker_memory_used_mb,
ps_memory_used_mb`` (per node, mean). Sample tables are pandas DataFrames with these columns.

User mistakes raise :class:`InvalidInputError`, which names the field, the value and what is
allowed; the Airflow layer maps it to a non-retryable failure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
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
USAGE_COLUMNS = ("worker_cpu_used", "ps_cpu_used", "worker_memory_used_mb", "ps_memory_used_mb")
SAMPLE_REQUIRED = ("workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput")
INTEGER_COLUMNS = ("workers", "ps", "worker_gpu", "batch_size")


class InvalidInputError(ValueError):
    """A mistake the user can fix. Names the field, the value and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str, detail: str = ""):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        message = f"{field_name}={value!r} is invalid: allowed {allowed}"
        super().__init__(f"{message}. {detail}".strip() if detail else message)


class InfeasibleQuotaError(InvalidInputError):
    """No configuration fits the quota; ``minimum`` says what the smallest one needs."""

    def __init__(self, field_name: str, value: Any, minimum: Mapping[str, float], detail: str = ""):
        self.minimum = dict(minimum)
        need = ", ".join(f"{k}={v:g}" for k, v in self.minimum.items())
        super().__init__(field_name, value, f"a quota of at least {need}", detail)


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


@dataclass(frozen=True)
class Configuration:
    """One allocation of a PS training job (a row of the vocabulary).

    ``worker_cpu`` and ``ps_cpu`` are cores per node (λw, λp); memories are MB per node;
    ``worker_gpu`` GPUs per worker; ``batch_size`` samples per worker step.
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
        _check_number("ps", self.ps, minimum=1, integer=True, strict=False)
        _check_number("worker_cpu", self.worker_cpu, minimum=0, integer=False, strict=True)
        _check_number("ps_cpu", self.ps_cpu, minimum=0, integer=False, strict=True)
        _check_number("worker_memory_mb", self.worker_memory_mb, minimum=0, integer=False, strict=False)
        _check_number("ps_memory_mb", self.ps_memory_mb, minimum=0, integer=False, strict=False)
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
        return (
            f"{self.workers} worker × {self.worker_cpu:g} CPU{gpu} / {self.worker_memory_mb:g} MB, "
            f"{self.ps} PS × {self.ps_cpu:g} CPU / {self.ps_memory_mb:g} MB, batch {self.batch_size}"
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
    Optional ``worker_gpu`` defaults to 0; memory columns default to 0 (unknown).
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
    rules = {
        "workers": (1, True, False), "ps": (1, True, False), "batch_size": (1, True, False),
        "worker_gpu": (0, True, False), "worker_cpu": (0, False, True), "ps_cpu": (0, False, True),
        "throughput": (0, False, True), "worker_memory_mb": (0, False, False),
        "ps_memory_mb": (0, False, False),
    }
    for column, (minimum, integer, strict) in rules.items():
        values = _as_float(columns[column])
        bad = ~np.isfinite(values)
        bad |= values <= minimum if strict else values < minimum
        if integer:
            bad |= np.isfinite(values) & (values != np.round(values))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            kind = "an integer" if integer else "a finite number"
            bound = f"> {minimum:g}" if strict else f"≥ {minimum:g}"
            raise InvalidInputError(
                f"{name}.{column}", columns[column][row], f"{kind} {bound}",
                f"First bad row: {row} ({int(bad.sum())} bad rows).",
            )
        columns[column] = values.astype(int) if integer else values
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
            columns[column] = values
    return pd.DataFrame(columns)


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
