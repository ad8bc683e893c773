"""A new job's prior from jobs like it, in the cluster simulation: one-off jobs with and without it.

    python benchmarks/similar_prior.py [--jobs 100] [--days 3] [--one-off-fraction 0.5] [--seeds 101 102 103 104 105]

A one-off family's job each day is a job nobody ran (no history of its own), on the layout of the
family's earlier jobs (``Family.signature``: the same model and layout, its tables grown a day).
``ours`` starts such a job from their models (``optimizer.similarity``: a few probes, the fit
pulled toward the prior); the ablation starts it cold. Both run the same trace (the report seeds,
which no tuning ran on) and pay the same measured transition costs. Printed per seed and pooled,
over the one-off jobs of day 2 on (day 1's have no earlier job to be like): median JCT, median
profile time, the median over jobs of JCT with the prior / JCT cold (paired by job), its
geometric mean, the JCT against the job's bound (``bound_run_s``, its median), and failures.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from sim.policies import OursPolicy
from sim.run import run_policy
from sim.workload import SimConfig

REPORT_SEEDS = (101, 102, 103, 104, 105)


def one_offs(table):
    """The one-off jobs of day 2 on, by job id."""
    return table[(table["recurrence"] == "one-off") & (table["day"] >= 1)].set_index("job")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--one-off-fraction", type=float, default=0.5)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(REPORT_SEEDS))
    args = parser.parse_args()
    header = (f"{'seed':>5} {'jobs':>5} {'JCT similar':>12} {'JCT cold':>9} {'profile similar':>16} "
              f"{'profile cold':>13} {'median ratio':>13} {'geo-mean':>9} {'/bound sim':>10} {'/bound cold':>11} "
              f"{'failed':>7}")
    print(header)
    print("-" * len(header))
    pooled = {"ratio": [], "similar": [], "cold": [], "ps": [], "pc": [], "bs": [], "bc": []}
    for seed in args.seeds:
        cfg = SimConfig(jobs=args.jobs, days=args.days, seed=seed, one_off_fraction=args.one_off_fraction)
        similar = one_offs(run_policy(cfg, "ours").jobs)
        cold = one_offs(run_policy(cfg, "ours", policy=OursPolicy(similar_priors=False)).jobs).loc[similar.index]
        done = (similar["status"] == "done") & (cold["status"] == "done")
        ratio = (similar["jct_s"] / cold["jct_s"])[done]
        bound_s = (similar["jct_s"] / similar["bound_run_s"])[done]
        bound_c = (cold["jct_s"] / cold["bound_run_s"])[done]
        failed = f"{int((similar['status'] != 'done').sum())}/{int((cold['status'] != 'done').sum())}"
        print(f"{seed:>5} {len(similar):>5} {similar['jct_s'].median():>12.0f} {cold['jct_s'].median():>9.0f} "
              f"{similar['profile_s'].median():>16.0f} {cold['profile_s'].median():>13.0f} {ratio.median():>13.3f} "
              f"{float(np.exp(np.log(ratio).mean())):>9.3f} {bound_s.median():>10.2f} {bound_c.median():>11.2f} "
              f"{failed:>7}")
        for key, values in (("ratio", ratio), ("similar", similar["jct_s"][done]), ("cold", cold["jct_s"][done]),
                            ("ps", similar["profile_s"][done]), ("pc", cold["profile_s"][done]),
                            ("bs", bound_s), ("bc", bound_c)):
            pooled[key].extend(values.tolist())
    ratio = np.array(pooled["ratio"])
    print(f"{'all':>5} {len(ratio):>5} {statistics.median(pooled['similar']):>12.0f} "
          f"{statistics.median(pooled['cold']):>9.0f} {statistics.median(pooled['ps']):>16.0f} "
          f"{statistics.median(pooled['pc']):>13.0f} {np.median(ratio):>13.3f} "
          f"{float(np.exp(np.log(ratio).mean())):>9.3f} "
          f"{statistics.median(pooled['bs']):>10.2f} {statistics.median(pooled['bc']):>11.2f}")


if __name__ == "__main__":
    sys.exit(main())
