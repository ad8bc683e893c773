"""Memory model: what each node needs, and when a growing node will hit its limit.

PS memory holds the embedding rows of its shard and their sparse-optimizer state; rows are
partitioned over the p servers, and the table grows as new ids arrive — with the samples trained,
not with the clock (DLRover-RM §5: PS memory grows with embedding rows; worker memory with the
batch):

    ps_memory(p, n)   = ps_base_mb + min(table_mb + table_growth_mb_per_m_samples · n / 10⁶, capacity) / p
    worker_memory(B)  = worker_base_mb + activation_mb_per_sample · B

with n the samples trained and ``capacity`` (``table_capacity_mb``, when the job's feature layout
is known) the tables with every row touched: Σ_t rows_t·8 + rows_t·(8·dim_t + 8) bytes — the id →
slot map, then each row and its Adagrad accumulator (float32) and its id
(``runtime.layout.FeatureLayout.table_mb``; a full 26 × 20,000 × 16 layout: 71.4 MB predicted,
71.1 MB measured as the growth of one PS's RSS). A PS cannot outgrow its tables, whatever the
growth fitted on seconds of profiling says. Both are linear in their parameters and fitted by NNLS from the
``*_memory_used_mb`` columns of a sample table (growth from its ``samples_seen`` column when the
windows were taken at different points of a run). A node's memory over time is fitted with the
Theil–Sen estimator (``scipy.stats.theilslopes``: robust to the allocator's sawtooth and to GC
drops) to forecast when it reaches its limit.
A request is the forecast peak plus ``MEMORY_MARGIN_FRACTION`` (VPA's safety margin), at least
``MEMORY_MIN_HEADROOM_MB`` more, rounded up to ``MEMORY_GRANULARITY_MB``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import nnls

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
    table_growth_mb_per_m_samples: float = 0.0
    pinned: dict[str, str] = field(default_factory=dict)
    table_capacity_mb: float | None = None

    def ps_peak_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """PS memory after training ``samples`` more samples."""
        grown = self.table_mb + self.table_growth_mb_per_m_samples * np.asarray(samples, dtype=float) / 1e6
        if self.table_capacity_mb is not None:
            grown = np.minimum(grown, max(self.table_capacity_mb, self.table_mb))
        return self.ps_base_mb + grown / np.asarray(ps, dtype=float)

    def worker_peak_mb(self, batch_size: Any) -> Any:
        return self.worker_base_mb + self.activation_mb_per_sample * np.asarray(batch_size, dtype=float)

    def ps_request_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        return memory_request_mb(self.ps_peak_mb(ps, samples))

    def worker_request_mb(self, batch_size: Any) -> Any:
        return memory_request_mb(self.worker_peak_mb(batch_size))

    def with_table_growth(self, mb_per_m_samples: float) -> "MemoryModel":
        """The same model with another growth of the whole table (sum over PS), MB per 10⁶ samples."""
        return replace(self, table_growth_mb_per_m_samples=max(float(mb_per_m_samples), 0.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MemoryModel":
        try:
            return cls(**data)
        except TypeError as err:
            raise InvalidInputError("model.memory", str(err), "a memory model written by `dlrover-rm fit`") from None


def _nnls_fit(columns: dict[str, np.ndarray], y: np.ndarray, why: dict[str, str]) -> tuple[dict[str, float], dict[str, str]]:
    """NNLS of y on the named columns; a column that never varies (beyond the first, the base)
    is pinned to 0 with the reason in ``why`` and the base absorbs it."""
    names = list(columns)
    keep = [names[0]] + [n for n in names[1:] if np.ptp(columns[n]) > 0]
    solution, _ = nnls(np.column_stack([columns[n] for n in keep]), y)
    values = dict.fromkeys(names, 0.0) | dict(zip(keep, map(float, solution)))
    return values, {n: why[n] for n in names if n not in keep}


def fit_memory(samples: pd.DataFrame, *, validated: bool = False, table_capacity_mb: float | None = None) -> MemoryModel:
    """Fit the memory model from a sample table with ``ps_memory_used_mb`` and
    ``worker_memory_used_mb`` (per-node means; rows with empty usage are ignored) and, when
    present, ``samples_seen`` (samples trained when the window was measured).
    ``validated``: ``samples`` is what :func:`validate_samples` returned (not checked again);
    ``table_capacity_mb``: the layout's bound on the tables (see the module docstring)."""
    table = samples if validated else validate_samples(samples)
    for column in ("ps_memory_used_mb", "worker_memory_used_mb"):
        if column not in table or not table[column].notna().any():
            raise InvalidInputError(
                f"samples.{column}", "missing",
                "measured per-node memory in MB (the profiler records it)",
                "The planner sizes memory from it.",
            )
    ps_rows = table[table["ps_memory_used_mb"].notna()]
    inverse_ps = 1.0 / ps_rows["ps"].to_numpy(float)
    seen = pd.to_numeric(ps_rows.get("samples_seen", 0.0), errors="coerce")
    seen = np.nan_to_num(np.broadcast_to(np.asarray(seen, dtype=float), inverse_ps.shape))
    ps, pinned = _nnls_fit(
        {"ps_base_mb": np.ones_like(inverse_ps), "table_mb": inverse_ps, "growth": seen / 1e6 * inverse_ps},
        ps_rows["ps_memory_used_mb"].to_numpy(float),
        {"table_mb": "ps never varies: the whole PS memory counts as base",
         "growth": "no samples_seen that varies: table growth unknown (0)"},
    )
    worker_rows = table[table["worker_memory_used_mb"].notna()]
    batch = worker_rows["batch_size"].to_numpy(float)
    worker, pinned_w = _nnls_fit(
        {"worker_base_mb": np.ones_like(batch), "activation_mb_per_sample": batch},
        worker_rows["worker_memory_used_mb"].to_numpy(float),
        {"activation_mb_per_sample": "batch_size never varies: worker memory is taken as constant"},
    )
    pinned = {("table_growth_mb_per_m_samples" if k == "growth" else k): v for k, v in pinned.items()}
    return MemoryModel(
        ps["ps_base_mb"], ps["table_mb"], worker["worker_base_mb"], worker["activation_mb_per_sample"],
        ps["growth"], pinned | pinned_w, table_capacity_mb,
    )


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


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Theil–Sen line (Sen 1968), as ``scipy.stats.theilslopes`` computes it: the slope is the
    median of the pairwise slopes (yj − yi) / (xj − xi) over pairs with xj > xi, the intercept
    median(y) − slope · median(x)."""
    slopes, intercepts = theil_sen_many(np.asarray(x, dtype=float)[None, :], np.asarray(y, dtype=float)[None, :])
    return float(slopes[0]), float(intercepts[0])


def theil_sen_many(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``theil_sen`` of each row of ``x`` and ``y`` (shape: series × points; every row has two
    distinct times) at once: the detectors fit a few points of every node each window."""
    dx = x[:, None, :] - x[:, :, None]
    dy = y[:, None, :] - y[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        pairwise = np.where(dx > 0, dy / dx, np.nan).reshape(len(x), -1)
    slopes = np.nanmedian(pairwise, axis=1)
    return slopes, np.median(y, axis=1) - slopes * np.median(x, axis=1)


def fit_trend(times_s: Sequence[float], used_mb: Sequence[float]) -> MemoryTrend:
    """Theil–Sen slope and intercept of a memory series (needs ≥ 2 points, distinct times)."""
    t = np.asarray(times_s, dtype=float)
    y = np.asarray(used_mb, dtype=float)
    if t.shape != y.shape or len(t) < 2 or np.ptp(t) == 0 or not (np.isfinite(t).all() and np.isfinite(y).all()):
        raise InvalidInputError("memory series", f"{len(t)} points", "≥ 2 finite points at distinct times")
    slope, intercept = theil_sen(t, y)
    last = int(np.argmax(t))
    return MemoryTrend(float(slope), float(intercept), float(t[last]), float(y[last]))
