"""Cluster-scale evaluation: every policy on the same simulated days, several seeds, each scenario.

    python benchmarks/cluster_sim.py [--jobs 1000] [--days 7] [--seeds 101 102 103 104 105]
                                     [--scenarios congested uncongested]
                                     [--policies user,user-adapts,dlrover,ours,oracle,oracle-jct]
                                     [--objective efficiency] [--large-fraction 0.05]
                                     [--one-off-fraction 0.1] [--shift-fraction 0.1]
                                     [--processes 2] [--out benchmarks/out/cluster] [--write-docs PAGE]

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

Seeds: ``TUNING_SEEDS`` are those the product's constants were tuned on; the published page
(``--write-docs``, which refuses them) uses only ``REPORT_SEEDS``, which no tuning ever ran on. The
page is generated whole: the command, the commit, the tables (mean over seeds per scenario and
cold / warm), the targets met or missed, the median JCT per truth family and per recurrence
(daily, one-off, shifted), and the JCT CDF and utilisation plots of the first seed.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.run import SUMMARY_COLUMNS, by_days, format_table, of_truth, profiling, simulate, write_outputs  # noqa: E402
from sim.workload import SimConfig  # noqa: E402

#: Cluster sizes of the scenarios, per 1,000 jobs a day (scaled with --jobs, never below the
#: largest job a family may ask for: 1,024 cores, 4 TiB).
SCENARIOS = {"congested": (8000.0, 40_000.0 * 1024), "uncongested": (1e7, 1e10)}
FLOOR = (1024.0, 4096.0 * 1024)
#: Seeds the constants were tuned on, and seeds kept for reporting (never tuned on).
TUNING_SEEDS = (1, 2, 3)
REPORT_SEEDS = (101, 102, 103, 104, 105)
POLICIES = "user,user-adapts,dlrover,ours,oracle,oracle-jct"


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


def targets(mean: pd.DataFrame, label: str) -> list[tuple[str, str, bool | None]]:
    """(goal, measured, met) on the means over seeds of one scenario's ``label`` (cold | warm) jobs;
    met None: reported, no goal."""
    by = mean.set_index("policy")
    out = []
    if "ours" not in by.index:
        return out
    o = by.loc["ours"]
    for owner in ("user", "user-adapts"):
        if owner in by.index:
            ratio = o.median_jct_s / by.loc[owner].median_jct_s
            out.append((f"median JCT ≤ 0.65× the owners' ({owner})", f"{ratio:.2f}×", bool(ratio <= 0.65)))
    if "dlrover" in by.index:
        d = by.loc["dlrover"]
        better = o.median_jct_s < d.median_jct_s and o.cpu_util >= d.cpu_util and o.mem_util >= d.mem_util
        out.append(("better JCT than DLRover 0.6.1 at equal or better utilisation",
                    f"{o.median_jct_s / d.median_jct_s:.2f}× its JCT; CPU {100 * (o.cpu_util - d.cpu_util):+.1f}, "
                    f"memory {100 * (o.mem_util - d.mem_util):+.1f} points", bool(better)))
    if "oracle" in by.index:  # the knee is an efficiency: its JCT is a goal at no more of its core-hours
        r = by.loc["oracle"]
        goal = 1.20 if label == "cold" else 1.05
        ratio, cores = o.median_jct_s / r.median_jct_s, o.resource_hours / r.resource_hours
        out.append((f"median JCT ≤ {goal:.2f}× the knee's (oracle) at equal or fewer core-hours",
                    f"{ratio:.2f}× at {cores:.2f}× its core-hours", bool(ratio <= goal and cores <= 1.0)))
    if "oracle-jct" in by.index:
        r = by.loc["oracle-jct"]
        out.append(("median JCT against the least-JCT plan (oracle-jct)",
                    f"{o.median_jct_s / r.median_jct_s:.2f}× at {o.resource_hours / r.resource_hours:.2f}× its "
                    "core-hours", None))
    return out


def profiling_target(jobs: pd.DataFrame, label: str) -> list[tuple[str, str, bool | None]]:
    """(goal, measured, met) of ``ours``' profiling on one scenario's ``label`` jobs of every seed
    (cold: day 1): the median share of the run its profile took in wall time over the profiled jobs
    of at least an hour (``sim.run.profiling``), at most 5 % cold (the paper profiles ~3 minutes of
    an hours-long job); reported for warm jobs."""
    ours = jobs[jobs["policy"] == "ours"]
    if label in ("cold", "warm"):
        ours = ours[(ours["day"] > 0) == (label == "warm")]
    shares = profiling(ours) if len(ours) else None
    if shares is None:
        return []
    measured = (f"{100 * shares['wall_share']:.1f} % in wall time ({100 * shares['cost_share']:.1f} % net of what "
                f"the probes trained) over {shares['jobs']} jobs")
    goal = "profiling ≤ 5 % of the run, jobs of ≥ 1 h (median)" if label == "cold" else \
        "profiling's share of the run, jobs of ≥ 1 h (median)"
    return [(goal, measured, bool(shares["wall_share"] <= 0.05) if label == "cold" else None)]


def by_family(jobs: pd.DataFrame, column: str = "truth") -> pd.DataFrame:
    """Median JCT (s) per value of ``column`` (the truth family, or the recurrence: daily, one-off,
    what shifted it) and policy over ``jobs`` (a failed job counts as ∞), with the jobs counted."""
    table = jobs.groupby([column, "policy"], sort=True)["jct_s"].median().unstack("policy")
    table.insert(0, "jobs", jobs[jobs["policy"] == jobs["policy"].iloc[0]].groupby(column).size())
    return table


def _commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (with uncommitted changes)" if dirty else head


def _markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def _shown(mean: pd.DataFrame) -> pd.DataFrame:
    shown = mean[["policy"]].copy()
    for metric in SUMMARY_COLUMNS[1:]:
        pct = metric in ("cpu_util", "mem_util", "completion_rate")
        f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:,.0f}")
        shown[metric] = ["n/a" if np.isnan(m) else (f(m) if np.isnan(c) else f"{f(m)} ± {f(c)}")
                         for m, c in zip(mean[metric], mean[metric + "_ci"])]
    return shown


def write_page(page: Path, args: argparse.Namespace, sections: list, families: dict, plots: list[Path],
               seconds: float) -> None:
    """The evaluation page, whole (see the module docstring)."""
    command = "python benchmarks/cluster_sim.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    images = page.parent / "img"
    images.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Cluster-scale evaluation (generated)", "",
        f"Generated by `{command}` at commit `{_commit()}` in {seconds / 60:.0f} minutes on "
        f"this machine; do not edit: run the command again. Method and policies: "
        "[the evaluation](evaluation.md#cluster-scale-evaluation-benchmarkssim).", "",
        f"{args.jobs} jobs a day × {args.days} days; report seeds {', '.join(map(str, args.seeds))} (the constants "
        f"were tuned on seeds {', '.join(map(str, TUNING_SEEDS))}, never on these); every policy pays the "
        "transitions of the runtime's measured table on pods (`optimizer/transition_costs.json`). "
        "Means over seeds ± a 95 % t-interval across seeds; a job that never completed counts as ∞.", "",
    ]
    for (scenario, label), mean, met in sections:
        lines += [f"## {scenario}, {label} jobs", "", _markdown(_shown(mean)), "", "| goal | measured | met |",
                  "|---|---|---|"]
        lines += [f"| {goal} | {value} | {'—' if ok is None else ('met' if ok else '**missed**')} |"
                  for goal, value, ok in met]
        lines.append("")
    for label, table in families.items():
        lines += [f"## Median JCT (s), {label}, every seed and day", "", _markdown(table.reset_index().round(0)), ""]
    for path in plots:
        target = images / f"cluster-{path.parent.parent.name}-{path.name}"
        shutil.copyfile(path, target)
        lines += [f"![{path.stem} ({path.parent.parent.name}, seed {args.seeds[0]})](img/{target.name})", ""]
    page.write_text("\n".join(lines))
    print(f"wrote {page}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000, help="jobs a day")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(REPORT_SEEDS))
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--objective", default="efficiency", choices=("efficiency", "throughput"))
    parser.add_argument("--large-fraction", type=float, default=0.05,
                        help="share of the families that are large PS jobs (default 0.05)")
    parser.add_argument("--one-off-fraction", type=float, default=0.1,
                        help="share of the families whose every run is a new job, no history ever (default 0.1)")
    parser.add_argument("--shift-fraction", type=float, default=0.1,
                        help="share of the families that shift once: tables or data × 2, or a new model (default 0.1)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--setup-dlrover", action="store_true")
    parser.add_argument("--out", default="benchmarks/out/cluster")
    parser.add_argument("--write-docs", type=Path, default=None, metavar="PAGE",
                        help="write the generated evaluation page (report seeds only), e.g. docs/cluster-evaluation.md")
    args = parser.parse_args()
    if args.write_docs and set(args.seeds) & set(TUNING_SEEDS):
        parser.error(f"--seeds {args.seeds}: a published page uses report seeds only, not {TUNING_SEEDS}")
    began = time.perf_counter()
    families: dict[str, pd.DataFrame] = {}
    plots: list[Path] = []
    policies = args.policies.split(",")
    for name in ("large_fraction", "one_off_fraction", "shift_fraction"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: a fraction in [0, 1]")

    tables = []
    for scenario in args.scenarios:
        cpu, memory = (max(v * args.jobs / 1000, floor) for v, floor in zip(SCENARIOS[scenario], FLOOR))
        for seed in args.seeds:
            cfg = SimConfig(jobs=args.jobs, days=args.days, seed=seed, cluster_cpu=cpu, cluster_memory_mb=memory,
                            large_fraction=args.large_fraction, one_off_fraction=args.one_off_fraction,
                            shift_fraction=args.shift_fraction)
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
            written = write_outputs(Path(args.out) / scenario / f"seed{seed}", summary, cis, runs, cfg, days)
            if seed == args.seeds[0]:
                plots += [p for p in written if p.suffix == ".png"]
            jobs = pd.concat([run.jobs for run in runs], ignore_index=True)
            families[scenario] = jobs if scenario not in families else pd.concat([families[scenario], jobs])
            for label, (table, _) in (days or {"all": (summary, None)}).items():
                tables.append(table.assign(scenario=scenario, days=label, seed=seed))

    table = pd.concat(tables, ignore_index=True)
    sections = []
    for (scenario, label), group in table.groupby(["scenario", "days"], sort=False):
        mean = across_seeds(group)
        print(f"\n== {scenario}, {label} jobs: mean over seeds {args.seeds} (± 95 % t-interval across seeds)")
        print(_shown(mean).to_string(index=False))
        met = targets(mean, label) + profiling_target(families[scenario], label)
        print("targets, on the means:")
        for goal, value, ok in met:
            print(f"  {goal}: {value} ({'reported' if ok is None else ('met' if ok else 'MISSED')})")
        sections.append(((scenario, label), mean, met))
    per_family = {f"{scenario}, per {column}": by_family(jobs, column) for scenario, jobs in families.items()
                  for column in ("truth", "recurrence")}
    for label, family_table in per_family.items():
        print(f"\n== {label}: median JCT (s), every seed and day")
        print(family_table.round(0).to_string())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(args.out) / "by_seed.csv", index=False)
    if args.write_docs:
        write_page(args.write_docs, args, sections, per_family, plots, time.perf_counter() - began)


if __name__ == "__main__":
    main()
