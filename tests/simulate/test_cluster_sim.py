"""The cluster evaluation's targets, computed from the jobs tables the page is written from."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cluster_sim import profiling_target, targets

pytestmark = pytest.mark.unit


def _jobs(rows):
    return pd.DataFrame(rows, columns=["policy", "day", "profile_s", "profile_cost_s", "jct_s"])


def test_the_profiling_target_is_the_median_share_of_profiled_cold_jobs_of_an_hour_or_more():
    jobs = _jobs([
        ("ours", 0, 180.0, 90.0, 3600.0),    # 5 %
        ("ours", 0, 720.0, 360.0, 7200.0),   # 10 %
        ("ours", 0, 40.0, 20.0, 4000.0),     # 1 %
        ("ours", 0, 600.0, 300.0, 1200.0),   # under an hour: not counted
        ("ours", 0, 0.0, 0.0, 9000.0),       # not profiled: not counted
        ("ours", 0, 100.0, 50.0, np.inf),    # never completed: not counted
        ("oracle", 0, 0.0, 0.0, 3600.0),
        ("ours", 3, 3000.0, 100.0, 4000.0),  # warm
    ])
    [(goal, measured, met)] = profiling_target(jobs, "cold")
    assert "≤ 5 %" in goal and measured.startswith("5.0 % in wall time (2.5 % net") and "over 3 jobs" in measured
    assert met is True
    [(_, warm, reported)] = profiling_target(jobs, "warm")
    assert warm.startswith("75.0 % in wall time") and "over 1 jobs" in warm and reported is None
    slower = jobs.assign(profile_s=jobs["profile_s"] * 1.2)
    assert profiling_target(slower, "cold")[0][2] is False


def test_no_profiled_job_of_an_hour_reports_nothing():
    assert profiling_target(_jobs([("ours", 0, 0.0, 0.0, 9000.0), ("ours", 0, 60.0, 30.0, 600.0)]), "cold") == []
    assert profiling_target(_jobs([("oracle", 0, 0.0, 0.0, 9000.0)]), "cold") == []


def test_the_knee_target_is_its_jct_at_equal_or_fewer_of_its_core_hours():
    def mean(jct, hours):
        return pd.DataFrame({"policy": ["ours", "oracle"], "median_jct_s": [jct, 1000.0],
                             "resource_hours": [hours, 100.0]})

    [(goal, measured, met)] = targets(mean(1040.0, 100.0), "warm")
    assert goal == "median JCT ≤ 1.05× the knee's (oracle) at equal or fewer core-hours"
    assert measured == "1.04× at 1.00× its core-hours" and met is True
    assert targets(mean(1040.0, 124.0), "warm")[0][2] is False  # as fast, on more of the cluster
    assert targets(mean(1060.0, 90.0), "warm")[0][2] is False
    assert targets(mean(1190.0, 95.0), "cold")[0][2] is True
