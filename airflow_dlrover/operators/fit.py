"""``DLRoverFitOperator``: fit the throughput and memory models (DLRover-RM §4, NNLS)."""

from __future__ import annotations

from typing import Any

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.job import user_errors


class DLRoverFitOperator(DLRoverBaseOperator):
    """Fit the throughput and memory models on this run's profile samples, warm-started from the
    job's prior (``HistoryStore.prior_model``); a warm start profiles nothing, and then the prior is
    this run's model until the fine-tune refits it. The model goes to the history store, a summary
    to XCom.

    Arguments: ``DLRoverBaseOperator``'s (the quota is not used).
    """

    ui_color = "#e8f4fd"

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.optimizer.types import InvalidInputError

        run, _ = self.run_ids(context)
        samples = self.history.samples(self.job, run_id=run, stage="profile")
        prior = self.history.prior_model(self.job, before_run=run)
        if samples.empty and prior is None:
            with user_errors():
                raise InvalidInputError("samples", f"run {run} of {self.job}", "profile samples: run the profile task first")
        if samples.empty:  # a warm start profiles nothing: the prior is this run's model until the fine-tune refits
            model = prior
        else:
            with user_errors():
                model = fit_profile(self.history, run, samples, prior)
        model_id = self.history.save_model(run, model)
        report = model.throughput.report
        summary = {
            "model_id": model_id, "samples": len(samples), "warm_start": prior is not None,
            "sharpness": model.throughput.sharpness,
            "parameters": {k: float(f"{v:.4g}") for k, v in model.throughput.params.items()},
            "in_sample_mape": round(report.in_sample_mape, 4),
            "out_of_sample_mape": None if report.out_of_sample_mape is None else round(report.out_of_sample_mape, 4),
            "out_of_sample_method": report.out_of_sample_method,
            "pinned": sorted(report.pinned), "memory_model": model.memory is not None,
        }
        self.log.info("fitted on %d samples: in-sample MAPE %.1f %%, %s", len(samples), 100 * report.in_sample_mape,
                      report.out_of_sample_method)
        return summary


def fit_profile(history: Any, run: int, samples: Any, prior: Any) -> Any:
    """The run's model fitted on its profile ``samples`` (warm-started from ``prior``), the PS
    tables bounded by the layout the profile recorded: the fit task's, and the launch's after it
    measured its plan."""
    from airflow_dlrover.optimizer.job_model import fit_job_model
    from airflow_dlrover.optimizer.types import EventKind

    profiled = [e for e in history.records(run, "event") if e.get("event") == EventKind.PROFILED]
    last = profiled[-1] if profiled else {}
    return fit_job_model(samples, prior, table_capacity_mb=last.get("table_capacity_mb"),
                         largest_table_mb=last.get("largest_table_mb"))
