"""``DLRoverLaunchOperator``: pre-tune (plan under the quota, DLRover-RM §5) and launch the job."""

from __future__ import annotations

import time
from typing import Any, Sequence

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.job import (
    build_spec, check_fault_nodes, duration_s, parse_configuration, parse_faults, user_errors,
)


class DLRoverLaunchOperator(DLRoverBaseOperator):
    """Pre-tune and launch: the controller plans under the quota with the fitted model (its
    planning phase: a plan that extrapolates past the probes is measured on the running job
    first, and planned again), then the job is launched on the plan — or adopt it when it already
    runs (after profiling, or on a retry) and resize it to the plan. Faults to inject (demos) are
    scheduled once per run.

    :param job_args: as for the profile task (templated)
    :param objective: ``throughput``, ``deadline`` (with ``deadline``) or ``efficiency`` (templated)
    :param deadline: for the ``deadline`` objective, e.g. ``2h`` (templated)
    :param baseline: the configuration the job would run without us (a configuration row), for
        the report's comparison (templated)
    :param inject: demo faults our runtime injects into itself, e.g. ``kill-worker@30s`` (from the
        launch) (templated)
    :param start_on: launch on this configuration (a configuration row) instead of the plan, which
        is still recorded: the fine-tune then resizes toward it when that pays (templated)
    :param plan_only: record and return the plan without launching

    Shared arguments (``job``, ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``.
    """

    template_fields: Sequence[str] = (*DLRoverBaseOperator.template_fields, "job_args", "objective", "deadline",
                                      "baseline", "inject", "start_on")
    ui_color = "#d9f2e6"

    def __init__(self, *, job_args: dict[str, Any] | None = None, objective: str = "throughput",
                 deadline: str | None = None, baseline: dict[str, Any] | None = None,
                 inject: str | list[str] | None = None, start_on: dict[str, Any] | None = None,
                 plan_only: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.job_args, self.objective, self.deadline = job_args, objective, deadline
        self.baseline, self.inject, self.start_on, self.plan_only = baseline, inject, start_on, plan_only

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.history.control import controller_state
        from airflow_dlrover.lifecycle.profiling import advance, stop_stand_in
        from airflow_dlrover.optimizer import constants as C
        from airflow_dlrover.optimizer.types import Configuration, EventKind, InvalidInputError, Objective, Phase

        run, job_id = self.run_ids(context)
        quota = self.parsed_quota()
        with user_errors():
            spec = build_spec(job_id, self.job_args)
            faults = parse_faults(self.inject)
            objective = Objective.parse(self.objective)
            deadline_s = duration_s("deadline", self.deadline) if self.deadline else None
            baseline = parse_configuration("baseline", self.baseline)
            start_on = parse_configuration("start_on", self.start_on)
            if faults and spec.trainer:
                raise InvalidInputError("inject", self.inject, "nothing with a trainer of your own: our runtime's "
                                        "master injects them into itself")
        state = controller_state(
            self.history, self.job, run, quota, phase=Phase.PLANNING, objective=objective,
            deadline_at_s=None if deadline_s is None else time.time() + deadline_s, batch_size=spec.batch_size,
            # a launch that does not run the plan does not measure it first
            plan_checks=C.PLAN_CHECK_PROBES if self.plan_only or start_on is not None else 0)
        if state.model is None:
            with user_errors():
                raise InvalidInputError("model", self.job, "a fitted model: run the fit task first")
        with user_errors():
            state, actions = advance(self.launcher, job_id, state, spec=spec,
                                     on_step=lambda *seen: self._record_check(run, *seen))
        chosen, model = state.plan, state.model
        with user_errors():
            check_fault_nodes(faults, start_on or chosen.config)
        record = {**chosen.to_dict(), "deadline_s": deadline_s, "time": time.time()}
        if baseline is not None:
            record["baseline"] = {**baseline.to_row(), "predicted_throughput": predict(model, baseline)}
        self.history.add(run, "plan", record)
        self.log.info("plan: %s — %s", chosen.config.describe(), chosen.reason)
        summary = {"run": run, "job_id": job_id, "config": chosen.config.to_row(),
                   "predicted_throughput": round(chosen.predicted_throughput, 1), "reason": chosen.reason}
        if self.plan_only:
            return summary
        target = start_on or chosen.config
        adopted = self.launcher.exists(job_id)
        with user_errors():  # the user's model, checked before any node starts
            self.launcher.launch(spec, target)  # adopts a running job
        current = Configuration(**self.launcher.read_job(job_id)["config"])
        resize = None
        if current != target:
            resize = self.launcher.resize(job_id, target)
        if state.apart:
            stop_stand_in(self.launcher, job_id)
        if not spec.trainer:
            self.launcher.master_call(job_id, "/plan", chosen.to_dict(details=False))
        already = any(e.get("event") == EventKind.FAULTS_SCHEDULED for e in self.history.records(run, "event"))
        if faults and not already:
            self.launcher.master_call(job_id, "/faults", {"faults": faults})
            self.history.add(run, "event", {"event": EventKind.FAULTS_SCHEDULED.value, "faults": faults,
                                            "time": time.time()})
        self.history.add(run, "event", {"event": EventKind.LAUNCHED.value, "time": time.time(), "adopted": adopted,
                                        "resize": resize, "config": target.to_row()})
        return {**summary, "adopted": adopted, "launched_on": target.to_row()}

    def _record_check(self, run: int, before: Any, after: Any, actions: list, observation: Any) -> None:
        """What a step that measured the plan left: the check's window in the profile, the model
        refitted on it, and a ``plan_checked`` event (the plan checked, its prediction, what it
        measured, the plan made again)."""
        import pandas as pd

        from airflow_dlrover.optimizer.constants import PLAN_CHECK_WINDOWS
        from airflow_dlrover.optimizer.types import EventKind

        if not observation.windows or before.plan is None:
            return
        row, checked, chosen = observation.windows[-1], before.plan, after.plan
        self.history.add_samples(run, pd.DataFrame(list(observation.windows)), stage="profile")
        self.history.save_model(run, after.model)
        self.history.add(run, "event", {
            "event": EventKind.PLAN_CHECKED.value, "config": checked.config.to_row(),
            "extrapolation": checked.extrapolation, "predicted_throughput": checked.predicted_throughput,
            "measured_throughput": row["throughput"], "probe_s": row["probe_s"],
            "window_s": PLAN_CHECK_WINDOWS * before.window_s,
            "samples_trained": 0.0 if before.apart else row.get("samples_trained"),  # a stand-in's are not the job's
            "replanned": chosen.config.to_row(), "replanned_throughput": chosen.predicted_throughput,
            "time": time.time()})
        self.log.info("plan check: %s (extrapolating %s): predicted %.0f, measured %.0f samples/s; "
                      "refitted plan %s", checked.config.describe(), checked.extrapolation,
                      checked.predicted_throughput, row["throughput"], chosen.config.describe())


def predict(model: Any, config: Any) -> float:
    """The model's throughput for one configuration."""
    import pandas as pd

    return float(model.throughput.predict(pd.DataFrame([config.to_row()]), band=False)[0])
