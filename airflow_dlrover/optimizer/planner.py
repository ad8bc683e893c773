"""Pre-tune planner: exact search of the configuration grid under a quota (DLRover-RM §5).

The grid is every (w, p, λw, λp[, g]) with w ≤ ``GRID_MAX_WORKERS``, p ≤ ``GRID_MAX_PS`` and λ in
``GRID_CPU_VALUES`` (401,408 points). It is built once per (batch, GPU values), sorted by total
cores, so that everything a quota of C cores allows is a prefix of it; the model's throughput is
one matrix-vector product over that prefix. Memory per node comes from the memory model plus its
margin (``memory.memory_request_mb``); for a job of known size the PS tables include the rows the
remaining samples will add.

Node sizes are searched up to ``NODE_CPU_TRUST_MULTIPLE`` × the largest the model was fitted on
(``FitReport.largest_node_cpu``).

The grid is of the model's kind of job (``ThroughputModel.allreduce``): for a PS job p ≥ 1 as
above; for an all-reduce job p = 0 and λp = 0 only (w × λw[× g]: 896 points), its memory the
workers' alone (each with the tables the remaining samples add: ``MemoryModel.worker_peak_mb``).
A grid keeps only its kind's feature columns (``model.kind_columns``).

Objectives:

* ``throughput``  — the highest predicted throughput; ties go to fewer cores.
* ``deadline``    — the least total cost (price · resources · predicted duration) that trains
  ``samples`` within ``deadline_s``.
* ``efficiency``  — the knee of the Pareto front (throughput vs. cores): the largest vertex of its
  upper concave hull whose marginal throughput per core is still ≥ ``KNEE_MARGINAL_FRACTION`` of
  the best throughput per core on the front.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import numpy as np

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import ThroughputModel, features, kind_columns
from airflow_dlrover.optimizer.types import (
    Configuration,
    InfeasibleQuotaError,
    InvalidInputError,
    Objective,
    Plan,
    Quota,
    check_kind,
)


@dataclass(frozen=True)
class SearchGrid:
    """Every candidate configuration, sorted by total cores (read-only arrays)."""

    workers: np.ndarray
    ps: np.ndarray
    worker_cpu: np.ndarray
    ps_cpu: np.ndarray
    worker_gpu: np.ndarray
    cores: np.ndarray
    feats: np.ndarray  # the design rows' columns of the grid's kind of job only: ``columns``
    columns: np.ndarray  # indices in ``model.PARAMETERS`` of the columns of ``feats``
    group_starts: np.ndarray  # first index of each distinct ``cores`` value
    group_of: np.ndarray  # the group (index into ``group_starts``) of each point
    _powers: dict = field(default_factory=dict, compare=False, repr=False)

    def feats_pow(self, q: float) -> np.ndarray:
        """feats**q, computed once per sharpness q (the model's q-norm works on it)."""
        if q not in self._powers:
            self._powers[q] = self.feats**q
            self._powers[q].flags.writeable = False
        return self._powers[q]

    def __len__(self) -> int:
        return len(self.cores)

    def prefix(self, cpu: float) -> int:
        """Number of grid points with at most ``cpu`` cores."""
        return int(np.searchsorted(self.cores, cpu + 1e-9, side="right"))


@lru_cache(maxsize=16)
def search_grid(
    batch_size: int,
    gpu_values: tuple[int, ...] = (0,),
    max_workers: int = C.GRID_MAX_WORKERS,
    max_ps: int = C.GRID_MAX_PS,
    cpu_values: tuple[float, ...] = C.GRID_CPU_VALUES,
    allreduce: bool = False,
) -> SearchGrid:
    """The grid of a PS job (p ≥ 1) or of an all-reduce job (``allreduce``: p = 0, λp = 0)."""
    ps_values, ps_cpu_values = (np.array([0]), (0.0,)) if allreduce else (np.arange(1, max_ps + 1), cpu_values)
    w, p, lw, lp, g = (
        a.ravel()
        for a in np.meshgrid(
            np.arange(1, max_workers + 1), ps_values, cpu_values, ps_cpu_values, gpu_values,
            indexing="ij",
        )
    )
    cores = w * lw + p * lp
    order = np.argsort(cores, kind="stable")
    arrays = [a[order] for a in (w, p, lw, lp, g, cores)]
    for a in arrays:
        a.flags.writeable = False
    w, p, lw, lp, g, cores = arrays
    columns = kind_columns(allreduce)
    feats = features(w, p, lw, lp, g, batch_size, columns)
    for a in (feats, columns):
        a.flags.writeable = False
    opens_group = np.r_[True, np.diff(cores) > 0]
    starts = np.flatnonzero(opens_group)
    group_of = np.cumsum(opens_group) - 1
    for a in (starts, group_of):
        a.flags.writeable = False
    return SearchGrid(w, p, lw, lp, g, cores, feats, columns, starts, group_of)


def minimum_requirement(memory: MemoryModel | None, batch_size: int, allreduce: bool = False,
                        worker_memory_mb: float | None = None, ps_memory_mb: float | None = None) -> dict[str, float]:
    """What the smallest configuration (1 worker, 1 PS — none for an all-reduce job —, least CPU)
    needs (memory: the explicit sizes, else the model's; 0 where neither says)."""
    least_cpu = min(C.GRID_CPU_VALUES)
    ps = 0 if allreduce else 1
    worker = worker_memory_mb or (float(memory.worker_request_mb(batch_size)) if memory is not None else 0.0)
    ps_each = ps_memory_mb or (float(memory.ps_request_mb(ps)) if memory is not None and ps else 0.0)
    return {"cpu": (1 + ps) * least_cpu, "memory_mb": float(worker + ps * ps_each), "nodes": 1 + ps}


def node_memory(memory: MemoryModel | None, quota: Quota, w: np.ndarray, p: np.ndarray, batch: int,
                samples: float | None, worker_memory_mb: float | None = None,
                ps_memory_mb: float | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(worker MB, PS MB per node) for each configuration (w, p), and where they come from when
    not (only) from the memory model ("" when they do).

    A size given explicitly is used as it is; else the memory model's request (PS: its tables
    for ``samples`` over p); without a model, the node gets an equal share of what the quota's
    memory leaves after the explicit sizes, in ``MEMORY_GRANULARITY_MB`` steps:
    ``(M − w·m_w − p·m_p) / (w' + p')`` over the w', p' nodes without a size."""
    worker = np.full(len(w), float(worker_memory_mb)) if worker_memory_mb else None
    ps = np.where(p > 0, float(ps_memory_mb), 0.0) if ps_memory_mb else None
    sources = ["as given"] if worker_memory_mb or ps_memory_mb else []
    if memory is not None:
        if worker is None or ps is None:
            sources.append("the memory model")
        if worker is None:
            worker = np.full(len(w), float(memory.worker_request_mb(batch, samples or 0.0)))
        if ps is None:
            ps = np.zeros(len(w)) if memory.allreduce else \
                memory.ps_request_mb(np.arange(1, C.GRID_MAX_PS + 1), samples or 0.0)[np.maximum(p, 1) - 1] * (p > 0)
        return worker, ps, "" if sources == ["the memory model"] else "; ".join(sources)
    if worker is None or ps is None:
        granule = C.MEMORY_GRANULARITY_MB
        left = quota.memory_mb - (w * worker if worker is not None else 0.0) - (p * ps if ps is not None else 0.0)
        sharing = (w if worker is None else 0) + (p if ps is None else 0)
        share = np.floor(np.maximum(left, 0.0) / np.maximum(sharing, 1) / granule) * granule
        worker = share if worker is None else worker
        ps = np.where(p > 0, share, 0.0) if ps is None else ps
        sources.append("an equal share of the quota's memory (no memory model)")
    return worker, ps, "; ".join(sources)


def plan(
    model: ThroughputModel,
    memory: MemoryModel | None,
    quota: Quota,
    objective: str = "throughput",
    *,
    samples: float | None = None,
    deadline_s: float | None = None,
    batch_size: int | None = None,
    exclude: Iterable[Configuration] = (),
    worker_memory_mb: float | None = None,
    ps_memory_mb: float | None = None,
) -> Plan:
    """Choose the configuration for ``objective`` under ``quota``; see the module docstring.

    ``samples`` (to train) makes PS memory include the table growth those samples bring;
    ``exclude`` removes configurations (e.g. ones a fine-tune revert rejected). Memory per node
    is :func:`node_memory`'s: ``worker_memory_mb`` / ``ps_memory_mb`` when given, else the memory
    model's, else (``memory`` None: a model fitted on throughput only) an equal share of the
    quota; the plan's reason says which.
    Raises :class:`InfeasibleQuotaError` when nothing fits, naming what the smallest job needs.
    """
    objective = Objective.parse(objective).value
    allreduce = model.allreduce
    if memory is not None:
        check_kind(memory, allreduce, "model.memory", "the throughput model is")
    for name, value in (("worker_memory", worker_memory_mb), ("ps_memory", ps_memory_mb)):
        if value is not None and not (np.isfinite(value) and value > 0):
            raise InvalidInputError(name, value, "a positive size in MB per node")
    if allreduce and ps_memory_mb:
        raise InvalidInputError("ps_memory", ps_memory_mb, "none: the job trains without PS (all-reduce)")
    if samples is not None and not (np.isfinite(samples) and samples > 0):
        raise InvalidInputError("samples", samples, "a positive number of samples to train")
    if objective == "deadline":
        if samples is None or deadline_s is None:
            raise InvalidInputError(
                "deadline", deadline_s, "both --samples and --deadline with the deadline objective"
            )
        if not (np.isfinite(deadline_s) and deadline_s > 0):
            raise InvalidInputError("deadline", deadline_s, "a positive duration")
    exclude = tuple(exclude)
    batch = int(batch_size or model.batch_size)
    use_gpu = quota.gpu > 0 and "gpu_compute" in model.identified
    gpu_values = (0,) + tuple(g for g in C.GRID_GPU_VALUES if g <= quota.gpu) if use_gpu else (0,)
    grid = search_grid(batch, gpu_values, allreduce=allreduce)

    n = grid.prefix(quota.cpu)
    minimum = minimum_requirement(memory, batch, allreduce, worker_memory_mb, ps_memory_mb)
    if n == 0:
        raise InfeasibleQuotaError("cpu", quota.cpu, minimum)
    w, p, g, cores = grid.workers[:n], grid.ps[:n], grid.worker_gpu[:n], grid.cores[:n]
    x = model.predict_features(grid.feats[:n], band=False, feats_q=grid.feats_pow(model.sharpness)[:n],
                               columns=grid.columns)
    worker_mem, ps_mem, memory_source = node_memory(memory, quota, w, p, batch, samples, worker_memory_mb, ps_memory_mb)
    total_mem = w * worker_mem + p * ps_mem
    allowed = np.ones(n, dtype=bool)  # every constraint but memory
    largest = model.report.largest_node_cpu if model.report is not None else None
    if largest:  # node sizes the model can vouch for (``NODE_CPU_TRUST_MULTIPLE``)
        allowed &= grid.worker_cpu[:n] <= C.NODE_CPU_TRUST_MULTIPLE * largest["worker_cpu"] + 1e-9
        allowed &= grid.ps_cpu[:n] <= C.NODE_CPU_TRUST_MULTIPLE * largest["ps_cpu"] + 1e-9
    if quota.max_nodes is not None:
        allowed &= (w + p) <= quota.max_nodes
    if use_gpu:
        allowed &= w * g <= quota.gpu
    for config in exclude:
        allowed &= ~(
            (w == config.workers) & (p == config.ps) & (grid.worker_cpu[:n] == config.worker_cpu)
            & (grid.ps_cpu[:n] == config.ps_cpu) & (g == config.worker_gpu)
        )
    feasible = allowed & (total_mem <= quota.memory_mb)
    # an equal share must still hold a process
    feasible &= (worker_mem >= C.MEMORY_GRANULARITY_MB) & ((p == 0) | (ps_mem >= C.MEMORY_GRANULARITY_MB))
    if not feasible.any():
        if not allowed.any():
            raise InvalidInputError("exclude", len(exclude), "exclusions that leave a configuration")
        tables = "each worker's tables" if allreduce else "the PS tables"
        growth = (
            f" ({tables} grow by {memory.table_growth_mb_per_m_samples * samples / 1e6:,.0f} MB over {samples:g} samples)"
            if samples and memory is not None and memory.table_growth_mb_per_m_samples else ""
        )
        raise InfeasibleQuotaError(
            "memory", f"{quota.memory_mb:g} MB", dict(minimum, memory_mb=float(total_mem[allowed].min())),
            f"No configuration within {quota.cpu:g} cores fits the memory{growth}.",
        )

    x_feasible = np.where(feasible, x, -np.inf)
    front = pareto_front(grid, n, x_feasible)
    if objective == "throughput":
        best = int(np.argmax(x_feasible))  # sorted by cores: the first maximum has the fewest
        score = x_feasible
    elif objective == "deadline":
        needed = samples / deadline_s
        price_core = quota.price_per_core_hour if quota.price_per_core_hour is not None else C.DEFAULT_PRICE_PER_CORE_HOUR
        price_gb = quota.price_per_gb_hour if quota.price_per_gb_hour is not None else C.DEFAULT_PRICE_PER_GB_HOUR
        on_time = x_feasible >= needed
        if not on_time.any():
            fastest = samples / x_feasible.max()
            raise InvalidInputError(
                "deadline", f"{deadline_s:g}s",
                f"≥ {fastest:.0f}s: the fastest plan under this quota trains {samples:g} samples "
                f"at {x_feasible.max():.0f} samples/s",
            )
        cost = (cores * price_core + total_mem / 1024.0 * price_gb) * (samples / x / 3600.0)
        score = np.where(on_time, -cost, -np.inf)
        best = int(np.argmax(score))
    else:
        best = knee(front, x, cores)
        score = None

    config = Configuration(
        workers=int(w[best]), ps=int(p[best]), worker_cpu=float(grid.worker_cpu[best]),
        ps_cpu=float(grid.ps_cpu[best]), worker_memory_mb=float(worker_mem[best]), ps_memory_mb=float(ps_mem[best]),
        worker_gpu=int(g[best]), batch_size=batch,
    )
    _, lower, upper = model.predict_features(grid.feats[best : best + 1], columns=grid.columns)
    alternatives = _alternatives(score, front, best)
    return Plan(
        config=config,
        predicted_throughput=float(x[best]),
        lower_throughput=float(lower[0]),
        upper_throughput=float(upper[0]),
        objective=objective,
        reason=_reason(objective, config, float(x[best]), quota, float(total_mem[best]), samples, deadline_s, use_gpu)
        + (f"; memory per node {memory_source}" if memory_source else ""),
        alternatives=_rows(grid, np.asarray(alternatives, dtype=int), x, total_mem),
        pareto_front=_rows(grid, front, x, total_mem),
    )


def pareto_front(grid: SearchGrid, n: int, x_feasible: np.ndarray) -> np.ndarray:
    """Indices of the Pareto-optimal points (more throughput needs more cores), by cores."""
    starts = grid.group_starts[grid.group_starts < n]
    group_max = np.maximum.reduceat(x_feasible, starts)
    previous_best = np.r_[-np.inf, np.maximum.accumulate(group_max)[:-1]]
    on_front = np.flatnonzero(group_max > previous_best)
    # The first point of each of those groups that reaches its group's maximum (a prefix of the
    # grid ends at a group boundary: every point of a core count or none).
    group = grid.group_of[:n]
    front_group = np.zeros(len(starts), dtype=bool)
    front_group[on_front] = True
    at_max = np.flatnonzero((x_feasible[:n] == group_max[group]) & front_group[group])
    first = np.r_[True, np.diff(group[at_max]) > 0]
    return at_max[first]


def knee(front: np.ndarray, x: np.ndarray, cores: np.ndarray) -> int:
    """Largest upper-hull vertex whose marginal throughput per core ≥ fraction × best average."""
    c, t = cores[front], x[front]
    hull: list[int] = []
    for i in range(len(front)):  # monotone chain, upper hull (points already sorted by cores)
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (c[b] - c[a]) * (t[i] - t[a]) - (t[b] - t[a]) * (c[i] - c[a]) >= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    best_per_core = float(np.max(t / c))
    chosen = hull[0]
    for a, b in zip(hull, hull[1:]):
        if (t[b] - t[a]) / (c[b] - c[a]) >= C.KNEE_MARGINAL_FRACTION * best_per_core:
            chosen = b
        else:
            break
    return int(front[chosen])


def _alternatives(score: np.ndarray | None, front: np.ndarray, best: int) -> list[int]:
    k = C.PLAN_ALTERNATIVES
    if score is None:  # efficiency: the front points nearest the knee
        position = int(np.flatnonzero(front == best)[0]) if best in front else 0
        near = sorted(range(len(front)), key=lambda i: abs(i - position))
        return [int(front[i]) for i in near if front[i] != best][:k]
    finite = np.isfinite(score)
    top = np.flatnonzero(finite)
    if len(top) > k + 1:
        top = top[np.argpartition(-score[top], k)[: k + 1]]
    top = top[np.argsort(-score[top], kind="stable")]
    return [int(i) for i in top if i != best][:k]


def _rows(grid: SearchGrid, index: np.ndarray, x: np.ndarray, total_mem: np.ndarray) -> list[dict[str, float]]:
    """The grid points ``index`` as plain rows (Python numbers: JSON-ready)."""
    columns = {
        "workers": grid.workers[index].astype(int), "ps": grid.ps[index].astype(int),
        "worker_cpu": grid.worker_cpu[index].astype(float), "ps_cpu": grid.ps_cpu[index].astype(float),
        "worker_gpu": grid.worker_gpu[index].astype(int), "cores": grid.cores[index].astype(float),
        "memory_mb": total_mem[index].astype(float), "predicted_throughput": x[index].astype(float),
    }
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*(column.tolist() for column in columns.values()))]


def _reason(objective, config, x, quota, total_mem, samples, deadline_s, gpu_searched) -> str:
    binding = []
    if config.cores >= 0.95 * quota.cpu:
        binding.append(f"cpu {config.cores:g}/{quota.cpu:g}")
    if total_mem >= 0.95 * quota.memory_mb:
        binding.append(f"memory {total_mem / 1024:.1f}/{quota.memory_mb / 1024:.1f} GiB")
    if quota.max_nodes is not None and config.nodes >= quota.max_nodes:
        binding.append(f"nodes {config.nodes}/{quota.max_nodes}")
    limit = "limited by " + ", ".join(binding) if binding else "inside the quota (more nodes would not pay)"
    if objective == "deadline":
        goal = f"least cost to train {samples:g} samples within {deadline_s:g}s"
    else:
        goal = {"throughput": "highest predicted throughput", "efficiency": "knee of throughput per core"}[objective]
    gpu_note = "" if gpu_searched or quota.gpu == 0 else "; GPUs not searched (model has no GPU samples)"
    ps = f" + {config.ps}ps×{config.ps_cpu:g}cpu" if config.ps else ", no PS (all-reduce)"
    return f"{goal}: {config.workers}w×{config.worker_cpu:g}cpu{ps} → {x:,.0f} samples/s, {limit}{gpu_note}"
