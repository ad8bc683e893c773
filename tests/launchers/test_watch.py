"""Window throughput from the workers' counters, and healing that respects the quota."""

import pytest

from airflow_dlrover.launchers.watch import heal, job_throughput
from airflow_dlrover.optimizer.types import Quota


def test_window_throughput_is_the_sum_of_each_workers_counter_rate():
    before = {"worker-0": (1000.0, 10.0), "worker-1": (500.0, 10.5)}
    after = {"worker-0": (3000.0, 12.0), "worker-1": (2500.0, 12.5)}
    assert job_throughput(before, after) == pytest.approx(2000 / 2 + 2000 / 2)
    assert job_throughput(before, {"worker-0": (3000.0, 12.0)}) is None  # a worker left
    assert job_throughput({"worker-0": (1000.0, 10.0)}, after) is None  # a worker joined
    assert job_throughput(before, {**after, "worker-1": (100.0, 12.5)}) is None  # restarted: counter reset
    assert job_throughput(before, before) is None  # nobody reported in the window
    assert job_throughput({}, {}) is None


class RecordingLauncher:
    """The two launcher calls healing makes, recorded; the job record of a 2-core plan."""

    def __init__(self):
        self.calls = []
        nodes = {"master": {"role": "master", "cpu": 0.5, "memory_mb": 512}}
        nodes |= {f"ps-{i}": {"role": "ps", "cpu": 0.5, "memory_mb": 1024} for i in range(2)}
        nodes |= {"worker-0": {"role": "worker", "cpu": 1.0, "memory_mb": 2048}}
        self.job = {"config": {"worker_cpu": 1.0}, "nodes": nodes}

    def read_job(self, job_id):
        return self.job

    def set_cpu(self, job_id, node, cpu):
        self.calls.append(("set_cpu", node, cpu))

    def relaunch(self, job_id, node, cpu=None, memory_mb=None):
        self.calls.append(("relaunch", node, cpu, memory_mb))


def hot(value):
    return {"instability": "hot_ps", "node": "ps-0", "reason": "", "action": {"kind": "set_cpu", "value": value}}


def test_healing_in_place_never_takes_the_job_past_its_quota():
    launcher = RecordingLauncher()
    assert heal(launcher, "j", hot(1.0), Quota(2.5, 8192))["healed"] == "CPU quota raised to 1 in place"
    refused = heal(launcher, "j", hot(1.0), Quota(2.0, 8192))
    assert refused["healed"] == "not healed: ps-0 at 1 would make 2.5 cores, past the quota's 2"
    assert launcher.calls == [("set_cpu", "ps-0", 1.0)]  # the master does not count: plans do not hold it
    oom = {"instability": "oom_risk", "node": "worker-0", "reason": "", "action": {"kind": "set_memory", "value": 4096}}
    assert heal(launcher, "j", oom, Quota(2.0, 6144))["healed"] == "relaunched with 4096 MB"
    assert heal(launcher, "j", oom, Quota(2.0, 5000))["healed"].startswith("not healed: worker-0 at 4096")
    assert heal(launcher, "j", hot(8.0))["healed"] == "CPU quota raised to 8 in place"  # no quota: no limit
    assert launcher.calls[1:] == [("relaunch", "worker-0", None, 4096), ("set_cpu", "ps-0", 8.0)]
