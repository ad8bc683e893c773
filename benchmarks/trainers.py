"""Trainers of the user's (examples/ddp_dlrm, examples/ps_dlrm, examples/torchrec_dlrm) through the
launcher, measured, in each way each can report (run alone: the machine is small).

    python benchmarks/trainers.py [--runs ddp_dlrm:every_node torchrec_dlrm:rank0 …] [--quota-cpu 2] [--out DIR]

Reporting modes (docs/trainers.md): ``every_node`` (each node's own rate, in its metrics file),
``rank0`` (rank 0 alone, the job's rate and progress: ``reports_from="rank0"``), ``prometheus``
(every node's gauges, scraped). For each example and mode, in one run:

1. **profile**: the designed probes under the quota (all-reduce ones for ddp_dlrm, PS ones for
   ps_dlrm) through the local launcher, one bounded window each; the model fitted on them and
   its leave-one-configuration-out MAPE (the out-of-sample error ``dlrover-rm fit`` reports);
2. **restart cost**: every group restart the profile made (SIGTERM → first report of every new
   worker), against what the controller charges a resize (their median,
   ``Launcher.restart_cost_s``) and the default it would charge without them;
3. **JCT**: the same job (``--samples``) trained on the plan and on the example's default
   configuration (the quota split evenly, as a user would), each from a fresh checkpoint; the
   wall time of each, the plan's predicted against its measured throughput.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from airflow_dlrover.launchers.contract import TrainerSpec
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.lifecycle.profiling import profile_job
from airflow_dlrover.lifecycle.run import run_job
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.job_model import fit_job_model
from airflow_dlrover.optimizer.planner import plan
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import Configuration, Quota
from airflow_dlrover.optimizer.transitions import measured as measured_transitions
from airflow_dlrover.runtime.spec import JobSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: (kind, the default configuration a user would write for a 2-core quota, samples to train,
#: the reporting modes the trainer has)
SETUPS = {
    "ddp_dlrm": ("allreduce", Configuration(2, 0, 1.0, 0.0, 1024, 0), 6_000_000, ("every_node", "rank0", "prometheus")),
    "ps_dlrm": ("ps", Configuration(2, 2, 0.5, 0.5, 1024, 1024), 600_000, ("every_node",)),
    "torchrec_dlrm": ("allreduce", Configuration(2, 0, 1.0, 0.0, 2048, 0), 6_000_000, ("rank0",)),
}
RUNS = [f"{example}:{mode}" for example, setup in SETUPS.items() for mode in setup[3]]
METRICS_PORT = 9400


def spec(example: str, job_id: str, samples: int, reports: str = "every_node") -> JobSpec:
    kind = SETUPS[example][0]
    command = (sys.executable, str(EXAMPLES / example / "train.py"))
    if example == "ddp_dlrm" and reports == "rank0":
        command += ("--reports-from", "rank0")
    trainer = TrainerSpec(command=command, kind=kind, grace_s=30,
                          reports_from="rank0" if reports == "rank0" else "every_node",
                          metrics_port=METRICS_PORT if reports == "prometheus" else 0)
    return JobSpec(job_id=job_id, samples=samples, batch_size=512, trainer=trainer.to_dict())


def measure(example: str, quota: Quota, window_s: float, out: Path, reports: str = "every_node") -> dict:
    kind, default, samples, _ = SETUPS[example]
    out = out / f"{example}-{reports}"
    out.mkdir(parents=True, exist_ok=True)
    launcher = LocalLauncher(out / "jobs")
    probes = design_probes(quota, batch_size=512, allreduce=kind == "allreduce")
    job = spec(example, f"{example.replace('_', '-')}-profile", samples * 100, reports)  # never finishes while profiling
    started = time.monotonic()
    try:
        table = profile_job(launcher, job, quota, window_s=window_s, probes=probes)
        restarts = [e["restart_s"] for e in launcher.read_job(job.job_id)["events"] if e.get("event") == "restart"]
        charged = launcher.restart_cost_s(job.job_id)
    finally:
        launcher.stop(job.job_id)
    profile_s = time.monotonic() - started
    table.to_csv(out / f"{example}-profile.csv", index=False)
    model = fit_job_model(table)
    chosen = plan(model.throughput, model.memory, quota, "throughput", samples=samples)
    runs = {}
    for name, config in (("plan", chosen.config), ("default", default)):
        summary = run_job(launcher, spec(example, f"{example.replace('_', '-')}-{name}", samples, reports), config, out / name,
                          timeout_s=1800)
        runs[name] = {"config": config.describe(), "wall_s": summary["wall_s"],
                      "median_throughput": summary["median_throughput"], "samples_done": summary["samples_done"]}
    table = measured_transitions()
    return {
        "example": example, "reports": reports, "probes": len(probes), "measured": len(table), "profile_s": profile_s,
        "loco_mape": model.throughput.report.out_of_sample_mape, "in_sample_mape": model.throughput.report.in_sample_mape,
        "restart_s": restarts, "charged_s": charged,
        "default_charge_s": table.relaunch_s if kind == "allreduce" else table.ps_change_s,
        "predicted": chosen.predicted_throughput, "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", default=RUNS, choices=RUNS, help="example:reporting mode")
    parser.add_argument("--quota-cpu", type=float, default=2.0)
    parser.add_argument("--quota-memory", default="4Gi")
    parser.add_argument("--window", type=float, default=C.TRAINER_PROBE_WINDOW_S)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="trainers-"))
    quota = Quota.parse(args.quota_cpu, args.quota_memory)
    runs = [run.split(":") for run in args.runs]
    results = [measure(example, quota, args.window, out, mode) for example, mode in runs]
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    rows = []
    for r in results:
        plan_run, default_run = r["runs"]["plan"], r["runs"]["default"]
        rows.append({
            "example": f"{r['example']} ({r['reports']})", "probes": f"{r['measured']}/{r['probes']}", "profile s": round(r["profile_s"]),
            "LOCO MAPE": f"{r['loco_mape']:.1%}" if r["loco_mape"] is not None else "—",
            "restarts s (median)": f"{statistics.median(r['restart_s']):.1f} of {len(r['restart_s'])}",
            "charged s": f"{r['charged_s']:.1f} (default {r['default_charge_s']:.0f})",
            "plan": plan_run["config"], "plan JCT s": round(plan_run["wall_s"]),
            "plan + profile s (bound)": round(plan_run["wall_s"] + r["profile_s"]),
            "default": default_run["config"], "default JCT s": round(default_run["wall_s"]),
            "JCT ratio": f"{plan_run['wall_s'] / default_run['wall_s']:.2f}",
            "predicted / measured": f"{r['predicted']:,.0f} / {plan_run['median_throughput']:,.0f}",
        })
    print(pd.DataFrame(rows).T.to_string(header=False))
    print(f"\nresults: {out / 'results.json'}")


if __name__ == "__main__":
    main()
