"""A job's kind (``launchers.kinds``) is chosen once from its spec: our runtime, or a trainer of the
user's (an ``allreduce`` one restarts its group for a failed node)."""

import pytest

from airflow_dlrover.launchers.base import Launcher
from airflow_dlrover.launchers.contract import TrainerSpec
from airflow_dlrover.launchers.kinds import AllreduceTrainerJob, RuntimeJob, TrainerJob, job_kind
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.unit

ALLREDUCE = TrainerSpec(command=("python", "train.py")).to_dict()
PS = TrainerSpec(command=("python", "train.py"), kind="ps", metrics_port=9400).to_dict()


class SpecOnly(Launcher):
    """A backend that only has its jobs' specs (and counts how often they are read)."""

    def __init__(self, specs: dict[str, JobSpec]):
        super().__init__()
        self.specs, self.reads = specs, 0

    def spec(self, job_id: str) -> JobSpec:
        self.reads += 1
        return self.specs[job_id]


def spec(job_id: str, trainer: dict | None = None) -> JobSpec:
    return JobSpec(job_id=job_id, samples=1000, trainer=trainer)


def test_the_kind_is_chosen_from_the_spec_once_per_job():
    launcher = SpecOnly({"ours": spec("ours"), "ddp": spec("ddp", ALLREDUCE), "ps": spec("ps", PS)})
    kinds = {job_id: launcher.kind(job_id) for job_id in ("ours", "ddp", "ps")}
    assert type(kinds["ours"]) is RuntimeJob and launcher.trainer("ours") is None
    assert type(kinds["ddp"]) is AllreduceTrainerJob and launcher.trainer("ddp") == TrainerSpec.from_dict(ALLREDUCE)
    assert type(kinds["ps"]) is TrainerJob and launcher.trainer("ps").kind == "ps"
    assert launcher.reads == 3  # once per job: the launcher keeps it
    assert all(launcher.kind(job_id) is kind and kind.job_id == job_id for job_id, kind in kinds.items())
    assert launcher.reads == 3


def test_a_record_without_the_trainer_flag_is_our_runtime_without_reading_the_spec():
    launcher = SpecOnly({})
    assert type(launcher.kind("ours", {"job_id": "ours", "nodes": {}})) is RuntimeJob and launcher.reads == 0
    launcher = SpecOnly({"ddp": spec("ddp", ALLREDUCE)})
    assert type(launcher.kind("ddp", {"job_id": "ddp", "nodes": {}, "trainer": True})) is AllreduceTrainerJob
    assert launcher.reads == 1


def test_each_kind_says_which_ports_its_nodes_listen_on():
    launcher = SpecOnly({})
    assert RuntimeJob(launcher, "j").ports("worker") == () and RuntimeJob(launcher, "j").ports("ps") == ("port",)
    assert job_kind(launcher, "j", ALLREDUCE).ports("worker") == ("port",)
    assert job_kind(launcher, "j", PS).ports("worker") == ("port", "metrics_port")
    assert job_kind(launcher, "j", None).restart_cost_s() is None
