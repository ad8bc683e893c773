"""Deploy each new model of ``dlrm_daily_retrain``: scheduled on the Asset its report emits.

The event's ``extra`` carries the exported model's ``uri``, its held-out ``auc`` and ``log_loss``
and the run (``airflow_dlrover.groups.model_asset``). This DAG gates on the AUC and hands the URI
on; replace ``publish`` with your serving system's rollout.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Param, dag, task

from airflow_dlrover.groups import model_asset

MODEL = model_asset("dlrm_daily_retrain", dag_id="dlrm_daily_retrain", task_group="dlrm_daily_retrain")


@dag(schedule=[MODEL], start_date=datetime(2026, 11, 1), catchup=False, tags=["dlrover", "deploy"],
     params={"min_auc": Param(0.5, type="number", minimum=0, maximum=1)}, doc_md=__doc__)
def deploy_on_new_model():
    @task
    def gate(triggering_asset_events=None, params=None) -> dict:
        """The newest model event; fails (without deploying) below ``min_auc``."""
        [event, *_] = reversed(list(triggering_asset_events[MODEL]))
        model = dict(event.extra)
        if model.get("auc") is None or model["auc"] < params["min_auc"]:
            raise ValueError(f"auc={model.get('auc')} is below min_auc={params['min_auc']}: not deployed")
        return model

    @task
    def publish(model: dict) -> str:
        print(f"deploying {model['uri'] or '(not exported)'}: AUC {model['auc']:.3f}, run {model['dag_run']}")
        return model["uri"] or ""

    publish(gate())


deploy_on_new_model()
