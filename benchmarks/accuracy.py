"""Accuracy of the throughput model on performance it was not written for.

    python benchmarks/accuracy.py [--held-out 60] [--grid PATH …] [--write-example PATH]

1. **The queueing simulation**: for each simulated system (default physics; a hot-PS skew; a
   PS-heavy model) and each training design, the sharpness q chosen, in-sample MAPE, leave-one-
   configuration-out (LOCO) MAPE, MAPE on held-out configurations (noise-free simulation, within
   64 cores), and how often the 90 % band covers the truth.
2. **Held-out families** (``sim.heldout``: generators and seeds frozen before the model was tuned
   on them): the model fitted on the cold probes (three windows, 5 % noise each) and scored on
   ``HELD_OUT_CONFIGS`` configurations up to 32 workers × 8 PS within 64 cores.
3. **Measured grids**: LOCO of the fit on each measured sample table: the runtime's grid on this
   machine (``benchmarks/runtime.py grid``: the simulator's calibration, and a later measurement)
   and any ``--grid`` (e.g. the example trainers' profiles that ``benchmarks/trainers.py`` writes).
4. **A warm start**: yesterday's model (of the same system, or of one whose dense part is 25 %
   slower) plus the warm probes, against a cold start on the cold probes.

``--write-example`` also writes the demo's bundled profile table (airflow_dlrover/data/).
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer.model import NO_SCALING, fit_throughput
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import Quota
from sim.heldout import HeldOutFamily, held_out_families
from sim.queueing import Physics, simulate_samples
from sim.truth import LOCAL_GRID

#: The runtime's grid measured again on this machine at the runtime's speed (``benchmarks/runtime.py
#: grid --repeats 3``, idle box): the same 21 configurations as ``LOCAL_GRID``, three windows each.
REMEASURED_GRID = LOCAL_GRID.with_name("local_grid_remeasured.csv")

QUOTA = Quota(cpu=64, memory_mb=256 * 1024)
COLUMNS = ["workers", "ps", "worker_cpu", "ps_cpu"]
SYSTEMS = {
    "default": Physics(),
    "hot PS (zipf 1.1)": Physics(zipf_skew=1.1),
    "PS-heavy (3× row cost)": Physics(ps_core_s_per_row=3e-6, ps_update_core_s_per_row=6e-6),
}


def candidate_configs(count: int, seed: int) -> pd.DataFrame:
    grid = pd.DataFrame(
        list(itertools.product((1, 2, 3, 4, 6, 8, 12, 16, 24), (1, 2, 3, 4, 6, 8), (0.5, 1, 2, 4), (0.5, 1, 2, 4))),
        columns=["workers", "ps", "worker_cpu", "ps_cpu"],
    )
    grid = grid[grid.workers * grid.worker_cpu + grid.ps * grid.ps_cpu <= QUOTA.cpu]
    return grid.sample(count, random_state=seed).reset_index(drop=True)


def designs(physics: Physics) -> dict[str, pd.DataFrame]:
    probes = design_probes(QUOTA)[["workers", "ps", "worker_cpu", "ps_cpu"]]
    extra = candidate_configs(13, seed=11)
    return {
        f"{len(probes)} cold probes × 3 windows": simulate_samples(probes, physics, windows=3, seed=1),
        "probes + 5 random × 2": simulate_samples(pd.concat([probes, extra.iloc[:5]]), physics, windows=2, seed=2),
        "probes + 13 random × 2": simulate_samples(pd.concat([probes, extra]), physics, windows=2, seed=3),
    }


#: The held-out families' test set: configurations up to 32 workers × 8 PS within the quota,
#: drawn once (seed frozen with the families').
HELD_OUT_CONFIGS = 80
HELD_OUT_NOISE_CV = 0.05


def held_out_grid() -> pd.DataFrame:
    """Every configuration up to 32 workers × 8 PS within the quota."""
    grid = pd.DataFrame(
        list(itertools.product((1, 2, 3, 4, 6, 8, 12, 16, 24, 32), (1, 2, 3, 4, 6, 8), (0.5, 1, 2, 4), (0.5, 1, 2, 4))),
        columns=COLUMNS,
    )
    grid = grid[grid.workers * grid.worker_cpu + grid.ps * grid.ps_cpu <= QUOTA.cpu]
    return grid.assign(worker_gpu=0, batch_size=512)


def held_out_configs() -> pd.DataFrame:
    return held_out_grid().sample(HELD_OUT_CONFIGS, random_state=17).reset_index(drop=True)


def family_samples(family: HeldOutFamily, windows: int = 3, seed: int = 0) -> pd.DataFrame:
    """The cold probes, ``windows`` windows each with ``HELD_OUT_NOISE_CV`` lognormal noise."""
    probes = design_probes(QUOTA, batch_size=family.batch).reset_index(drop=True)
    rows = pd.concat([probes] * windows, ignore_index=True)
    truth = family.throughput(*(rows[c].to_numpy(float) for c in COLUMNS))
    rng = np.random.default_rng([family.seed, seed])
    return rows.assign(throughput=truth * rng.lognormal(0.0, HELD_OUT_NOISE_CV, len(rows)))


def held_out_table(dense: int = 200) -> pd.DataFrame:
    """One row per held-out family: the cold probes' model (q, LOCO and held-out MAPE, band
    cover, fit time), and the form error — the held-out MAPE of a fit on ``dense`` other
    configurations without noise — with the core curve the fit chooses and with whole cores."""
    configs = held_out_configs()
    grid = held_out_grid().merge(configs[COLUMNS], how="left", indicator=True).query("_merge == 'left_only'")
    grid = grid.drop(columns="_merge").sample(dense, random_state=23)
    out = []
    for family in held_out_families():
        truth = family.throughput(*(configs[c].to_numpy(float) for c in COLUMNS))
        start = time.perf_counter()
        model = fit_throughput(family_samples(family), leave_one_out=True)
        elapsed = (time.perf_counter() - start) * 1000
        mape, cover = evaluate(model, configs, truth)
        rows = grid.assign(throughput=family.throughput(*(grid[c].to_numpy(float) for c in COLUMNS)))
        curve = fit_throughput(rows, leave_one_out=False)
        whole = fit_throughput(rows, scaling=NO_SCALING, leave_one_out=False)
        out.append(dict(family=family.name, q=model.sharpness, loco=model.report.out_of_sample_mape,
                        held_out=mape, cover=cover, fit_ms=elapsed, dense=evaluate(curve, configs, truth)[0],
                        curve=" ".join(f"{v:g}" for v in curve.scaling),
                        dense_whole_cores=evaluate(whole, configs, truth)[0]))
    return pd.DataFrame(out)


def grid_loco(path) -> tuple[int, float, float]:
    """(samples, q, LOCO MAPE) of the fit on a measured sample table."""
    table = pd.read_csv(path)
    model = fit_throughput(table, leave_one_out=True)
    return len(table), model.sharpness, model.report.out_of_sample_mape


def evaluate(model, held_out: pd.DataFrame, truth: np.ndarray) -> tuple[float, float]:
    x, lower, upper = model.predict(held_out)
    return float(np.mean(np.abs(x - truth) / truth)), float(np.mean((lower <= truth) & (truth <= upper)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--held-out", type=int, default=60)
    parser.add_argument("--grid", nargs="*", default=[], metavar="PATH", help="more measured sample tables")
    parser.add_argument("--write-example", metavar="PATH")
    args = parser.parse_args()

    held_out = candidate_configs(args.held_out, seed=5)
    header = f"{'system':24s} {'training design':28s} {'q':>4s} {'in-sample':>9s} {'LOCO':>6s} {'held-out':>8s} {'band cover':>10s} {'fit ms':>7s}"
    print(header)
    print("-" * len(header))
    for name, physics in SYSTEMS.items():
        truth = simulate_samples(held_out, replace(physics, noise_cv=0.0), seed=9)["throughput"].to_numpy()
        for design, samples in designs(physics).items():
            start = time.perf_counter()
            model = fit_throughput(samples)
            elapsed = (time.perf_counter() - start) * 1000
            mape, cover = evaluate(model, held_out, truth)
            r = model.report
            print(f"{name:24s} {design:28s} {model.sharpness:4g} {r.in_sample_mape:9.1%} {r.out_of_sample_mape:6.1%} {mape:8.1%} {cover:10.0%} {elapsed:7.0f}")

    print(f"\nheld-out families (sim.heldout; {HELD_OUT_CONFIGS} configurations up to 32 workers × 8 PS)")
    table = held_out_table()
    print(table.to_string(index=False, formatters={
        "loco": "{:.1%}".format, "held_out": "{:.1%}".format, "cover": "{:.0%}".format, "fit_ms": "{:.0f}".format,
        "dense": "{:.1%}".format, "dense_whole_cores": "{:.1%}".format}))
    print("(held_out: the cold probes' model; dense: the form error, a fit on 200 noise-free configurations, "
          "with the core curve (a_w a_p ℓ) it chose and with whole cores)")
    print(f"worst held-out MAPE {table.held_out.max():.1%}; median {table.held_out.median():.1%}")

    print("\nmeasured grids: leave-one-configuration-out MAPE")
    for path in [LOCAL_GRID, REMEASURED_GRID, *args.grid]:
        n, q, loco = grid_loco(path)
        print(f"{str(path):60s} {n:4d} samples  q={q:g}  LOCO {loco:.1%}")

    today = Physics()
    truth = simulate_samples(held_out, replace(today, noise_cv=0.0), seed=9)["throughput"].to_numpy()
    cold_probes = design_probes(QUOTA)
    cold = fit_throughput(simulate_samples(cold_probes, today, windows=3, seed=4), leave_one_out=False)
    scenarios = {
        "the same system (a new day)": today,
        "a system with a 25 % slower dense part": replace(today, dense_core_s_per_sample=today.dense_core_s_per_sample * 1.25),
    }
    for label, yesterday in scenarios.items():
        print(f"\nwarm start: today = default system; yesterday's model fitted on {label}")
        prior = fit_throughput(designs(yesterday)["probes + 5 random × 2"], leave_one_out=False)
        warm_probes = design_probes(QUOTA, prior=prior)
        warm = fit_throughput(simulate_samples(warm_probes, today, windows=3, seed=4), prior, leave_one_out=False)
        print(f"{'':40s} {'probes':>6s} {'held-out':>8s} {'band cover':>10s}")
        for name, count, model in (("yesterday's model, no profiling", 0, prior),
                                   (f"cold: {len(cold_probes)} probes × 3 windows", len(cold_probes), cold),
                                   (f"warm: {len(warm_probes)} probes × 3 windows + prior", len(warm_probes), warm)):
            mape, cover = evaluate(model, held_out, truth)
            print(f"{name:40s} {count:6d} {mape:8.1%} {cover:10.0%}")

    if args.write_example:
        table = designs(Physics())["probes + 5 random × 2"]
        table.round(3).to_csv(args.write_example, index=False)
        print(f"\nwrote {len(table)} samples to {args.write_example}")


if __name__ == "__main__":
    main()
