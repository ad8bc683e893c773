"""How long must a probe measure? Windows of W seconds measured as the profiling does
(Σ_workers Δsamples/Δt between the workers' last reports, ``launchers.watch.job_throughput``),
replayed from the master's report log, against the rate of shards done over 40 s on one
configuration (2w×0.5 + 1ps×0.5), with the workers reporting as while profiled
(``timings.PROBE_REPORT_INTERVAL_S``).

    python benchmarks/probe_window.py    # run alone: it starts a real job
"""

import json
import statistics
import tempfile
import time

import numpy as np

from airflow_dlrover import timings as T
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.launchers.watch import job_throughput
from airflow_dlrover.optimizer.types import Configuration
from airflow_dlrover.runtime.spec import JobSpec

launcher = LocalLauncher(tempfile.mkdtemp())
launcher.launch(JobSpec("win", samples=50_000_000), Configuration(2, 1, 0.5, 0.5, 1024, 1024))
try:
    launcher.master_call("win", "/report_interval", {"seconds": T.PROBE_REPORT_INTERVAL_S})
    time.sleep(8)
    s0, t0 = launcher.master_call("win", "/status")["samples_done"], time.time()
    time.sleep(40)
    s1, t1 = launcher.master_call("win", "/status")["samples_done"], time.time()
finally:
    launcher.stop("win")
truth = (s1 - s0) / (t1 - t0)
reports = [json.loads(line) for line in (launcher.job_dir("win") / "metrics.jsonl").read_text().splitlines()]
reports = [r for r in reports if r.get("role") == "worker" and t0 <= r["time"] <= t1]


def latest(at: float) -> dict[str, tuple[float, float]]:
    out = {}
    for r in reports:
        if r["time"] <= at:
            out[r["node"]] = (float(r["samples"]), float(r["time"]))
    return out


print(f"reference: {truth:,.0f} samples/s from the shards done over {t1 - t0:.0f} s")
print(f"{'window':>8}{'windows':>9}{'median error':>14}{'median |error|':>16}{'max |error|':>13}")
for w in (0.5, 1.0, 1.5, 2.0, 3.0, 4.0):
    errors = []
    for a in np.arange(t0 + 1.5, t1 - w, w):
        x = job_throughput(latest(a), latest(a + w))
        if x is not None:
            errors.append(x / truth - 1)
    size = [abs(e) for e in errors]
    print(f"{w:>7.1f}s{len(errors):>9}{100 * statistics.median(errors):>+13.1f}%{100 * statistics.median(size):>15.1f}%"
          f"{100 * max(size):>12.1f}%")
