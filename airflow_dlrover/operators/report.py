"""``DLRoverReportOperator``: account for every sample, stop the job, report what the optimizer did."""

from __future__ import annotations

from typing import Any

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover import timings as T


class DLRoverReportOperator(DLRoverBaseOperator):
    """Finish the run: account for every sample, read the held-out evaluation the job computed
    itself (or its trainer reported: no torch here), stop the job, and print and store what the
    optimizer did — the chosen plan against the baseline, predicted and measured throughput,
    utilisation, decisions and recoveries. Run it with ``trigger_rule="all_done"``: it
    also stops the job of a failed run, and then fails.

    :param model_asset: an Asset (``groups.model_asset``) to emit on success, its event's ``extra``
        the exported model's URI, held-out AUC and log loss, the same of the model the job continued
        from (``previous_*``), and the run; it joins ``outlets``

    Shared arguments: ``DLRoverBaseOperator``'s (the quota is not used).
    """

    ui_color = "#eeeeee"

    def __init__(self, *, model_asset: Any = None, **kwargs: Any):
        if model_asset is not None:
            kwargs["outlets"] = [*(kwargs.get("outlets") or []), model_asset]
        super().__init__(**kwargs)
        self.model_asset = model_asset

    def execute(self, context: Any) -> dict[str, Any]:
        import json

        from airflow.sdk.exceptions import AirflowFailException

        from airflow_dlrover.history.report import build_report, format_report
        from airflow_dlrover.lifecycle.profiling import stop_stand_in
        from airflow_dlrover.lifecycle.run import job_summary, trainer_summary

        run, job_id = self.run_ids(context)
        stop_stand_in(self.launcher, job_id)  # a run that ended before its launch on the plan
        if not self.launcher.exists(job_id):
            self.history.finish_run(run, "failed", {"error": "the job was never launched"})
            raise AirflowFailException(f"job {job_id} was never launched: see the upstream tasks")
        try:
            status = self.launcher.progress(job_id, timeout=T.MASTER_POLL_TIMEOUT_S)
        except ConnectionError:
            status = {"state": "unreachable"}
        try:
            if status["state"] != "done":
                job = None
            elif self.launcher.trainer(job_id):
                job = trainer_summary(self.launcher, job_id)
            else:
                job = job_summary(self.launcher, job_id, self.launcher.spec(job_id))
        finally:
            self.launcher.stop(job_id)
        report = build_report(self.history, run, job, status)
        self.history.finish_run(run, report["status"], report)
        path = self.launcher.job_dir(job_id) / "report.json"
        path.write_text(json.dumps(report, indent=2, default=str))
        for line in format_report(report):
            self.log.info("%s", line)
        self.log.info("Full report: %s; history store: %s (job %r, run %d)", path, self.history.url, self.job, run)
        if report["status"] != "succeeded":
            raise AirflowFailException(f"job {job_id} did not complete: {report.get('error', status['state'])}")
        if self.model_asset is not None:
            context["outlet_events"][self.model_asset].extra = model_event(job, run, context["run_id"])
        return {key: report[key] for key in ("status", "jct_s", "profile_share", "profile_cost_share",
                                              "measured_throughput", "predicted_throughput", "samples_lost",
                                              "recoveries", "resizes")}


def model_event(job: dict[str, Any], run: int, dag_run: str) -> dict[str, Any]:
    """The model Asset event's ``extra`` (``groups.model_asset``), from the finished job's summary:
    our runtime's held-out evaluation, or what a trainer of the user's reported. ``previous_*``: the
    model the job continued from (``job_args.init_from``), evaluated on the same held-out rows;
    None when there was none. A metric undefined on those rows (NaN) is None."""
    previous = job.get("previous_model") or {}
    return {"uri": job.get("export"), "auc": _metric(job.get("eval_auc", job.get("auc"))),
            "log_loss": _metric(job.get("eval_loss", job.get("loss"))),
            "previous_uri": previous.get("uri"), "previous_auc": _metric(previous.get("auc")),
            "previous_log_loss": _metric(previous.get("loss")),
            "samples_trained": job.get("samples_trained"), "dag_run": dag_run, "run": run}


def _metric(value: Any) -> float | None:
    """A metric for the event's JSON: a float, or None when missing or NaN."""
    return None if value is None or value != value else float(value)
