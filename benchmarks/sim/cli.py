"""Cluster-scale evaluation: days of DLRM jobs under each policy, on one trace (``sim``).

    python benchmarks/simulate.py --jobs 1000 --days 7 --seed 1 --policies user,dlrover,ours,oracle --out DIR

With ``--days`` > 1 it also prints the cold jobs (day 1: no history) and the warm ones (days 2…).

The simulator is not part of the installed provider (an Airflow worker installs neither it nor
matplotlib): it lives in ``benchmarks/sim`` and drives the product's public API — the ``ours``
policy runs ``optimizer.controller.step``. ``benchmarks/cluster_sim.py`` runs several seeds.
User mistakes print ``error: <field>=<value> is invalid: allowed ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from airflow_dlrover.cli import run_command
from airflow_dlrover.optimizer.types import InvalidInputError, parse_memory_mb


def run(args: argparse.Namespace) -> None:
    from sim.dlrover_bridge import DLRoverUnavailable
    from sim.run import by_days, format_table, of_truth, per_job_against, profiling, simulate, write_outputs
    from sim.workload import SimConfig

    if args.jobs < 1:
        raise InvalidInputError("jobs", args.jobs, "an integer ≥ 1")
    if args.days < 1:
        raise InvalidInputError("days", args.days, "an integer ≥ 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    kwargs = {}
    if args.cluster_cpu is not None:
        kwargs["cluster_cpu"] = float(args.cluster_cpu)
    if args.cluster_memory is not None:
        kwargs["cluster_memory_mb"] = parse_memory_mb(args.cluster_memory, "cluster_memory")
    if not 0.0 <= args.allreduce_fraction <= 1.0:
        raise InvalidInputError("allreduce-fraction", args.allreduce_fraction, "a fraction in [0, 1]")
    for name in ("large_fraction", "one_off_fraction", "shift_fraction"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise InvalidInputError(name.replace("_", "-"), getattr(args, name), "a fraction in [0, 1]")
    cfg = SimConfig(jobs=args.jobs, days=args.days, seed=args.seed, allreduce_fraction=args.allreduce_fraction,
                    large_fraction=args.large_fraction, one_off_fraction=args.one_off_fraction,
                    shift_fraction=args.shift_fraction, **kwargs)
    if args.no_instability:
        cfg = cfg.without_instability()
    start = time.perf_counter()
    try:
        summary, cis, runs = simulate(cfg, policies, objective=args.objective, dlrover_venv=args.dlrover_venv,
                                      setup_dlrover=args.setup_dlrover, processes=args.processes)
    except DLRoverUnavailable as err:
        raise InvalidInputError("policies", "dlrover", "a dlrover venv", str(err)) from None
    seconds = time.perf_counter() - start
    print(f"{cfg.jobs} jobs a day × {cfg.days} days, seed {cfg.seed}, cluster {cfg.cluster_cpu:g} cores / {cfg.cluster_memory_mb / 1024:g} GiB, "
          f"objective {args.objective}: simulated in {seconds:.1f} s "
          f"({', '.join(f'{r.name} {r.seconds:.1f} s' for r in runs)})")
    print("95% bootstrap intervals over jobs in brackets; JCT and run time over every job, one that never completed as inf")
    print(format_table(summary, cis))
    days = by_days(runs, seed=cfg.seed)
    for label, (table, intervals) in days.items():
        print(f"\n{label} jobs ({'day 1: no history' if label == 'cold' else f'days 2–{cfg.days}: history from earlier days'})")
        print(format_table(table, intervals))
    large = of_truth(runs, "large", seed=cfg.seed)
    if large is not None:
        print(f"\nlarge families ({int((runs[0].jobs['truth'] == 'large').sum())} jobs: hundreds of workers, more than 64 PS at best)")
        print(format_table(*large))
    against = per_job_against(runs)
    if against is not None:
        print("\nper job, JCT over the oracle's (the same job; over jobs both completed, "
              "a failed job counted over 2× and 3×)")
        print(against.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for policy_run in runs:
        if (profiled := profiling(policy_run.jobs)) is not None:
            print(f"\n{policy_run.name}: profiling of the {profiled['jobs']} profiled jobs of ≥ 1 h, median share "
                  f"of the JCT: {100 * profiled['wall_share']:.1f} % of its wall time, "
                  f"{100 * profiled['cost_share']:.1f} % its cost (net of what probes on the "
                  f"job itself trained)")
    paths = write_outputs(Path(args.out), summary, cis, runs, cfg, days)
    print("wrote " + ", ".join(str(p) for p in paths))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simulate.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--days", type=int, default=1, help="days of the trace: families recur daily (default 1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policies", default="user,dlrover,ours,oracle", help="comma-separated: user, user-adapts, dlrover, ours, oracle, oracle-jct")
    p.add_argument("--out", required=True, help="folder for summary.csv, summary_ci.csv, jobs.csv, utilisation.csv, PNGs")
    p.add_argument("--objective", choices=("efficiency", "throughput"), default="efficiency",
                   help="the pre-tune objective of ours and the oracle (default efficiency: the knee)")
    p.add_argument("--cluster-cpu", default=None, help="cores of the cluster quota (default 8000)")
    p.add_argument("--cluster-memory", default=None, help="memory of the cluster quota (default 40000Gi)")
    p.add_argument("--allreduce-fraction", type=float, default=0.0,
                   help="share of the job families that train data-parallel without PS (default 0)")
    p.add_argument("--large-fraction", type=float, default=0.0,
                   help="share of the job families that are large PS jobs: hundreds of workers, > 64 PS (default 0)")
    p.add_argument("--one-off-fraction", type=float, default=0.0,
                   help="share of the families whose every run is a new job, with no history (default 0)")
    p.add_argument("--shift-fraction", type=float, default=0.0,
                   help="share of the families that shift once: tables or data × 2, or a new model (default 0)")
    p.add_argument("--no-instability", action="store_true", help="no failures, hot PS, stragglers, under-sized users")
    p.add_argument("--processes", type=int, default=2, help="policies simulated in parallel (default 2)")
    p.add_argument("--dlrover-venv", default=None, help="venv with dlrover==0.6.1 (default $AIRFLOW_DLROVER_DLROVER_VENV or ./.venv-dlrover)")
    p.add_argument("--setup-dlrover", action="store_true", help="create the dlrover venv if missing (pip, network)")
    p.set_defaults(func=run)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)
