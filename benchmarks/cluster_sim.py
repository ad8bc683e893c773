"""Cluster-scale evaluation: every policy on the same simulated days, several seeds, each scenario.

    python benchmarks/cluster_sim.py [--jobs 1000] [--days 7] [--seeds 1 2 3] [--scenarios congested uncongested]
                                     [--policies user,dlrover,ours,oracle] [--objective efficiency]
                                     [--large-fraction 0.05]
                                     [--processes 2] [--out benchmarks/out/cluster]

Scenarios: ``congested`` is the default cluster (8,000 cores, 40,000 GiB for 1,000 jobs a day:
jobs queue at the day's peak); ``uncongested`` a cluster no job ever waits for. For each scenario
and seed it runs ``benchmarks/simulate.py``'s engine (one trace, every policy) and prints the
seed's table with 95 % bootstrap intervals over jobs; then, for the cold jobs (day 1: no history)
and the warm ones (days 2…), the mean over seeds with a 95 % t-interval across seeds, and the
targets of the issue checked against those means (``oracle`` is the knee reference, ``bound`` the
per-job run-time lower bound of :mod:`sim.bound`). A share ``--large-fraction`` of the families are
large PS jobs (hundreds of workers, more than 64 PS at best: ``sim.workload._large_truth``); each
seed's table for them alone follows its table. The dlrover policy needs its venv (``make
dlrover-venv``; ``--setup-dlrover`` creates it). Nothing here is asserted: it prints what it measures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.run import SUMMARY_COLUMNS, by_days, format_table, of_truth, simulate, write_outputs  # noqa: E402
from sim.workload import SimConfig  # noqa: E402

#: Cluster sizes of the scenarios, per 1,000 jobs a day (scaled with --jobs, never below the
#: largest job a family may ask for: 1,024 cores, 4 TiB).
SCENARIOS = {"congested": (8000.0, 40_000.0 * 1024), "uncongested": (1e7, 1e10)}
FLOOR = (1024.0, 4096.0 * 1024)


def across_seeds(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for policy, group in table.groupby("policy", sort=False):
        row = {"policy": policy}
        for metric in SUMMARY_COLUMNS[1:]:
            values = group[metric].to_numpy(float)
            mean = float(np.mean(values))
            if not np.all(np.isfinite(values)):  # a seed where that many jobs never completed: ∞, no interval
                row[metric], row[metric + "_ci"] = mean, float("nan")
                continue
            half = float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
            row[metric] = mean
            row[metric + "_ci"] = half
        rows.append(row)
    return pd.DataFrame(rows)


def targets(mean: pd.DataFrame) -> list[str]:
    by = mean.set_index("policy")
    out = []
    if {"user", "ours"} <= set(by.index):
        u, o = by.loc["user"], by.loc["ours"]
        out.append(f"vs user: median JCT {o.median_jct_s / u.median_jct_s - 1:+.0%} (target −35 % or better)")
        out.append(f"vs user: CPU util {100 * (o.cpu_util - u.cpu_util):+.1f} points, memory util "
                   f"{100 * (o.mem_util - u.mem_util):+.1f} points (target +20 each)")
        out.append(f"ours completion rate {o.completion_rate:.1%} (target ≥ 98 %)")
    if {"dlrover", "ours"} <= set(by.index):
        d, o = by.loc["dlrover"], by.loc["ours"]
        out.append(f"vs DLRover: median JCT {o.median_jct_s / d.median_jct_s - 1:+.0%}, p90 {o.p90_jct_s / d.p90_jct_s - 1:+.0%}; "
                   f"CPU util {100 * (o.cpu_util - d.cpu_util):+.1f} points, memory {100 * (o.mem_util - d.mem_util):+.1f} points "
                   "(target: better JCT at equal or better utilisation)")
    if {"oracle", "ours"} <= set(by.index):
        r, o = by.loc["oracle"], by.loc["ours"]
        out.append(f"vs oracle (knee reference): median JCT {o.median_jct_s / r.median_jct_s - 1:+.0%} (target within +10 %)")
    if "bound" in by.index:
        b = by.loc["bound"]
        ratios = ", ".join(f"{name} {by.loc[name].median_jct_s / b.median_jct_s:.2f}×"
                           for name in by.index if name != "bound")
        out.append(f"vs bound (per-job run-time lower bound, no queueing): median JCT {ratios}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000, help="jobs a day")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--policies", default="user,dlrover,ours,oracle")
    parser.add_argument("--objective", default="efficiency", choices=("efficiency", "throughput"))
    parser.add_argument("--large-fraction", type=float, default=0.05,
                        help="share of the families that are large PS jobs (default 0.05)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--setup-dlrover", action="store_true")
    parser.add_argument("--out", default="benchmarks/out/cluster")
    args = parser.parse_args()
    policies = args.policies.split(",")
    if not 0.0 <= args.large_fraction <= 1.0:
        parser.error(f"--large-fraction={args.large_fraction}: a fraction in [0, 1]")

    tables = []
    for scenario in args.scenarios:
        cpu, memory = (max(v * args.jobs / 1000, floor) for v, floor in zip(SCENARIOS[scenario], FLOOR))
        for seed in args.seeds:
            cfg = SimConfig(jobs=args.jobs, days=args.days, seed=seed, cluster_cpu=cpu, cluster_memory_mb=memory,
                            large_fraction=args.large_fraction)
            start = time.perf_counter()
            summary, cis, runs = simulate(cfg, policies, objective=args.objective, setup_dlrover=args.setup_dlrover,
                                          processes=args.processes)
            seconds = time.perf_counter() - start
            print(f"\n== {scenario}, seed {seed}: {args.jobs} jobs a day × {args.days} days in {seconds:.1f} s "
                  f"({', '.join(f'{r.name} {r.seconds:.1f} s' for r in runs)})")
            print(format_table(summary, cis))
            large = of_truth(runs, "large", seed=seed)
            if large is not None:
                print(f"large families ({int((runs[0].jobs['truth'] == 'large').sum())} jobs):")
                print(format_table(*large))
            days = by_days(runs, seed=seed)
            write_outputs(Path(args.out) / scenario / f"seed{seed}", summary, cis, runs, cfg, days)
            for label, (table, _) in (days or {"all": (summary, None)}).items():
                tables.append(table.assign(scenario=scenario, days=label, seed=seed))

    table = pd.concat(tables, ignore_index=True)
    for (scenario, label), group in table.groupby(["scenario", "days"], sort=False):
        mean = across_seeds(group)
        print(f"\n== {scenario}, {label} jobs: mean over seeds {args.seeds} (± 95 % t-interval across seeds)")
        shown = mean[["policy"]].copy()
        for metric in SUMMARY_COLUMNS[1:]:
            pct = metric in ("cpu_util", "mem_util", "completion_rate")
            f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.0f}")
            shown[metric] = ["n/a" if np.isnan(m) else f"{f(m)} ± {f(c)}" for m, c in zip(mean[metric], mean[metric + "_ci"])]
        print(shown.to_string(index=False))
        print("targets, on the means:")
        for line in targets(mean):
            print("  " + line)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(args.out) / "by_seed.csv", index=False)


if __name__ == "__main__":
    main()
