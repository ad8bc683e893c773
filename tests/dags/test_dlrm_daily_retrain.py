"""The example DAG end to end with ``dag.test()`` (the real task runner, triggers run inline),
on the local launcher: a cold run, then warm-started runs of the same job with injected faults
whose recovery is an Airflow retry. Runs in order: each later run warm-starts from the earlier."""

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_dlrover.history.store import HistoryStore
from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.optimizer import constants as C

pytestmark = pytest.mark.dag

DAG_FILE = Path(__file__).parents[2] / "dags" / "dlrm_daily_retrain.py"
JOB = "dlrm_daily_retrain"
#: small and quick: 1.5 cores → 5 cold probes designed, of which a job of about a minute measures
#: the minimum (``PROFILE_BUDGET_FRACTION``)
SMALL = {"samples": 1_200_000, "table_size": 5000, "quota_cpu": 1.5, "quota_memory": "4Gi"}
#: the task group's prefix of the task ids
GROUP = f"{JOB}."


def task_instances(dagrun):
    """The run's task instances by their id within the group."""
    return {ti.task_id.removeprefix(GROUP): ti for ti in dagrun.get_task_instances()}


def test_dag_file_parses_without_torch_or_kubernetes():
    code = (f"import runpy, sys; runpy.run_path({str(DAG_FILE)!r}); "
            "print(sorted(m for m in ('torch', 'kubernetes', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture(scope="module")
def dag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert bag.import_errors == {}
    dag = bag.get_dag(JOB)
    assert sorted(dag.task_dict) == [GROUP + t for t in ("fine_tune", "fit", "guard", "launch", "profile", "report")]
    assert dag.task_dict[GROUP + "report"].trigger_rule == "all_done"
    return dag


def run(dag, logical_date=None, **params):
    run = dag.test(run_conf={**SMALL, **params}, **({"logical_date": logical_date} if logical_date else {}))
    tis = task_instances(run)
    history = HistoryStore()
    record = history.runs(JOB)[-1]
    return run, tis, record, history


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """The export root of the runs that export (``<root>/<ds>``)."""
    return str(tmp_path_factory.mktemp("exports"))


#: The logical dates of the cold run and of the next day's, which continues from its export.
DAY_1, DAY_2 = datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 11, 2, tzinfo=timezone.utc)


def test_cold_run_profiles_plans_trains_and_reports(dag, exports):
    dagrun, tis, record, history = run(dag, logical_date=DAY_1, export=exports)
    assert dagrun.state == "success", {t: ti.state for t, ti in tis.items()}
    report = record["summary"]
    assert record["status"] == "succeeded"
    assert report["probes"] == C.MIN_PROBES_COLD and not report["warm_start"]
    events = history.records(record["id"], "event")
    [profiled] = [e for e in events if e["event"] == "profiled"]
    assert profiled["probes"] == 5 and profiled["measured"] == C.MIN_PROBES_COLD  # the budget ended it
    assert profiled["samples_trained"] > 0  # the probes trained the job itself ...
    if report["measured_throughput"] is not None:  # ... so, measured on the plan, it cost less than its time
        assert 0 <= report["profile_cost_s"] < report["profile_s"]
    assert report["samples_lost"] == 0 and report["job"]["samples_trained"] >= SMALL["samples"]
    assert report["job"]["eval_auc"] > 0.6
    plan = history.records(record["id"], "plan")[-1]
    cores = plan["workers"] * plan["worker_cpu"] + plan["ps"] * plan["ps_cpu"]
    assert cores <= SMALL["quota_cpu"] + 1e-9
    assert report["job"]["config"]["workers"] == plan["workers"]  # the job ran on the plan
    assert report["baseline"]["predicted_throughput"] > 0
    checks = [e for e in events if e["event"] == "plan_checked"]
    assert len(history.samples(JOB, run_id=record["id"], stage="profile")) == C.MIN_PROBES_COLD + len(checks)
    assert not list(CgroupManager().groups(tis["launch"].xcom_pull(task_ids=GROUP + "launch")["job_id"]))
    assert report["job"]["export"] == f"{exports}/2026-11-01" and report["model_comparison"] is None


def test_a_second_job_on_the_same_layout_starts_from_the_first_ones_model(dag):
    from airflow.dag_processing.dagbag import DagBag

    other = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag("ctr_daily_retrain")
    dagrun = other.test(run_conf={"samples": 2_000_000, "quota_cpu": SMALL["quota_cpu"], "quota_memory": "4Gi"})
    history = HistoryStore()
    record = history.runs("ctr_daily_retrain")[-1]
    assert dagrun.state == "success" and record["status"] == "succeeded"
    report = record["summary"]
    [(source, s)] = report["similar_start"]  # 20,000 rows a table against the first job's 5,000: s = 4^-¼
    assert source.endswith(f"/{JOB}") and s == pytest.approx(4 ** -0.25) and not report["warm_start"]
    [profiled] = [e for e in history.records(record["id"], "event") if e["event"] == "profiled"]
    # 2 + round((1 − s)·(5 − 2)), against the cold design's 5
    assert profiled["probes"] == C.MIN_PROBES_SIMILAR + 1 < 5
    assert profiled["measured"] == profiled["probes"] and report["samples_lost"] == 0


def test_the_next_day_continues_from_the_export_and_compares_the_two_models(dag, exports):
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    dagrun, tis, record, _ = run(dag, logical_date=DAY_2, export=exports, samples=400_000)
    assert dagrun.state == "success", {t: ti.state for t, ti in tis.items()}
    report = record["summary"]
    previous = f"{exports}/2026-11-01"
    assert report["job"]["previous_model"]["uri"] == previous and report["job"]["export"] == f"{exports}/2026-11-02"
    compared = report["model_comparison"]
    assert compared["previous_uri"] == previous and compared["samples"] == report["job"]["eval_samples"]
    assert 0.5 < compared["previous_auc"] < 1 and compared["auc_change"] == pytest.approx(
        compared["auc"] - compared["previous_auc"])
    with create_session() as session:
        [event] = session.query(AssetEvent).filter_by(source_dag_id=JOB, source_run_id=dagrun.run_id).all()
        extra = dict(event.extra)
    assert extra["previous_uri"] == previous and extra["previous_auc"] == compared["previous_auc"]
    assert extra["uri"] == f"{exports}/2026-11-02" and extra["auc"] == compared["auc"]


def test_warm_run_recovers_a_killed_worker_through_a_retry(dag, killed_worker_run):
    # conftest's KILLED_WORKER_CONF: long enough that the job still trains after the guard's retry
    # recovered the worker (the session's run: tests/plugins draws it too)
    dagrun, history = killed_worker_run, HistoryStore()
    tis = task_instances(dagrun)
    [record] = history.runs(JOB, run_key=dagrun.run_id)
    assert dagrun.state == "success", {t: ti.state for t, ti in tis.items()}
    report = record["summary"]
    # A warm start profiles nothing: it launches where the last run ended, the fine-tune refits on its windows.
    assert report["warm_start"] and report["probes"] == 0 and report["profile_s"] == 0
    assert history.samples(JOB, run_id=record["id"], stage="profile").empty
    assert tis["fit"].xcom_pull(task_ids=GROUP + "fit")["samples"] == 0
    assert tis["guard"].try_number >= 2
    assert report["samples_lost"] == 0 and report["job"]["samples_trained"] >= dagrun.conf["samples"]
    [failure] = report["failures"]
    assert failure["nodes"][0]["name"] == "worker-0" and failure["nodes"][0]["state"] == "failed"
    [recovery] = report["recoveries"]
    assert recovery["node"] == "worker-0" and recovery["try_number"] == failure["try_number"] + 1
    # recovered while the job trained, not after it: fine-tune windows were measured afterwards
    finetune = history.samples(JOB, run_id=record["id"], stage="finetune")
    assert finetune["timestamp"].max() > recovery["time"]


@pytest.mark.skipif(CgroupManager().mode == "advisory", reason="a real OOM kill needs a cgroup memory limit")
def test_an_oom_kill_is_relaunched_with_more_memory_exactly_once(dag):
    dagrun, tis, record, history = run(dag, inject="oom-worker@4s")
    assert dagrun.state == "success", {t: ti.state for t, ti in tis.items()}
    report = record["summary"]
    [failure] = report["failures"]
    assert failure["nodes"][0]["state"] == "oom_killed"
    [recovery] = report["recoveries"]
    planned = history.records(record["id"], "plan")[-1]["worker_memory_mb"]
    granule = C.MEMORY_GRANULARITY_MB
    assert recovery["memory_mb"] == -(-planned * C.OOM_MEMORY_GROWTH // granule) * granule
    job_dir = LocalLauncher(Path(os.environ["AIRFLOW_HOME"]) / "dlrover" / "jobs").job_dir(report["job"]["job_id"])
    nodes = json.loads((job_dir / "job.json").read_text())["nodes"]
    assert nodes["worker-0"]["memory_mb"] == recovery["memory_mb"] and nodes["worker-0"]["restarts"] == 1
    assert report["samples_lost"] == 0


def test_a_bad_quota_fails_at_once_without_retry(dag):
    dagrun, tis, record, _ = run(dag, quota_memory="12XB")
    assert dagrun.state == "failed"
    assert tis["profile"].state == "failed" and tis["profile"].try_number == 1
    assert tis["launch"].state == "upstream_failed"
    assert tis["report"].state == "failed" and record["status"] == "failed"
