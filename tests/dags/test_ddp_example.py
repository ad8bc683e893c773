"""examples/ddp_dlrm — a torch.distributed DLRM that knows nothing of us — through its whole DAG
with ``dag.test()`` on the local launcher: profiled on all-reduce probes through the launcher,
fitted, launched on a configuration of the user's (``start_on``), resized by the fine-tune (a
group restart, charged its measured cost), a worker killed from outside and recovered by the
guard's retry, reported; the trainer's own progress counter shows every sample trained."""

import os
import threading
import time
from pathlib import Path

import pytest

from airflow_dlrover.history.store import HistoryStore
from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.operators.job import launcher_job_id

JOB = "ddp_dlrm"
START_ON = {"workers": 1, "ps": 0, "worker_cpu": 0.5, "ps_cpu": 0, "worker_memory_mb": 1024, "batch_size": 512}
CONF = {"samples": 12_000_000, "quota_cpu": 2.0, "quota_memory": "4Gi", "turn": "10s", "start_on": START_ON}


@pytest.fixture(scope="module")
def dag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert bag.import_errors == {}
    return bag.get_dag("ddp_dlrm_daily_retrain")


def kill_a_worker_after_the_resize(seen: dict, deadline_s: float = 400.0) -> None:
    """From outside the DAG, as a node crash would: SIGKILL worker-0 a few seconds after the
    fine-tune's first resize (or 60 s after the launch, when there is none)."""
    history, launcher = HistoryStore(), LocalLauncher(Path(os.environ["AIRFLOW_HOME"]) / "dlrover" / "jobs")
    started = time.monotonic()
    launched_at = None
    while time.monotonic() - started < deadline_s:
        runs = history.runs(JOB)
        run = runs[-1] if runs else None
        if run and run["status"] == "running":
            events = history.records(run["id"], "event")
            if launched_at is None and any(e.get("event") == "launched" for e in events):
                launched_at = time.monotonic()
            resized = any(d["action"] == "resize" for d in history.records(run["id"], "decision"))
            if launched_at is not None and (resized or time.monotonic() - launched_at > 60):
                time.sleep(4.0)
                job_id = launcher_job_id(JOB, run["run_key"])
                seen.update(job_id=job_id, after_resize=resized, at=time.time())
                launcher.kill_node(job_id, "worker-0")
                return
        time.sleep(0.5)


def test_the_ddp_example_through_its_dag(dag):
    seen: dict = {}
    killer = threading.Thread(target=kill_a_worker_after_the_resize, args=(seen,), daemon=True)
    killer.start()
    dagrun = dag.test(run_conf=CONF)
    killer.join(timeout=5)
    history = HistoryStore()
    tis = {ti.task_id: ti for ti in dagrun.get_task_instances()}
    [record] = history.runs(JOB, run_key=dagrun.run_id)
    assert dagrun.state == "success", {t: ti.state for t, ti in tis.items()}
    report = record["summary"]
    job = report["job"]
    # the trainer's own counter, restored from its checkpoint after each restart, reached the end
    assert job["trainer"] and job["samples_done"] == job["samples_total"] == CONF["samples"]
    assert report["status"] == "succeeded" and job["auc"] > 0.7
    # profiled through the launcher, on all-reduce probes, each node measured from its cgroup
    profile = history.samples(JOB, run_id=record["id"], stage="profile")
    assert len(profile) >= 4 and (profile.ps == 0).all() and (profile.worker_cpu_used > 0).all()
    assert (profile.worker_cpu_used <= profile.worker_cpu * 1.15).all()
    # the fine-tune resized the user's start by a group restart, charged what restarts measured
    [resize, *_] = [d for d in history.records(record["id"], "decision") if d["action"] == "resize"]
    assert resize["current"]["workers"] == 1 and resize["current"]["worker_cpu"] == 0.5
    assert resize["target"]["ps"] == 0 and resize["resize"]["actions"][0].startswith("group restarted")
    assert 0 < resize["numbers"]["cost_s"] < 30  # measured (profiling's restarts), not the 60 s default
    # the worker killed after the resize was recovered by the guard's retry
    assert seen.get("after_resize"), seen
    [failure] = report["failures"]
    assert failure["nodes"][0]["name"] == "worker-0"
    [recovery] = report["recoveries"]
    assert recovery["node"] == "worker-0" and tis["guard"].try_number >= 2
    assert job["restarts"] == 1 and job["resizes"] >= 1 and all(s is not None and s > 0 for s in job["restart_s"])
    # nothing left behind
    assert not list(CgroupManager().groups(seen["job_id"]))
