"""Fit error of the throughput model on each truth family of the cluster simulation.

    python benchmarks/fit_error.py [--cpu 128] [--draws 8] [--dense 300] [--held-out 300] [--seed 0]

For each family (``sim.fit_error``): the held-out MAPE on the planner's grid within the quota of
the model fitted on the cold probes with the simulator's noise (what a cold start plans with),
of the model fitted on the same probes without noise, and of the model fitted on a dense
noise-free grid (the error of the model's form on that family). Random families are drawn ``--draws`` times: the median and the range over the draws.
The last row is the model's own formula (a dense model's predictions refitted): it shows what a
family inside the model's span scores. Nothing here is asserted: it prints what it measures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_dlrover.optimizer.types import Quota  # noqa: E402
from sim.fit_error import fit_error, fit_error_table, own_formula  # noqa: E402
from sim.truth import MovingHotShard  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", type=float, default=128.0, help="the quota's cores")
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--dense", type=int, default=300)
    parser.add_argument("--held-out", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    start = time.perf_counter()
    quota = Quota(cpu=args.cpu, memory_mb=1024.0 * 1024)
    table = fit_error_table(quota, draws=args.draws, dense=args.dense, held_out=args.held_out, seed=args.seed)
    own = fit_error(own_formula(MovingHotShard(seed=5), quota, args.dense, args.seed), quota, dense=args.dense,
                    held_out=args.held_out, seed=args.seed)
    print(f"quota {args.cpu:g} cores; held-out MAPE on {args.held_out} planner-grid configurations (fewer where the grid is small)")
    header = (f"{'family':20s} {'draws':>5s} {'from probes':>18s} {'noise-free probes':>18s}   "
              f"{'dense grid (form error)':24s}")
    print(header)
    print("-" * len(header))
    for row in table.itertuples():
        probes = f"{row.probes_median:6.1%}" + (f" (≤ {row.probes_max:6.1%})" if row.draws > 1 else " " * 11)
        dense = f"{row.dense_median:6.1%}" + (f" ({row.dense_min:.1%}–{row.dense_max:.1%})" if row.draws > 1 else "")
        print(f"{row.family:20s} {row.draws:5d} {probes:>18s} {row.exact_median:18.1%}   {dense:<24s}")
    print(f"{'the model itself':20s} {1:5d} {own.probes:6.1%}{'':11s} {own.probes_exact:18.1e}   {own.dense:.1e}")
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
