"""Deploy each new model of ``dlrm_daily_retrain``: scheduled on the Asset its report emits.

The event's ``extra`` carries the exported model's ``uri``, its held-out ``auc`` and ``log_loss``,
the same of the model the run continued from (``previous_uri``, ``previous_auc``,
``previous_log_loss``: yesterday's export, evaluated on today's held-out rows; None without one)
and the run (``airflow_dlrover.groups.model_asset``). The gate (``airflow_dlrover.daily.deploy_verdict``)
deploys a model whose AUC is at least ``min_auc`` and at most ``max_auc_drop`` below the previous
model's; without a previous model only ``min_auc`` applies. ``publish`` hands the URI on: replace it
with your serving system's rollout.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Param, dag, task

from airflow_dlrover.daily import MAX_AUC_DROP, deploy_verdict
from airflow_dlrover.groups import model_asset

MODEL = model_asset("dlrm_daily_retrain", dag_id="dlrm_daily_retrain", task_group="dlrm_daily_retrain")


@dag(schedule=[MODEL], start_date=datetime(2026, 11, 1), catchup=False, tags=["dlrover", "deploy"],
     params={"min_auc": Param(0.5, type="number", minimum=0, maximum=1, description="the least held-out AUC"),
             "max_auc_drop": Param(MAX_AUC_DROP, type="number", minimum=0, maximum=1,
                                   description="how far below the previous model's AUC (on the same held-out "
                                               "rows) today's may be")},
     doc_md=__doc__)
def deploy_on_new_model():
    @task
    def gate(triggering_asset_events=None, params=None) -> dict:
        """The newest model event; fails (without deploying) when ``deploy_verdict`` refuses it."""
        from airflow.sdk.exceptions import AirflowFailException

        [event, *_] = reversed(list(triggering_asset_events[MODEL]))
        model = dict(event.extra)
        verdict = deploy_verdict(model.get("auc"), model.get("previous_auc"), min_auc=params["min_auc"],
                                 max_auc_drop=params["max_auc_drop"])
        if not verdict.deploy:
            raise AirflowFailException(verdict.reason)
        print(verdict.reason)
        return model

    @task
    def publish(model: dict) -> str:
        print(f"deploying {model['uri'] or '(not exported)'}: AUC {model['auc']:.4f}, run {model['dag_run']}"
              + (f"; the previous model {model['previous_uri']}: AUC {model['previous_auc']:.4f} on the same rows"
                 if model.get("previous_auc") is not None else ""))
        return model["uri"] or ""

    publish(gate())


deploy_on_new_model()
