"""The stand-in a profile apart measures (``probes.profile_apart``): its own id and key, no state."""

from __future__ import annotations

import pytest

from airflow_dlrover.lifecycle.profiling import stand_in, stand_in_id, stop_stand_in
from airflow_dlrover.operators.job import launcher_job_id
from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.runtime.spec import JobSpec, check_job_id

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("job_id", ["a", "daily-scheduled-2026-12-07", launcher_job_id(
    JobIdentity("a_dag_with_a_rather_long_name", "group", "the_job"), "scheduled__2026-12-07T00:00:00+00:00")])
def test_a_stand_in_has_an_id_of_its_own_as_short_as_the_launchers(job_id):
    assert len(job_id) <= 52
    other = stand_in_id(job_id)
    assert check_job_id(other) == other and len(other) <= 52 and other != job_id
    assert stand_in_id(job_id) == other and stand_in_id(job_id + "x") != other  # the same job's, only its


def test_a_stand_in_trains_the_same_job_without_its_state_export_or_key(tmp_path):
    spec = JobSpec(job_id="daily", samples=1_000_000, init_from=str(tmp_path / "yesterday"),
                   export=str(tmp_path / "today"))
    other = stand_in(spec)
    assert other.job_id == stand_in_id("daily") and other.samples == spec.samples and other.data == spec.data
    assert other.layout == spec.layout and other.batch_size == spec.batch_size
    assert other.init_from == "" and other.export == "" and other.authkey != spec.authkey


class Jobs:
    def __init__(self, *running):
        self.running, self.stopped_ids = set(running), []

    def exists(self, job_id):
        return job_id in self.running

    def stopped(self, job_id):
        return job_id in self.stopped_ids

    def stop(self, job_id):
        self.stopped_ids.append(job_id)


def test_only_a_running_stand_in_is_stopped():
    jobs = Jobs("daily", stand_in_id("daily"))
    assert stop_stand_in(jobs, "daily") and jobs.stopped_ids == [stand_in_id("daily")]  # never the job itself
    assert not stop_stand_in(jobs, "daily") and not stop_stand_in(Jobs("daily"), "daily")
