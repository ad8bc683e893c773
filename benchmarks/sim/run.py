"""Run policies over one trace and summarise: the engine behind ``benchmarks/simulate.py``.

Metrics per policy (``SUMMARY_COLUMNS``):

* ``median_jct_s`` / ``p90_jct_s`` — job completion time (arrival → last sample, queueing and
  profiling included) over the jobs that completed;
* ``cpu_util`` / ``mem_util`` — used / allocated, time-weighted over every job's allocation
  (Σ used·dt / Σ allocated·dt);
* ``completion_rate`` — jobs that trained all their samples / jobs;
* ``resource_hours`` — allocated core-hours;
* ``queue_delay_s`` — mean time a job waited for the cluster.

Beside the policies, the ``bound`` row: each job's run-time lower bound (:mod:`sim.bound`), which
no policy beats on any job (``run_s ≥ bound_run_s``; the JCT too, the bound has no queueing).
Its JCT and run-time columns are the same; the others do not apply (NaN, printed ``n/a``).

Confidence intervals: percentile bootstrap over jobs (``bootstrap`` resamples, seeded), per
metric; across seeds the benchmark reports mean ± a t-interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.bound import bound_table, check
from sim.cluster import BIN_S, Cluster, JobRun
from sim.policies import POLICIES, make_policy
from sim.workload import SimConfig, generate_trace

SUMMARY_COLUMNS = ("policy", "median_jct_s", "p90_jct_s", "median_run_s", "cpu_util", "mem_util", "completion_rate",
                   "resource_hours", "queue_delay_s")
JOB_COLUMNS = ("policy", "job", "family", "day", "truth", "recurrence", "arrival_s", "samples", "status", "jct_s", "run_s", "queue_s",
               "profile_s", "profile_cost_s", "cpu_alloc_core_h", "cpu_used_core_h", "mem_alloc_gb_h", "mem_used_gb_h",
               "cpu_util", "mem_util", "workers", "ps", "worker_cpu", "ps_cpu", "worker_memory_mb", "ps_memory_mb",
               "resizes", "deferred", "refused", "failures", "ooms", "wasted_samples", "trained_samples",
               "peak_true_rate", "bound_run_s")
BOUND = "bound"
#: The policies from the slowest to simulate to the fastest.
POLICY_COST = ("dlrover", "ours", "oracle", "oracle-jct", "user-adapts", "user")


@dataclass
class PolicyRun:
    name: str
    jobs: pd.DataFrame
    series: pd.DataFrame
    seconds: float
    counters: dict = field(default_factory=dict)


def job_table(name: str, jobs: list[JobRun]) -> pd.DataFrame:
    """One row per job (``bound_run_s`` empty: :func:`with_bounds` fills it)."""
    rows = []
    for job in jobs:
        spec, c = job.spec, getattr(job, "config_final", None) or job.config
        rows.append(dict(
            policy=name, job=spec.id, family=spec.family.index, day=spec.day, truth=_truth_name(spec.family.truth),
            recurrence=spec.family.recurrence,
            arrival_s=spec.arrival_s, samples=spec.samples, status=job.phase,
            jct_s=(job.end_s - spec.arrival_s) if job.phase == "done" else np.inf,
            run_s=(job.end_s - job.start_s) if job.phase == "done" else np.inf, queue_s=job.queue_s,
            profile_s=job.profile_s, profile_cost_s=job.profile_cost_s,
            cpu_alloc_core_h=job.cpu_alloc_s / 3600, cpu_used_core_h=job.cpu_used_s / 3600,
            mem_alloc_gb_h=job.mem_alloc_s / 3600 / 1024, mem_used_gb_h=job.mem_used_s / 3600 / 1024,
            cpu_util=job.cpu_used_s / job.cpu_alloc_s if job.cpu_alloc_s else np.nan,
            mem_util=job.mem_used_s / job.mem_alloc_s if job.mem_alloc_s else np.nan,
            workers=c.workers if c else np.nan, ps=c.ps if c else np.nan,
            worker_cpu=c.worker_cpu if c else np.nan, ps_cpu=c.ps_cpu if c else np.nan,
            worker_memory_mb=c.worker_memory_mb if c else np.nan, ps_memory_mb=c.ps_memory_mb if c else np.nan,
            resizes=job.resizes, deferred=job.deferred, refused=job.refused, failures=job.failures, ooms=job.ooms,
            wasted_samples=job.wasted_samples, trained_samples=job.trained_samples,
            peak_true_rate=job.peak_true_rate, bound_run_s=np.nan,
        ))
    return pd.DataFrame(rows, columns=list(JOB_COLUMNS))


def profiling(table: pd.DataFrame, min_jct_s: float = 3600.0) -> dict | None:
    """The profiled jobs that completed within at least ``min_jct_s``: how many, and the median of
    their profiling's wall time and of its cost (``profile_cost_s``: the wall time less the plan's
    true time for the samples the probes trained), each as a share of the job's JCT. None: none."""
    jobs = table[(table["profile_s"] > 0) & np.isfinite(table["jct_s"]) & (table["jct_s"] >= min_jct_s)]
    if jobs.empty:
        return None
    return dict(jobs=len(jobs), wall_share=float((jobs["profile_s"] / jobs["jct_s"]).median()),
                cost_share=float((jobs["profile_cost_s"] / jobs["jct_s"]).median()))


def _truth_name(truth) -> str:
    return f"queueing:{truth.physics}" if truth.family == "queueing" else truth.family


def _quantile(values: np.ndarray, q: float) -> float:
    """A quantile over every job, a job that never completed counting as an infinite time
    (``method="inverted_cdf"``: an order statistic, so that a quantile is ∞ exactly when that
    many jobs failed, never an interpolation between a time and ∞)."""
    return float(np.quantile(values, q, method="inverted_cdf")) if len(values) else np.nan


def summarise(table: pd.DataFrame) -> dict:
    """One policy's metrics over all its jobs: JCT (arrival → end) and run time (start → end)
    with failed jobs as ∞, utilisation over every allocation, the completion rate beside them."""
    jct, run = table["jct_s"].to_numpy(float), table["run_s"].to_numpy(float)
    return dict(
        policy=table["policy"].iloc[0],
        median_jct_s=_quantile(jct, 0.5),
        p90_jct_s=_quantile(jct, 0.9),
        median_run_s=_quantile(run, 0.5),
        cpu_util=float(table["cpu_used_core_h"].sum() / table["cpu_alloc_core_h"].sum()),
        mem_util=float(table["mem_used_gb_h"].sum() / table["mem_alloc_gb_h"].sum()),
        completion_rate=float((table["status"] == "done").mean()),
        resource_hours=float(table["cpu_alloc_core_h"].sum()),
        queue_delay_s=float(table["queue_s"].mean()),
    )


def by_days(runs: list[PolicyRun], resamples: int = 400, seed: int = 0) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """(summary, intervals) over the cold jobs (day 1: a family's first day, no history) and the
    warm ones (days 2…: history from the family's earlier runs in this simulation), each ending
    with its ``bound`` row; {} for one day."""
    out = {}
    for label, warm in (("cold", False), ("warm", True)):
        tables = [run.jobs[(run.jobs["day"] > 0) == warm] for run in runs]
        if any(t.empty for t in tables):
            return {}
        out[label] = summaries(tables, tables[0]["bound_run_s"].to_numpy(float), resamples, seed)
    return out


def per_job_against(runs: list[PolicyRun], reference: str = "oracle") -> pd.DataFrame | None:
    """Each policy's JCT over ``reference``'s, job by job (the same trace), for all jobs and, over
    several days, the cold and the warm ones: the geometric mean and the median of the ratios
    over the jobs both completed, the jobs over 2× and 3× (a job the policy failed counts there)
    and the jobs the policy failed. None without ``reference``.

    A policy that profiles has a second line, ``<policy> profile + <reference>``: ``reference``'s
    JCT plus what the policy's profile cost the job (``profile_cost_s``), over ``reference``'s —
    what its profile alone costs, as if the plan after it were ``reference``'s (at most: the cost
    is measured against the policy's own plan, no faster than ``reference``'s)."""
    by_name = {run.name: run.jobs.set_index("job") for run in runs}
    if reference not in by_name:
        return None
    ref = by_name[reference]
    rows = []
    for name, jobs in by_name.items():
        if name == reference:
            continue
        jobs = jobs.loc[ref.index]
        ratios = {name: jobs["jct_s"] / ref["jct_s"]}
        if "profile_cost_s" in jobs and (jobs["profile_cost_s"] > 0).any():
            ratios[f"{name} profile + {reference}"] = (ref["jct_s"] + jobs["profile_cost_s"]) / ref["jct_s"]
        groups = {"all": np.ones(len(jobs), dtype=bool)}
        if jobs["day"].nunique() > 1:
            groups |= {"cold": (jobs["day"] == 0).to_numpy(), "warm": (jobs["day"] > 0).to_numpy()}
        for policy, ratio in ratios.items():
            for label, mask in groups.items():
                r = ratio[mask]
                finite = r[np.isfinite(r)]
                rows.append(dict(policy=policy, jobs=label, geometric_mean=float(np.exp(np.log(finite).mean())),
                                 median=float(finite.median()), over_2x=int((r > 2).sum()),
                                 over_3x=int((r > 3).sum()), failed=int(np.isposinf(r).sum())))
    return pd.DataFrame(rows)


def of_truth(runs: list[PolicyRun], truth: str, resamples: int = 400, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(summary, intervals) over the jobs of one truth family (the ``truth`` column, e.g. ``large``),
    ending with its ``bound`` row; None when the trace has none."""
    tables = [run.jobs[run.jobs["truth"] == truth] for run in runs]
    if any(t.empty for t in tables):
        return None
    return summaries(tables, tables[0]["bound_run_s"].to_numpy(float), resamples, seed)


def summaries(tables: list[pd.DataFrame], bound_s: np.ndarray, resamples: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, intervals) of each policy's job table, then the ``bound`` row of ``bound_s``."""
    summary = pd.DataFrame([summarise(t) for t in tables] + [summarise_bound(bound_s)], columns=list(SUMMARY_COLUMNS))
    cis = pd.concat([bootstrap(t, resamples, seed) for t in tables] + [bootstrap_bound(bound_s, resamples, seed)],
                    ignore_index=True)
    return summary, cis


def summarise_bound(bound_s: np.ndarray) -> dict:
    """The ``bound`` row: JCT and run time are the per-job bound; the other metrics do not apply."""
    row = {metric: np.nan for metric in SUMMARY_COLUMNS}
    row.update(policy=BOUND, median_jct_s=_quantile(bound_s, 0.5), p90_jct_s=_quantile(bound_s, 0.9),
               median_run_s=_quantile(bound_s, 0.5))
    return row


def bootstrap_bound(bound_s: np.ndarray, resamples: int = 400, seed: int = 0) -> pd.DataFrame:
    """Percentile 95 % intervals of the ``bound`` row's metrics, resampling jobs as :func:`bootstrap`."""
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(resamples):
        idx = rng.integers(len(bound_s), size=len(bound_s))
        stats.append((_quantile(bound_s[idx], 0.5), _quantile(bound_s[idx], 0.9)))
    stats = np.array(stats)
    lo = np.percentile(stats, 2.5, axis=0, method="inverted_cdf")
    hi = np.percentile(stats, 97.5, axis=0, method="inverted_cdf")
    return pd.DataFrame({"policy": BOUND, "metric": ["median_jct_s", "p90_jct_s", "median_run_s"],
                         "low": [lo[0], lo[1], lo[0]], "high": [hi[0], hi[1], hi[0]]})


def bootstrap(table: pd.DataFrame, resamples: int = 400, seed: int = 0) -> pd.DataFrame:
    """Percentile 95 % intervals of every summary metric, resampling jobs."""
    rng = np.random.default_rng(seed)
    n = len(table)
    done = (table["status"] == "done").to_numpy()
    jct, run = table["jct_s"].to_numpy(float), table["run_s"].to_numpy(float)
    arrays = {k: table[k].to_numpy() for k in ("cpu_used_core_h", "cpu_alloc_core_h", "mem_used_gb_h", "mem_alloc_gb_h", "queue_s")}
    stats = []
    for _ in range(resamples):
        idx = rng.integers(n, size=n)
        stats.append((
            _quantile(jct[idx], 0.5), _quantile(jct[idx], 0.9), _quantile(run[idx], 0.5),
            arrays["cpu_used_core_h"][idx].sum() / arrays["cpu_alloc_core_h"][idx].sum(),
            arrays["mem_used_gb_h"][idx].sum() / arrays["mem_alloc_gb_h"][idx].sum(),
            done[idx].mean(), arrays["cpu_alloc_core_h"][idx].sum(), arrays["queue_s"][idx].mean(),
        ))
    stats = np.array(stats)
    lo = np.nanpercentile(stats, 2.5, axis=0, method="inverted_cdf")
    hi = np.nanpercentile(stats, 97.5, axis=0, method="inverted_cdf")
    names = SUMMARY_COLUMNS[1:]
    return pd.DataFrame({"policy": table["policy"].iloc[0], "metric": names, "low": lo, "high": hi})


def run_policy(cfg: SimConfig, name: str, *, trace=None, objective: str = "efficiency", bridge=None,
               policy=None, bounds: dict | None = None) -> PolicyRun:
    """One policy on the trace of ``cfg`` (``policy``: an instance to run under ``name``, e.g. an
    ablation of one; default ``make_policy(name)``). ``bounds``: :func:`sim.bound.bound_table`'s
    (default: computed here); {} leaves the jobs' ``bound_run_s`` to :func:`with_bounds`."""
    trace = trace if trace is not None else generate_trace(cfg)
    bounds = bound_table(cfg, trace) if bounds is None else bounds
    policy = policy if policy is not None else make_policy(name, objective=objective, bridge=bridge)
    start = time.perf_counter()
    cluster = Cluster(cfg, trace, policy)
    jobs = cluster.run()
    seconds = time.perf_counter() - start
    bins = cluster.bins
    last = int(np.max(np.flatnonzero(bins["cpu_alloc"] > 0), initial=0)) + 1
    series = pd.DataFrame({
        "policy": name, "t_s": np.arange(last) * BIN_S,
        "cpu_alloc": bins["cpu_alloc"][:last] / BIN_S, "cpu_used": bins["cpu_used"][:last] / BIN_S,
        "mem_alloc_gb": bins["mem_alloc"][:last] / BIN_S / 1024, "mem_used_gb": bins["mem_used"][:last] / BIN_S / 1024,
    })
    counters = {k: getattr(policy, k) for k in ("fits", "steps") if hasattr(policy, k)}
    if bridge is not None and name == "dlrover":
        counters["bridge_calls"] = bridge.calls
    run = PolicyRun(name, job_table(name, jobs), series, seconds, counters)
    return with_bounds(run, bounds) if bounds else run


def with_bounds(run: PolicyRun, bounds: dict) -> PolicyRun:
    """``run`` with each job's ``bound_run_s``, checked: no job ran faster than the bound's X*
    (else it would not be a bound)."""
    table = run.jobs.assign(bound_run_s=run.jobs["job"].map(lambda job: bounds[job][0]))
    check(run.name, table, bounds)
    return replace(run, jobs=table)


def format_table(summary: pd.DataFrame, cis: pd.DataFrame | None = None) -> str:
    fmt = {"median_jct_s": "{:.0f}", "p90_jct_s": "{:.0f}", "median_run_s": "{:.0f}", "cpu_util": "{:.1%}", "mem_util": "{:.1%}",
           "completion_rate": "{:.1%}", "resource_hours": "{:.0f}", "queue_delay_s": "{:.0f}"}
    header = ["policy"] + list(fmt)
    lines = []
    rows = []
    for _, row in summary.iterrows():
        cells = [row["policy"]]
        for metric, f in fmt.items():
            if pd.isna(row[metric]):
                cells.append("n/a")
                continue
            cell = f.format(row[metric])
            if cis is not None:
                ci = cis[(cis["policy"] == row["policy"]) & (cis["metric"] == metric)]
                if len(ci):
                    cell += f" [{f.format(ci['low'].iloc[0])}, {f.format(ci['high'].iloc[0])}]"
            cells.append(cell)
        rows.append(cells)
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines.append("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for cells in rows:
        lines.append("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    return "\n".join(lines)


def plot(runs: list[PolicyRun], out: Path, day_s: float) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        jct = np.sort(run.jobs.loc[run.jobs["status"] == "done", "jct_s"].to_numpy(float) / 3600)
        ax.plot(jct, np.arange(1, len(jct) + 1) / len(run.jobs), label=run.name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log)")
    ax.set_ylabel("fraction of jobs completed within")
    ax.set_title("JCT CDF (failed jobs never reach the top)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for run in runs:
        s = run.series
        hours = s["t_s"] / 3600
        with np.errstate(invalid="ignore", divide="ignore"):
            axes[0].plot(hours, s["cpu_used"] / s["cpu_alloc"], label=run.name)
            axes[1].plot(hours, s["mem_used_gb"] / s["mem_alloc_gb"], label=run.name)
        axes[2].plot(hours, s["cpu_alloc"], label=run.name)
    axes[0].set_ylabel("CPU used / allocated")
    axes[1].set_ylabel("memory used / allocated")
    axes[2].set_ylabel("cores allocated")
    axes[2].set_xlabel(f"hours (arrivals end at {day_s / 3600:.0f} h)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(ncol=4, fontsize=8)
    fig.suptitle("Utilisation over time (10-minute bins)")
    fig.tight_layout()
    paths.append(out / "utilisation.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _run_one(args) -> PolicyRun:
    """One policy's run, with one BLAS thread: the matrices are small, and policies run side by
    side (OpenBLAS's default pool of a thread per core made two processes 1.6× slower)."""
    from threadpoolctl import threadpool_limits

    cfg, name, objective, dlrover_venv, setup_dlrover, bounds = args
    bridge = None
    if name == "dlrover":
        from sim.dlrover_bridge import DLRoverBridge

        bridge = DLRoverBridge(dlrover_venv, create=setup_dlrover)
    try:
        with threadpool_limits(limits=1):
            return run_policy(cfg, name, objective=objective, bridge=bridge, bounds=bounds)
    finally:
        if bridge is not None:
            bridge.close()


def _bound_table(cfg: SimConfig) -> dict[int, tuple[float, float]]:
    return bound_table(cfg, generate_trace(cfg))


def simulate(cfg: SimConfig, policies=POLICIES, *, objective: str = "efficiency", dlrover_venv=None,
             setup_dlrover: bool = False, resamples: int = 400, processes: int = 1,
             ) -> tuple[pd.DataFrame, pd.DataFrame, list[PolicyRun]]:
    """Run ``policies`` on one trace (each regenerates it from the seed: identical); returns
    (summary, confidence intervals, runs). ``processes`` > 1 runs policies in parallel. The summary
    ends with the ``bound`` row (:mod:`sim.bound`)."""
    policies = list(policies)
    for name in policies:
        if name not in POLICIES:
            from airflow_dlrover.optimizer.types import InvalidInputError

            raise InvalidInputError("policies", name, ", ".join(POLICIES))
    if "dlrover" in policies:  # fail fast, before minutes of other policies
        from sim.dlrover_bridge import ensure_venv

        ensure_venv(dlrover_venv, create=setup_dlrover)
    if processes > 1 and len(policies) > 1:
        import multiprocessing

        # Longest first (dlrover, ours), so that the pool finishes together; the jobs' bounds last,
        # on the core the shorter policies leave, added to every policy's jobs here (with_bounds).
        jobs = [(cfg, name, objective, dlrover_venv, False, {}) for name in policies]
        order = sorted(range(len(jobs)), key=lambda i: POLICY_COST.index(policies[i]))
        with multiprocessing.get_context("fork").Pool(min(processes, len(jobs))) as pool:
            pending = {i: pool.apply_async(_run_one, (jobs[i],)) for i in order}
            bounds = pool.apply_async(_bound_table, (cfg,)).get()
            runs = [with_bounds(pending[i].get(), bounds) for i in range(len(jobs))]
    else:
        bounds = _bound_table(cfg)
        runs = [_run_one((cfg, name, objective, dlrover_venv, False, bounds)) for name in policies]
    bound_s = np.array([b for b, _ in bounds.values()])
    summary, cis = summaries([run.jobs for run in runs], bound_s, resamples, cfg.seed)
    return summary, cis, runs


def write_outputs(out: Path, summary: pd.DataFrame, cis: pd.DataFrame, runs: list[PolicyRun], cfg: SimConfig,
                  days: dict | None = None) -> list[Path]:
    """The files; ``days`` (:func:`by_days`) adds ``summary_days.csv`` (``days`` = cold | warm, then
    the summary's columns)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.csv", out / "summary_ci.csv", out / "jobs.csv", out / "utilisation.csv"]
    summary.to_csv(paths[0], index=False)
    cis.to_csv(paths[1], index=False)
    if days:
        paths.append(out / "summary_days.csv")
        pd.concat([table.assign(days=label)[["days", *SUMMARY_COLUMNS]] for label, (table, _) in days.items()],
                  ignore_index=True).to_csv(paths[-1], index=False)
    pd.concat([run.jobs for run in runs], ignore_index=True).to_csv(paths[2], index=False)
    pd.concat([run.series for run in runs], ignore_index=True).to_csv(paths[3], index=False)
    paths += plot(runs, out, cfg.day_s * cfg.days)
    return paths
