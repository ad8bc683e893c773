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

An all-reduce job (p = 0, ``types.is_allreduce``) has no PS: ``ps_base_mb`` and ``table_mb`` are
None ("not identifiable: the job has no PS" in ``pinned``) and a PS needs 0 MB. Each of its
workers holds the whole model, tables included, so the tables' growth is each worker's:

    worker_memory(B, n) = worker_base_mb + activation_mb_per_sample · B
                          + min(table_growth_mb_per_m_samples · n / 10⁶, capacity)      (p = 0)

fitted from ``worker_memory_used_mb`` (and ``samples_seen``). The tables as they were when
measured are in ``worker_base_mb``, so once every row is touched the cap over-reserves by at most
those.
A request is the forecast peak plus ``MEMORY_MARGIN_FRACTION`` of it (VPA's safety margin), at
least ``MEMORY_MIN_HEADROOM_MB`` more, and for a PS at least its tables' share once more (a
checkpoint's save or restore holds a second copy of its rows), rounded up to ``MEMORY_GRANULARITY_MB``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import InvalidInputError, is_allreduce, not_identifiable, validate_samples


def memory_request_mb(peak_mb: Any, transient_mb: Any = 0.0) -> Any:
    """Peak + margin, rounded up to the granularity (vectorised): the margin is
    ``MEMORY_MARGIN_FRACTION`` of the peak, at least ``MEMORY_MIN_HEADROOM_MB`` and at least
    ``transient_mb`` (a known short-lived copy above the steady peak: a PS's checkpoint)."""
    peak = np.asarray(peak_mb, dtype=float)
    headroom = np.maximum(np.maximum(peak * C.MEMORY_MARGIN_FRACTION, C.MEMORY_MIN_HEADROOM_MB),
                          np.asarray(transient_mb, dtype=float))
    return np.ceil((peak + headroom) / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB


@dataclass(frozen=True)
class MemoryModel:
    """Per-node memory in MB; see the module docstring for the equations. ``ps_base_mb`` and
    ``table_mb`` None: the model of an all-reduce job (no PS)."""

    ps_base_mb: float | None
    table_mb: float | None
    worker_base_mb: float
    activation_mb_per_sample: float
    table_growth_mb_per_m_samples: float = 0.0
    pinned: dict[str, str] = field(default_factory=dict)
    table_capacity_mb: float | None = None

    @property
    def allreduce(self) -> bool:
        """The model of an all-reduce job (``types.is_allreduce``): it has no PS part."""
        return self.ps_base_mb is None

    def ps_peak_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """PS memory after training ``samples`` more samples; 0 where ``ps`` is 0 (no PS)."""
        p = np.asarray(ps, dtype=float)
        n = np.asarray(samples, dtype=float)
        if self.allreduce:
            if np.any(p != 0):
                raise InvalidInputError("ps", ps, "0: the memory model is of an all-reduce job (no PS)")
            return np.zeros(np.broadcast(p, n).shape)
        return np.where(p > 0, self.ps_base_mb + self.ps_tables_mb(p, n), 0.0)

    def ps_tables_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """One PS's share of the tables after training ``samples`` more samples (0 where ``ps`` is 0)."""
        p = np.asarray(ps, dtype=float)
        if self.allreduce:
            return np.zeros(np.broadcast(p, np.asarray(samples)).shape)
        grown = self.table_mb + self.table_growth_mb_per_m_samples * np.asarray(samples, dtype=float) / 1e6
        if self.table_capacity_mb is not None:
            grown = np.minimum(grown, max(self.table_capacity_mb, self.table_mb))
        return np.where(p > 0, grown / np.where(p > 0, p, 1.0), 0.0)

    def worker_peak_mb(self, batch_size: Any, samples: Any = 0.0) -> Any:
        """Worker memory at ``batch_size``; an all-reduce worker's after training ``samples``
        more samples (it holds the whole tables; a PS job's worker holds none)."""
        peak = self.worker_base_mb + self.activation_mb_per_sample * np.asarray(batch_size, dtype=float)
        if not self.allreduce or not self.table_growth_mb_per_m_samples:
            return peak
        grown = self.table_growth_mb_per_m_samples * np.asarray(samples, dtype=float) / 1e6
        if self.table_capacity_mb is not None:
            grown = np.minimum(grown, self.table_capacity_mb)
        return peak + grown

    def ps_request_mb(self, ps: Any, samples: Any = 0.0) -> Any:
        """The request (``memory_request_mb``) for a PS's peak, with room for a second copy of its
        tables (``ParameterServer.save`` copies every row it holds before writing them,
        ``restore`` reads the checkpoint's rows beside the tables it fills);
        0 where ``ps`` is 0: nothing runs."""
        request = memory_request_mb(self.ps_peak_mb(ps, samples), self.ps_tables_mb(ps, samples))
        p = np.asarray(ps)
        return request if np.all(p > 0) else np.where(p > 0, request, 0.0)

    def worker_request_mb(self, batch_size: Any, samples: Any = 0.0) -> Any:
        return memory_request_mb(self.worker_peak_mb(batch_size, samples))

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


def memory_columns(allreduce: bool) -> tuple[str, ...]:
    """The usage columns a memory fit needs: the workers' (all-reduce), and the PS's (PS jobs)."""
    return ("worker_memory_used_mb",) if allreduce else ("ps_memory_used_mb", "worker_memory_used_mb")


def has_memory_usage(table: pd.DataFrame) -> bool:
    """Whether a (validated) sample table measured what ``fit_memory`` needs for its kind of job."""
    return all(c in table and table[c].notna().any() for c in memory_columns(is_allreduce(table)))


def fit_memory(samples: pd.DataFrame, *, validated: bool = False, table_capacity_mb: float | None = None) -> MemoryModel:
    """Fit the memory model from a sample table with ``ps_memory_used_mb`` (PS jobs) and
    ``worker_memory_used_mb`` (per-node means; rows with empty usage are ignored) and, when
    present, ``samples_seen`` (samples trained when the window was measured).
    ``validated``: ``samples`` is what :func:`validate_samples` returned (not checked again);
    ``table_capacity_mb``: the layout's bound on the tables (see the module docstring)."""
    table = samples if validated else validate_samples(samples)
    allreduce = is_allreduce(table)
    for column in memory_columns(allreduce):
        if column not in table or not table[column].notna().any():
            raise InvalidInputError(
                f"samples.{column}", "missing",
                "measured per-node memory in MB (the profiler records it)",
                "The planner sizes memory from it.",
            )
    if allreduce:
        return _fit_allreduce_memory(table, table_capacity_mb)
    ps_rows = table[table["ps_memory_used_mb"].notna()]
    inverse_ps = 1.0 / ps_rows["ps"].to_numpy(float)
    seen = _samples_seen(ps_rows)
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


def _samples_seen(rows: pd.DataFrame) -> np.ndarray:
    seen = pd.to_numeric(rows.get("samples_seen", 0.0), errors="coerce")
    return np.nan_to_num(np.broadcast_to(np.asarray(seen, dtype=float), (len(rows),)))


def _fit_allreduce_memory(table: pd.DataFrame, table_capacity_mb: float | None) -> MemoryModel:
    """The workers' part of the model, with the tables' growth on each worker (no PS part)."""
    rows = table[table["worker_memory_used_mb"].notna()]
    batch = rows["batch_size"].to_numpy(float)
    worker, pinned = _nnls_fit(
        {"worker_base_mb": np.ones_like(batch), "activation_mb_per_sample": batch, "growth": _samples_seen(rows) / 1e6},
        rows["worker_memory_used_mb"].to_numpy(float),
        {"activation_mb_per_sample": "batch_size never varies: worker memory is taken as constant",
         "growth": "no samples_seen that varies: table growth unknown (0)"},
    )
    pinned = {("table_growth_mb_per_m_samples" if k == "growth" else k): v for k, v in pinned.items()}
    no_ps = dict.fromkeys(("ps_base_mb", "table_mb"), not_identifiable(True))
    return MemoryModel(None, None, worker["worker_base_mb"], worker["activation_mb_per_sample"], worker["growth"],
                       no_ps | pinned, table_capacity_mb)


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
