"""Window throughput from the workers' counters."""

import pytest

from airflow_dlrover.launchers.watch import job_throughput

pytestmark = pytest.mark.unit


def test_window_throughput_is_the_sum_of_each_workers_counter_rate():
    before = {"worker-0": (1000.0, 10.0), "worker-1": (500.0, 10.5)}
    after = {"worker-0": (3000.0, 12.0), "worker-1": (2500.0, 12.5)}
    assert job_throughput(before, after) == pytest.approx(2000 / 2 + 2000 / 2)
    assert job_throughput(before, {"worker-0": (3000.0, 12.0)}) is None  # a worker left
    assert job_throughput({"worker-0": (1000.0, 10.0)}, after) is None  # a worker joined
    assert job_throughput(before, {**after, "worker-1": (100.0, 12.5)}) is None  # restarted: counter reset
    assert job_throughput(before, before) is None  # nobody reported in the window
    assert job_throughput({}, {}) is None
