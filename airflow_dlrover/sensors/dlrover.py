"""``DLRoverInstabilitySensor``: the instability guard of a running job (deferrable).

Recovery is an ordinary Airflow retry. The trigger watches the job; what can be healed in place
(hot PS, straggler, OOM risk) is healed and recorded, and the sensor defers again. A failed,
OOM-killed or lost node raises ``DLRoverNodeFailure`` — retryable — and the **retry performs the
recovery**: ``execute`` first relaunches every failed node (an OOM-killed one with
``OOM_MEMORY_GROWTH`` × its memory, once per real OOM kill: a relaunched node is running, so a
second retry finds nothing to grow), the job resumes from its checkpoint (a lost worker's shards
are requeued; a lost PS rolls the job back to the last consistent checkpoint), and the guard
watches again.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowRescheduleException

from airflow_dlrover.operators.job import DLRoverTaskMixin, duration_s, parse_quota, user_errors


class DLRoverNodeFailure(AirflowException):
    """A node of the job failed: retryable; the retry relaunches it and resumes the job."""


class DLRoverInstabilitySensor(DLRoverTaskMixin, BaseSensorOperator):
    """Guard the job until it completes (see the module docstring). Set ``retries`` ≥ 1: each
    retry is one recovery.

    :param job: the job's name (templated)
    :param quota: healing in place never takes the job past it; the connection's default when
        None, no limit when neither is set (templated)
    :param window: measurement window of the detectors (templated)
    :param turn: hand the worker slot back (reschedule) after this long; set it where tasks run
        one at a time (``airflow dags test``) so that the fine-tune gets its turns (templated)
    :param deferrable: watch from the triggerer (default); False pokes from the worker
    :param kubernetes: Kubernetes launcher settings over the connection's (namespace, image,
        service_account, node_selector, tolerations, ...: ``launchers.KUBERNETES_OPTIONS``) (templated)
    :param dlrover_conn_id: the ``dlrover`` connection
    """

    template_fields: Sequence[str] = ("job", "quota", "window", "turn", "kubernetes")
    ui_color = "#fde8e8"

    def __init__(self, *, job: str, quota: dict[str, Any] | None = None, window: str | float = "3s",
                 turn: str | float | None = None, deferrable: bool = True, kubernetes: dict[str, Any] | None = None,
                 dlrover_conn_id: str = "dlrover_default",
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.quota, self.window, self.turn, self.deferrable = job, quota, window, turn, deferrable
        self.dlrover_conn_id = dlrover_conn_id
        self.kubernetes = kubernetes

    def execute(self, context: Any) -> Any:
        from airflow_dlrover.launchers.watch import failed_nodes

        run, job_id = self.run_ids(context)
        self._quota()  # a bad quota fails now, not at the first healing
        failed = failed_nodes(self.launcher.status(job_id))
        events = [e.get("event") for e in self.history.records(run, "event")]
        failures_seen = [i for i, e in enumerate(events) if e == "node_failed"]
        recoveries = [i for i, e in enumerate(events) if e == "recovered"]
        if failed and (not failures_seen or (recoveries and recoveries[-1] > failures_seen[-1])):
            # A failure no try has reported yet (it happened while this task was not deferred):
            # this try fails, the retry recovers — recovery is always an Airflow retry.
            self._fail(context, failed)
        for event in self.launcher.recover(job_id):
            record = {"event": "recovered", "time": time.time(), "try_number": context["ti"].try_number, **event}
            self.history.add(run, "event", record)
            self.log.warning("recovered %s (%s): relaunched with %s MB in %.1fs", event["node"], event["reason"],
                             event["memory_mb"], event["recovered_in_s"])
        if not self.deferrable:
            return super().execute(context)
        self._defer(job_id, self.turn_ends_at())

    def _quota(self) -> Any:
        if self.quota in (None, "", {}) and self.hook.settings.quota is None:
            return None
        with user_errors():
            return parse_quota(self.quota, self.hook.settings.quota)

    def poke(self, context: Any) -> bool:
        """One check (non-deferrable mode): True when the job is done; a failed node raises."""
        from airflow_dlrover.launchers.watch import failed_nodes

        _, job_id = self.run_ids(context)
        failed = failed_nodes(self.launcher.status(job_id))
        if failed:
            self._fail(context, failed)
        return self.launcher.master_call(job_id, "/status")["state"] == "done"

    def _defer(self, job_id: str, turn_ends_at: float | None) -> None:
        from airflow_dlrover.triggers.dlrover import DLRoverJobTrigger

        trigger = DLRoverJobTrigger(job_id, "guard", window_s=duration_s("window", self.window),
                                    turn_ends_at=turn_ends_at, **self.trigger_kwargs())
        self.defer(trigger=trigger, method_name="execute_complete")

    def _fail(self, context: Any, nodes: list[dict[str, Any]]) -> None:
        run, job_id = self.run_ids(context)
        self.history.add(run, "event", {"event": "node_failed", "time": time.time(), "nodes": nodes,
                                        "try_number": context["ti"].try_number})
        names = ", ".join(f"{n['name']} ({n['state']}: {n['reason']})" for n in nodes)
        raise DLRoverNodeFailure(f"job {job_id}: {names}; the retry relaunches it and resumes from the checkpoint")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from airflow_dlrover.launchers.watch import heal

        run, job_id = self.run_ids(context)
        if event["kind"] == "failed":
            self._fail(context, event["nodes"])
        elif event["kind"] == "instability":
            for record in event["events"]:
                healed = heal(self.launcher, job_id, record, self._quota())
                self.history.add(run, "event", {"event": "instability", "time": time.time(), **healed})
                self.log.warning("%s on %s: %s — %s", record["instability"], record["node"], record["reason"],
                                 healed["healed"])
        elif event["kind"] == "turn":
            raise AirflowRescheduleException(datetime.now(timezone.utc) + timedelta(seconds=1))
        elif event["kind"] == "done":
            events = self.history.records(run, "event")
            return {"job_id": job_id, "recoveries": sum(e.get("event") == "recovered" for e in events),
                    "healed": sum(e.get("event") == "instability" for e in events)}
        elif event["kind"] == "timeout":
            raise AirflowException(f"job {job_id} did not finish while guarded")
        self._defer(job_id, event.get("turn_ends_at"))
