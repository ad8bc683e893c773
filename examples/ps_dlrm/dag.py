"""Daily retrain of a parameter-server trainer that is not ours — ``train.py`` beside this file,
a DLRM with its own PS over ``TF_CONFIG`` — with DLRover-RM: profile → fit → launch →
(fine-tune ‖ guard) → report.

The trainer keeps the launcher's contract (docs/trainers.md) through its metrics file only; the
DAG hands it over as ``job_args.trainer`` with ``kind="ps"``: probes and plans have PS, a resize
restarts the group (each PS re-partitions its rows from the checkpoint) and is charged the restart
it measured, and a failed node is relaunched alone. This file imports no torch.

Params: samples; quota_cpu / quota_memory; start_on (launch on this configuration instead of
the plan: the fine-tune moves it when that pays); turn (as in dags/dlrm_daily_retrain.py).
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_dlrover.operators import (
    DLRoverFineTuneOperator, DLRoverFitOperator, DLRoverLaunchOperator, DLRoverProfileOperator, DLRoverReportOperator,
)
from airflow_dlrover.sensors import DLRoverInstabilitySensor

JOB = "ps_dlrm"
TRAINER = {"command": [sys.executable, str(Path(__file__).resolve().with_name("train.py")), "--checkpoint-interval", "5"],
           "kind": "ps", "grace_s": 20}
JOB_ARGS = {"trainer": TRAINER, "samples": "{{ params.samples }}"}
QUOTA = {"cpu": "{{ params.quota_cpu }}", "memory": "{{ params.quota_memory }}"}

with DAG(
    dag_id="ps_dlrm_daily_retrain",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    params={
        "samples": Param(2_000_000, type="integer", minimum=1),
        "quota_cpu": Param(2.0, type="number", exclusiveMinimum=0),
        "quota_memory": Param("4Gi", type="string"),
        "start_on": Param(None, type=["object", "null"], description="a configuration row; null: the plan"),
        "turn": Param("20s", type=["string", "null"]),
    },
    tags=["dlrover", "dlrm", "trainer"],
    doc_md=__doc__,
) as dag:
    profile = DLRoverProfileOperator(task_id="profile", job=JOB, job_args=JOB_ARGS, quota=QUOTA, probe_window="5s")
    fit = DLRoverFitOperator(task_id="fit", job=JOB)
    launch = DLRoverLaunchOperator(task_id="launch", job=JOB, job_args=JOB_ARGS, quota=QUOTA,
                                   start_on="{{ params.start_on }}", retries=2)
    fine_tune = DLRoverFineTuneOperator(task_id="fine_tune", job=JOB, quota=QUOTA, turn="{{ params.turn }}")
    guard = DLRoverInstabilitySensor(task_id="guard", job=JOB, quota=QUOTA, turn="{{ params.turn }}", retries=4)
    report = DLRoverReportOperator(task_id="report", job=JOB, trigger_rule="all_done")

    profile >> fit >> launch >> [fine_tune, guard] >> report
