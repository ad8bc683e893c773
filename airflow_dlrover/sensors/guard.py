"""``DLRoverInstabilitySensor``: the instability guard of a running job (deferrable).

Recovery is an ordinary Airflow retry. The trigger watches the job and wakes the guard when the
controller has something to decide (a failed node, or what the detectors see in the nodes'
usage); the guard hands the observation to ``controller.step`` and carries out what it returns:
healing in place (hot PS, straggler, OOM risk) is applied and recorded, and the guard defers again.
A failed, OOM-killed or lost node is first reported — ``Fail(retryable)`` raises
``DLRoverNodeFailure`` — and the **retry performs the recovery**: its first step finds the failure
reported and relaunches the node (an OOM-killed one with ``OOM_MEMORY_GROWTH`` × its memory, once
per kill, within the quota); the job resumes from its checkpoint (a lost worker's shards are
requeued; a lost PS rolls the job back to the last consistent checkpoint), and the guard watches
again. An OOM kill the quota leaves no room for fails without retry.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.job import duration_s


class DLRoverNodeFailure(AirflowException):
    """A node of the job failed: retryable; the retry relaunches it and resumes the job."""


class DLRoverInstabilitySensor(DLRoverBaseOperator, BaseSensorOperator):
    """Guard the job until it completes (see the module docstring). Set ``retries`` ≥ 1: each
    retry is one recovery.

    :param window: measurement window of the detectors (templated)
    :param turn: hand the worker slot back (reschedule) after this long; set it where tasks run
        one at a time (``airflow dags test``) so that the fine-tune gets its turns (templated)
    :param deferrable: watch from the triggerer (default); False pokes from the worker

    Shared arguments (``job``, ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``;
    healing in place never takes the job past the quota (none when neither the task nor the
    connection sets one).
    """

    template_fields: Sequence[str] = (*DLRoverBaseOperator.template_fields, "window", "turn")
    ui_color = "#fde8e8"

    def __init__(self, *, window: str | float = "3s", turn: str | float | None = None, deferrable: bool = True,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.window, self.turn, self.deferrable = window, turn, deferrable

    def execute(self, context: Any) -> Any:
        run, job_id = self.run_ids(context)
        self.parsed_quota(required=False)  # a bad quota fails now, not at the first healing
        self._step(context, run, job_id)  # a failure seen now is reported (this try fails) or recovered
        if not self.deferrable:
            return super().execute(context)
        self._defer(job_id, self.turn_ends_at())

    def poke(self, context: Any) -> bool:
        """One check (non-deferrable mode): True when the job is done."""
        run, job_id = self.run_ids(context)
        self._step(context, run, job_id)
        return self.launcher.progress(job_id)["state"] == "done"

    def _step(self, context: Any, run: int, job_id: str, usage: tuple = (), node_history: tuple = ()) -> tuple:
        """Observe the nodes (plus ``usage``), ``controller.step``, carry out and record its
        actions; returns the detectors' history to carry on."""
        from airflow_dlrover.history.control import action_event, controller_state, failure_record
        from airflow_dlrover.launchers.base import statuses
        from airflow_dlrover.optimizer.controller import Fail, Keep, Observation, step
        from airflow_dlrover.optimizer.types import Configuration

        record = self.launcher.read_job(job_id)
        nodes = tuple(statuses(record))
        if not usage and not any(n.failed for n in nodes):
            return node_history
        state = controller_state(self.history, self.job, run, self.parsed_quota(required=False), node_history)
        config = Configuration(**record["config"])
        new_state, actions = step(state, Observation(time.time(), config, nodes=nodes, usage=usage))
        try_number = context["ti"].try_number
        for fail in (a for a in actions if isinstance(a, Fail)):
            self.history.add(run, "event", failure_record(fail, nodes, try_number))
            message = f"job {job_id}: {fail.describe()}"
            if not fail.retryable:
                raise AirflowFailException(message)
            raise DLRoverNodeFailure(f"{message}; the retry relaunches it and resumes from the checkpoint")
        for record in [k.to_record() for k in actions if isinstance(k, Keep)] + self.launcher.apply(job_id, actions):
            event = action_event(record, nodes, try_number)
            self.history.add(run, "event", event)
            self.log.warning("%s: %s — %s", event["event"], record["text"], event.get("healed", "relaunched"))
        return new_state.node_history

    def _defer(self, job_id: str, turn_ends_at: float | None, node_history: tuple = (),
               started_at: float | None = None) -> None:
        from airflow_dlrover.triggers.job import DLRoverJobTrigger

        quota = self.parsed_quota(required=False)
        trigger = DLRoverJobTrigger(job_id, "guard", window_s=duration_s("window", self.window),
                                    turn_ends_at=turn_ends_at, quota=None if quota is None else quota.to_dict(),
                                    history=list(node_history), started_at=started_at, **self.trigger_kwargs())
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        run, job_id = self.run_ids(context)
        history = tuple(event.get("history") or ())
        if event["kind"] == "observation":
            history = self._step(context, run, job_id, tuple(event.get("usage") or ()), history)
        elif event["kind"] == "turn":
            raise AirflowRescheduleException(datetime.now(timezone.utc) + timedelta(seconds=1))
        elif event["kind"] == "done":
            events = self.history.records(run, "event")
            return {"job_id": job_id, "recoveries": sum(e.get("event") == "recovered" for e in events),
                    "healed": sum(e.get("event") == "instability" for e in events)}
        elif event["kind"] == "timeout":
            raise AirflowException(f"job {job_id} did not finish while guarded")
        self._defer(job_id, event.get("turn_ends_at"), history, event.get("started_at"))
