"""``DLRoverInstabilitySensor``: the instability guard of a running job.

Recovery is an ordinary Airflow retry. The watch (from the triggerer when deferrable, else from
the worker: ``triggers.job``) wakes the guard when the
controller has something to decide (a failed node, or what the detectors see in the nodes'
usage); the guard hands the observation to ``controller.step`` and carries out what it returns:
healing in place (hot PS, straggler, OOM risk) is applied and recorded, and the guard watches again.
A failed, OOM-killed or lost node is first reported — ``Fail(retryable)`` raises
``DLRoverNodeFailure`` — and the **retry performs the recovery**: its first step finds the failure
reported and relaunches the node (an OOM-killed one with ``OOM_MEMORY_GROWTH`` × its memory, once
per kill, within the quota); the job resumes from its checkpoint (a lost worker's shards are
requeued; a lost PS rolls the job back to the last consistent checkpoint), and the guard watches
again. An OOM kill the quota leaves no room for fails without retry.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout

from airflow_dlrover import metrics
from airflow_dlrover.operators.base import Again, DLRoverWatchingOperator


class DLRoverNodeFailure(AirflowException):
    """A node of the job failed: retryable; the retry relaunches it and resumes the job."""


class DLRoverInstabilitySensor(DLRoverWatchingOperator, BaseSensorOperator):
    """Guard the job until it completes (see the module docstring). Set ``retries`` ≥ 1: each
    retry is one recovery (``DLRoverRetrainGroup`` sets them, with a short delay for a node failure).

    Watching (``window``, ``deferrable``): ``DLRoverWatchingOperator``; the sensor's ``timeout``
    (from the first try, as Airflow's sensors count it) ends the watch without retry. Shared
    arguments (``job``, ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``;
    healing in place never takes the job past the quota (none when neither the task nor the
    connection sets one).
    """

    ui_color = "#fde8e8"
    purpose = "guard"

    def timeout_s(self) -> float:
        return float(self.timeout)

    def execute(self, context: Any) -> Any:
        run, job_id = self.run_ids(context)
        self.parsed_quota(required=False)  # a bad quota fails now, not at the first healing
        self._step(context, run, job_id)  # a failure seen now is reported (this try fails) or recovered
        return self.watch(context, self.deadline(context))

    def poke(self, context: Any) -> bool:
        """One check without a measurement window: a failed node is reported or recovered; True
        when the job is done. (``execute`` watches in both modes; this serves a caller that
        drives the sensor's poke loop itself.)"""
        run, job_id = self.run_ids(context)
        self._step(context, run, job_id)
        return self.launcher.progress(job_id)["state"] == "done"

    def watch_kwargs(self, context: Any) -> dict[str, Any]:
        quota = self.parsed_quota(required=False)
        return {**super().watch_kwargs(context), "quota": None if quota is None else quota.to_dict()}

    def handle(self, context: Any, event: dict[str, Any]) -> Any:
        run, job_id = self.run_ids(context)
        history = tuple(event.get("history") or ())
        if event["kind"] == "observation":
            return Again(self._step(context, run, job_id, tuple(event.get("usage") or ()), history))
        if event["kind"] == "turn":
            self.hand_back()
        if event["kind"] == "timeout":
            raise AirflowSensorTimeout(f"job {job_id} did not finish within the guard's timeout of {self.timeout:g} s")
        events = self.history.records(run, "event")
        return {"job_id": job_id, "recoveries": sum(e.get("event") == "recovered" for e in events),
                "healed": sum(e.get("event") == "instability" for e in events)}

    def _step(self, context: Any, run: int, job_id: str, usage: tuple = (), node_history: tuple = ()) -> tuple:
        """Observe the nodes (plus ``usage``), ``controller.step``, carry out and record its
        actions; returns the detectors' history to carry on."""
        from airflow_dlrover.history.control import action_event, controller_state, failure_record
        from airflow_dlrover.launchers.base import statuses
        from airflow_dlrover.lifecycle.observer import restart_budget
        from airflow_dlrover.optimizer.controller import Fail, Keep, step
        from airflow_dlrover.optimizer.types import Reason

        record = self.launcher.read_job(job_id)
        nodes = tuple(statuses(record))
        if not usage and not any(n.failed for n in nodes):
            return node_history
        state = controller_state(self.history, self.job, run, self.parsed_quota(required=False), node_history,
                                 restart_budget=restart_budget(self.launcher, job_id))
        new_state, actions = step(state, self.observation(job_id, record=record, usage=usage))
        try_number = context["ti"].try_number
        for fail in (a for a in actions if isinstance(a, Fail)):
            self.history.add(run, "event", failure_record(fail, nodes, try_number))
            metrics.incr("node_failures", self.metric_tags())
            message = f"job {job_id}: {fail.describe()}"
            if not fail.retryable:
                raise AirflowFailException(message)
            raise DLRoverNodeFailure(f"{message}; the retry relaunches it and resumes from the checkpoint")
        keeps = [k for k in actions if isinstance(k, Keep)]
        for wait in (k for k in keeps if k.reason == Reason.RESTART_BACKOFF):  # a wait, not an event
            self.log.info("job %s: %s", job_id, wait.describe())
        keeps = [k.to_record() for k in keeps if k.reason != Reason.RESTART_BACKOFF]
        for record in keeps + self.launcher.apply(job_id, actions):
            event = action_event(record, nodes, try_number)
            self.history.add(run, "event", event)
            metrics.incr({"recovered": "recoveries", "instability": "instabilities"}.get(event["event"], event["event"]),
                         self.metric_tags())
            self.log.warning("%s: %s — %s", event["event"], record["text"], event.get("healed", "relaunched"))
        return new_state.node_history
