"""A second team's daily CTR retraining on the same feature layout as ``dlrm_daily_retrain``.

Its job has a name of its own, so none of ``dlrm_daily_retrain``'s runs is its history. On its
first run the profile finds that job in the history store with the same signature (26 lookups
of dim 16, 13 dense features, DenseDLRM's MLPs, batch 512, our runtime) and starts from its model
(a *similar* start): it measures two probes instead of a cold profile's, and the report names the
job its prior came from. From its second run on it warm-starts from its own history. Run it after
``make demo``:

    AIRFLOW_HOME=airflow-home airflow dags test ctr_daily_retrain
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_dlrover.groups import DLRoverRetrainGroup

JOB = "ctr_daily_retrain"

with DAG(
    dag_id="ctr_daily_retrain",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    params={
        "samples": Param(16_000_000, type="integer", minimum=1),
        "quota_cpu": Param(2.0, type="number", exclusiveMinimum=0),
        "quota_memory": Param("8Gi", type="string"),
    },
    tags=["dlrover", "dlrm"],
    doc_md=__doc__,
) as dag:
    DLRoverRetrainGroup(job=JOB, job_args={"samples": "{{ params.samples }}", "seed": 1},
                        quota={"cpu": "{{ params.quota_cpu }}", "memory": "{{ params.quota_memory }}"})
