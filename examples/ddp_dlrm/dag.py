"""Daily retrain of a trainer that is not ours — ``train.py`` beside this file, a torch.distributed
DLRM — with DLRover-RM: profile → fit → launch → (fine-tune ‖ guard) → report.

The trainer keeps the launcher's contract (docs/trainers.md); the DAG hands it over as
``trainer=`` of its task group (an argv list, never a shell line). Probes, the plan and every resize are
all-reduce configurations (``ps = 0``); a resize restarts the group from its checkpoint and the
controller charges it the restart it measured. This file imports no torch.

Params: samples; quota_cpu / quota_memory; start_on (launch on this configuration instead of
the plan: the fine-tune moves it when that pays).
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_dlrover.groups import DLRoverRetrainGroup

JOB = "ddp_dlrm"
TRAINER = {"command": [sys.executable, str(Path(__file__).resolve().with_name("train.py")), "--checkpoint-interval", "3"],
           "kind": "allreduce", "grace_s": 20}
JOB_ARGS = {"samples": "{{ params.samples }}"}
QUOTA = {"cpu": "{{ params.quota_cpu }}", "memory": "{{ params.quota_memory }}"}

with DAG(
    dag_id="ddp_dlrm_daily_retrain",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    params={
        "samples": Param(20_000_000, type="integer", minimum=1),
        "quota_cpu": Param(2.0, type="number", exclusiveMinimum=0),
        "quota_memory": Param("4Gi", type="string"),
        "start_on": Param(None, type=["object", "null"], description="a configuration row; null: the plan"),
    },
    tags=["dlrover", "dlrm", "trainer"],
    doc_md=__doc__,
) as dag:
    DLRoverRetrainGroup(job=JOB, trainer=TRAINER, job_args=JOB_ARGS, quota=QUOTA, start_on="{{ params.start_on }}",
                        probe_window="6s")
