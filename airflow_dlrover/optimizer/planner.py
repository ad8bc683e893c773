"""Pre-tune planner: the best configuration under a quota (DLRover-RM §5), the exhaustive search's
answer without enumerating every configuration.

Search range (:func:`search_range`): w workers and p PS (p = 0 for an all-reduce job), as many as
the quota's cores (and nodes) allow at the smallest node size, at most ``PLAN_MAX_WORKERS`` and
``PLAN_MAX_PS``; CPU per node λw, λp from ``GRID_CPU_VALUES`` up to ``NODE_CPU_TRUST_MULTIPLE`` ×
the largest the model was fitted on (``FitReport.largest_node_cpu``); GPUs per worker g from
``GRID_GPU_VALUES`` when the quota has GPUs and the model knows them (``gpu_compute`` identified).
Up to 1,024 × 256 × 7² × 5 ≈ 64 M configurations: too many to enumerate in a plan's time.

Structure. For one node shape s = (λw, λp, g), with u = w^-q, v = p^-q and φ_k = θ_k^q, the model
(``model.py``; p = 0: v = 0) is

    Y = (1/X)^q = (a_s + b_s·v)·u + f_s·v²/u + e_s·v + c_s + r(w)
    a_s = φ_overhead·B^-q + φ_worker_compute·λw^-q  (on GPU: + φ_gpu_compute·g^-q instead),
    b_s = φ_ps_latency·min(λp, 1)^-q,   e_s = φ_ps_service·λp^-q + φ_network,
    f_s = φ_contention·λp^-q,   c_s = φ_ps_request·(λp·B)^-q + φ_io,
    r(w) = φ_allreduce·(2(w−1)/(w²·B))^q + φ_allreduce_latency·(2(w−1)/(w·B))^q

with every coefficient ≥ 0. Hence (1) X never falls as p grows (v falls), and (2) at a fixed p,
Y = A·u + F/u + const in u (A = a_s + b_s·v, F = f_s·v²) is convex, least at u* = √(F/A): the best
worker/PS ratio w*/p = (A/f_s)^(1/2q) that the contention term sets. So over w ∈ [w1, w2] the
largest X is at an integer next to w* clipped to [w1, w2] (at w2 when F = 0, at w1 when A = 0), and
over a box [w1, w2] × [p1, p2] of one shape X is at most X̄ = X(ŵ, p2), ŵ that integer, while every
configuration in it costs at least c̲ = w1·λw + p1·λp cores (and the least memory at w ≥ w1, p ≥ p1).

Search (PS jobs): branch and bound over such boxes, one per shape to start. A box is halved at the
geometric mean of each side of more than one value; one of at most ``PLAN_ROWS_BOX``
configurations is split into its rows (one w each: an exact bound), and a row of at most
``PLAN_EXPAND_ROW`` that survives its bound is evaluated whole. A box is dropped when it can hold
nothing the plan depends on:

* a point of the Pareto front needs X > F(c−), the best throughput of a feasible configuration of
  fewer cores; a box with X̄ ≤ F_K(c̲−) holds none, F_K ≤ F being the same over the configurations
  evaluated so far (each box's guess: ŵ with the most PS that fit; every configuration evaluated).
  A box that can hold no point of the front but past the fewest cores of a known configuration at
  least as fast as X̄ keeps only the cheaper part;
* the plan and its ``PLAN_ALTERNATIVES`` alternatives are the k + 1 first configurations by score,
  ties to fewer cores then grid order: a box cannot hold one when even at best it ranks after the
  (k+1)-th evaluated so far — throughput: X̄ against its X (c̲ against its cores on a tie);
  deadline: X̄ below samples/deadline, or the least cost (c̲·price + least memory·price) · samples / X̄
  against its cost; efficiency: the knee and its alternatives are points of the front.

The configurations left are chosen from by the exhaustive search's own rules (:func:`pareto_front`,
:func:`knee`, the objectives), which look at nothing else: so the plan, its alternatives, its
front and its knee are the exhaustive search's (``plan(..., exhaustive=True)``; compared on random
models and quotas in tests/optimizer/test_planner_search.py, timed by benchmarks/planner_scale.py).
Bounds and configurations are evaluated by the one formula above, so that ties compare exactly;
where X̄ rests on the continuous w* of a box of several w, it is raised by ``PLAN_BOUND_SLACK``.
Memory, nodes and GPUs bound the boxes too (a box keeps the rows and columns where something fits).
An all-reduce job's range is one-dimensional (w × λw × g: at most 36 k configurations): enumerated.

Memory per node is :func:`node_memory`'s: the memory model plus its margin
(``memory.memory_request_mb``), for a job of known size with the rows the remaining samples add.

Objectives:

* ``throughput``  — the highest predicted throughput; ties go to fewer cores.
* ``deadline``    — the least total cost (price · resources · predicted duration) that trains
  ``samples`` within ``deadline_s``.
* ``efficiency``  — the knee of the Pareto front (throughput vs. cores): the largest vertex of its
  upper concave hull whose marginal throughput per core is still ≥ ``KNEE_MARGINAL_FRACTION`` of
  the best throughput per core on the front.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Iterable

import numpy as np

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import ThroughputModel, effective_cores, features, kind_columns
from airflow_dlrover.optimizer.types import (
    Configuration,
    InfeasibleQuotaError,
    InvalidInputError,
    Objective,
    Plan,
    Quota,
    check_kind,
)

_CORES_EPS = 1e-9  # a configuration of exactly the quota's cores fits it
#: Every node size is a multiple of this many cores (so is every configuration's total).
_CORE_STEP = 0.5
assert all(float(v / _CORE_STEP).is_integer() for v in C.GRID_CPU_VALUES)


def _steps(cores: np.ndarray) -> np.ndarray:
    """A configuration's total cores in units of ``_CORE_STEP`` (exact)."""
    return np.rint(np.asarray(cores) / _CORE_STEP).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The search range and its configurations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchRange:
    """1 ≤ w ≤ ``max_workers``, 1 ≤ p ≤ ``max_ps`` (p = 0 for ``allreduce``), CPU per node and GPUs
    per worker from these values (ascending). A node shape s is (λw, λp, g), numbered in that order."""

    max_workers: int
    max_ps: int
    worker_cpu: tuple[float, ...]
    ps_cpu: tuple[float, ...]
    worker_gpu: tuple[int, ...] = (0,)
    allreduce: bool = False

    def shapes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(λw, λp, g) of each node shape, in shape order (read-only: kept for the range)."""
        return _shapes(self)

    @property
    def size(self) -> int:
        """Configurations in the range (before the quota's cores cut it)."""
        return self.max_workers * max(self.max_ps, 1) * len(self.worker_cpu) * len(self.ps_cpu) * len(self.worker_gpu)


@functools.lru_cache(maxsize=256)
def _shapes(rng: SearchRange) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lw, lp, g = np.meshgrid(np.asarray(rng.worker_cpu, float), np.asarray(rng.ps_cpu, float),
                            np.asarray(rng.worker_gpu), indexing="ij")
    shapes = tuple(a.ravel() for a in (lw, lp, g))
    for a in shapes:
        a.flags.writeable = False
    return shapes


def search_range(cpu: float, *, allreduce: bool = False, gpu_values: tuple[int, ...] = (0,),
                 largest_node_cpu: dict[str, float] | None = None, max_nodes: int | None = None) -> SearchRange:
    """The range a plan under ``cpu`` cores (and ``max_nodes``) searches; see the module docstring.
    ``largest_node_cpu``: the model's (``FitReport.largest_node_cpu``); None searches every size."""

    def trusted(role: str) -> tuple[float, ...]:
        if largest_node_cpu is None:
            return tuple(C.GRID_CPU_VALUES)
        values = tuple(v for v in C.GRID_CPU_VALUES if v <= C.NODE_CPU_TRUST_MULTIPLE * largest_node_cpu[role] + 1e-9)
        if not values:
            raise InvalidInputError(
                f"model.largest_node_cpu.{role}", largest_node_cpu[role],
                f"at least {min(C.GRID_CPU_VALUES) / C.NODE_CPU_TRUST_MULTIPLE:g} cores: the planner's smallest node "
                f"({min(C.GRID_CPU_VALUES):g}) within {C.NODE_CPU_TRUST_MULTIPLE:g}× the largest the model was fitted on",
            )
        return values

    worker_cpu = trusted("worker_cpu")
    ps_cpu = (0.0,) if allreduce else trusted("ps_cpu")
    budget = float(cpu) + _CORES_EPS
    workers = min(C.PLAN_MAX_WORKERS, math.floor((budget - min(ps_cpu)) / min(worker_cpu)))
    ps = 0 if allreduce else min(C.PLAN_MAX_PS, math.floor((budget - min(worker_cpu)) / min(ps_cpu)))
    if max_nodes is not None:
        workers = min(workers, max_nodes - (0 if allreduce else 1))
        ps = min(ps, max_nodes - 1) if not allreduce else 0
    return SearchRange(max(workers, 0), max(ps, 0), worker_cpu, ps_cpu, tuple(gpu_values), allreduce)


@dataclass(frozen=True)
class Configurations:
    """Configurations of one range, sorted by total cores, then (w, p, λw, λp, g): the order in which
    the planner breaks ties (fewer cores first). ``shape``: each one's node shape (``SearchRange.shapes``)."""

    range: SearchRange
    shape: np.ndarray
    workers: np.ndarray
    ps: np.ndarray
    worker_cpu: np.ndarray
    ps_cpu: np.ndarray
    worker_gpu: np.ndarray
    cores: np.ndarray

    @classmethod
    def of(cls, rng: SearchRange, shape: np.ndarray, workers: np.ndarray, ps: np.ndarray) -> "Configurations":
        shapes = rng.shapes()
        lw, lp, g = (a[shape] for a in shapes)
        cores = workers * lw + ps * lp
        # (w, p, s) in one integer: shapes are numbered in (λw, λp, g) order of ascending values
        rest = (workers.astype(np.int64) * (rng.max_ps + 1) + ps) * len(shapes[0]) + shape
        order = np.lexsort((rest, cores))
        return cls(rng, shape[order], workers[order], ps[order], lw[order], lp[order], g[order], cores[order])

    def take(self, index: np.ndarray) -> "Configurations":
        return Configurations(self.range, *(a[index] for a in (self.shape, self.workers, self.ps, self.worker_cpu,
                                                                 self.ps_cpu, self.worker_gpu, self.cores)))

    def __len__(self) -> int:
        return len(self.cores)


def configurations(rng: SearchRange, cpu: float) -> Configurations:
    """Every configuration of ``rng`` with at most ``cpu`` cores (the exhaustive search's set)."""
    lw_s, lp_s, _ = rng.shapes()
    budget = float(cpu) + _CORES_EPS
    shapes, workers, ps = [], [], []
    w = np.arange(1, rng.max_workers + 1)
    for s, (lw, lp) in enumerate(zip(lw_s, lp_s)):
        if rng.allreduce:
            fits = w[w * lw <= budget]
            shapes.append(np.full(len(fits), s))
            workers.append(fits)
            ps.append(np.zeros(len(fits), dtype=int))
            continue
        most = np.minimum(rng.max_ps, np.floor((budget - w * lw) / lp)).astype(int)
        ws, most = w[most >= 1], most[most >= 1]
        total = int(most.sum())
        shapes.append(np.full(total, s))
        workers.append(np.repeat(ws, most))
        ps.append(np.arange(total) - np.repeat(np.cumsum(most) - most, most) + 1)
    cat = (np.concatenate(a) if a else np.zeros(0, dtype=int) for a in (shapes, workers, ps))
    return Configurations.of(rng, *cat)


# ---------------------------------------------------------------------------------------------
# The model in separable form (one evaluation for the search, its bounds and the exhaustive one)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Separable:
    """The coefficients of the module docstring's Y for each node shape of a range, and u = w^-q,
    v = p^-q, r(w) by index (u[w], v[p], r[w]; v[0] = 0: no PS)."""

    q: float
    a: np.ndarray
    b: np.ndarray
    e: np.ndarray
    f: np.ndarray
    c: np.ndarray
    u: np.ndarray
    v: np.ndarray
    r: np.ndarray

    @classmethod
    def of(cls, model: ThroughputModel, rng: SearchRange, batch: int) -> "_Separable":
        q, B = float(model.sharpness), float(batch)
        phi = {name: value**q for name, value in model.params.items()}
        lw, lp, g = rng.shapes()
        has_ps = lp > 0
        lw = effective_cores(lw, model.scaling[0], model.scaling[2])  # as model.features
        lp_ = effective_cores(np.where(has_ps, lp, 1.0), model.scaling[1], model.scaling[2])
        with np.errstate(divide="ignore"):
            a = phi["overhead"] * B**-q + np.where(g > 0, phi["gpu_compute"] * np.maximum(g, 1.0) ** -q,
                                                    phi["worker_compute"] * lw**-q)
            b = np.where(has_ps, phi["ps_latency"] * np.minimum(lp_, 1.0) ** -q, 0.0)
            e = np.where(has_ps, phi["ps_service"] * lp_**-q + phi["network"], 0.0)
            f = np.where(has_ps, phi["contention"] * lp_**-q, 0.0)
            c = np.where(has_ps, phi["ps_request"] * (lp_ * B) ** -q, 0.0) + phi["io"]
        w = np.arange(0, rng.max_workers + 1, dtype=float)
        p = np.arange(0, rng.max_ps + 1, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(w > 0, w ** -q, np.nan)
            v = np.where(p > 0, p ** -q, 0.0)
            ring = 2.0 * (w - 1.0)
            r = np.where(w > 0, phi["allreduce"] * (ring / (w * w * B)) ** q
                         + phi["allreduce_latency"] * (ring / (w * B)) ** q, np.nan)
        return cls(q, a, b, e, f, c, u, v, r)

    def inverse_q(self, s: np.ndarray, w: np.ndarray, p: np.ndarray) -> np.ndarray:
        """Y = (1/X)^q of each configuration (shape s, w workers, p PS)."""
        v = self.v[p]
        return _y(self.a[s] + self.b[s] * v, self.f[s] * v * v, self.u[w], self.e[s] * v, self.c[s], self.r[w])

    def throughput(self, y: np.ndarray) -> np.ndarray:
        return np.maximum(y, 1e-300) ** (-1.0 / self.q)


def _y(A, F, u, ev, c, r):
    """Y = A·u + F/u + e·v + c + r, always in this order (bounds and points then round alike)."""
    return A * u + F / u + ev + c + r


def predicted_throughput(model: ThroughputModel, configs: Configurations, batch: int) -> np.ndarray:
    """The model's throughput of each configuration as the planner evaluates it (the separable
    form; equal to ``ThroughputModel.predict`` up to rounding)."""
    sep = _Separable.of(model, configs.range, batch)
    return sep.throughput(sep.inverse_q(configs.shape, configs.workers, configs.ps))


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------


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
    ``(M − w·m_w − p·m_p) / (w' + p')`` over the w', p' nodes without a size. ``w`` and ``p``
    broadcast (e.g. a column of workers against a row of PS)."""
    shape = np.broadcast_shapes(np.shape(w), np.shape(p))
    worker = np.full(shape, float(worker_memory_mb)) if worker_memory_mb else None
    ps = np.where(p > 0, float(ps_memory_mb), 0.0) if ps_memory_mb else None
    sources = ["as given"] if worker_memory_mb or ps_memory_mb else []
    if memory is not None:
        if worker is None or ps is None:
            sources.append("the memory model")
        if worker is None:
            worker = np.full(shape, float(memory.worker_request_mb(batch, samples or 0.0)))
        if ps is None:
            most = max(int(np.max(p, initial=0)), 1)
            ps = np.zeros(shape) if memory.allreduce else np.broadcast_to(
                memory.ps_request_mb(np.arange(1, most + 1), samples or 0.0)[np.maximum(p, 1) - 1] * (p > 0), shape)
        return worker, ps, "" if sources == ["the memory model"] else "; ".join(sources)
    if worker is None or ps is None:
        granule = C.MEMORY_GRANULARITY_MB
        left = quota.memory_mb - (w * worker if worker is not None else 0.0) - (p * ps if ps is not None else 0.0)
        sharing = (w if worker is None else 0) + (p if ps is None else 0)
        share = np.broadcast_to(np.floor(np.maximum(left, 0.0) / np.maximum(sharing, 1) / granule) * granule, shape)
        worker = share if worker is None else worker
        ps = np.where(p > 0, share, 0.0) if ps is None else ps
        sources.append("an equal share of the quota's memory (no memory model)")
    return worker, ps, "; ".join(sources)


@dataclass(frozen=True)
class _NodeMemory:
    """:func:`node_memory` of every (w, p) of a range, by index [w, p] (row 0 unused; column 0: p = 0)."""

    worker: np.ndarray
    ps: np.ndarray
    total: np.ndarray
    fits: np.ndarray  # within the quota's memory, and each node holds a process
    source: str

    @classmethod
    def of(cls, rng: SearchRange, quota: Quota, memory, batch, samples, worker_memory_mb, ps_memory_mb) -> "_NodeMemory":
        w, p = np.arange(rng.max_workers + 1)[:, None], np.arange(rng.max_ps + 1)[None, :]
        worker, ps, source = node_memory(memory, quota, w, p, batch, samples, worker_memory_mb, ps_memory_mb)
        total = w * worker + p * ps
        return cls(*np.broadcast_arrays(worker, ps), total, _fits_memory(w, p, worker, ps, quota, rng.allreduce),
                   source)


def _fits_memory(w, p, worker, ps, quota: Quota, allreduce: bool):
    """Whether (w, p) with ``worker`` / ``ps`` MB per node fits the quota's memory, each node holding
    a process (at least ``NODE_MIN_MEMORY_MB``), with a worker and, for a PS job, a PS."""
    return ((w * worker + p * ps <= quota.memory_mb) & (worker >= C.NODE_MIN_MEMORY_MB)
            & ((p == 0) | (ps >= C.NODE_MIN_MEMORY_MB)) & (w > 0) & ((p > 0) | allreduce))


class _Grid:
    """What a plan computes from its range, quota, memory model, samples and exclusions alone,
    whatever the throughput model: node memory (:class:`_NodeMemory`), the smallest job's needs, the
    exclusions' keys and (w, p) pairs, and what the branch and bound reads of [w, p]. The latest
    are kept by their inputs' values (:meth:`of`; at least ``_GRIDS_KEPT``, more while they hold at
    most ``_GRIDS_KEPT_CELLS`` cells): the fine-tune plans each running job again every window, and
    on posterior draws of its model, mostly on the same inputs."""

    def __init__(self, rng: SearchRange, quota: Quota, memory, batch, samples, worker_memory_mb, ps_memory_mb,
                 exclude: tuple[Configuration, ...]):
        self.minimum = minimum_requirement(memory, batch, rng.allreduce, worker_memory_mb, ps_memory_mb)
        self.mem = mem = _NodeMemory.of(rng, quota, memory, batch, samples, worker_memory_mb, ps_memory_mb)
        self.excluded = _excluded_keys(rng, exclude)
        self.allowed = _allowed_pairs(rng, quota, exclude)
        W, P = rng.max_workers, rng.max_ps
        self.nodes = quota.max_nodes if quota.max_nodes is not None else W + P + 1
        self._least_mem = None
        if rng.allreduce:  # enumerated: no branch and bound
            return
        lw_s, lp_s, _ = rng.shapes()
        budget = quota.cpu + _CORES_EPS
        # [w, p]: something fits in memory, and in the cores and nodes at the smallest node size ...
        w_all, p_all = np.arange(W + 1)[:, None], np.arange(P + 1)[None, :]
        fits = mem.fits & (w_all * lw_s.min() + p_all * lp_s.min() <= budget) & (w_all + p_all <= self.nodes)
        self.fits = fits
        p_idx = np.arange(P + 1, dtype=np.int32)
        self.last_fit = np.maximum.accumulate(np.where(fits, p_idx, np.int32(0)), axis=1)  # the most PS ≤ p that fit w
        fits_from = np.logical_or.accumulate(fits[::-1], axis=0)[::-1]  # ... for some w' ≥ w
        self.last_from = np.maximum.accumulate(np.where(fits_from, p_idx, np.int32(0)), axis=1)
        self.next_from = np.minimum.accumulate(np.where(fits_from, p_idx, np.int32(P + 1))[:, ::-1], axis=1)[:, ::-1]
        most_w = np.where(fits.any(axis=0), W - np.argmax(fits[::-1], axis=0), 0)  # [p]: the most workers that fit p
        self.most_w_from = np.maximum.accumulate(most_w[::-1])[::-1]  # ... for some p' ≥ p

    def least_mem(self) -> np.ndarray:
        """[w, p]: the least memory of a configuration that fits at w' ≥ w, p' ≥ p (the deadline's bound)."""
        if self._least_mem is None:
            least = np.where(self.fits, self.mem.total, np.inf)
            self._least_mem = np.minimum.accumulate(np.minimum.accumulate(least[::-1], axis=0)[:, ::-1],
                                                    axis=1)[::-1, ::-1]
        return self._least_mem

    @staticmethod
    def key(rng: SearchRange, quota: Quota, memory: MemoryModel | None, batch: int, samples: float,
            worker_memory_mb: float | None, ps_memory_mb: float | None, exclude: tuple[Configuration, ...]) -> tuple:
        """The grid's inputs by value (floats by ``repr``: exact)."""
        memory_key = None if memory is None else repr(tuple(getattr(memory, f.name) for f in fields(memory)))
        return (rng, quota, memory_key, batch, repr(float(samples)), worker_memory_mb, ps_memory_mb, exclude)

    @classmethod
    def of(cls, key: tuple, rng: SearchRange, quota: Quota, memory: MemoryModel | None, batch: int, samples: float,
           worker_memory_mb: float | None, ps_memory_mb: float | None, exclude: tuple[Configuration, ...]) -> "_Grid":
        """The grid of these inputs (``key``: theirs, :meth:`key`), kept or made."""
        with _GRIDS_LOCK:
            grid = _GRIDS.get(key)
            if grid is not None:
                _GRIDS.move_to_end(key)
                return grid
        grid = cls(rng, quota, memory, batch, samples, worker_memory_mb, ps_memory_mb, exclude)
        global _GRIDS_CELLS
        with _GRIDS_LOCK:
            if key not in _GRIDS:
                _GRIDS_CELLS += grid.mem.total.size
            _GRIDS[key] = grid
            while len(_GRIDS) > _GRIDS_KEPT and _GRIDS_CELLS > _GRIDS_KEPT_CELLS:
                _GRIDS_CELLS -= _GRIDS.popitem(last=False)[1].mem.total.size
        return grid


def _kept_plan(memo: tuple, model: ThroughputModel) -> "Plan | None":
    """A copy of the plan kept under ``memo`` for this very ``model`` object (None: none)."""
    with _GRIDS_LOCK:
        kept = _PLANS.get(memo)
        if kept is None or kept[0] is not model:
            return None
        _PLANS.move_to_end(memo)
    plan = kept[1]
    return replace(plan, alternatives=[dict(r) for r in plan.alternatives],
                   pareto_front=[dict(r) for r in plan.pareto_front], extrapolation=dict(plan.extrapolation))


def _keep_plan(memo: tuple, model: ThroughputModel, plan: "Plan") -> "Plan":
    """Keep ``plan`` of ``model`` under ``memo`` (the latest ``_PLANS_KEPT``, the model held with it
    so that its ``id`` in ``memo`` stays its own); returns a copy (the caller's to change)."""
    with _GRIDS_LOCK:
        _PLANS[memo] = (model, plan)
        while len(_PLANS) > _PLANS_KEPT:
            _PLANS.popitem(last=False)
    return _kept_plan(memo, model)


#: The grids kept (:meth:`_Grid.of`): one step's plans (the model's and its posterior draws') share one;
#: each holds a few arrays of (w, p) cells, ~40 bytes a cell (~10 MB at the largest range, 1,025 × 257;
#: ~0.7 MB at 129 × 129). At least the latest ``_GRIDS_KEPT``, more while all hold ≤ ``_GRIDS_KEPT_CELLS`` (~40 MB).
_GRIDS_KEPT = 4
_GRIDS_KEPT_CELLS = 2**20
_GRIDS: OrderedDict[tuple, _Grid] = OrderedDict()
_GRIDS_CELLS = 0  # the cells of the grids kept
_GRIDS_LOCK = threading.Lock()
#: Plans kept by their grid's inputs and the model object (:func:`_keep_plan`): the fine-tune plans a
#: job's model again every window, on the same grid until the model is refitted or the samples move
#: the memory; each is small (its rows), kept with its model so that an ``id`` is not reused.
_PLANS_KEPT = 512
_PLANS: OrderedDict[tuple, tuple[ThroughputModel, Plan]] = OrderedDict()


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


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
    exhaustive: bool = False,
    samples_done: float = 0.0,
    brief: bool = False,
) -> Plan:
    """Choose the configuration for ``objective`` under ``quota``; see the module docstring.

    ``samples`` (to train) makes PS memory include the table growth those samples bring, on the
    memory model's curve from ``samples_done`` (those a running job trained already);
    ``exclude`` removes configurations (e.g. ones a fine-tune revert rejected). Memory per node
    is :func:`node_memory`'s: ``worker_memory_mb`` / ``ps_memory_mb`` when given, else the memory
    model's, else (``memory`` None: a model fitted on throughput only) an equal share of the
    quota; the plan's reason says which. ``exhaustive``: evaluate every configuration of the range
    (the reference the structured search answers alike; seconds past a few thousand cores).
    ``brief``: the choice alone, for a model planned once (a posterior draw): not kept for a later
    call (it would only push others' plans out); no band (NaN), alternatives, Pareto front or
    extrapolation, nor their notes in the reason. Raises :class:`InfeasibleQuotaError` when nothing
    fits, naming what the smallest job needs.
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
    rng, use_gpu = _range_of(model, quota)
    if rng.max_workers < 1 or (not allreduce and rng.max_ps < 1):
        raise InfeasibleQuotaError("cpu", quota.cpu,
                                   minimum_requirement(memory, batch, allreduce, worker_memory_mb, ps_memory_mb))

    # The plan depends on the samples and the deadline only through the memory (the grid's) but for
    # the deadline objective: an equal plan of this model object on this grid is kept and copied
    # (a kept plan passed the checks below on these very inputs).
    grid_key = _Grid.key(rng, quota, memory, batch, samples_done + (samples or 0.0), worker_memory_mb, ps_memory_mb,
                         exclude)
    memo = (grid_key, id(model), objective, exhaustive) + ((repr(float(samples)), repr(float(deadline_s)))
                                                           if objective == "deadline" else ())
    kept = None if brief else _kept_plan(memo, model)
    if kept is not None:
        return kept
    grid_of = _Grid.of(grid_key, rng, quota, memory, batch, samples_done + (samples or 0.0), worker_memory_mb,
                       ps_memory_mb, exclude)
    minimum, mem, excluded, allowed = grid_of.minimum, grid_of.mem, grid_of.excluded, grid_of.allowed
    if not allowed.any():
        raise InvalidInputError("exclude", len(exclude), "exclusions that leave a configuration")
    if not (allowed & mem.fits).any():
        tables = "each worker's tables" if allreduce else "the PS tables"
        grown = memory.table_growth_mb(samples_done + (samples or 0.0)) - memory.table_growth_mb(samples_done) \
            if memory is not None else 0.0
        growth = (
            f" ({tables} grow by {float(grown):,.0f} MB over {samples:g} samples)"
            if samples and memory is not None and memory.table_growth_mb_per_m_samples else ""
        )
        raise InfeasibleQuotaError(
            "memory", f"{quota.memory_mb:g} MB", dict(minimum, memory_mb=float(mem.total[allowed].min())),
            f"No configuration within {quota.cpu:g} cores fits the memory{growth}.",
        )

    sep = _Separable.of(model, rng, batch)
    needed = samples / deadline_s if objective == "deadline" else None
    price_core = quota.price_per_core_hour if quota.price_per_core_hour is not None else C.DEFAULT_PRICE_PER_CORE_HOUR
    price_gb = quota.price_per_gb_hour if quota.price_per_gb_hour is not None else C.DEFAULT_PRICE_PER_GB_HOUR
    cost = _Cost(price_core, price_gb, samples) if objective == "deadline" else None
    if exhaustive or allreduce:
        found = configurations(rng, quota.cpu)
    else:
        found = _branch_and_bound(sep, rng, quota, grid_of, objective, needed, cost)
    keys = _keys(rng, found.shape, found.workers, found.ps)
    keep = mem.fits[found.workers, found.ps] & ~np.isin(keys, excluded)
    if quota.max_nodes is not None:
        keep &= found.workers + found.ps <= quota.max_nodes
    if use_gpu:
        keep &= found.workers * found.worker_gpu <= quota.gpu
    grid = found.take(np.flatnonzero(keep))
    w, p, cores = grid.workers, grid.ps, grid.cores
    x = sep.throughput(sep.inverse_q(grid.shape, w, p))
    total_mem = mem.total[w, p]
    front = pareto_front(cores, x)
    if objective == "throughput":
        best = _surest_of_the_fastest(model, grid, x, batch, allreduce)
        score = x
    elif objective == "deadline":
        on_time = x >= needed
        if not on_time.any():
            fastest = samples / x.max()
            raise InvalidInputError(
                "deadline", f"{deadline_s:g}s",
                f"≥ {fastest:.0f}s: the fastest plan under this quota trains {samples:g} samples "
                f"at {x.max():.0f} samples/s",
            )
        score = np.where(on_time, -cost(cores, total_mem, x), -np.inf)
        best = int(np.argmax(score))
    else:
        best = knee(front, x, cores)
        score = None

    config = Configuration(
        workers=int(w[best]), ps=int(p[best]), worker_cpu=float(grid.worker_cpu[best]),
        ps_cpu=float(grid.ps_cpu[best]), worker_memory_mb=float(mem.worker[w[best], p[best]]),
        ps_memory_mb=float(mem.ps[w[best], p[best]]), worker_gpu=int(grid.worker_gpu[best]), batch_size=batch,
    )
    reason = _reason(objective, config, float(x[best]), quota, float(total_mem[best]), samples, deadline_s, use_gpu)
    if brief:
        return Plan(config, float(x[best]), math.nan, math.nan, objective, reason)
    row = features(config.workers, config.ps, config.worker_cpu, config.ps_cpu, config.worker_gpu, batch,
                   kind_columns(allreduce), scaling=model.scaling)[None, :]
    _, lower, upper = model.predict_features(row, columns=kind_columns(allreduce))
    alternatives = _alternatives(score, front, best)
    outside = extrapolation(model, config)
    return _keep_plan(memo, model, Plan(
        config=config,
        predicted_throughput=float(x[best]),
        lower_throughput=float(lower[0]),
        upper_throughput=float(upper[0]),
        objective=objective,
        reason=reason + f" (90 % band {float(lower[0]):,.0f}–{float(upper[0]):,.0f})" + _range_note(model, outside)
        + (f"; memory per node {mem.source}" if mem.source else ""),
        alternatives=_rows(grid, np.asarray(alternatives, dtype=int), x, total_mem),
        pareto_front=_rows(grid, front, x, total_mem),
        extrapolation=outside,
    ))


def _range_of(model: ThroughputModel, quota: Quota) -> tuple[SearchRange, bool]:
    """The range a plan of ``model`` under ``quota`` searches, and whether it searches GPUs."""
    use_gpu = quota.gpu > 0 and "gpu_compute" in model.identified
    gpu_values = (0,) + tuple(g for g in C.GRID_GPU_VALUES if g <= quota.gpu) if use_gpu else (0,)
    largest = model.report.largest_node_cpu if model.report is not None else None
    return search_range(quota.cpu, allreduce=model.allreduce, gpu_values=gpu_values, largest_node_cpu=largest,
                        max_nodes=quota.max_nodes), use_gpu


def throughput_ceiling(model: ThroughputModel, quota: Quota, batch_size: int | None = None) -> float:
    """At least the ``predicted_throughput`` of any plan of ``model`` under ``quota`` (whatever
    its memory, GPUs and exclusions): X never falls as p grows (the module docstring's (1)), so for
    each node shape and worker count the most PS the cores and nodes allow bound every other PS
    count. Evaluated by the plan's own formula (:class:`_Separable`): it compares exactly. 0 when
    nothing fits the cores."""
    rng, _ = _range_of(model, quota)
    sep = _Separable.of(model, rng, int(batch_size or model.batch_size))
    lw, lp, _ = rng.shapes()
    budget = quota.cpu + _CORES_EPS
    nodes = quota.max_nodes if quota.max_nodes is not None else rng.max_workers + rng.max_ps + 1
    s, w = np.repeat(np.arange(len(lw)), rng.max_workers), np.tile(np.arange(1, rng.max_workers + 1), len(lw))
    if rng.allreduce:
        p = np.zeros_like(w)
        fits = (w * lw[s] <= budget) & (w <= nodes)
    else:
        p = np.minimum.reduce([np.full_like(w, rng.max_ps), np.floor((budget - w * lw[s]) / lp[s]).astype(np.int64),
                               nodes - w])
        fits = p >= 1
    if not fits.any():
        return 0.0
    return float(sep.throughput(sep.inverse_q(s[fits], w[fits], p[fits])).max())


def plan_at(model: ThroughputModel, memory: MemoryModel | None, quota: Quota, objective: Objective | str,
            config: Configuration, why: str, *, samples: float | None = None) -> Plan | None:
    """A plan of ``config``'s resources (workers, PS, their CPU and GPUs; its batch size), not a
    search: memory per node as :func:`plan` sizes it (:func:`node_memory`, for ``samples`` to
    train), the model's prediction and band, ``why`` its reason. None when it does not fit
    ``quota`` (cores, GPUs, memory, nodes) or its nodes get no memory."""
    w, p = np.array([config.workers]), np.array([config.ps])
    worker, ps, source = node_memory(memory, quota, w, p, config.batch_size, samples or 0.0)
    sized = replace(config, worker_memory_mb=float(worker[0]), ps_memory_mb=float(ps[0]))
    fits = (sized.cores <= quota.cpu + _CORES_EPS and sized.gpus <= quota.gpu
            and (quota.max_nodes is None or sized.nodes <= quota.max_nodes)
            and bool(_fits_memory(sized.workers, sized.ps, sized.worker_memory_mb, sized.ps_memory_mb, quota,
                                  sized.ps == 0)))
    if not fits:
        return None
    x, lower, upper = (float(v[0]) for v in model.predict_features(model.features(sized)))
    outside = extrapolation(model, sized)
    return Plan(sized, x, lower, upper, Objective.parse(objective).value,
                f"{why}: {sized.describe()} → {x:,.0f} samples/s (90 % band {lower:,.0f}–{upper:,.0f})"
                + _range_note(model, outside) + (f"; memory per node {source}" if source else ""),
                extrapolation=outside)


def _surest_of_the_fastest(model: ThroughputModel, grid: "Configurations", x: np.ndarray, batch: int,
                           allreduce: bool) -> int:
    """The throughput objective's choice: of the ``PLAN_ALTERNATIVES`` + 1 fastest (ties to fewer
    cores, then grid order: what both searches hold), those within ``PLAN_TIE_FRACTION`` of the
    fastest, the one with the highest lower end of the band (the first, on a tie)."""
    top = np.lexsort((np.arange(len(x)), grid.cores, -x))[: C.PLAN_ALTERNATIVES + 1]
    near = top[x[top] >= (1.0 - C.PLAN_TIE_FRACTION) * x[top[0]]]
    if len(near) == 1:
        return int(near[0])
    rows = features(grid.workers[near], grid.ps[near], grid.worker_cpu[near], grid.ps_cpu[near],
                    grid.worker_gpu[near], batch, kind_columns(allreduce), scaling=model.scaling)
    _, lower, _ = model.predict_features(rows, columns=kind_columns(allreduce))
    return int(near[int(np.argmax(lower))])


def extrapolation(model: ThroughputModel, config: Configuration) -> dict[str, float]:
    """How far ``config`` lies outside the range the model was fitted on
    (``FitReport.probed_range``), per column: value / most probed above it, least probed / value
    below it; columns inside their range are left out (empty: an interpolation in each column)."""
    probed = model.report.probed_range if model.report is not None else None
    out: dict[str, float] = {}
    for name, (low, high) in (probed or {}).items():
        value = float(getattr(config, name))
        if value > high and high > 0:
            out[name] = value / high
        elif 0 < value < low:
            out[name] = low / value
    return out


def _range_note(model: ThroughputModel, outside: dict[str, float]) -> str:
    if model.report is None or model.report.probed_range is None:
        return ""
    if not outside:
        return "; inside the probed range"
    probed = model.report.probed_range
    return "; extrapolates past the probes: " + ", ".join(
        f"{name} {factor:.2g}× ({probed[name][0]:g}–{probed[name][1]:g} probed)" for name, factor in outside.items())


@dataclass(frozen=True)
class _Cost:
    """The deadline objective's cost: (cores · price + memory · price) × the predicted duration."""

    price_core: float
    price_gb: float
    samples: float

    def __call__(self, cores, memory_mb, x):
        return (cores * self.price_core + memory_mb / 1024.0 * self.price_gb) * (self.samples / x / 3600.0)


def _keys(rng: SearchRange, shape, workers, ps) -> np.ndarray:
    """One integer per configuration of ``rng``."""
    return (np.asarray(shape, np.int64) * (rng.max_workers + 1) + workers) * (rng.max_ps + 1) + ps


def _excluded_keys(rng: SearchRange, exclude: tuple[Configuration, ...]) -> np.ndarray:
    """The keys of the excluded configurations that are in ``rng``."""
    lw, lp, g = rng.shapes()
    keys = []
    for config in exclude:
        shape = np.flatnonzero((lw == config.worker_cpu) & (lp == config.ps_cpu) & (g == config.worker_gpu))
        if len(shape) and 1 <= config.workers <= rng.max_workers and config.ps <= rng.max_ps \
                and (config.ps >= 1) != rng.allreduce:
            keys.append(int(_keys(rng, shape[0], config.workers, config.ps)))
    return np.unique(np.asarray(keys, dtype=np.int64))


def _allowed_pairs(rng: SearchRange, quota: Quota, exclude: tuple[Configuration, ...]) -> np.ndarray:
    """[w, p]: some configuration with w workers and p PS fits the quota's cores, nodes and GPUs and
    is not excluded (memory aside: it depends on (w, p) only)."""
    lw, lp, g = rng.shapes()
    w, p = np.arange(rng.max_workers + 1)[:, None], np.arange(rng.max_ps + 1)[None, :]
    budget = quota.cpu + _CORES_EPS
    allowed = (w * lw.min() + p * lp.min() <= budget) & (w > 0) & ((p > 0) | rng.allreduce)
    if quota.max_nodes is not None:
        allowed &= w + p <= quota.max_nodes
    pairs = {(c.workers, c.ps) for c in exclude if 1 <= c.workers <= rng.max_workers and 0 <= c.ps <= rng.max_ps}
    for cw, cp in pairs:
        if not allowed[cw, cp]:
            continue
        fits = (cw * lw + cp * lp <= budget) & ((g == 0) | (cw * g <= quota.gpu))
        shapes = {(float(a), float(b), int(c)) for a, b, c in zip(lw[fits], lp[fits], g[fits])}
        gone = {(c.worker_cpu, c.ps_cpu, c.worker_gpu) for c in exclude if (c.workers, c.ps) == (cw, cp)}
        allowed[cw, cp] = bool(shapes - gone)
    return allowed


# ---------------------------------------------------------------------------------------------
# The structured search (PS jobs): branch and bound over boxes of (w, p) of one node shape
# ---------------------------------------------------------------------------------------------


class _Best:
    """The k first of the configurations added, by (``rank``, cores), each counted once: the worst
    of them is the bar a box must reach to hold one of the k first of all."""

    def __init__(self, k: int):
        self.k = k
        self.key, self.rank, self.cores = np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
        self.bar, self.bar_cores = np.inf, np.inf  # (rank, cores) of the k-th: none yet

    def add(self, key: np.ndarray, rank: np.ndarray, cores: np.ndarray) -> None:
        better = (rank < self.bar) | ((rank == self.bar) & (cores <= self.bar_cores))
        if not better.any():
            return
        key, first = np.unique(np.concatenate([self.key, key[better]]), return_index=True)
        rank, cores = np.concatenate([self.rank, rank[better]])[first], np.concatenate([self.cores, cores[better]])[first]
        order = np.lexsort((cores, rank))[: self.k]
        self.key, self.rank, self.cores = key[order], rank[order], cores[order]
        if len(order) == self.k:
            self.bar, self.bar_cores = float(self.rank[-1]), float(self.cores[-1])

    def reachable(self, rank: np.ndarray, least_cores: np.ndarray) -> np.ndarray:
        """Whether something ranked at best ``rank`` with at least ``least_cores`` cores can be among the k first."""
        return (rank < self.bar) | ((rank == self.bar) & (least_cores <= self.bar_cores))


class _Known:
    """Configurations evaluated so far (feasible, not excluded), kept for the pruning rules: their
    Pareto front (F_K), the k + 1 best by X and, for a deadline, the k + 1 cheapest on time."""

    def __init__(self, objective: str, k: int, needed: float | None, cost: _Cost | None, budget: float):
        self.objective, self.needed, self.cost = objective, needed, cost
        # F_K by core step: below[i] = the best X known at fewer than i steps of cores (non-decreasing).
        self.below = np.full(int(budget / _CORE_STEP) + 2, -np.inf)
        self.fastest = _Best(k + 1)
        self.cheapest = _Best(k + 1)

    def add(self, key, cores, x, money) -> None:
        at = np.minimum(_steps(cores) + 1, len(self.below) - 1)
        new = x > self.below[at]  # beats what is known at its own cores or fewer
        if new.any():
            np.maximum.at(self.below, at[new], x[new])
            np.maximum.accumulate(self.below, out=self.below)
        if self.objective == "throughput":
            self.fastest.add(key, -x, cores)
        elif self.objective == "deadline":
            on_time = x >= self.needed
            self.cheapest.add(key[on_time], money[on_time], cores[on_time])

    def best_below(self, cores: np.ndarray) -> np.ndarray:
        """F_K(c−): the best X evaluated at fewer cores than each ``cores`` (−inf: none)."""
        return self.below[np.minimum(_steps(cores), len(self.below) - 1)]

    def cores_reaching(self, x: np.ndarray) -> np.ndarray:
        """The fewest cores of a known configuration with at least ``x`` (inf: none): a configuration
        of more cores and at most ``x`` is not on the front."""
        at = np.searchsorted(self.below, x, side="left")  # below[at] ≥ x: a known one of at − 1 steps
        return np.where(at < len(self.below), (at - 1) * _CORE_STEP, np.inf)

    def wanted(self, x_best, least_cores, least_money=None) -> tuple[np.ndarray, np.ndarray]:
        """Whether a box (or a configuration) with at most ``x_best`` and at least ``least_cores``
        (and ``least_money``) can hold a point of the front, and one of the objective's k + 1 best."""
        front = x_best > self.best_below(least_cores)
        if self.objective == "throughput":
            best = self.fastest.reachable(-x_best, least_cores)
        elif self.objective == "deadline":
            best = (x_best >= self.needed) & self.cheapest.reachable(least_money, least_cores)
        else:
            best = np.zeros(len(front), dtype=bool)
        return front, best


def _halve(box: np.ndarray, cap: np.ndarray, lo_row: int, hi_row: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (``box``'s columns, ``cap`` theirs) split in two along rows [lo, hi] (at ⌊√(lo·hi)⌋)
    where that side holds more than one value; every other row is copied."""
    lo, hi = box[lo_row], box[hi_row]
    cut = hi > lo
    mid = np.clip(np.floor(np.sqrt(lo * hi)).astype(np.int64), lo, hi - 1)
    idx = np.concatenate([np.arange(len(lo)), np.flatnonzero(cut)])
    out, n = box[:, idx], len(lo)
    out[hi_row, :n] = np.where(cut, mid, hi)
    out[lo_row, n:] = mid[cut] + 1
    return out, cap[idx]


def _branch_and_bound(sep: _Separable, rng: SearchRange, quota: Quota, grid_of: "_Grid", objective: str,
                      needed: float | None, cost: _Cost | None) -> Configurations:
    """The configurations the plan depends on, and a few more (see the module docstring)."""
    W, P = rng.max_workers, rng.max_ps
    lw_s, lp_s, g_s = rng.shapes()
    budget = quota.cpu + _CORES_EPS
    nodes = grid_of.nodes
    mem, excluded, fits, last_fit = grid_of.mem, grid_of.excluded, grid_of.fits, grid_of.last_fit
    last_from, next_from, most_w_from = grid_of.last_from, grid_of.next_from, grid_of.most_w_from
    least_mem = grid_of.least_mem() if cost is not None else None

    most_cores = min(budget, W * lw_s.max() + P * lp_s.max())  # (a quota may have more cores than the range can use)
    known = _Known(objective, C.PLAN_ALTERNATIVES, needed, cost, most_cores)
    found: list[tuple[np.ndarray, ...]] = []

    ranked = objective != "efficiency"  # the k + 1 best by score count each configuration once: by its key

    def evaluate(s, w, p):
        """(key, cores, x, money) of configurations that fit (memory, cores, nodes, GPUs: by construction)."""
        key = _keys(rng, s, w, p) if ranked or len(excluded) else None
        x = sep.throughput(sep.inverse_q(s, w, p))
        cores = w * lw_s[s] + p * lp_s[s]
        money = cost(cores, mem.total[w, p], x) if cost is not None else None
        return key, cores, x, money

    def learn(key, cores, x, money):
        if len(excluded):
            mine = ~np.isin(key, excluded)
            key, cores, x, money = key[mine], cores[mine], x[mine], money[mine] if money is not None else None
        known.add(key, cores, x, money)

    # The boxes: rows (s, w1, w2, p1, p2) of one array (filtered at once), and the most cores a
    # configuration of each may have and still matter.
    count = len(lw_s)
    box = np.stack([np.arange(count), np.ones(count, np.int64),
                    np.where(g_s > 0, np.minimum(W, quota.gpu // np.maximum(g_s, 1)), W),
                    np.ones(count, np.int64), np.full(count, P)]).astype(np.int64)
    cap = np.full(count, budget)
    q = sep.q
    while box.shape[1]:
        s, w1, w2, p1, p2 = box
        lw, lp = lw_s[s], lp_s[s]
        box[2] = np.minimum.reduce([w2, np.floor((cap - p1 * lp) / lw).astype(np.int64), nodes - p1, most_w_from[p1]])
        box[4] = np.minimum.reduce([p2, np.floor((cap - w1 * lw) / lp).astype(np.int64), nodes - w1])
        live = (w1 <= box[2]) & (box[4] >= p1)
        box, cap = box[:, live], cap[live]
        box[4], box[3] = last_from[box[1], box[4]], next_from[box[1], box[3]]
        live = box[3] <= box[4]
        box, cap = box[:, live], cap[live]
        if not box.shape[1]:
            break
        s, w1, w2, p1, p2 = box
        lw, lp = lw_s[s], lp_s[s]

        # The bound: at p2, the best w of [w1, w2] (module docstring).
        v2 = sep.v[p2]
        A = sep.a[s] + sep.b[s] * v2
        F = sep.f[s] * v2 * v2
        ev, c = sep.e[s] * v2, sep.c[s]
        interior = (A > 0) & (F > 0) & (w2 > w1)
        w_hat = np.where(F > 0, w1, w2)  # F = 0: X grows with w; A = 0: it falls
        y_hat = _y(A, F, sep.u[w_hat], ev, c, sep.r[w_hat])
        if interior.any():
            with np.errstate(divide="ignore", invalid="ignore"):
                w_star = np.where(interior, (F / A) ** (-0.5 / q), 0.0)
            base = np.floor(np.minimum(w_star, W + 1.0)).astype(np.int64)
            for step in (-1, 0, 1, 2):  # the integers next to w* (Y is unimodal in w; ±1 for rounding)
                w_try = np.clip(base + step, w1, w2)
                y_try = _y(A, F, sep.u[w_try], ev, c, sep.r[w_try])
                better = interior & (y_try < y_hat)
                w_hat, y_hat = np.where(better, w_try, w_hat), np.where(better, y_try, y_hat)
        x_bound = sep.throughput(np.where(interior, y_hat * (1.0 - C.PLAN_BOUND_SLACK), y_hat))
        least_cores = w1 * lw + p1 * lp

        # Each box's guess: ŵ workers with the most PS that fit; evaluated, it joins the known set.
        p_guess = np.minimum.reduce([p2, np.floor((budget - w_hat * lw) / lp).astype(np.int64), nodes - w_hat])
        p_guess = last_fit[w_hat, np.maximum(p_guess, 0)]
        real = p_guess >= 1
        learn(*evaluate(s[real], w_hat[real], p_guess[real].astype(np.int64)))

        least_money = cost(least_cores, least_mem[w1, p1], x_bound) if cost is not None else None
        front, best = known.wanted(x_bound, least_cores, least_money)
        # A box that can hold none of the best holds front points only below the cores of a known
        # configuration as fast as its bound: it keeps those.
        cap = np.where(best, cap, np.minimum(cap, known.cores_reaching(x_bound) + _CORES_EPS))
        split = front | best
        box, cap = box[:, split], cap[split]
        s, w1, w2, p1, p2 = box

        # Short rows (one w) that may still matter: every configuration, evaluated.
        small = (w1 == w2) & (p2 - p1 < C.PLAN_EXPAND_ROW)
        if small.any():
            n = (p2 - p1 + 1)[small]
            at = np.repeat(np.flatnonzero(small), n)
            ew, ep, es = w1[at], p1[at] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n), s[at]
            fit = fits[ew, ep] & (ew * lw_s[es] + ep * lp_s[es] <= cap[at])
            points = (es[fit], ew[fit], ep[fit])
            key, cores, x, money = point = evaluate(*points)
            learn(*point)
            wanted = np.logical_or(*known.wanted(x, cores, money))
            found.append(tuple(a[wanted] for a in points))
            box, cap = box[:, ~small], cap[~small]
            s, w1, w2, p1, p2 = box
        # A small box becomes its rows (each bounded exactly, at its own w); a larger one is halved
        # along each side of more than one value, at its geometric mean.
        rows = (w2 > w1) & ((w2 - w1 + 1) * (p2 - p1 + 1) <= C.PLAN_ROWS_BOX)
        if rows.any():
            n = (w2 - w1 + 1)[rows]
            at = np.repeat(np.flatnonzero(rows), n)
            row_w = w1[at] + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
            expanded = box[:, at]
            expanded[1] = expanded[2] = row_w
            keep = ~rows
            whole = np.arange(len(at) + int(keep.sum())) >= int(keep.sum())
            box, cap = np.concatenate([box[:, keep], expanded], axis=1), np.concatenate([cap[keep], cap[at]])
        else:
            whole = np.zeros(box.shape[1], dtype=bool)
        halved, halved_cap = _halve(*_halve(box[:, ~whole], cap[~whole], 1, 2), 3, 4)
        box, cap = np.concatenate([box[:, whole], halved], axis=1), np.concatenate([cap[whole], halved_cap])

    if not found:
        return Configurations.of(rng, *(np.zeros(0, np.int64),) * 3)
    s, w, p = (np.concatenate(a) for a in zip(*found))
    # What the final known set still wants (it knows more than when each was found: fewer candidates).
    _, cores, x, money = evaluate(s, w, p)
    wanted = np.logical_or(*known.wanted(x, cores, money))
    return Configurations.of(rng, s[wanted], w[wanted], p[wanted])


# ---------------------------------------------------------------------------------------------
# The exhaustive search's rules
# ---------------------------------------------------------------------------------------------


def pareto_front(cores: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Indices of the Pareto-optimal points (more throughput needs more cores) of configurations
    sorted by cores (``Configurations``' order; x = −inf for one that does not fit): each core
    count whose best throughput beats every smaller one's, at its first point that reaches it."""
    if not len(cores):
        return np.zeros(0, dtype=int)
    opens_group = np.concatenate([[True], np.diff(cores) > 0])
    starts = np.flatnonzero(opens_group)
    group = np.cumsum(opens_group) - 1
    group_max = np.maximum.reduceat(x, starts)
    previous_best = np.concatenate([[-np.inf], np.maximum.accumulate(group_max)[:-1]])
    front_group = group_max > previous_best
    at_max = np.flatnonzero((x == group_max[group]) & front_group[group])
    first = np.concatenate([[True], np.diff(group[at_max]) > 0])
    return at_max[first]


def knee(front: np.ndarray, x: np.ndarray, cores: np.ndarray) -> int:
    """Largest upper-hull vertex whose marginal throughput per core ≥ fraction × best average."""
    c, t = cores[front], x[front]
    hull = _upper_hull(c, t)
    best_per_core = float(np.max(t / c))
    a, b = hull[:-1], hull[1:]
    pays = (t[b] - t[a]) / (c[b] - c[a]) >= C.KNEE_MARGINAL_FRACTION * best_per_core
    return int(front[hull[len(pays) if pays.all() else int(np.argmin(pays))]])


def _upper_hull(c: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Indices of the strict upper hull's vertices of points sorted by c (Andrew's monotone chain,
    in parallel): a point on or below the segment between its neighbours is none, so every such
    point goes at once, until none is left; what remains is concave through every vertex."""
    hull = np.arange(len(c))
    while len(hull) > 2:
        a, m, b = hull[:-2], hull[1:-1], hull[2:]
        under = (c[m] - c[a]) * (t[b] - t[a]) - (t[m] - t[a]) * (c[b] - c[a]) >= 0
        if not under.any():
            break
        hull = hull[np.concatenate([[True], ~under, [True]])]
    return hull


def _alternatives(score: np.ndarray | None, front: np.ndarray, best: int) -> list[int]:
    """The ``PLAN_ALTERNATIVES`` next best by score (ties: the earlier, i.e. fewer cores, first);
    for the efficiency objective (``score`` None), the front points nearest the knee."""
    k = C.PLAN_ALTERNATIVES
    if score is None:
        position = int(np.flatnonzero(front == best)[0]) if best in front else 0
        near = front[np.argsort(np.abs(np.arange(len(front)) - position), kind="stable")]
        return [int(i) for i in near[: k + 1] if i != best][:k]
    top = np.flatnonzero(np.isfinite(score))
    if len(top) > k + 1:  # every point at least as good as the (k+1)-th, then the k + 1 first of them
        kth = np.partition(score[top], len(top) - (k + 1))[len(top) - (k + 1)]
        top = top[score[top] >= kth]
    top = top[np.argsort(-score[top], kind="stable")][: k + 1]
    return [int(i) for i in top if i != best][:k]


def _rows(grid: Configurations, index: np.ndarray, x: np.ndarray, total_mem: np.ndarray) -> list[dict[str, float]]:
    """The configurations ``index`` as plain rows (Python numbers: JSON-ready)."""
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
