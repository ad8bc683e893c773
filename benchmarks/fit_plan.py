"""Speed of the optimizer: fit time, plan time over the largest range, 10,000 plans in a row.

    python benchmarks/fit_plan.py [--repeats 7] [--plans 10000]

Prints medians over repeats (the machines are shared and noisy: read ratios, not single times).
Targets (issue #2): fit ≤ 20 ms for 200 samples; a plan ≤ 100 ms; 10,000 plans ≤ 60 s. The planner at
scale (issue 20: up to 1,024 workers and 256 PS, GPUs, quotas to 16,384 cores) is benchmarks/planner_scale.py.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np
import pandas as pd

from sim.synthetic import model_samples  # samples from known θ

from airflow_dlrover.optimizer import constants as C  # noqa: E402
from airflow_dlrover.optimizer.memory import MemoryModel  # noqa: E402
from airflow_dlrover.optimizer.model import fit_throughput  # noqa: E402
from airflow_dlrover.optimizer.planner import plan  # noqa: E402
from airflow_dlrover.optimizer.types import Quota  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def samples_of_size(n: int) -> pd.DataFrame:
    configs = list(itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8), (0.5, 1, 2, 4), (0.5, 1, 2, 4)))
    rng = np.random.default_rng(0)
    picked = [configs[i] for i in rng.integers(len(configs), size=n)]
    return model_samples(configs=picked, noise=0.05, seed=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--plans", type=int, default=10_000)
    args = parser.parse_args()

    rows = []
    for n in (200, 2000):
        table = samples_of_size(n)
        configs = table.groupby(["workers", "ps", "worker_cpu", "ps_cpu"]).ngroups
        rows.append((f"fit {n} samples ({configs} configs), q fixed (+ 5-fold held-out error)", timed(lambda: fit_throughput(table, sharpness=2.0, leave_one_out=False), args.repeats), ""))
        rows.append((f"fit {n} samples, q by 5-fold CV + held-out error (default)", timed(lambda: fit_throughput(table, leave_one_out=False), args.repeats), "≤ 20 ms at 200"))
        rows.append((f"fit {n} samples + leave-one-configuration-out", timed(lambda: fit_throughput(table, leave_one_out=True), max(1, args.repeats // 3)), "(CLI `fit`)"))

    model = fit_throughput(samples_of_size(200), leave_one_out=False)
    memory = MemoryModel(400, 8000, 900, 0.5, table_growth_mb_per_m_samples=20)
    everything = Quota(cpu=1e6, memory_mb=1e12)
    rows.append(("plan, largest range, throughput", timed(lambda: plan(model, memory, everything), args.repeats), "≤ 100 ms"))
    rows.append(("plan, largest range, efficiency", timed(lambda: plan(model, memory, everything, "efficiency"), args.repeats), "≤ 100 ms"))
    rows.append(("plan, largest range, deadline", timed(lambda: plan(model, memory, everything, "deadline", samples=1e8, deadline_s=3600), args.repeats), "≤ 100 ms"))

    rng = np.random.default_rng(2)
    quotas = [Quota(cpu=float(c), memory_mb=float(m), max_nodes=int(n))
              for c, m, n in zip(rng.choice([16, 32, 64, 128, 256, 512, 1024], args.plans),
                                 rng.choice([64, 256, 1024, 4096], args.plans) * 1024.0,
                                 rng.integers(8, 200, args.plans))]
    start = time.perf_counter()
    for quota in quotas:
        plan(model, memory, quota, samples=1e8)
    total = time.perf_counter() - start
    rows.append((f"{args.plans:,} plans in a row (random quotas 16–1024 cores)", total, "≤ 60 s"))

    print(f"{'measurement':62s} {'median':>12s}  target")
    for name, seconds, target in rows:
        shown = f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"
        print(f"{name:62s} {shown:>12s}  {target}")
    print(f"\nrange: w ≤ {C.PLAN_MAX_WORKERS}, p ≤ {C.PLAN_MAX_PS} (as the quota allows), λ ∈ {C.GRID_CPU_VALUES}")


if __name__ == "__main__":
    main()
