"""The one observer: the guard task and its trigger's gate hand ``controller.step`` the same
observation and the same state for the same job; the observation carries the progress, the node
statuses and the measured restart cost whoever asks."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest

from airflow_dlrover.launchers.base import statuses
from airflow_dlrover.lifecycle.observer import observe
from airflow_dlrover.optimizer import controller
from airflow_dlrover.optimizer.transitions import measured as measured_transitions
from airflow_dlrover.optimizer.types import Configuration

pytestmark = pytest.mark.unit

CONFIG = Configuration(2, 1, 1.0, 1.0, 2048.0, 2048.0, 0, 512)
QUOTA = {"cpu": 8, "memory": "16Gi"}
JOB = "observed"


def node(name: str, role: str, index: int, cpu: float, memory_mb: float, state: str = "running") -> dict:
    return {"name": name, "role": role, "index": index, "state": state, "cpu": cpu, "memory_mb": memory_mb,
            "restarts": 0}


class RecordedJob:
    """The reading side of a launcher over one job's record, as a backend returns it; ``apply``
    records what it is asked to do."""

    def __init__(self, restart_cost_s: float | None = None):
        nodes = [node("master", "master", 0, 0.5, 512), node("ps-0", "ps", 0, 1.0, 2048),
                 node("worker-0", "worker", 0, 1.0, 2048), node("worker-1", "worker", 1, 1.0, 2048)]
        self.record = {"config": CONFIG.to_row(), "nodes": {n["name"]: n for n in nodes}, "events": []}
        self.cost, self.applied = restart_cost_s, []

    def exists(self, job_id: str) -> bool:
        return True

    def read_job(self, job_id: str) -> dict:
        return copy.deepcopy(self.record)

    def status(self, job_id: str):
        return statuses(self.read_job(job_id))

    def progress(self, job_id: str, timeout: float = 0.0) -> dict:
        return {"state": "running", "samples_done": 600_000, "samples_total": 2_000_000, "throughput": 30_000.0}

    def metrics(self, job_id: str) -> dict:
        return {"status": self.progress(job_id), "nodes": {}, "usage_time": 0.0, "usage": {}}

    def restart_cost_s(self, job_id: str) -> float | None:
        return self.cost

    def transition_costs(self):
        return KUBERNETES

    def can_resize_in_place(self) -> bool:
        return False

    def trainer(self, job_id: str):
        return None

    def apply(self, job_id: str, actions) -> list:
        self.applied += list(actions)
        return []


def usage_rows(now: float) -> tuple[dict, ...]:
    return tuple({"time_s": now, "node": name, "role": role, "cpu_used": 0.9, "cpu_limit": 1.0,
                  "memory_used_mb": 900.0, "memory_limit_mb": 2048.0,
                  "throughput": 15_000.0 if role == "worker" else None, "age_s": 60.0}
                 for name, role in (("ps-0", "ps"), ("worker-0", "worker"), ("worker-1", "worker")))


#: a backend's table as a Kubernetes launcher gives it
KUBERNETES = measured_transitions().on_kubernetes()


def test_the_observation_carries_progress_nodes_and_the_costs_of_transitions():
    job = RecordedJob(restart_cost_s=12.5)
    seen = observe(job, "j", usage=usage_rows(1.0))
    assert seen.config == CONFIG and seen.samples_done == 600_000 and seen.samples_total == 2_000_000
    assert [n.name for n in seen.nodes] == ["master", "ps-0", "worker-0", "worker-1"]
    assert seen.restart_cost_s == 12.5 and len(seen.usage) == 3 and seen.windows == ()
    assert seen.transitions is KUBERNETES and seen.in_place is False  # the launcher's, as it has them


def test_a_master_that_failed_is_not_asked_for_progress():
    job = RecordedJob()
    job.record["nodes"]["master"]["state"] = "failed"
    job.progress = lambda *a, **k: pytest.fail("a failed master was asked for its progress")
    seen = observe(job, "j")
    assert seen.samples_done == 0 and seen.samples_total is None and any(n.failed for n in seen.nodes)


def test_the_guard_and_its_triggers_gate_step_on_the_same_observation_and_state(airflow_db, monkeypatch):
    from airflow_dlrover.history.store import HistoryStore
    from airflow_dlrover.sensors import DLRoverInstabilitySensor
    from airflow_dlrover.triggers.job import DLRoverJobTrigger, JobWatch

    steps = []

    def recording_step(state, observation):
        steps.append((state, observation))
        return state, []

    monkeypatch.setattr(controller, "step", recording_step)
    job = RecordedJob()
    guard = DLRoverInstabilitySensor(task_id="guard", job=JOB, quota=QUOTA, window="2s")
    guard.__dict__["launcher"] = job  # the launcher the hook would make
    context = {"run_id": "manual__observed", "ti": SimpleNamespace(try_number=1)}
    run, job_id = guard.run_ids(context)
    guard.history.add(run, "plan", {"time": 900.0, "objective": "efficiency", "deadline_s": None})
    usage = usage_rows(1000.0)

    guard._step(context, run, job_id, usage)
    kwargs = guard.watch_kwargs(context)
    assert kwargs["history_run"] == run
    trigger = DLRoverJobTrigger(job_id, "guard", **kwargs)  # as the guard defers to it
    watch = JobWatch(job, trigger, HistoryStore())
    watch._controller_acts(job.progress(job_id), list(usage))

    [(guard_state, guard_seen), (gate_state, gate_seen)] = steps
    assert dataclasses.replace(gate_seen, now_s=0.0) == dataclasses.replace(guard_seen, now_s=0.0)
    assert guard_seen.samples_done == 600_000  # the guard sees the job's progress
    # the run's state, as the guard rebuilds it: not an empty one of the quota alone
    assert gate_state == guard_state and gate_state.since_s == 900.0 and gate_state.objective == "efficiency"
