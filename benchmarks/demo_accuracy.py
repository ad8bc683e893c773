"""The cold demo, repeated: how well the chosen plan's prediction holds, what memory the plan
uses of what it asks, and what profiling costs.

    python benchmarks/demo_accuracy.py [--runs 3] [--out benchmarks/out/demo]

Each run is ``make demo`` in a fresh AIRFLOW_HOME (a cold start: no history), run one after the
other (the machine is small: run it alone); with ``--similar``, each is followed in the same home
by ``ctr_daily_retrain`` (another job on the demo's layout: a prior from similar jobs), a row of
its own. From each run's report (the report task's
``report.json``): the plan's predicted throughput against the median of the fine-tune's windows
on the plan, |predicted − measured| / measured; per-role memory and CPU utilisation (median
used / allocated over the windows); the profiling share of the run (probes, and the launch's
plan checks, ``Plan.extrapolation``) and its cost to the run (``report.profiling_cost_s``: the
probes train the job); OOM kills. Prints one row per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_demo(home: Path) -> dict:
    """``make demo`` in ``home``; the run's report, with the wall time and the OOM kills."""
    started = time.monotonic()
    subprocess.run(["make", "-s", "demo", f"DEMO_HOME={home}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.STDOUT)
    return read_report(home, "dlrm-daily-retrain", home / "dags-test.log", started)


def run_similar(home: Path) -> dict:
    """``ctr_daily_retrain`` in the home of a demo run: a new job on its layout."""
    started = time.monotonic()
    log = home / "ctr-test.log"
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags")}
    with log.open("w") as out:
        subprocess.run([str(ROOT / ".venv" / "bin" / "airflow"), "dags", "test", "ctr_daily_retrain"], cwd=ROOT,
                       env=env, check=True, stdout=out, stderr=subprocess.STDOUT)
    return read_report(home, "ctr-daily-retrain", log, started)


def read_report(home: Path, job: str, log: Path, started: float) -> dict:
    """The report of ``job``'s run in ``home`` (its launcher job id starts with the job's name)."""
    [path] = (home / "dlrover" / "jobs").glob(f"{job}-*/report.json")
    report = json.loads(path.read_text())
    report["wall_s"] = time.monotonic() - started
    report["oom_kills"] = log.read_text().count("OOM-killed")
    return report


def row(report: dict) -> dict:
    predicted, measured = report["predicted_throughput"], report["measured_throughput"]
    util = report["utilisation"]
    return {
        "predicted": predicted, "measured": measured, "error": abs(predicted - measured) / measured,
        "signed": predicted / measured - 1, "profile_share": report["profile_share"],
        "profile_cost_share": report["profile_cost_share"],
        "probes": report["probes"], "checks": report.get("plan_checks", 0), "jct_s": report["jct_s"],
        "worker_memory": util["worker_memory"], "ps_memory": util["ps_memory"], "worker_cpu": util["worker_cpu"],
        "ps_cpu": util["ps_cpu"], "oom_kills": report["oom_kills"], "status": report["status"],
        "plan": "{workers}w×{worker_cpu:g} + {ps}ps×{ps_cpu:g}, {worker_memory_mb:g}/{ps_memory_mb:g} MB".format(
            **report["plan"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "demo"))
    parser.add_argument("--similar", action="store_true", help="after each, a new job on its layout")
    args = parser.parse_args()
    out = Path(args.out)
    rows, similar = [], []
    for k in range(args.runs):
        home = out / f"run-{k + 1}"
        subprocess.run(["rm", "-rf", str(home)], check=True)
        rows.append(row(run_demo(home)))
        print(f"run {k + 1}: {rows[-1]['plan']}", file=sys.stderr)
        if args.similar:
            similar.append(row(run_similar(home)))
            print(f"similar {k + 1}: {similar[-1]['plan']}", file=sys.stderr)
    table(rows, "cold")
    if similar:
        table(similar, "similar (ctr_daily_retrain after the cold run)")
    (out / "summary.json").write_text(json.dumps({"cold": rows, "similar": similar}, indent=1))


def table(rows: list[dict], title: str) -> None:
    print(title)
    header = (f"{'run':>4} {'predicted':>10} {'measured':>10} {'error':>7} {'profiling':>10} {'cost':>6} {'probes':>7} "
              f"{'w_mem':>6} {'ps_mem':>6} {'w_cpu':>6} {'ps_cpu':>6} {'OOM':>4} {'JCT s':>6}  status")
    print(header)
    print("-" * len(header))
    for k, r in enumerate(rows, 1):
        print(f"{k:>4} {r['predicted']:>10,.0f} {r['measured']:>10,.0f} {100 * r['signed']:>+6.1f}% "
              f"{100 * r['profile_share']:>9.1f}% {100 * r['profile_cost_share']:>5.1f}% "
              f"{r['probes']:>4}+{r['checks']:<2} {100 * r['worker_memory']:>5.0f}% "
              f"{100 * r['ps_memory']:>5.0f}% {100 * r['worker_cpu']:>5.0f}% {100 * r['ps_cpu']:>5.0f}% "
              f"{r['oom_kills']:>4} {r['jct_s']:>6.0f}  {r['status']}")
    median = {k: statistics.median(r[k] for r in rows) for k in
              ("error", "profile_share", "profile_cost_share", "worker_memory", "ps_memory", "jct_s")}
    print(f"median |predicted − measured| / measured {100 * median['error']:.1f} %; profiling "
          f"{100 * median['profile_share']:.1f} % of the run (its cost to the run "
          f"{100 * median['profile_cost_share']:.1f} %); memory utilisation worker "
          f"{100 * median['worker_memory']:.0f} %, PS {100 * median['ps_memory']:.0f} %; JCT {median['jct_s']:.0f} s")


if __name__ == "__main__":
    main()
