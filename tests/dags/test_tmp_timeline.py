"""The example trainers — examples/torchrec_dlrm (TorchRec's sharded DLRM over torch.distributed,
no PS, rank 0 alone reporting) and examples/ps_dlrm (its own PS over TF_CONFIG, driven through its
metrics file only), neither knowing anything of us — through their whole DAGs with ``dag.test()``
on the local launcher: profiled through the launcher on probes of their kind, fitted, launched on
a configuration of the user's (``start_on``), resized by the fine-tune (a group restart, charged
its measured cost), a worker killed from outside and recovered by the guard's retry (the whole
group of the all-reduce trainer, the worker alone in the PS trainer), reported; the trainer's own
progress counter shows every sample trained. (examples/ddp_dlrm's trainer, resized and killed,
is tests/launchers/test_trainer.py's.)"""

import os
import threading
import time
from pathlib import Path

import pytest

from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.history.store import HistoryStore
from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.operators.job import launcher_job_id

pytestmark = pytest.mark.dag

EXAMPLES = {
    # job: (DAG id, its params: a start of the user's that the fine-tune must leave)
    # 1.5 cores: probes of one torch thread each (two threads on this machine's two cores contend
    # with the Airflow process); a start far below the plan, so that the resize pays at the
    # pessimistic end of a model fitted on three probes, and long enough that both still train
    # after the killed worker is recovered (torchrec_dlrm at 6 M samples: resized 52 s after its
    # launch, killed 4 s later, recovered in 14 s, done 100 s after that)
    "ps_dlrm": ("ps_dlrm_daily_retrain", {
        "samples": 700_000, "quota_cpu": 2.0, "quota_memory": "4Gi",
        "start_on": {"workers": 1, "ps": 1, "worker_cpu": 0.5, "ps_cpu": 0.25, "worker_memory_mb": 1024,
                     "ps_memory_mb": 1024, "batch_size": 512}}),
    "torchrec_dlrm": ("torchrec_dlrm_daily_retrain", {
        "samples": 3_000_000, "quota_cpu": 1.5, "quota_memory": "6Gi",
        "start_on": {"workers": 1, "ps": 0, "worker_cpu": 0.25, "ps_cpu": 0, "worker_memory_mb": 2048,
                     "batch_size": 512}}),
}


@pytest.fixture(scope="module")
def bag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert bag.import_errors == {}
    return bag


def kill_a_worker_after_the_resize(job: str, seen: dict, deadline_s: float = 400.0) -> None:
    """From outside the DAG, as a node crash would: SIGKILL worker-0 a few seconds after the
    fine-tune's first resize (or 60 s after the launch, when there is none)."""
    history, launcher = HistoryStore(), LocalLauncher(Path(os.environ["AIRFLOW_HOME"]) / "dlrover" / "jobs")
    started = time.monotonic()
    launched_at = None
    while time.monotonic() - started < deadline_s:
        runs = history.runs(job)
        run = runs[-1] if runs else None
        if run and run["status"] == "running":
            events = history.records(run["id"], "event")
            if launched_at is None and any(e.get("event") == "launched" for e in events):
                launched_at = time.monotonic()
            resized = any(d["action"] == "resize" for d in history.records(run["id"], "decision"))
            if launched_at is not None and (resized or time.monotonic() - launched_at > 60):
                time.sleep(4.0)
                job_id = launcher_job_id(JobIdentity(run["dag_id"], run["task_group"], job), run["run_key"])
                seen.update(job_id=job_id, after_resize=resized, at=time.time())
                launcher.kill_node(job_id, "worker-0")
                return
        time.sleep(0.5)


@pytest.mark.parametrize("job", sorted(EXAMPLES))
def test_an_example_trainer_through_its_dag(bag, job):
    dag_id, conf = EXAMPLES[job]
    allreduce = conf["start_on"]["ps"] == 0
    seen: dict = {}
    killer = threading.Thread(target=kill_a_worker_after_the_resize, args=(job, seen), daemon=True)
    killer.start()
    dagrun = bag.get_dag(dag_id).test(run_conf=conf)
    killer.join(timeout=5)
    history = HistoryStore()
    tis = {ti.task_id.removeprefix(f"{job}."): ti for ti in dagrun.get_task_instances()}
    [record] = history.runs(job, run_key=dagrun.run_id)
    print("TIMELINE", sorted((str(ti.start_date), str(ti.end_date), t) for t, ti in tis.items()))
    for kind in ("event", "decision"):
        print("REC", kind, [(r.get("event") or r.get("action"), r.get("at") or r.get("time")) for r in history.records(record["id"], kind)])
    assert dagrun.state == "success", {t: ti.state for t, ti in tis.items()}
    report = record["summary"]
    # the trainer's own counter, restored from its checkpoint after each restart, reached the end
    summary = report["job"]
    assert summary["trainer"] and summary["samples_done"] == summary["samples_total"] == conf["samples"]
    assert report["status"] == "succeeded" and summary["auc"] > 0.7
    # profiled through the launcher, on probes of its kind, each node measured from its cgroup
    profile = history.samples(job, run_id=record["id"], stage="profile")
    assert len(profile) >= 3 and ((profile.ps == 0) if allreduce else (profile.ps >= 1)).all()
    assert (profile.worker_cpu_used > 0).all() and (profile.worker_cpu_used <= profile.worker_cpu * 1.15).all()
    # the fine-tune resized the user's start by a group restart, charged what restarts measured
    [resize, *_] = [d for d in history.records(record["id"], "decision") if d["action"] == "resize"]
    assert {k: resize["current"][k] for k in conf["start_on"]} == conf["start_on"]
    assert (resize["target"]["ps"] == 0) == allreduce and resize["resize"]["actions"][0].startswith("group restarted")
    assert 0 < resize["numbers"]["cost_s"] < 30  # measured (profiling's restarts), not the 60 s default
    # the worker killed after the resize was recovered by the guard's retry
    assert seen.get("after_resize"), seen
    [failure] = report["failures"]
    assert failure["nodes"][0]["name"] == "worker-0"
    [recovery] = report["recoveries"]
    assert recovery["node"] == "worker-0" and tis["guard"].try_number >= 2
    assert summary["restarts"] == 1 and summary["resizes"] >= 1
    assert all(s is not None and s > 0 for s in summary["restart_s"])
    # the all-reduce group restarted as a whole for the kill; the PS trainer relaunched the worker alone
    assert len(summary["restart_s"]) == summary["resizes"] + (1 if allreduce else 0)
    # nothing left behind
    assert not list(CgroupManager().groups(seen["job_id"]))
