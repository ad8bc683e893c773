"""``DLRoverFineTuneOperator``: fine-tune the running job (DLRover-RM §5)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any, Sequence

from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowFailException

from airflow_dlrover import metrics
from airflow_dlrover.operators.base import Again, DLRoverWatchingOperator
from airflow_dlrover.operators.job import positive_int, user_errors


class DLRoverFineTuneOperator(DLRoverWatchingOperator):
    """Fine-tune while the job trains: a watch measures the job in windows; on each batch of
    windows the operator hands them to the controller (``controller.step``: refit, then keep or
    resize for the plan's objective and what is left of its deadline), carries out its resize,
    records the decision with its reason, and waits again until the job completes.

    :param windows: windows per decision (templated)
    :param timeout: stop fine-tuning (the task fails without retry; the job goes on, guarded) this
        long after the first try started: seconds or a ``timedelta``; default ``[sensors]
        default_timeout`` (7 days), as a sensor's

    Watching (``window``, ``deferrable``): ``DLRoverWatchingOperator``; shared arguments (``job``,
    ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``.
    """

    template_fields: Sequence[str] = (*DLRoverWatchingOperator.template_fields, "windows")
    ui_color = "#fff4d6"
    purpose = "finetune"

    def __init__(self, *, windows: int | str = 3, timeout: timedelta | float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.windows = windows
        if timeout is None:
            timeout = conf.getfloat("sensors", "default_timeout")
        self.timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)

    def timeout_s(self) -> float:
        return self.timeout

    def execute(self, context: Any) -> Any:
        from airflow_dlrover.optimizer.types import InvalidInputError

        self.run_ids(context)
        self.parsed_quota()
        with user_errors():
            if positive_int("windows", self.windows) < 1:
                raise InvalidInputError("windows", self.windows, "≥ 1")
        return self.watch(context, self.deadline(context))

    def watch_kwargs(self, context: Any) -> dict[str, Any]:
        return {**super().watch_kwargs(context), "windows": positive_int("windows", self.windows)}

    def handle(self, context: Any, event: dict[str, Any]) -> Any:
        run, job_id = self.run_ids(context)
        if event["kind"] == "windows":
            self._decide(run, job_id, event["rows"])
        elif event.get("rows"):  # windows measured before a turn, the end or a time-out: kept, not judged
            self._store_windows(run, event["rows"])
        if event["kind"] == "turn":
            self.hand_back()
        elif event["kind"] == "done":
            from airflow_dlrover.optimizer.types import RESIZE_ACTIONS

            decisions = self.history.records(run, "decision")
            return {"job_id": job_id, "decisions": len(decisions),
                    "resizes": sum(d["action"] in RESIZE_ACTIONS for d in decisions)}
        elif event["kind"] == "timeout":
            raise AirflowFailException(f"job {job_id} did not finish within the fine-tune's timeout of "
                                       f"{self.timeout:g} s; the guard still watches it")
        return Again()

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
        if resize:
            metrics.incr("resizes", self.metric_tags())
