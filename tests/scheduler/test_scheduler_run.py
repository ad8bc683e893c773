"""The example DAG under a real scheduler, triggerer and LocalExecutor (``conftest.Deployment``):
triggered through the public REST API with a killed worker, the fine-tune and the guard deferred
at the same time, the guard's failed try and its retry that recovers the job."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from airflow_dlrover.history.store import HistoryStore

pytestmark = pytest.mark.scheduler

DAG_ID = "dlrm_daily_retrain"
#: tests/dags' SMALL run (1.5 cores: 4 cold probes), a worker killed 20 s after the launch, which
#: the job outlives by about as long again at the runtime's speed (~80k samples/s), so that the
#: guard's retry recovers a job still training.
CONF = {"samples": 3_000_000, "table_size": 5000, "quota_cpu": 1.5, "quota_memory": "4Gi",
        "inject": "kill-worker@20s"}
#: Seconds the run may take (measured 190-220 s on 2 cores at load 5-9, beside the components; generous).
RUN_TIMEOUT_S = 1200
POLL_S = 0.5
DONE = ("success", "failed")


DEPLOY_DAG_ID = "deploy_on_new_model"


def trigger(deployment, conf: dict, name: str) -> str:
    run_id = f"{name}__{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    deployment.api("POST", f"/dags/{DAG_ID}/dagRuns",
                   json={"dag_run_id": run_id, "logical_date": datetime.now(timezone.utc).isoformat(), "conf": conf})
    return run_id


def task_instances(deployment, run_id: str, dag_id: str = DAG_ID) -> dict[str, dict]:
    """The run's task instances by task name (a task group's prefix dropped)."""
    tis = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {ti["task_id"].rsplit(".", 1)[-1]: ti for ti in tis}


def poll_until_done(deployment, run_id: str, until=None) -> tuple[dict, list[tuple[float, dict]], dict]:
    """Poll the run and its task instances every ``POLL_S`` until the run ends (or ``until(task
    instances)`` holds): (the run, the states seen ``[(seconds, {task: state})]``, the last task
    instances by task name)."""
    started, seen = time.monotonic(), []
    while True:
        assert not deployment.dead(), f"components died: {deployment.dead()}"
        tis = task_instances(deployment, run_id)
        seen.append((time.monotonic() - started, {t: ti["state"] for t, ti in tis.items()}))
        run = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
        if run["state"] in DONE or (until is not None and until(tis)):
            return run, seen, task_instances(deployment, run_id)
        assert time.monotonic() - started < RUN_TIMEOUT_S, f"run {run_id} not done in {RUN_TIMEOUT_S} s: {seen[-1]}"
        time.sleep(POLL_S)


def test_killing_the_deferred_guard_stops_the_job_and_leaves_no_process(deployment, diagnose):
    """A user marks the deferred guard failed: the triggerer's ``on_kill`` stops the job, the
    fine-tune watching beside it fails at once, the report fails the run."""
    run_id = trigger(deployment, {**CONF, "samples": 40_000_000, "inject": ""}, "kill_guard")  # still training when killed
    # killed once a triggerer runs its trigger (a trigger not yet started has nothing to kill)
    run, seen, tis = poll_until_done(deployment, run_id, until=lambda tis: tis["fine_tune"]["state"] == "deferred"
                                     and tis["guard"]["state"] == "deferred" and tis["guard"].get("triggerer_job"))
    assert run["state"] == "running", seen[-1]
    time.sleep(5)
    assert deployment.job_processes(), "the job is not running"
    deployment.api("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{tis['guard']['task_id']}",
                   json={"new_state": "failed"})
    deadline = time.monotonic() + 120
    while deployment.job_processes():
        assert time.monotonic() < deadline, "job processes left running after the guard was killed"
        time.sleep(POLL_S)
    run, seen, tis = poll_until_done(deployment, run_id)
    states = {t: (ti["state"], ti["try_number"]) for t, ti in tis.items()}
    assert run["state"] == "failed" and states["guard"][0] == "failed", states
    assert states["fine_tune"][0] == "failed" and states["report"][0] == "failed", states
    assert deployment.job_processes() == []


def test_the_example_dag_runs_under_a_scheduler_and_recovers_by_a_retry(deployment, diagnose):
    started = time.monotonic()
    run_id = trigger(deployment, CONF, "scheduler_tier")
    run, seen, tis = poll_until_done(deployment, run_id)
    print(f"run {run_id}: {run['state']} in {time.monotonic() - started:.0f} s")
    states = {t: (ti["state"], ti["try_number"]) for t, ti in tis.items()}
    assert run["state"] == "success", states
    assert all(state == "success" for state, _ in states.values()), states

    both_deferred = [at for at, s in seen if s.get("fine_tune") == s.get("guard") == "deferred"]
    print(f"fine_tune and guard both deferred in {len(both_deferred)} of {len(seen)} polls")
    assert both_deferred, [s for _, s in seen]

    assert tis["guard"]["try_number"] >= 2, states  # the first try reported the failure, a retry recovered

    history = HistoryStore(f"sqlite:///{deployment.home / 'dlrover_history.db'}")
    [record] = [r for r in history.runs() if run_id in r["run_key"]]
    summary = record["summary"]
    assert record["status"] == "succeeded", summary
    [failure] = summary["failures"]
    assert failure["nodes"][0]["name"] == "worker-0" and failure["nodes"][0]["state"] == "failed", failure
    [recovery] = summary["recoveries"]
    assert recovery["node"] == "worker-0" and recovery["try_number"] > failure["try_number"], (failure, recovery)
    assert summary["samples_lost"] == 0 and summary["job"]["samples_trained"] >= CONF["samples"], summary

    xcom = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{tis['report']['task_id']}"
                                 "/xcomEntries/return_value")
    report = json.loads(xcom["value"]) if isinstance(xcom["value"], str) else xcom["value"]
    assert report["status"] == "succeeded" and report["samples_lost"] == 0 and len(report["recoveries"]) == 1, report

    assert deployment.job_processes() == [], "job processes left running after the report"
    scheduler_log = (deployment.logs / "scheduler.log").read_text()
    # A job node that kept a task's stdin (its supervisor's request socket) holds the supervisor
    # and its executor slot for [workers] socket_cleanup_timeout after the task ended.
    assert "exited with open sockets" not in scheduler_log
    # Airflow's own race (apache/airflow#67287, #72716: a stale executor success for a deferral
    # the trigger has already resumed fails the try): counted, not asserted.
    print(f"tries failed by Airflow's stale-success race: {scheduler_log.count('task-state-changed-externally')}")

    # The report emitted the model's Asset: the deploy DAG scheduled on it runs, on this run's model
    # (asset-triggered runs need the scheduler's schedules: on, with every other DAG paused, lest
    # the daily ones start a run of their own beside it).
    for dag in deployment.api("GET", "/dags")["dags"]:
        if dag["dag_id"] != DEPLOY_DAG_ID:
            deployment.api("PATCH", f"/dags/{dag['dag_id']}", json={"is_paused": True})
    deployment.restart("scheduler", AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="True")
    deadline = time.monotonic() + 300
    while not (runs := deployment.api("GET", f"/dags/{DEPLOY_DAG_ID}/dagRuns")["dag_runs"]) or \
            runs[-1]["state"] not in DONE:
        assert time.monotonic() < deadline, f"{DEPLOY_DAG_ID} did not run after the report: {runs}"
        time.sleep(POLL_S)
    [deploy] = runs
    assert deploy["state"] == "success" and deploy["run_type"] == "asset_triggered", deploy
    gate = task_instances(deployment, deploy["dag_run_id"], DEPLOY_DAG_ID)["gate"]
    model = deployment.api("GET", f"/dags/{DEPLOY_DAG_ID}/dagRuns/{deploy['dag_run_id']}/taskInstances/gate"
                                  "/xcomEntries/return_value")["value"]
    model = json.loads(model) if isinstance(model, str) else model
    assert gate["state"] == "success" and model["dag_run"] == run_id and model["auc"] == summary["job"]["eval_auc"]
