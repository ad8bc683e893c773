"""A lower bound on each job's run time that no policy can beat: the ``bound`` row.

For a job of ``n`` samples with CPU quota ``L`` (``family.limit_cpu``) and realised-rate factor
``f`` (:func:`sim.cluster.rate_factor`, one draw per job, the same for every policy)::

    bound_run_s = c₀ + T,    T = n / (X* · f),
    c₀ = the cold launch of the transition table (``cfg.transitions.cold_launch_s``)
    X* = max { truth(w, p, λw, λp) : w·λw + p·λp ≤ L, 1 ≤ w ≤ 1,024, 1 ≤ p ≤ 256, λw, λp ≥ 0.5 }
         (an all-reduce family: p = λp = 0), rounded up by at most a relative ``REL`` = 10⁻⁶

Why nobody is faster: a job trains only at ``truth(config) · f``, where ``config`` is its
allocation (never past ``L``: the cluster refuses it), or that allocation with a hot PS's λp
lowered (still in the domain, or below 0.5 where a table is clamped to its 0.5 value and a roofline
is lower), times a straggler's slow-down (< 1). So it needs at least ``T`` of training. Before its first
sample it pays a cold launch, a first probe's or a run's: every policy starts from nothing.
Queueing, resizes, failures, OOMs and instability only add. Memory is ignored (relaxing it only
raises X*). The JCT bound is the same (no queueing).

The domain of X* holds every configuration a policy runs: the planner's range (w ≤
``PLAN_MAX_WORKERS``, p ≤ ``PLAN_MAX_PS``, per-node CPU ≥ 0.5), the owners' (w ≤ 256, p ≤ 64, CPU
1/2/4/8), DLRover's (p ≤ 15, nodes of ≥ 1
core, any CPU value) and a healed hot PS's extra cores (which add no throughput past the group's
λp). The simulation records the truth at every configuration each job ran (``peak_true_rate``)
and :func:`check` fails a run where it exceeds X*; ``tests/simulate`` checks it on the default
scenario.

X* is computed, not sampled. An all-reduce truth grows with λw: X* is its largest value at
λw = L / w over w, times (1 + ``REL``). Otherwise branch and bound over λw intervals of each (w, p) on the budget line.
An interval [a, b] is covered by the box [a, b] × [0.5, (L − w·a)/p]; its upper bound is the
truth at the box's top corner for a truth that grows with λw and λp (rooflines, all-reduce, the moving shard), and
the largest value at the box's vertices and the table nodes inside for the queueing tables
(log-throughput is multilinear in log λ between nodes, so its maximum over a box is at one of
them; a table is flat past its last row of w and of p, so no configuration there is faster than
the same with the table's last w and p, which costs less: the pairs stop there). Boxes whose upper bound is at most (1 + ``rel``) × the best feasible value found are closed;
the others are halved. Once all are closed, X* = (1 + ``rel``) × that best value: at or above the
true maximum, at most ``rel`` above it — so a policy that runs a job at the argmax still lands
above the bound by more than the event times' rounding. A truth's ``scale`` multiplies its
throughput, so X* is computed (and cached) for the truth at scale 1.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from airflow_dlrover.optimizer import constants as C
from sim.cluster import rate_factor
from sim.truth import TABLE_CPU, TABLE_PS, TABLE_WORKERS, AllReduce, QueueingTable, Truth
from sim.workload import JobSpec, SimConfig

CPU_MIN = float(min(C.GRID_CPU_VALUES))  # the smallest per-node CPU of any policy
MAX_WORKERS = int(C.PLAN_MAX_WORKERS)
MAX_PS = int(C.PLAN_MAX_PS)
REL = 1e-6  # X* is at most this much (relative) above the true maximum


def peak_throughput(truth: Truth, limit_cpu: float) -> float:
    """X*: the largest true throughput of any configuration within ``limit_cpu`` cores."""
    return float(truth.scale) * _peak(replace(truth, scale=1.0), float(limit_cpu))


@lru_cache(maxsize=4096)
def _peak(truth: Truth, limit: float) -> float:
    if isinstance(truth, AllReduce):  # grows with λw: the whole budget on the workers
        w = np.arange(1, min(MAX_WORKERS, int(limit // CPU_MIN)) + 1, dtype=float)
        return float(np.max(truth.throughput(w, 0.0, limit / w, 0.0))) * (1.0 + REL)
    return _branch_and_bound(truth, limit)


def _pairs(limit: float, max_workers: int = MAX_WORKERS, max_ps: int = MAX_PS) -> tuple[np.ndarray, np.ndarray]:
    w, p = np.meshgrid(np.arange(1, max_workers + 1), np.arange(1, max_ps + 1), indexing="ij")
    w, p = w.ravel().astype(float), p.ravel().astype(float)
    fits = (w + p) * CPU_MIN <= limit
    return w[fits], p[fits]


@lru_cache(maxsize=8)
def _table_slices(truth: QueueingTable) -> np.ndarray:
    """log-throughput of a queueing table (scale 1) at every (w, p) up to its last row of each and every
    pair of its CPU nodes: shape (TABLE_WORKERS[-1], TABLE_PS[-1], nodes, nodes). At fixed (w, p) the
    table is bilinear in (log λw, log λp) between these nodes (clamped outside them)."""
    from sim.truth import _queueing_tables, _table_points

    nodes = np.asarray(TABLE_CPU, dtype=float)
    w, p, lw, lp = np.meshgrid(np.arange(1, TABLE_WORKERS[-1] + 1), np.arange(1, TABLE_PS[-1] + 1), nodes, nodes,
                               indexing="ij")
    points, shape = _table_points(w, p, lw, lp)
    return _queueing_tables()[truth.physics]["throughput"](points.reshape(-1, 4)).reshape(shape)


def _table_value(slices: np.ndarray, w, p, lw, lp) -> np.ndarray:
    """The table (scale 1) at integer (w, p) and any (λw, λp), by its bilinear pieces."""
    nodes = np.asarray(TABLE_CPU, dtype=float)
    last = len(nodes) - 1

    def locate(v):
        k = np.clip(np.log2(np.maximum(v, 1e-300) / nodes[0]), 0.0, float(last))
        i = np.minimum(np.floor(k), last - 1).astype(int)
        return i, k - i

    wi, pi = w.astype(int) - 1, p.astype(int) - 1
    i, t = locate(lw)
    j, u = locate(lp)
    s00, s10, s01, s11 = (slices[wi, pi, i + di, j + dj] for di, dj in ((0, 0), (1, 0), (0, 1), (1, 1)))
    return np.exp((1 - t) * (1 - u) * s00 + t * (1 - u) * s10 + (1 - t) * u * s01 + t * u * s11)


def _bounds(truth: Truth, limit: float, w, p, a, b) -> tuple[np.ndarray, np.ndarray]:
    """(upper bound over each box [a, b] × [CPU_MIN, (L − w·a)/p], best feasible value found in it)."""
    top = (limit - w * a) / p  # the box's largest λp
    if isinstance(truth, QueueingTable):
        nodes = np.broadcast_to(np.asarray(TABLE_CPU, dtype=float), (len(a), len(TABLE_CPU)))
        lw = np.clip(np.concatenate([a[:, None], b[:, None], nodes], axis=1), a[:, None], b[:, None])[:, :, None]
        lp = np.clip(np.concatenate([np.full((len(a), 1), CPU_MIN), top[:, None], nodes], axis=1),
                     CPU_MIN, top[:, None])[:, None, :]
        x = _table_value(_table_slices(truth), w[:, None, None], p[:, None, None], lw, lp)
        feasible = w[:, None, None] * lw + p[:, None, None] * lp <= limit
        upper = x.reshape(len(a), -1).max(axis=1)
        lower = np.where(feasible, x, -np.inf).reshape(len(a), -1).max(axis=1)
        return upper, lower
    upper = truth.throughput(w, p, b, top)  # grows with λw and λp: the top corner
    lower = np.maximum(truth.throughput(w, p, a, top), truth.throughput(w, p, b, (limit - w * b) / p))
    return upper, lower


def _branch_and_bound(truth: Truth, limit: float, rel: float = REL, rounds: int = 80) -> float:
    w, p = _pairs(limit, *((TABLE_WORKERS[-1], TABLE_PS[-1]) if isinstance(truth, QueueingTable) else ()))
    if not len(w):
        return 0.0
    a, b = np.full(len(w), CPU_MIN), (limit - p * CPU_MIN) / w  # one box per (w, p) first
    best = -np.inf
    for _ in range(rounds):
        upper, lower = _bounds(truth, limit, w, p, a, b)
        best = max(best, float(lower.max()))
        open_ = upper > best * (1.0 + rel)  # a closed box cannot beat best · (1 + rel)
        if not open_.any():
            return best * (1.0 + rel)
        w, p, a, b = w[open_], p[open_], a[open_], b[open_]
        mid = np.sqrt(a * b)  # halve in log λw (the tables' axis)
        w, p = np.concatenate([w, w]), np.concatenate([p, p])
        a, b = np.concatenate([a, mid]), np.concatenate([mid, b])
    upper, _ = _bounds(truth, limit, w, p, a, b)
    return max(best * (1.0 + rel), float(upper.max()))


def start_cost_s(cfg: SimConfig) -> float:
    """c₀: the least a job pays before its first sample (a cold launch)."""
    return cfg.transitions.cold_launch_s


def bound_run_s(cfg: SimConfig, spec: JobSpec) -> tuple[float, float]:
    """(the job's run-time lower bound, X*)."""
    peak = peak_throughput(spec.family.truth, spec.family.limit_cpu)
    training = spec.samples / (peak * rate_factor(cfg, spec))
    return start_cost_s(cfg) + training, peak


def bound_table(cfg: SimConfig, trace: list[JobSpec]) -> dict[int, tuple[float, float]]:
    """Per job id: (bound_run_s, X*)."""
    return {spec.id: bound_run_s(cfg, spec) for spec in trace}


def check(name: str, table, bounds: dict[int, tuple[float, float]]) -> None:
    """Fail when a job ran at a true rate above its X* (the bound would not be one)."""
    for job, peak in zip(table["job"], table["peak_true_rate"]):
        if peak > bounds[job][1]:
            raise AssertionError(f"policy {name!r}, job {job}: ran at a true rate of {peak:.6g} samples/s, above the "
                                 f"bound's X* = {bounds[job][1]:.6g}: the bound's domain misses a configuration")


__all__ = ["bound_run_s", "bound_table", "check", "peak_throughput", "start_cost_s"]
