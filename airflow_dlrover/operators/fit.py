"""``DLRoverFitOperator``: fit the throughput and memory models (DLRover-RM §4, NNLS)."""

from __future__ import annotations

from typing import Any

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.job import user_errors


class DLRoverFitOperator(DLRoverBaseOperator):
    """The controller's fitting phase: the throughput and memory models fitted on this run's
    profile samples, warm-started from the job's prior (``job_model.choose_prior``); a warm start
    profiles nothing, and then the prior is this run's model until the fine-tune refits it. The
    model goes to the history store, a summary to XCom.

    Arguments: ``DLRoverBaseOperator``'s (the quota is not used).
    """

    ui_color = "#e8f4fd"

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.history.control import controller_state
        from airflow_dlrover.lifecycle.profiling import advance
        from airflow_dlrover.optimizer.types import InvalidInputError, Phase

        run, job_id = self.run_ids(context)
        state = controller_state(self.history, self.job, run, None, phase=Phase.FITTING)
        if not state.profile and state.prior is None:
            with user_errors():
                raise InvalidInputError("samples", f"run {run} of {self.job}", "profile samples: run the profile task first")
        with user_errors():
            state, _ = advance(self.launcher, job_id, state)
        model = state.model
        model_id = self.history.save_model(run, model)
        report = model.throughput.report
        samples = len(state.profile)
        summary = {
            "model_id": model_id, "samples": samples, "warm_start": state.prior is not None,
            "sharpness": model.throughput.sharpness,
            "parameters": {k: float(f"{v:.4g}") for k, v in model.throughput.params.items()},
            "in_sample_mape": round(report.in_sample_mape, 4),
            "out_of_sample_mape": None if report.out_of_sample_mape is None else round(report.out_of_sample_mape, 4),
            "out_of_sample_method": report.out_of_sample_method,
            "pinned": sorted(report.pinned), "memory_model": model.memory is not None,
        }
        self.log.info("fitted on %d samples: in-sample MAPE %.1f %%, %s", samples, 100 * report.in_sample_mape,
                      report.out_of_sample_method)
        return summary
