"""``DLRoverFineTuneOperator``: fine-tune the running job (DLRover-RM §5), deferrable."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from airflow.sdk.exceptions import AirflowRescheduleException

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.job import duration_s, positive_int, user_errors


class DLRoverFineTuneOperator(DLRoverBaseOperator):
    """Fine-tune while the job trains (deferrable): a trigger measures the job in windows; on
    each batch of windows the operator hands them to the controller (``controller.step``: refit,
    then keep or resize for the plan's objective and what is left of its deadline), carries out
    its resize, records the decision with its reason, and defers again until the job completes.

    :param window: measurement window (templated)
    :param windows: windows per decision (templated)
    :param turn: hand the worker slot back (reschedule) after this long; set it where tasks run
        one at a time (``airflow dags test``) so that the instability guard gets its turns (templated)

    Shared arguments (``job``, ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``.
    """

    template_fields: Sequence[str] = (*DLRoverBaseOperator.template_fields, "window", "windows", "turn")
    ui_color = "#fff4d6"

    def __init__(self, *, window: str | float = "3s", windows: int | str = 3, turn: str | float | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.window, self.windows, self.turn = window, windows, turn

    def execute(self, context: Any) -> None:
        from airflow_dlrover.optimizer.types import InvalidInputError

        _, job_id = self.run_ids(context)
        self.parsed_quota()
        with user_errors():
            if positive_int("windows", self.windows) < 1:
                raise InvalidInputError("windows", self.windows, "≥ 1")
        self._defer(job_id, self.turn_ends_at())

    def _defer(self, job_id: str, turn_ends_at: float | None, started_at: float | None = None) -> None:
        from airflow_dlrover.triggers.job import DLRoverJobTrigger

        trigger = DLRoverJobTrigger(job_id, "finetune", window_s=duration_s("window", self.window),
                                    windows=positive_int("windows", self.windows), turn_ends_at=turn_ends_at,
                                    started_at=started_at, **self.trigger_kwargs())
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any] | None:
        run, job_id = self.run_ids(context)
        if event["kind"] == "windows":
            self._decide(run, job_id, event["rows"])
        elif event.get("rows"):  # windows measured before a turn, the end or a time-out: kept, not judged
            self._store_windows(run, event["rows"])
        if event["kind"] == "turn":
            raise AirflowRescheduleException(datetime.now(timezone.utc) + timedelta(seconds=1))
        elif event["kind"] == "done":
            decisions = self.history.records(run, "decision")
            return {"job_id": job_id, "decisions": len(decisions),
                    "resizes": sum(d["action"] != "keep" for d in decisions)}
        elif event["kind"] == "timeout":
            raise TimeoutError(f"job {job_id} did not finish while fine-tuning")
        self._defer(job_id, event.get("turn_ends_at"), event.get("started_at"))

    def _store_windows(self, run: int, rows: list[dict[str, Any]]) -> None:
        import pandas as pd

        if rows:
            self.history.add_samples(run, pd.DataFrame(rows), stage="finetune")

    def _decide(self, run: int, job_id: str, rows: list[dict[str, Any]]) -> None:
        from airflow_dlrover.history.control import controller_state, decision_record
        from airflow_dlrover.optimizer.controller import Resize, measured_since_resize, step

        state = controller_state(self.history, self.job, run, self.parsed_quota())
        observation = self.observation(job_id, windows=tuple(rows))
        with user_errors():
            new_state, (action,) = step(state, observation)
        self._store_windows(run, rows)
        if new_state.model is not state.model:
            self.history.save_model(run, new_state.model)
        measured = measured_since_resize(replace(new_state, since_s=state.since_s), observation.config)
        done = self.launcher.apply(job_id, [action]) if isinstance(action, Resize) else []
        resize = {"actions": done[0]["done"], "seconds": done[0]["seconds"]} if done else None
        self.history.add(run, "decision", decision_record(action, observation.config, measured,
                                                          observation.samples_done, resize))
        self.log.info("fine-tune: %s — %s", action.kind, action.describe())
