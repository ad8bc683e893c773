"""Daily DLRM retraining with DLRover-RM: profile → fit → launch → (fine-tune ‖ guard) → report.

Copy this DAG and change its params. One task group (``DLRoverRetrainGroup``) builds the tasks;
recovery is an Airflow retry of its ``guard`` task. This file imports no torch and no Kubernetes client.

Params (Trigger DAG w/ config, or ``airflow dags test dlrm_daily_retrain -c '{...}'``):
  dataset      ``synthetic``, or a Parquet/CSV/TSV file, folder, glob or fsspec URL (``s3://...``)
  layout       the dataset's feature layout (docs/data.md); null: the Criteo columns
  model        your dense model, ``pkg.module:build``; empty: DenseDLRM
  export       a folder or URL: each day's model is exported to ``<export>/<ds>``, and the day's run
               continues from the newest complete export dated before its ``ds`` (below); empty: none
  samples      samples to train (one epoch); null: every training row of the dataset
  table_size   rows per embedding table (26 tables of the Criteo layout)
  quota_cpu / quota_memory   the quota the optimizer plans under
  objective    throughput | deadline | efficiency
  baseline     the configuration the job would run without the optimizer (for the report)
  inject       demo faults: ``kill-worker@30s``, ``oom-worker@20s`` (comma-separated; from the launch)

Day over day: ``job_args.init_from`` is ``previous_export(params.export, ds)`` (a macro,
``airflow_dlrover.daily``): the newest export under ``export`` that is complete (has its manifest)
and dated before the run's ``ds``, or none. The job loads it, trains on, and evaluates both models
on the day's held-out rows; the report and the model's Asset event compare them, and
``dags/deploy_on_new_model.py`` gates on that. A rerun of a day continues from the day before, never
from its own export. ``airflow dags test`` without a logical date runs "today" again: give each test
run its own date (``airflow dags test dlrm_daily_retrain 2026-11-02``). ``make demo`` does: it exports
to ``$AIRFLOW_HOME/models`` and runs the day after its newest export (today the first time), so a
second ``make demo`` continues from the first's model and prints the comparison.

The same file runs under ``airflow dags test`` and under a scheduler (with a triggerer when
``[operators] default_deferrable`` is on). The report emits ``model_asset(JOB, dag_id=...)``: schedule
a deploy DAG on it (``dags/deploy_on_new_model.py``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_dlrover.daily import previous_export
from airflow_dlrover.groups import DLRoverRetrainGroup

JOB = "dlrm_daily_retrain"
JOB_ARGS = {"samples": "{{ params.samples }}", "data": "{{ params.dataset }}", "layout": "{{ params.layout }}",
            "model": "{{ params.model }}", "export": "{{ (params.export ~ '/' ~ ds) if params.export else '' }}",
            "table_size": "{{ None if params.layout else params.table_size }}",
            "init_from": "{{ previous_export(params.export, ds) }}"}
QUOTA = {"cpu": "{{ params.quota_cpu }}", "memory": "{{ params.quota_memory }}"}

with DAG(
    dag_id="dlrm_daily_retrain",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    params={
        "dataset": Param("synthetic", type="string",
                         description="synthetic, or a Parquet/CSV/TSV file, folder, glob or fsspec URL"),
        "layout": Param(None, type=["object", "null"], description="feature layout; null: the Criteo columns"),
        "model": Param("", type="string", description="pkg.module:build of your dense model; empty: DenseDLRM"),
        "export": Param("", type="string", description="export each day's model to <export>/<ds> and continue "
                        "from the newest one before ds; empty: none"),
        "samples": Param(16_000_000, type=["integer", "null"], minimum=1),
        "table_size": Param(20_000, type="integer", minimum=2),
        "quota_cpu": Param(2.0, type="number", exclusiveMinimum=0),
        "quota_memory": Param("8Gi", type="string"),
        "objective": Param("throughput", enum=["throughput", "deadline", "efficiency"]),
        # What a user would set by hand: the quota split evenly, memory generous.
        "baseline": Param({"workers": 2, "ps": 2, "worker_cpu": 0.5, "ps_cpu": 0.5, "worker_memory_mb": 2048,
                           "ps_memory_mb": 2048, "worker_gpu": 0, "batch_size": 512}, type="object"),
        "inject": Param("", type="string", description="e.g. kill-worker@30s, oom-worker@20s"),
    },
    user_defined_macros={"previous_export": previous_export},
    tags=["dlrover", "dlrm"],
    doc_md=__doc__,
) as dag:
    DLRoverRetrainGroup(job=JOB, job_args=JOB_ARGS, quota=QUOTA, objective="{{ params.objective }}",
                        baseline="{{ params.baseline }}", inject="{{ params.inject }}")
