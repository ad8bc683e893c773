"""The planner at the scale of a real cluster (issue 20): up to 1,024 workers and 256 PS, GPUs, ps = 0.

    python benchmarks/planner_scale.py [--repeats 5] [--plans 10000] [--processes 2] [--exhaustive]

Prints one table, medians over ``--repeats`` (wall and CPU time of this process: on a shared machine
the wall time is the CPU time plus the wait for a core; read both):

* the per-plan setup (the range, the memory per node of every (w, p), the model's separable
  coefficients: nothing is cached between plans, so this is the precomputation a plan pays);
* a plan over the largest range (16,384 cores: w ≤ 1,024, p ≤ 256, 7 × 7 node sizes), each objective,
  for a PS job, a PS job with GPUs (g ∈ {0, 1, 2, 4, 8}) and an all-reduce job (ps = 0) with GPUs;
* the exhaustive search beside the structured one on a quota it can still enumerate (and, with
  ``--exhaustive``, on the largest range: minutes and GBs);
* ``--plans`` plans in a row for random quotas: cores log-uniform in 16–16,384, memory 1–8 GiB a
  core, a node limit on a third of them, the three objectives in turn, the PS model — over
  ``--processes`` processes (the 2 cores of the target).

Targets (issue 20): a plan ≤ 100 ms, the precomputation ≤ 1 s, 10,000 plans ≤ 60 s on 2 cores.
Each row says whether its median met its target; a missed one is printed as missed.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import time

import numpy as np
import pandas as pd

from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA, TRUE_THETA, model_samples  # noqa: E402

from airflow_dlrover.optimizer import planner  # noqa: E402
from airflow_dlrover.optimizer.memory import MemoryModel  # noqa: E402
from airflow_dlrover.optimizer.model import fit_throughput  # noqa: E402
from airflow_dlrover.optimizer.types import InvalidInputError, Quota  # noqa: E402

LARGEST = 16_384.0
MEMORY = MemoryModel(400.0, 8000.0, 900.0, 0.5, table_growth_mb_per_m_samples=20.0)
AR_MEMORY = MemoryModel(None, None, 3000.0, 0.5, table_growth_mb_per_m_samples=20.0, table_capacity_mb=6000.0)


def models():
    """The demo job's model (fitted on 200 noisy samples, as fit_plan.py), one with GPU samples, an all-reduce one."""
    configs = [(w, p, lw, lp) for w in (1, 2, 4, 8, 16) for p in (1, 2, 4, 8) for lw in (0.5, 1, 2, 4) for lp in (0.5, 1, 2, 4)]
    pick = [configs[i] for i in np.random.default_rng(0).integers(len(configs), size=200)]
    ps = fit_throughput(model_samples(configs=pick, noise=0.05, seed=1), leave_one_out=False)
    gpu = fit_throughput(pd.concat([model_samples(configs=pick[:60], noise=0.05, seed=2),
                                    model_samples(dict(TRUE_THETA, gpu_compute=2e-5), configs=pick[60:120], gpu=1,
                                                  noise=0.05, seed=3)]), leave_one_out=False)
    allreduce = fit_throughput(pd.concat([
        model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.02, windows=2, seed=3),
        model_samples(dict(ALLREDUCE_THETA, gpu_compute=2e-5), ALLREDUCE_CONFIGS, gpu=1, noise=0.02, seed=4)]),
        leave_one_out=False)
    return ps, gpu, allreduce


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median wall s, median CPU s) of ``fn``."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def setup(model, memory, quota: Quota, allreduce: bool = False) -> None:
    """What a plan computes before it searches: its range, every (w, p)'s memory, the separable form."""
    rng = planner.search_range(quota.cpu, allreduce=allreduce, largest_node_cpu=model.report.largest_node_cpu)
    mem = planner._NodeMemory.of(rng, quota, memory, 512, 1e8, None, None)
    planner._allowed_pairs(rng, quota, ())
    planner._Separable.of(model, rng, 512)
    return rng, mem


def random_quotas(count: int, seed: int = 2) -> list[Quota]:
    rng = np.random.default_rng(seed)
    cores = np.exp(rng.uniform(math.log(16), math.log(LARGEST), count))
    cores = np.round(cores * 2) / 2
    memory = cores * rng.uniform(1, 8, count) * 1024
    nodes = rng.integers(8, 600, count)
    limited = rng.random(count) < 1 / 3
    return [Quota(float(c), float(m), max_nodes=int(n) if lim else None) for c, m, n, lim in zip(cores, memory, nodes, limited)]


OBJECTIVES = ("throughput", "efficiency", "deadline")


def _plan_many(args) -> tuple[float, float, list[float], int]:
    """(wall s, CPU s, each plan's wall s, refused) of plans for ``quotas`` (one process)."""
    model, quotas, offset = args
    each, refused = [], 0
    wall, cpu = time.perf_counter(), time.process_time()
    for i, quota in enumerate(quotas):
        objective = OBJECTIVES[(offset + i) % 3]
        extra = dict(samples=1e8, deadline_s=1e8 / (2e3 * math.sqrt(quota.cpu))) if objective == "deadline" else dict(samples=1e8)
        start = time.perf_counter()
        try:
            planner.plan(model, MEMORY, quota, objective, **extra)
        except InvalidInputError:  # a deadline out of reach, a quota too small for the tables
            refused += 1
        each.append(time.perf_counter() - start)
    return time.perf_counter() - wall, time.process_time() - cpu, each, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plans", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--exhaustive", action="store_true", help="also the exhaustive search of the largest range")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    ps_model, gpu_model, ar_model = models()
    rows: list[tuple[str, float, float, str, float | None]] = []  # name, wall, cpu, target text, target s

    largest = Quota(LARGEST, 64 * 1024 * 1024.0)
    with_gpu = Quota(LARGEST, 64 * 1024 * 1024.0, gpu=8 * 1024)
    rng, _ = setup(ps_model, MEMORY, largest)
    rows.append((f"setup of a plan, largest range ({rng.size / 1e6:.1f} M configurations: node sizes ≤ 2× the fitted)",
                 *timed(lambda: setup(ps_model, MEMORY, largest), args.repeats), "≤ 1 s", 1.0))
    gpu_rng = planner.search_range(LARGEST, gpu_values=(0, 1, 2, 4, 8), largest_node_cpu=gpu_model.report.largest_node_cpu)
    rows.append((f"setup, largest range with GPUs ({gpu_rng.size / 1e6:.1f} M)",
                 *timed(lambda: setup(gpu_model, MEMORY, with_gpu), args.repeats), "≤ 1 s", 1.0))
    cases = [("PS job", ps_model, MEMORY, largest), ("PS job, GPUs", gpu_model, MEMORY, with_gpu),
             ("all-reduce (ps = 0), GPUs", ar_model, AR_MEMORY, with_gpu)]
    for label, model, memory, quota in cases:
        for objective in OBJECTIVES:
            extra = dict(samples=1e9, deadline_s=1e9 / 4e4) if objective == "deadline" else dict(samples=1e9)
            chosen = planner.plan(model, memory, quota, objective, **extra)
            c = chosen.config
            name = (f"plan, largest range, {label}, {objective} → {c.workers}w {c.ps}ps g{c.worker_gpu}, "
                    f"front {len(chosen.pareto_front)}")
            rows.append((name, *timed(lambda: planner.plan(model, memory, quota, objective, **extra), args.repeats),
                         "≤ 100 ms", 0.1))

    moderate = Quota(512.0, 4 * 1024 * 1024.0)
    size = len(planner.configurations(planner.search_range(512.0), 512.0))
    for objective in ("throughput", "efficiency"):
        same = planner.plan(ps_model, MEMORY, moderate, objective) == planner.plan(ps_model, MEMORY, moderate, objective,
                                                                                     exhaustive=True)
        rows.append((f"plan, 512 cores, {objective}, structured (same plan, front, alternatives: {same})",
                     *timed(lambda: planner.plan(ps_model, MEMORY, moderate, objective), args.repeats), "", None))
        rows.append((f"plan, 512 cores, {objective}, exhaustive ({size / 1e6:.1f} M configurations)",
                     *timed(lambda: planner.plan(ps_model, MEMORY, moderate, objective, exhaustive=True),
                            max(1, args.repeats // 2)), "(reference)", None))
    if args.exhaustive:
        rows.append(("plan, largest range, exhaustive, throughput",
                     *timed(lambda: planner.plan(ps_model, MEMORY, largest, exhaustive=True), 1), "(reference)", None))

    quotas = random_quotas(args.plans)
    chunks = [(ps_model, quotas[i::args.processes], i) for i in range(args.processes)]
    wall = time.perf_counter()
    if args.processes > 1:
        with multiprocessing.get_context("fork").Pool(args.processes) as pool:
            results = pool.map(_plan_many, chunks)
    else:
        results = [_plan_many(chunks[0])]
    wall = time.perf_counter() - wall
    each = np.concatenate([r[2] for r in results])
    refused = sum(r[3] for r in results)
    rows.append((f"{args.plans:,} plans, random quotas 16–16,384 cores, {args.processes} processes "
                 f"({refused} refused), in all", wall, sum(r[1] for r in results), "≤ 60 s", 60.0))
    rows.append((f"  … each of those plans: median (p90 {np.percentile(each, 90) * 1000:.0f} ms, "
                 f"max {each.max() * 1000:.0f} ms)", float(np.median(each)), float("nan"), "", None))

    print(f"{'measurement':104s} {'wall':>10s} {'CPU':>10s}  target")
    for name, wall_s, cpu_s, target, limit in rows:
        verdict = "" if limit is None else (" met" if wall_s <= limit else
                                            f" MISSED by wall time{' (met in CPU time: the machine was shared)' if cpu_s <= limit else ''}")
        print(f"{name:104s} {_fmt(wall_s):>10s} {_fmt(cpu_s):>10s}  {target}{verdict}")
    print(f"\nload average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}, on {os.cpu_count()} cores; "
          f"medians of {args.repeats} repeats")


def _fmt(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


if __name__ == "__main__":
    main()
