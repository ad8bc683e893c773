"""Memory model: what each node needs, and when a growing node will hit its limit.

PS memory holds the embedding rows of its shard and their sparse-optimizer state; rows are
partitioned over the p servers, and the table grows as new ids arrive (DLRover-RM §5: PS memory
grows with embedding rows; worker memory with the batch):

    ps_memory(p, t)   = ps_base_mb + (table_mb + table_growth_mb_per_hour · t) / p
    worker_memory(B)  = worker_base_mb + activation_mb_per_sample · B

Both are linear in their parameters and fitted by NNLS from the ``*_memory_used_mb`` columns of a
sample table; growth is fitted from a time series with the Theil–Sen estimator
(``scipy.stats.theilslopes``: robust to the sawtooth of the allocator and to GC drops).
A request is the forecast peak plus ``MEMORY_MARGIN_FRACTION`` (VPA's safety margin), at least
``MEMORY_MIN_HEADROOM_MB`` more, rounded up to ``MEMORY_GRANULARITY_MB``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import nnls
from scipy.stats import theilslopes

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import InvalidInputError, validate_samples


def memory_request_mb(peak_mb: Any) -> Any:
    """Peak + margin (at least the minimum headroom), rounded up to the granularity (vectorised)."""
    peak = np.asarray(peak_mb, dtype=float)
    wanted = np.maximum(peak * (1.0 + C.MEMORY_MARGIN_FRACTION), peak + C.MEMORY_MIN_HEADROOM_MB)
    return np.ceil(wanted / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB


@dataclass(frozen=True)
class MemoryModel:
    """Per-node memory in MB; see the module docstring for the equations."""

    ps_base_mb: float
    table_mb: float
    worker_base_mb: float
    activation_mb_per_sample: float
    table_growth_mb_per_hour: float = 0.0
    pinned: dict[str, str] = field(default_factory=dict)

    def ps_peak_mb(self, ps: Any, hours: Any = 0.0) -> Any:
        grown = self.table_mb + self.table_growth_mb_per_hour * np.asarray(hours, dtype=float)
        return self.ps_base_mb + grown / np.asarray(ps, dtype=float)

    def worker_peak_mb(self, batch_size: Any) -> Any:
        return self.worker_base_mb + self.activation_mb_per_sample * np.asarray(batch_size, dtype=float)

    def ps_request_mb(self, ps: Any, hours: Any = 0.0) -> Any:
        return memory_request_mb(self.ps_peak_mb(ps, hours))

    def worker_request_mb(self, batch_size: Any) -> Any:
        return memory_request_mb(self.worker_peak_mb(batch_size))

    def with_table_growth(self, mb_per_hour: float) -> "MemoryModel":
        """The same model with a fitted growth of the whole table (sum over PS), MB/hour."""
        return replace(self, table_growth_mb_per_hour=max(float(mb_per_hour), 0.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MemoryModel":
        try:
            return cls(**data)
        except TypeError as err:
            raise InvalidInputError("model.memory", str(err), "a memory model written by `dlrover-rm fit`") from None


def _fit_linear(x: np.ndarray, y: np.ndarray, names: tuple[str, str], why: str) -> tuple[float, float, dict[str, str]]:
    """NNLS fit of y = a + b·x; pins b to 0 when x never varies (a absorbs it)."""
    if np.ptp(x) == 0:
        return float(np.median(y)), 0.0, {names[1]: why}
    solution, _ = nnls(np.column_stack([np.ones_like(x), x]), y)
    return float(solution[0]), float(solution[1]), {}


def fit_memory(samples: pd.DataFrame) -> MemoryModel:
    """Fit the memory model from a sample table with ``ps_memory_used_mb`` and
    ``worker_memory_used_mb`` (per-node means). Rows with empty usage are ignored."""
    table = validate_samples(samples)
    for column in ("ps_memory_used_mb", "worker_memory_used_mb"):
        if column not in table or not table[column].notna().any():
            raise InvalidInputError(
                f"samples.{column}", "missing",
                "measured per-node memory in MB (the profiler records it)",
                "The planner sizes memory from it.",
            )
    ps_rows = table[table["ps_memory_used_mb"].notna()]
    ps_base, table_mb, pinned = _fit_linear(
        1.0 / ps_rows["ps"].to_numpy(float), ps_rows["ps_memory_used_mb"].to_numpy(float),
        ("ps_base_mb", "table_mb"), "ps never varies: the whole PS memory counts as base",
    )
    worker_rows = table[table["worker_memory_used_mb"].notna()]
    worker_base, per_sample, pinned_w = _fit_linear(
        worker_rows["batch_size"].to_numpy(float), worker_rows["worker_memory_used_mb"].to_numpy(float),
        ("worker_base_mb", "activation_mb_per_sample"),
        "batch_size never varies: worker memory is taken as constant",
    )
    return MemoryModel(ps_base, table_mb, worker_base, per_sample, 0.0, {**pinned, **pinned_w})


@dataclass(frozen=True)
class MemoryTrend:
    """A robust linear trend of one node's memory: used(t) = intercept + slope · t."""

    slope_mb_per_s: float
    intercept_mb: float
    last_time_s: float
    last_used_mb: float

    def at(self, time_s: float) -> float:
        return self.intercept_mb + self.slope_mb_per_s * time_s

    def seconds_to(self, limit_mb: float) -> float:
        """Seconds from the last observation until the trend reaches ``limit_mb`` (inf if never)."""
        now = max(self.at(self.last_time_s), self.last_used_mb)
        if now >= limit_mb:
            return 0.0
        if self.slope_mb_per_s <= 0:
            return float("inf")
        return (limit_mb - now) / self.slope_mb_per_s


def fit_trend(times_s: Sequence[float], used_mb: Sequence[float]) -> MemoryTrend:
    """Theil–Sen slope and intercept of a memory series (needs ≥ 2 points, distinct times)."""
    t = np.asarray(times_s, dtype=float)
    y = np.asarray(used_mb, dtype=float)
    if t.shape != y.shape or len(t) < 2 or np.ptp(t) == 0 or not (np.isfinite(t).all() and np.isfinite(y).all()):
        raise InvalidInputError("memory series", f"{len(t)} points", "≥ 2 finite points at distinct times")
    slope, intercept, _, _ = theilslopes(y, t)
    last = int(np.argmax(t))
    return MemoryTrend(float(slope), float(intercept), float(t[last]), float(y[last]))
