"""How long must a probe measure? Consecutive W-second windows of the master's throughput polls
against the rate of shards done over 36 s, on one configuration (2w×0.5 + 1ps×0.5).

    python benchmarks/probe_window.py    # run alone: it starts a real job
"""
import statistics, tempfile, time
import numpy as np
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.optimizer.types import Configuration
from airflow_dlrover.runtime.spec import JobSpec
l = LocalLauncher(tempfile.mkdtemp())
l.launch(JobSpec("win", samples=50_000_000), Configuration(2, 1, 0.5, 0.5, 1024, 1024))
try:
    time.sleep(8)
    s0 = l.master_call("win", "/status")["samples_done"]; t0 = time.time()
    readings = []  # (time, throughput) polled every 0.25 s
    while time.time() - t0 < 36:
        st = l.master_call("win", "/status"); readings.append((time.time() - t0, st["throughput"])); time.sleep(0.25)
    s1 = l.master_call("win", "/status")["samples_done"]; truth = (s1 - s0) / (time.time() - t0)
    t = np.array([r[0] for r in readings]); x = np.array([r[1] for r in readings])
    print(f"reference: {truth:,.0f} samples/s from shards done over {time.time()-t0:.0f}s; mean of polls {x.mean():,.0f}")
    for w in (1.0, 2.0, 3.0, 4.0):
        errs = [abs(x[(t >= a) & (t < a + w)].mean() / truth - 1) for a in np.arange(0, 36 - w, w)]
        print(f"window {w:.0f}s: {len(errs)} windows, median |error| {100*statistics.median(errs):.1f}%, max {100*max(errs):.1f}%")
finally:
    l.stop("win")
