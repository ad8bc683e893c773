"""The daily retrain DAG, measured: parse time, end-to-end time, profiling share (cold and warm
start), and the job's completion time against the same job on the DAG's baseline configuration.

    python benchmarks/dag.py [--samples N] [--skip-baseline] [--out benchmarks/out/dag]

Runs ``airflow dags test dlrm_daily_retrain`` twice in a fresh AIRFLOW_HOME (the second run is
warm-started from the first's model), then trains the same job on the baseline configuration
with the local launcher (``run_job``), and prints one table. Run it alone: the machine is small.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "dlrm_daily_retrain"


def airflow(env: dict[str, str], *args: str, log: Path | None = None) -> float:
    started = time.monotonic()
    with open(log or os.devnull, "w") as out:
        subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=env, check=True, stdout=out,
                       stderr=subprocess.STDOUT)
    return time.monotonic() - started


def parse_times(env: dict[str, str], repeats: int = 5) -> list[float]:
    """Seconds DagBag takes to parse dags/ in a fresh process (Airflow already imported)."""
    code = ("import time; from airflow.dag_processing.dagbag import DagBag; t = time.monotonic(); "
            f"bag = DagBag(dag_folder={str(ROOT / 'dags')!r}); assert not bag.import_errors, bag.import_errors; "
            "print(time.monotonic() - t)")
    return [float(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                 text=True).stdout.split()[-1]) for _ in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, help="job size (default: the DAG's default)")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "dag"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="dlrover-bench-home-"))
    env = dict(os.environ, AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False")
    conf = json.dumps({"samples": args.samples} if args.samples else {})

    parse = parse_times(env)
    airflow(env, "db", "migrate")
    from airflow_dlrover.history.store import HistoryStore  # after AIRFLOW_HOME is known

    os.environ["AIRFLOW_HOME"] = str(home)
    rows = []
    for start in ("cold", "warm"):
        wall = airflow(env, "dags", "test", DAG_ID, "-c", conf, log=out / f"dags-test-{start}.log")
        run = HistoryStore().runs(DAG_ID)[-1]
        report = run["summary"]
        rows.append({"start": start, "status": run["status"], "wall_s": wall, "run_s": report["run_seconds"],
                     "profile_s": report["profile_s"], "probes": report["probes"],
                     "share": report["profile_s"] / report["run_seconds"], "jct_s": report["jct_s"],
                     "measured": report["measured_throughput"], "predicted": report["predicted_throughput"],
                     "config": report["plan"], "baseline": report["baseline"], "job": report["job"]})
        (out / f"report-{start}.json").write_text(json.dumps(report, indent=2, default=str))

    print(f"\nDAG parse (DagBag of dags/, {len(parse)} fresh processes): median {1000 * statistics.median(parse):.0f} ms, "
          f"max {1000 * max(parse):.0f} ms")
    print(f"\n{'start':6}{'status':>11}{'dags test s':>12}{'run s':>8}{'profile s':>10}{'probes':>7}{'share':>7}"
          f"{'JCT s':>8}{'pred/s':>9}{'meas/s':>9}")
    for r in rows:
        print(f"{r['start']:6}{r['status']:>11}{r['wall_s']:>12.0f}{r['run_s']:>8.0f}{r['profile_s']:>10.1f}"
              f"{r['probes']:>7}{100 * r['share']:>6.1f}%{r['jct_s']:>8.0f}{r['predicted']:>9,.0f}{r['measured']:>9,.0f}")

    if not args.skip_baseline:
        from airflow_dlrover.launchers.local import LocalLauncher
        from airflow_dlrover.lifecycle.run import run_job
        from airflow_dlrover.optimizer.types import Configuration
        from airflow_dlrover.runtime.spec import JobSpec

        job_dir = home / "dlrover" / "jobs" / rows[-1]["job"]["job_id"]
        spec = JobSpec.load(job_dir / "spec.json")
        spec = JobSpec.from_json(json.dumps({**json.loads(spec.to_json()), "job_id": "baseline"}))
        baseline = Configuration(**{k: v for k, v in rows[-1]["baseline"].items() if k != "predicted_throughput"})
        started = time.monotonic()
        summary = run_job(LocalLauncher(home / "baseline-jobs"), spec, baseline, out / "baseline")
        jct = time.monotonic() - started
        print(f"\nJCT, same job ({spec.samples:,} samples), same machine, one benchmark run:")
        print(f"{'configuration':58}{'JCT s':>8}{'samples/s':>11}")
        for r in rows:
            c = r["config"]
            label = f"tuned, {r['start']} (incl. profiling): {c['workers']}w×{c['worker_cpu']:g} + {c['ps']}ps×{c['ps_cpu']:g}"
            print(f"{label:58}{r['jct_s']:>8.0f}{r['measured']:>11,.0f}")
        print(f"{'baseline: ' + baseline.describe()[:48]:58}{jct:>8.0f}{summary['median_throughput']:>11,.0f}")
        for r in rows:
            print(f"tuned/baseline JCT ({r['start']}): {r['jct_s'] / jct:.2f}")


if __name__ == "__main__":
    main()
