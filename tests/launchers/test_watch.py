"""Window throughput from the workers' counters."""

import pytest

from airflow_dlrover.launchers.watch import job_throughput, profile_row

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


def test_a_sample_row_keeps_each_roles_mean_and_its_largest_node():
    config = {"workers": 2, "ps": 2, "worker_cpu": 1.0, "ps_cpu": 1.0, "worker_memory_mb": 512.0,
              "ps_memory_mb": 512.0, "worker_gpu": 0, "batch_size": 512}
    nodes = [{"role": "worker", "cpu_used": 0.8, "memory_used_mb": 300.0},
             {"role": "worker", "cpu_used": 0.6, "memory_used_mb": 340.0},
             {"role": "ps", "cpu_used": 0.5, "memory_used_mb": 150.0},
             {"role": "ps", "cpu_used": 0.7, "memory_used_mb": 210.0}]  # a hot PS
    row = profile_row(config, nodes, 1000.0, 5000)
    assert (row["ps_memory_used_mb"], row["ps_memory_peak_mb"]) == (180.0, 210.0)
    assert (row["worker_memory_used_mb"], row["worker_memory_peak_mb"]) == (320.0, 340.0)
    assert profile_row({**config, "ps": 2}, nodes[:2], 1000.0, 5000) is None  # a PS job's window without its PS
