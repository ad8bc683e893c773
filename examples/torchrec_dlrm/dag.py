"""Daily retrain of a TorchRec trainer — ``train.py`` beside this file: TorchRec's ``DLRM`` over a
sharded ``EmbeddingBagCollection`` with fbgemm's fused row-wise Adagrad, torch.distributed (gloo)
on CPU — with DLRover-RM: profile → fit → launch → (fine-tune ‖ guard) → report.

The trainer keeps the launcher's contract (docs/trainers.md) as TorchRec's own examples log: rank 0
alone reports the job's rate and progress (``reports_from="rank0"``). It is an all-reduce job
(``ps = 0``): probes, the plan and every resize restart the group from its checkpoint, which rank 0
gathers whole so that the group may resume at another world size. This file imports no torch; the
workers need the ``torchrec`` extra and torchrec itself (docs/trainers.md).

Params: samples; quota_cpu / quota_memory; start_on (launch on this configuration instead of
the plan: the fine-tune moves it when that pays).
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_dlrover.groups import DLRoverRetrainGroup

JOB = "torchrec_dlrm"
TRAINER = {"command": [sys.executable, str(Path(__file__).resolve().with_name("train.py")),
                       "--checkpoint-interval", "3"],
           "kind": "allreduce", "reports_from": "rank0", "grace_s": 30}
JOB_ARGS = {"samples": "{{ params.samples }}"}
QUOTA = {"cpu": "{{ params.quota_cpu }}", "memory": "{{ params.quota_memory }}"}

with DAG(
    dag_id="torchrec_dlrm_daily_retrain",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    params={
        "samples": Param(20_000_000, type="integer", minimum=1),
        "quota_cpu": Param(2.0, type="number", exclusiveMinimum=0),
        "quota_memory": Param("6Gi", type="string"),
        "start_on": Param(None, type=["object", "null"], description="a configuration row; null: the plan"),
    },
    tags=["dlrover", "dlrm", "trainer", "torchrec"],
    doc_md=__doc__,
) as dag:
    DLRoverRetrainGroup(job=JOB, trainer=TRAINER, job_args=JOB_ARGS, quota=QUOTA, start_on="{{ params.start_on }}",
                        probe_window="6s")
