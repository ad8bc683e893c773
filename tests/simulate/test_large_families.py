"""Large PS families (issue 20): hundreds of workers and more than 64 PS at their best, within the
planner's range; added without changing the other families; run by ours and the oracle."""

from __future__ import annotations

from dataclasses import replace

import pytest

import numpy as np

from sim.policies import true_plan
from sim.run import run_policy
from sim.workload import SimConfig, generate_trace
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import Quota

pytestmark = pytest.mark.unit

#: Large families only, on a cluster that holds three of them at once.
LARGE = SimConfig(jobs=6, seed=3, cluster_cpu=3000.0, cluster_memory_mb=12e6, large_fraction=1.0)


class _Job:  # what true_plan reads of a job
    def __init__(self, spec):
        self.spec = spec


def test_large_families_are_added_without_changing_the_others():
    base = SimConfig(jobs=40, seed=2, allreduce_fraction=0.2)
    before, after = generate_trace(base), generate_trace(replace(base, large_fraction=0.3))
    assert [j.arrival_s for j in before] == [j.arrival_s for j in after]
    large = {j.family.index for j in after if j.family.truth.family == "large"}
    assert 0 < len(large) < 40
    for old, new in zip(before, after):
        if new.family.index in large:
            assert new.family.user.ps >= 32 and new.family.user.workers >= 128 and old.family.user.ps > 0
        else:  # common random numbers: the same family (all-reduce ones too), the same draws
            assert new.family == old.family and new.samples == old.samples and new.hot_ps_at == old.hot_ps_at


def test_large_families_need_hundreds_of_workers_and_more_than_64_ps_within_a_cluster_sims_floor():
    trace = generate_trace(replace(LARGE, jobs=12, seed=11))
    need_both = 0
    for spec in trace:
        family = spec.family
        assert family.truth.family == "large"
        assert family.user.cores <= family.limit_cpu <= 1024 and family.limit_memory_mb <= 4096 * 1024  # FLOOR
        best = true_plan(_Job(spec), "throughput", Quota(family.limit_cpu, family.limit_memory_mb))
        assert best.workers <= C.PLAN_MAX_WORKERS and best.ps <= C.PLAN_MAX_PS
        need_both += best.workers > 128 and best.ps > 64
    assert need_both >= 0.7 * len(trace)  # measured on 60 families: 85 %


def test_ours_and_the_oracle_run_large_jobs_past_the_old_grid():
    """Every sample trained once (plus the rolled back), no job faster than the bound (run_policy
    checks it), and configurations past 128 workers and 64 PS."""
    for policy in ("ours", "oracle"):
        jobs = run_policy(LARGE, policy).jobs
        done = jobs[jobs["status"] == "done"]
        assert len(done) >= len(jobs) - 1, policy
        assert np.allclose(done["trained_samples"], done["samples"] + done["wasted_samples"], rtol=1e-9)
        assert (jobs["truth"] == "large").all()
        assert (jobs["workers"] > 128).any() and (jobs["ps"] > 64).any(), policy
