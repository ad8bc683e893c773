"""The user-data path, measured (run alone: the machine is small).

    python benchmarks/data.py reader    [--gb 0.25 1 2]     rows/s per core and a reader's peak RSS
    python benchmarks/data.py training  [--repeats 3]       job throughput: synthetic vs its Parquet copy
    python benchmarks/data.py ps-memory [--samples 3e6]     26 tables × 1M rows × dim 16 on 2 PS

reader     writes Parquet copies of the synthetic data (row groups of 65,536 rows) of each size, and
           streams each through ``TabularSource`` shard by shard (8,192 rows), as a worker does, in a
           fresh process pinned to one core; against the synthetic source the same way. Prints rows/s
           and the process's peak RSS: the goal is an RSS independent of the dataset's size.
training   the demo's plan (3 workers × 0.5 core + 1 PS × 0.5 core) on synthetic data and on its
           Parquet copy, alternated; the workers' samples/s over 8 s after a 4 s warm-up
           (``runtime.measure``; goal: Parquet ≥ 0.9×).
ps-memory  26 tables of 1,000,000 rows, dim 16, 2 PS, uniform ids (so the tables fill: ~1.9 GB per
           PS): the memory model fitted on the first quarter of the run (as a profile would, with the
           layout's bound) forecasts each PS's peak; against the peak the cgroup measured, and against
           the layout's equation with the rows the PS actually holds (goal: ±15 %).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from runtime import measure

from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.optimizer.types import Configuration
from airflow_dlrover.runtime.datasets import write_synthetic
from airflow_dlrover.runtime.spec import JobSpec

ROW_GROUP = 65_536
READER = """
import resource, sys, time
from airflow_dlrover.runtime.layout import FeatureLayout
from airflow_dlrover.runtime.data import FeatureSpec, SyntheticSource
from airflow_dlrover.runtime.datasets import TabularSource, scan
data, rows = sys.argv[1], int(sys.argv[2])
if data == "synthetic":
    source = SyntheticSource(FeatureSpec(13, (20_000,) * 26))
else:
    source = TabularSource(scan(data, FeatureLayout.criteo()), FeatureLayout.criteo())
    rows = len(source)
t = time.perf_counter()
for a in range(0, rows, 8192):
    source.samples(a, min(a + 8192, rows))
print(rows / (time.perf_counter() - t), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rows)
"""


def _read(data: str, rows: int) -> tuple[float, float, int]:
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", READER, data, str(rows)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def _size_gb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*.parquet")) / 1e9


def cmd_reader(args) -> None:
    print(f"{'source':28s} {'rows':>11s} {'on disk':>8s} {'rows/s (1 core)':>16s} {'peak RSS':>9s}")
    rate, rss, _ = _read("synthetic", 2_000_000)
    print(f"{'synthetic':28s} {2_000_000:11,d} {'—':>8s} {rate:16,.0f} {rss:7.0f} MB")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        rows_per_gb = None
        for gb in args.gb:
            folder = Path(tmp) / f"d{gb:g}"
            if rows_per_gb is None:  # calibrate: bytes per row of this data in Parquet
                write_synthetic(str(Path(tmp) / "probe"), 200_000, row_group_rows=ROW_GROUP)
                rows_per_gb = 200_000 / _size_gb(Path(tmp) / "probe")
            rows = int(gb * rows_per_gb)
            write_synthetic(str(folder), rows, files=max(1, int(gb * 4)), row_group_rows=ROW_GROUP)
            rate, rss, rows = _read(str(folder), 0)
            print(f"{'parquet, ' + str(len(list(folder.glob('*.parquet')))) + ' files':28s} {rows:11,d} "
                  f"{_size_gb(folder):6.2f} GB {rate:16,.0f} {rss:7.0f} MB", flush=True)


def cmd_training(args) -> None:
    config = Configuration(3, 1, 0.5, 0.5, 2048, 2048)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        write_synthetic(str(Path(tmp) / "copy"), 3_000_000, files=4, row_group_rows=ROW_GROUP)
        launcher = LocalLauncher(Path(tmp) / "jobs", CgroupManager())
        rates: dict[str, list[float]] = {"synthetic": [], "parquet": []}
        for repeat in range(args.repeats):
            for kind in rates:
                spec = JobSpec(job_id=f"{kind}-{repeat}", samples=2_400_000 if kind == "synthetic" else None,
                               data="synthetic" if kind == "synthetic" else str(Path(tmp) / "copy"),
                               checkpoint_interval_s=30.0)
                rates[kind].append(measure(launcher, config, spec.job_id, spec=spec)["throughput"])
                print(f"{kind:9s} run {repeat + 1}: {rates[kind][-1]:8,.0f} samples/s", flush=True)
    syn, pq = statistics.median(rates["synthetic"]), statistics.median(rates["parquet"])
    print(f"\n{config.describe()}: median synthetic {syn:,.0f}, Parquet {pq:,.0f} samples/s; ratio {pq / syn:.2f} "
          f"(goal ≥ 0.90; {args.repeats} alternated runs each)")


def cmd_ps_memory(args) -> None:
    import pandas as pd

    from airflow_dlrover.optimizer.memory import fit_memory
    from airflow_dlrover.optimizer import constants as C

    config = Configuration(2, 2, 0.5, 0.5, 2048, 4096)
    spec = JobSpec(job_id="psmem", samples=int(args.samples), table_sizes=(1_000_000,) * 26, embedding_dim=16,
                   bottom_mlp=(64, 16), zipf_skew=args.zipf_skew, checkpoint_interval_s=3600.0)
    layout = spec.layout
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        launcher = LocalLauncher(Path(tmp) / "jobs", CgroupManager())
        job_id = launcher.launch(spec, config)
        rows, peaks = [], {}
        try:
            while True:
                status = launcher.master_call(job_id, "/status")
                metrics = launcher.metrics(job_id)
                ps = [u for u in metrics["usage"].values() if u["role"] == "ps"]
                workers = [u for u in metrics["usage"].values() if u["role"] == "worker"]
                if ps and workers:
                    rows.append({**config.to_row(), "throughput": max(status["throughput"], 1.0),
                                 "ps_memory_used_mb": float(np.mean([u["memory_mb"] for u in ps])),
                                 "worker_memory_used_mb": float(np.mean([u["memory_mb"] for u in workers])),
                                 "samples_seen": status["samples_done"], "timestamp": time.time()})
                    for name, u in metrics["usage"].items():
                        if u["role"] == "ps":
                            peaks[name] = max(peaks.get(name, 0.0), u["memory_peak_mb"] or u["memory_mb"])
                if status["state"] in ("finishing", "done"):
                    break
                time.sleep(2.0)
            checkpoint = launcher.master_call(job_id, "/checkpoint", {})
            touched = np.zeros(len(layout.sparse))
            for path in checkpoint["files"]:
                with np.load(path) as data:
                    touched += [len(data[f"t{t}_ids"]) for t in range(len(layout.sparse))]
        finally:
            launcher.stop(job_id)
    table = pd.DataFrame(rows)
    early = table[table["samples_seen"] <= 0.25 * spec.samples]
    capacity = layout.table_mb()
    model = fit_memory(early, table_capacity_mb=capacity)
    forecast = float(model.ps_peak_mb(config.ps, spec.samples))
    unbounded = float(dataclasses.replace(model, table_capacity_mb=None, table_asymptote_mb=None)
                      .ps_peak_mb(config.ps, spec.samples))
    equation = C.PS_PROCESS_BASE_MB + layout.table_mb(tuple(touched), ps=config.ps) / config.ps
    measured = statistics.median(peaks.values())
    print(f"26 tables × 1,000,000 rows × dim 16, {config.describe()}, {spec.samples:,} samples, zipf skew "
          f"{args.zipf_skew:g}; rows touched {touched.sum() / layout.table_sizes[0] / 26:.0%} of the tables; "
          f"every row touched: {capacity:,.0f} MB over all PS")
    print(f"{'':46s} {'MB per PS':>10s} {'vs measured':>11s}")
    print(f"{'measured peak (cgroup, median of the PS)':46s} {measured:10,.0f}")
    for label, value in (("layout equation, rows the PS hold", equation),
                         (f"memory model fitted on {len(early)} early windows", forecast),
                         ("the same as a line, unbounded", unbounded)):
        print(f"{label:46s} {value:10,.0f} {value / measured - 1:+10.1%}")
    print(f"(model: base {model.ps_base_mb:.0f} MB + table {model.table_mb:.0f} MB + growth "
          f"{model.table_growth_mb_per_m_samples:.0f} MB per 10⁶ samples at first, "
          f"towards {model.asymptote_mb:,.0f} MB "
          f"(every row: {capacity:,.0f} MB); goal ±15 %)")
    print(json.dumps({"measured_mb": measured, "equation_mb": equation, "forecast_mb": forecast, "unbounded_mb": unbounded,
                      "peaks_mb": peaks}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"), help="where the datasets are written")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("reader")
    p.add_argument("--gb", type=float, nargs="+", default=[0.25, 1.0, 2.0])
    p.set_defaults(func=cmd_reader)
    p = sub.add_parser("training")
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(func=cmd_training)
    p = sub.add_parser("ps-memory")
    p.add_argument("--samples", type=float, default=3e6)
    p.add_argument("--zipf-skew", type=float, default=0.0)
    p.set_defaults(func=cmd_ps_memory)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
