"""The simulation's per-job comparison against the oracle."""

import math

import pandas as pd
import pytest

from sim.run import PolicyRun, per_job_against

pytestmark = pytest.mark.unit


def _run(name: str, jct: list[float], days: list[int]) -> PolicyRun:
    return PolicyRun(name, pd.DataFrame({"job": range(len(jct)), "day": days, "jct_s": jct}), pd.DataFrame(), 0.0)


def test_per_job_ratios_against_the_oracle_count_failed_jobs_as_the_slowest():
    oracle = _run("oracle", [100, 100, 200, 400], [0, 0, 1, 1])
    ours = _run("ours", [150, 400, 200, math.inf], [0, 0, 1, 1])
    table = per_job_against([ours, oracle]).set_index("jobs")
    assert list(table.index) == ["all", "cold", "warm"] and (table["policy"] == "ours").all()
    cold, warm, every = table.loc["cold"], table.loc["warm"], table.loc["all"]
    assert cold["geometric_mean"] == pytest.approx(math.sqrt(1.5 * 4)) and cold["median"] == pytest.approx(2.75)
    assert (cold["over_2x"], cold["over_3x"], cold["failed"]) == (1, 1, 0)
    assert warm["geometric_mean"] == pytest.approx(1.0) and (warm["over_3x"], warm["failed"]) == (1, 1)
    assert (every["over_2x"], every["over_3x"], every["failed"]) == (2, 2, 1)
    assert per_job_against([ours]) is None
    # a policy that profiles: its profile's cost added to the oracle's JCT, as if it then planned as the oracle
    ours.jobs["profile_cost_s"] = [50.0, 20.0, 0.0, 0.0]
    floor = per_job_against([ours, oracle]).set_index(["policy", "jobs"]).loc["ours profile + oracle"]
    assert floor.loc["cold", "median"] == pytest.approx(1.35) and floor.loc["warm", "median"] == 1.0
    assert (floor["failed"] == 0).all() and floor.loc["all", "over_2x"] == 0
    assert list(per_job_against([_run("ours", [1.0], [0]), _run("oracle", [2.0], [0])])["jobs"]) == ["all"]
