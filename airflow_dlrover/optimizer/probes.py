"""Probe design: the few configurations to profile so that the throughput model is identifiable.

Every probe runs for the same bounded time, so profiling time is the number of probes; their
cost is their cores. We pick a locally D-optimal design (greedy: each step adds the candidate that
most increases log det of the information matrix AᵀA, where the rows are the fit's own scaled
design rows X(θ₀)·f(x)), at the guess θ₀ = the prior model when there is one, else
``DESIGN_GUESS``. Among candidates within ``PROBE_TIE_FRACTION`` of the best gain, the one with
fewest cores wins. A cold start takes max(``MIN_PROBES_COLD``, #parameters to identify +
``PROBES_BEYOND_PARAMETERS``) probes, of which the profile measures those that identify the
parameters and then, the most informative first, those that fit in its share of the job's run time
(:func:`profile_continues`); a warm start (a prior throughput *and* memory model)
``MIN_PROBES_WARM``, none: the prior plans and the fine-tune re-scales it.

An all-reduce job (``allreduce``: no PS) is probed on p = 0 only: w from ``PROBE_WORKERS``, λw from
``PROBE_CPU``, ``ps_cpu`` and ``ps_memory_mb`` 0, the D-optimal choice over its own terms (the PS
features are 0 there and drop out), memory shared over its workers.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel, memory_request_mb, node_peaks, ps_request_mb
from airflow_dlrover.optimizer.similarity import similar_probe_count
from airflow_dlrover.optimizer.model import NO_SCALING, PARAMETERS, ThroughputModel, features
from airflow_dlrover.optimizer.transitions import TransitionCosts, measured
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, Configuration, InvalidInputError, Quota, check_kind

log = logging.getLogger(__name__)

#: θ₀ for a cold-start design: only its rough proportions matter (which term dominates where).
#: From a fit of our queueing simulation of a small CPU DLRM (benchmarks/accuracy.py). The
#: all-reduce terms are our estimate, not a fit (no all-reduce job was profiled yet): a ring of a
#: small DLRM's dense gradients (a few MB) takes about the step's overhead in bandwidth, and a
#: hop ~0.1 ms (gloo over TCP on one machine).
DESIGN_GUESS = dict(
    overhead=2e-3, worker_compute=4e-4, gpu_compute=4e-5, ps_latency=5e-5, ps_service=1e-4, ps_request=1e-5, network=1e-5, contention=1e-6, io=1e-6,
    allreduce=2e-3, allreduce_latency=1e-4,
)


def design_probes(
    quota: Quota,
    *,
    batch_size: int = 512,
    worker_gpu: int = 0,
    prior: ThroughputModel | None = None,
    memory: MemoryModel | None = None,
    count: int | None = None,
    table_mb: float | None = None,
    largest_table_mb: float | None = None,
    allreduce: bool | None = None,
    similarity: float | None = None,
) -> pd.DataFrame:
    """Return the probe configurations (a configuration table, one row per probe): a cold design's
    count, none for a warm start (a ``prior`` and its ``memory``), ``similarity.similar_probe_count``
    for a ``prior`` from jobs ``similarity`` alike (``count``: that many).

    ``allreduce``: probe an all-reduce job (p = 0 only) rather than a PS job; None: the prior's
    kind, else a PS job. Memory per node comes from ``memory`` (a prior memory model) when given,
    else an equal share of ``PROBE_QUOTA_FRACTION`` of the quota's memory over the probe's own
    nodes (the probes run one at a time; :func:`probe_sized` raises a later probe's nodes to what
    the earlier ones used) — and a PS never less than what its share of the layout's tables needs
    (``table_mb``: every row touched, ``FeatureLayout.table_mb``), with room for a second copy of
    its share of the largest (``largest_table_mb``; None: of them all), as
    ``MemoryModel.ps_request_mb``; an
    all-reduce worker, which holds every table, never less than
    ``memory_request_mb(PS_PROCESS_BASE_MB + table_mb)`` (a worker's process is at least a PS's).
    """
    if allreduce is None:
        allreduce = prior.allreduce if prior is not None else False
    for model, name in ((prior, "prior"), (memory, "memory")):
        if model is not None:
            check_kind(model, allreduce, name, "the probes are")
    if worker_gpu and worker_gpu > quota.gpu:
        raise InvalidInputError("worker_gpu", worker_gpu, f"≤ the quota's gpu ({quota.gpu})")
    budget = max(quota.cpu * C.PROBE_QUOTA_FRACTION, min(quota.cpu, C.PROBE_MIN_BUDGET_CORES))
    ps_values, ps_cpu_values = ((0,), (0.0,)) if allreduce else (C.PROBE_PS, C.PROBE_CPU)
    candidates = np.array(
        [
            (w, p, lw, lp)
            for w, p, lw, lp in itertools.product(C.PROBE_WORKERS, ps_values, C.PROBE_CPU, ps_cpu_values)
            if w * lw + p * lp <= budget + 1e-9
            and (quota.max_nodes is None or w + p <= quota.max_nodes)
            and w * worker_gpu <= max(quota.gpu, 0)
        ],
        dtype=float,
    ).reshape(-1, 4)
    if len(candidates) == 0:
        smallest = min(C.PROBE_CPU) * (1 if allreduce else 2)
        raise InvalidInputError("cpu", quota.cpu, f"≥ {smallest:g} cores to profile at all")
    feats = features(candidates[:, 0], candidates[:, 1], candidates[:, 2], candidates[:, 3], worker_gpu, batch_size,
                     scaling=prior.scaling if prior is not None else NO_SCALING)
    theta = prior.theta if prior is not None else np.array([DESIGN_GUESS[n] for n in PARAMETERS])
    unknown = [j for j in range(len(PARAMETERS)) if feats[:, j].any()]
    rows = feats[:, unknown] * (1.0 / (feats @ theta))[:, None]
    rows /= np.linalg.norm(rows, axis=0)
    if count is None:
        cold = min(max(C.MIN_PROBES_COLD, len(unknown) + C.PROBES_BEYOND_PARAMETERS), len(candidates))
        if prior is not None and memory is not None:
            count = C.MIN_PROBES_WARM
        else:
            count = cold if similarity is None or prior is None else similar_probe_count(similarity, cold)
    count = min(count, len(candidates))
    if count == 0:
        return pd.DataFrame({column: pd.Series(dtype=float) for column in CONFIG_COLUMNS})
    cores = candidates[:, 0] * candidates[:, 2] + candidates[:, 1] * candidates[:, 3]

    chosen: list[int] = []
    info = 1e-9 * np.eye(len(unknown))
    for _ in range(count):
        inverse = np.linalg.inv(info)
        # Matrix determinant lemma: log det(M + a aᵀ) − log det(M) = log(1 + aᵀ M⁻¹ a).
        gain = np.log1p(np.einsum("ij,jk,ik->i", rows, inverse, rows))
        gain[chosen] = -np.inf
        good = np.flatnonzero(gain >= gain.max() - abs(gain.max()) * C.PROBE_TIE_FRACTION)
        pick = int(good[np.argmin(cores[good])])
        chosen.append(pick)
        info = info + np.outer(rows[pick], rows[pick])

    picked = candidates[chosen]
    table = pd.DataFrame(picked, columns=["workers", "ps", "worker_cpu", "ps_cpu"])
    table[["workers", "ps"]] = table[["workers", "ps"]].astype(int)
    if memory is not None:
        table["worker_memory_mb"] = float(memory.worker_request_mb(batch_size))
        table["ps_memory_mb"] = memory.ps_request_mb(table["ps"].to_numpy())
    else:
        nodes = (table["workers"] + table["ps"]).to_numpy(float)  # an all-reduce job's: its workers
        share = np.maximum(np.floor(quota.memory_mb * C.PROBE_QUOTA_FRACTION / nodes / C.MEMORY_GRANULARITY_MB)
                           * C.MEMORY_GRANULARITY_MB, float(C.NODE_MIN_MEMORY_MB))
        table["worker_memory_mb"] = share
        table["ps_memory_mb"] = 0.0 if allreduce else share
        if table_mb:
            if allreduce:
                table["worker_memory_mb"] = np.maximum(share, float(memory_request_mb(C.PS_PROCESS_BASE_MB + table_mb)))
                where = "on every worker"
            else:
                tables = table_mb / table["ps"].to_numpy(float)
                largest = tables if largest_table_mb is None else np.minimum(tables, largest_table_mb / table["ps"])
                # as MemoryModel.ps_request_mb
                need = ps_request_mb(C.PS_PROCESS_BASE_MB + tables, C.PS_TABLE_COPY_FACTOR * largest)
                table["ps_memory_mb"] = np.maximum(share, need)
                where = "over the PS"
            total = table["workers"] * table["worker_memory_mb"] + table["ps"] * table["ps_memory_mb"]
            over = total > quota.memory_mb
            if over.all():
                raise InvalidInputError("memory", f"{quota.memory_mb:g} MB", f"≥ {float(total[over].iloc[0]):g} MB "
                                        f"to profile: the layout's tables take {table_mb:,.0f} MB {where}")
            table = table[~over].reset_index(drop=True)
    table["worker_gpu"] = int(worker_gpu)
    table["batch_size"] = int(batch_size)
    return table[list(CONFIG_COLUMNS)]


def probes_always_measured(designed: int) -> int:
    """How many of a cold design's probes its profile measures unless the job is too short to pay
    for them (:func:`profile_continues`): those that identify the model's parameters (the design
    less its ``PROBES_BEYOND_PARAMETERS``), at least ``MIN_PROBES_COLD``. A term the probes cannot
    identify is pinned at 0 — a bottleneck the planner then takes for absent —, so the budget of an
    ordinary job cuts only the probes beyond the parameters (cross-validation of q, the
    out-of-sample error), and a short job's partial fit plans no later run (:func:`profile_is_partial`)."""
    return min(designed, max(C.MIN_PROBES_COLD, designed - C.PROBES_BEYOND_PARAMETERS))


def profile_continues(measured: int, designed: int, elapsed_s: float, samples_left: float,
                      best_throughput: float, next_s: float | None = None) -> bool:
    """Whether a cold profile measures another of its ``designed`` probes after ``measured`` of them
    (in the design's order: the most informative first) took ``elapsed_s``: always below
    ``MIN_PROBES_COLD``; then while one more probe, of ``next_s`` (:func:`next_probe_cost_s`; None:
    the mean time of those so far, elapsed / measured), keeps the profile within a fraction f of the
    job's run time as measured so far,

        elapsed + next_s ≤ f · (elapsed + samples_left / X_best),

    X_best (``best_throughput``) the rate the run is expected at: the best a probe measured (the
    plan, chosen over a range that holds the probes, is expected at least as fast), or the plan's on
    a fit of the probes that identify the model (:func:`next_probe_in_budget`'s ``run_throughput``):
    f = ``PROFILE_SHORT_JOB_FRACTION`` below
    :func:`probes_always_measured` (past it the job is too short to pay for the probes that
    identify the model: :func:`profile_is_partial`), ``PROFILE_BUDGET_FRACTION`` beyond."""
    if measured >= designed:
        return False
    if measured < min(C.MIN_PROBES_COLD, designed):
        return True
    if not best_throughput > 0:
        return True
    run_s = elapsed_s + max(samples_left, 0.0) / best_throughput
    identifying = measured < probes_always_measured(designed)
    fraction = C.PROFILE_SHORT_JOB_FRACTION if identifying else C.PROFILE_BUDGET_FRACTION
    return elapsed_s + (elapsed_s / measured if next_s is None else next_s) <= fraction * run_s


def next_probe_cost_s(rows: pd.DataFrame, probe: Configuration, transitions: TransitionCosts | None = None, *,
                      in_place: bool = True, state_mb: float = 0.0) -> float | None:
    """What measuring ``probe`` next takes: the table's transition from the probe measured last
    (``TransitionCosts.of``: a PS count change writes and reads back ``state_mb``) plus a window's own
    time, the median of what each probe so far took (``probe_s``) past its own transition (the
    first's: a cold launch). None: no probe's time is known. ``transitions``: the backend's table
    (None: the runtime's)."""
    cost_of = _next_probe_costs(rows, transitions, in_place=in_place, state_mb=state_mb)
    return cost_of(probe) if cost_of is not None else None


def _next_probe_costs(rows: pd.DataFrame, transitions: TransitionCosts | None, *, in_place: bool,
                      state_mb: float) -> Callable[[Configuration], float] | None:
    """:func:`next_probe_cost_s` for any next probe, the window's own time taken from ``rows`` once."""
    if rows.empty or "probe_s" not in rows or not np.isfinite(rows["probe_s"].to_numpy(float)).any():
        return None
    table = transitions if transitions is not None else measured()
    configs = _configurations(rows)
    moves = [table.of(a, b, in_place=in_place, state_mb=state_mb) for a, b in zip([None, *configs[:-1]], configs)]
    own = float(np.nanmedian(np.maximum(rows["probe_s"].to_numpy(float) - np.asarray(moves), 0.0)))
    return lambda probe: table.of(configs[-1], probe, in_place=in_place, state_mb=state_mb) + own


def _configurations(rows: pd.DataFrame) -> list[Configuration]:
    """Each row's configuration (a column the table lacks reads as NaN), read column by column."""
    columns = [rows[c].tolist() if c in rows else [float("nan")] * len(rows) for c in CONFIG_COLUMNS]
    return [Configuration(**dict(zip(CONFIG_COLUMNS, values))) for values in zip(*columns)]


def next_probe_in_budget(order: tuple[Configuration, ...], index: int, rows: pd.DataFrame, quota: Quota, *,
                         samples_left: float | None, run_throughput: float | None = None,
                         transitions: TransitionCosts | None = None, in_place: bool = True, state_mb: float = 0.0
                         ) -> tuple[tuple[Configuration, ...], Configuration | None, bool]:
    """The profile's next probe after ``index`` of ``order`` were measured (``rows``), while
    :func:`profile_continues` keeps it in its budget at what that probe costs
    (:func:`next_probe_cost_s`): ``order[index]`` as :func:`next_probe` sizes it while the probes
    that identify the model last (:func:`probes_always_measured`: a cheaper one is not taken out of
    the cheapest order); past them, the most informative of those left whose cost fits, moved to
    ``index`` (a probe behind a PS change that passes the budget gives way to a cheaper one).
    ``run_throughput``: the rate the rest of the run is expected at (None: the best probe's).
    Returns the order, the probe (None: none) and whether the budget ended the profile."""
    elapsed_s = float(np.nansum(rows["probe_s"].to_numpy(float))) if "probe_s" in rows else 0.0
    best = run_throughput if run_throughput else best_throughput(rows)
    cost_of = _next_probe_costs(rows, transitions, in_place=in_place, state_mb=state_mb) if index else None
    order, k = tuple(order), index
    while k < len(order):
        order, probe = next_probe(order, k, rows, quota)
        if probe is None:
            break
        cost = cost_of(probe) if cost_of is not None else None
        if samples_left is None or profile_continues(index, len(order), elapsed_s, samples_left, best, cost):
            return order[:index] + (order[k],) + order[index:k] + order[k + 1:], probe, False
        if index < probes_always_measured(len(order)):
            return order, None, True
        k += 1
    return order, None, k > index


def profile_is_partial(measured: int, designed: int) -> bool:
    """Whether a cold profile ended before the probes that identify the model
    (:func:`probes_always_measured`): its fit plans this run and is not kept as the job's prior
    (``job_model.choose_prior``) — a term it pinned at 0 would be a bottleneck every later run's
    plan takes for absent."""
    return measured < probes_always_measured(designed)


def probe_sized(probe: Configuration, measured: pd.DataFrame, quota: Quota) -> Configuration | None:
    """``probe`` with each node's memory at least what the job's largest node of its role used on
    the probes measured before it, with every request's margin (``memory.memory_request_mb`` of the
    peak: the VPA rule, peak + margin): a worker's after any probe (a PS job's worker holds the
    dense model and a batch, whatever the shape), a PS's after the probes with as many PS (its
    share of the tables depends on their count; a probe with another count restarts its PS on the
    design's share of the layout's tables). None when, so sized, it passes the quota's memory.

    The design's per-node share is a guess made before anything ran, smaller on a probe of more
    nodes: without this, a resize to such a probe shrinks a running node below what it uses — an
    OOM kill and a relaunch."""
    row = probe.to_row()
    if len(measured):
        worker_peak = node_peaks(measured, "worker").max() if "worker_memory_used_mb" in measured else np.nan
        if np.isfinite(worker_peak):
            row["worker_memory_mb"] = max(row["worker_memory_mb"], float(memory_request_mb(worker_peak)))
        if probe.ps and "ps_memory_used_mb" in measured:
            ps_peak = node_peaks(measured[measured["ps"] == probe.ps], "ps").max()
            if np.isfinite(ps_peak):
                row["ps_memory_mb"] = max(row["ps_memory_mb"], float(ps_request_mb(ps_peak)))
    sized = Configuration(**row)
    return sized if sized.memory_mb <= quota.memory_mb else None


def next_probe(order: tuple[Configuration, ...], index: int, measured: pd.DataFrame,
               quota: Quota) -> tuple[tuple[Configuration, ...], Configuration | None]:
    """``order[index]`` as :func:`probe_sized` sizes it after ``measured``; a probe that, so sized,
    passes the quota leaves the order (it is no longer designed) and the next is taken. Returns the
    order left and the probe (None when none is left)."""
    order = tuple(order)
    while index < len(order):
        sized = probe_sized(order[index], measured, quota)
        if sized is not None:
            return order, sized
        log.warning("probe %s skipped: with the memory the job's nodes used, it passes the quota %s",
                    order[index].describe(), quota)
        order = order[:index] + order[index + 1:]
    return order, None


def _rule_order(probes: pd.DataFrame) -> list[Configuration]:
    """By PS count; within it by worker count, ascending and descending in turn (a snake: the job
    keeps its workers across the PS change); then by CPU: the order ties fall back to."""
    table = probes.reindex(columns=list(CONFIG_COLUMNS))
    groups = []
    for turn, (_, group) in enumerate(table.groupby("ps", sort=True)):
        groups.append(group.sort_values(["workers", "ps_cpu", "worker_cpu", "ps_memory_mb", "worker_memory_mb"],
                                        ascending=[turn % 2 == 0, True, True, True, True], kind="stable"))
    return _configurations(pd.concat(groups))


def path_cost_s(order: list[Configuration], transitions: TransitionCosts, *, in_place: bool = True,
                state_mb: float = 0.0) -> float:
    """What visiting ``order`` on one running job costs after its launch: Σ ``transitions.of``."""
    return sum(transitions.of(a, b, in_place=in_place, state_mb=state_mb) for a, b in zip(order, order[1:]))


def order_probes(probes: pd.DataFrame, transitions: TransitionCosts | None = None, *, in_place: bool = True,
                 state_mb: float = 0.0) -> list[Configuration]:
    """The cheapest order to visit the probes on one running job: the open path through them of
    least Σ ``transitions.of`` (the launch costs the same wherever it starts), exactly by
    Held–Karp's dynamic programme over subsets (O(2ⁿ·n²)) up to ``PROBE_ORDER_EXACT_MAX``
    probes, else nearest-neighbour from the first. Ties go to the rule order (:func:`_rule_order`).
    ``transitions``: the backend's table (None: the runtime's, ``transitions.measured``)."""
    rule = _rule_order(probes)
    n = len(rule)
    if n < 3:
        return rule
    table = transitions if transitions is not None else measured()
    cost = np.array([[table.of(a, b, in_place=in_place, state_mb=state_mb) if a is not b else 0.0 for b in rule]
                     for a in rule])
    if n > C.PROBE_ORDER_EXACT_MAX:
        path, left = [0], list(range(1, n))
        while left:
            nearest = min(left, key=lambda j: (cost[path[-1], j], j))
            path.append(nearest)
            left.remove(nearest)
        return [rule[i] for i in path]
    full = (1 << n) - 1
    best = np.full((1 << n, n), np.inf)
    came = np.full((1 << n, n), -1, dtype=int)
    nodes, bits = np.arange(n), 1 << np.arange(n)
    best[bits, nodes] = 0.0
    members = (np.arange(1 << n)[:, None] & bits) != 0
    sizes = members.sum(axis=1)
    for size in range(1, n):  # the paths through `size` probes extend to `size + 1`, every subset at once
        masks = np.flatnonzero(sizes == size)
        through = best[masks][:, :, None] + cost  # [mask, last, next]: best[mask, i] + cost[i, j]
        last = np.argmin(through, axis=1)  # the first of equal costs, the lowest index
        value = np.take_along_axis(through, last[:, None, :], axis=1)[:, 0, :]
        grow = ~members[masks] & np.isfinite(value)
        rows, cols = np.nonzero(grow)
        best[masks[rows] | bits[cols], cols] = value[rows, cols]
        came[masks[rows] | bits[cols], cols] = last[rows, cols]
    if sum(cost[i, i + 1] for i in range(n - 1)) <= best[full].min() + 1e-9:
        return rule  # a tie keeps the rule order
    end, mask, path = int(np.argmin(best[full])), full, []
    while end >= 0:
        path.append(end)
        end, mask = came[mask, end], mask & ~(1 << end)
    return [rule[i] for i in reversed(path)]


def profile_apart(probes: pd.DataFrame, transitions: TransitionCosts | None = None, *, in_place: bool = True,
                  state_mb: float = 0.0, window_s: float = C.PROBE_WINDOW_S) -> bool:
    """Whether the profile measures its probes on a stand-in of the job — the same job started
    without the state it continues (its export), whose training is thrown away once the job
    itself launches on its plan — rather than on the job itself. A PS count change of the job
    writes and reads back its whole state (``TransitionCosts.of``: minutes for tens of GB); the
    stand-in's state is its own few rows. So the stand-in pays when the PS changes of the
    identifying probes, each in its cheapest order (:func:`visiting_order`), cost more at the
    job's state than at none by more than what it throws away — at most its n windows' training
    — and its own cold launch,

        path(order at state_mb) − path(order at 0) > n · window_s + cold_launch_s.

    A job without state (``state_mb`` 0) is always profiled on itself."""
    always = probes_always_measured(len(probes))
    if not state_mb > 0 or always < 2:
        return False
    table = transitions if transitions is not None else measured()
    head = probes.iloc[:always]
    at_state = path_cost_s(order_probes(head, table, in_place=in_place, state_mb=state_mb), table,
                           in_place=in_place, state_mb=state_mb)
    apart = path_cost_s(order_probes(head, table, in_place=in_place), table, in_place=in_place)
    return at_state - apart > always * window_s + table.cold_launch_s


def visiting_order(probes: pd.DataFrame, transitions: TransitionCosts | None = None, *, in_place: bool = True,
                   state_mb: float = 0.0) -> list[Configuration]:
    """The order a profile measures the design's probes in: those it always measures
    (:func:`probes_always_measured`) in the cheapest order (:func:`order_probes`, on the
    backend's ``transitions``), the rest in the design's own order (the most informative first),
    so that wherever the budget ends the profile (:func:`profile_continues`) it has measured a
    prefix of the design."""
    always = probes_always_measured(len(probes))
    head = order_probes(probes.iloc[:always], transitions, in_place=in_place, state_mb=state_mb) if always else []
    return head + _configurations(probes.iloc[always:])


def window_settled(rates: list[float] | np.ndarray, halfwidth: float = C.PROBE_STOP_HALFWIDTH) -> bool:
    """Whether a probe window may end before its length (sequential stopping): its interval rates
    r₁…rₙ (each every worker's rate between two of its reports) number at least
    ``PROBE_MIN_INTERVALS`` and their mean's ~95 % interval is within ``halfwidth`` of the mean,

        t₀.₉₇₅,ₙ₋₁ · s / √n ≤ halfwidth · r̄   (Chow & Robbins, Ann. Math. Stat. 1965).

    The window's measurement stays the whole window's rate; the rule only says when it is enough."""
    from scipy.stats import t

    r = np.asarray(rates, dtype=float)
    n = len(r)
    if halfwidth <= 0 or n < max(C.PROBE_MIN_INTERVALS, 2) or not r.mean() > 0:
        return False
    return float(t.ppf(0.975, n - 1) * r.std(ddof=1) / np.sqrt(n)) <= halfwidth * float(r.mean())


def best_throughput(rows: pd.DataFrame) -> float:
    """The best configuration's median throughput over the probes measured so far (0: none)."""
    if rows.empty:
        return 0.0
    return float(rows.groupby(list(CONFIG_COLUMNS), sort=False)["throughput"].median().max())
