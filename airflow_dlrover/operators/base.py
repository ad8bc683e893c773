"""``DLRoverBaseOperator``: what every DLRover task shares — the job, the quota, the Kubernetes
settings and the connection — with the cached hook, history store and launcher, and the run's ids.

A job is its DAG's id, its task group's id and its *name* (``job``, stable across days: the history
store keys yesterday's model by the three, ``history.identity``), and per DAG run it has a launcher
*job id* derived from the three and the Airflow ``run_id``, so that every task of one run — and
every retry — addresses the same running job, and no other DAG's.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import Any, Sequence

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException

from airflow_dlrover import timings as T
from airflow_dlrover.links import DLRoverRunLink
from airflow_dlrover.operators.job import duration_s, launcher_job_id, parse_quota, user_errors
from airflow_dlrover.optimizer import constants as C


class DLRoverBaseOperator(BaseOperator):
    """The shared arguments of the DLRover tasks.

    :param job: the job's name, stable across runs (templated)
    :param quota: ``{"cpu", "memory", "gpu", "max_nodes"}``, what the job may use; the
        connection's default when None (templated)
    :param kubernetes: Kubernetes launcher settings over the connection's (namespace, image,
        service_account, node_selector, tolerations, ...: ``launchers.KUBERNETES_OPTIONS``) (templated)
    :param dlrover_conn_id: the ``dlrover`` connection
    """

    template_fields: Sequence[str] = ("job", "quota", "kubernetes")
    operator_extra_links = (DLRoverRunLink(),)

    def __init__(self, *, job: str, quota: dict[str, Any] | None = None, kubernetes: dict[str, Any] | None = None,
                 dlrover_conn_id: str = "dlrover_default", **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.quota, self.kubernetes, self.dlrover_conn_id = job, quota, kubernetes, dlrover_conn_id

    @cached_property
    def hook(self):
        from airflow_dlrover.hooks.dlrover import DLRoverHook

        return DLRoverHook(self.dlrover_conn_id)

    @cached_property
    def history(self):
        return self.hook.get_history()

    @cached_property
    def launcher(self):
        with user_errors():
            return self.hook.get_launcher(self.kubernetes)

    def parsed_quota(self, *, required: bool = True):
        """The task's quota (a user error when invalid); None when neither the task nor the
        connection sets one and ``required`` is False."""
        if not required and self.quota in (None, "", {}) and self.hook.settings.quota is None:
            return None
        with user_errors():
            return parse_quota(self.quota, self.hook.settings.quota)

    def job_identity(self):
        """This task's job: (the DAG's id, its task group's id or '' at the root, ``job``)."""
        from airflow_dlrover.history.identity import JobIdentity, task_group_of
        from airflow_dlrover.optimizer.types import InvalidInputError

        if not self.job or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(self.job)):
            with user_errors():
                raise InvalidInputError("job", self.job, "a name of letters, digits, '_', '.', '-'")
        with user_errors():
            return JobIdentity(self.dag_id, task_group_of(self), str(self.job))

    def run_ids(self, context: Any) -> tuple[int, str]:
        """(history run id, launcher job id) of this DAG run's job (``job_identity``)."""
        identity = self.job_identity()
        self._dlrover_job_id = launcher_job_id(identity, context["run_id"])
        return self.history.start_run(identity, context["run_id"]), self._dlrover_job_id

    def on_kill(self) -> None:
        """A killed task (marked failed, cleared, timed out) deletes its run's job and the job's
        stand-in: no orphan pods or processes. The report task stops them on every other ending."""
        from airflow_dlrover.lifecycle.profiling import stop_stand_in

        job_id = getattr(self, "_dlrover_job_id", None)
        if job_id and self.launcher.exists(job_id):
            self.log.warning("task killed: stopping job %s", job_id)
            self.launcher.stop(job_id)
        if job_id and stop_stand_in(self.launcher, job_id):
            self.log.warning("task killed: stopped the stand-in of job %s", job_id)

    def metric_tags(self) -> dict[str, str]:
        """The tags of this job's metrics (``airflow_dlrover.metrics``)."""
        return {"dag_id": self.dag_id, "job": str(self.job)}

    def trigger_kwargs(self) -> dict[str, Any]:
        settings = self.hook.settings
        with user_errors():
            options = self.hook.launcher_options(self.kubernetes)
        return {"launcher": settings.launcher, "jobs_dir": settings.jobs_dir, "launcher_options": options}

    def observation(self, job_id: str, **fields: Any):
        """The controller's observation of the running job now (``lifecycle.observer.observe``), with the
        ``windows`` or ``usage`` this task's watch closed."""
        from airflow_dlrover.lifecycle.observer import observe

        return observe(self.launcher, job_id, **fields)


class Again:
    """A watch event handled: wait for the next one, carrying the detectors' ``history``."""

    def __init__(self, history: tuple = ()):
        self.history = history


class DLRoverWatchingOperator(DLRoverBaseOperator):
    """A task that watches the running job until it ends (the fine-tune, the guard): from the
    triggerer when ``deferrable``, else from its worker slot — the same watch
    (``triggers.job.DLRoverJobTrigger``), the same handling of its events (``handle``).

    :param window: measurement window (templated)
    :param deferrable: watch from the triggerer; default ``[operators] default_deferrable``, as
        Airflow's own deferrable operators do

    Both modes end the task ``timeout`` after its first try started (a deadline kept across
    re-deferrals and turns), hand the worker slot back when a sibling watching the same job waits
    for one (``triggers.job.Turns``), and stop the job when the task is killed — the fine-tune
    also when its guard has failed (killed between two deferrals, where nothing else stops the job).
    """

    template_fields: Sequence[str] = (*DLRoverBaseOperator.template_fields, "window")
    #: ``finetune`` or ``guard``: the trigger's purpose
    purpose: str = ""

    def __init__(self, *, window: str | float = f"{C.MEASUREMENT_WINDOW_S:g}s",
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.window, self.deferrable = window, deferrable

    def handle(self, context: Any, event: dict[str, Any]) -> Any:
        """Act on one event of the watch; ``Again`` to wait for the next, else the task's result."""
        raise NotImplementedError

    def timeout_s(self) -> float:
        raise NotImplementedError

    def deadline(self, context: Any) -> float:
        """``timeout`` after the first try of the task started (a turn reschedules it)."""
        ti = context["ti"]
        first = ti.get_first_reschedule_date(context) or getattr(ti, "start_date", None)
        start = first.timestamp() if first else time.time()
        return start + self.timeout_s()

    def watch(self, context: Any, deadline: float, history: tuple = (), waiting_since: float | None = None) -> Any:
        """Wait for the job's events and handle them until the task ends."""
        from airflow_dlrover.triggers.job import DLRoverJobTrigger

        _, job_id = self.run_ids(context)
        while True:
            trigger = DLRoverJobTrigger(job_id, self.purpose, deadline=deadline, history=list(history),
                                        waiting_since=waiting_since, **self.watch_kwargs(context))
            if self.deferrable:
                self.defer(trigger=trigger, method_name="execute_complete",
                           timeout=timedelta(seconds=max(deadline - time.time(), 1.0)))
            event = trigger.wait(self.launcher)
            outcome = self._handle(context, event)
            if not isinstance(outcome, Again):
                return outcome
            history, waiting_since = outcome.history, event.get("waiting_since")

    def _handle(self, context: Any, event: dict[str, Any]) -> Any:
        if event["kind"] == "stopped":
            raise AirflowFailException(f"job {event['job_id']} was stopped (a task of its run was killed, or "
                                       "`dlrover-rm stop`): nothing left to watch")
        if event["kind"] == "sibling_failed":  # the guard failed (killed between deferrals: no on_kill ran)
            self.log.warning("%s failed: stopping job %s", ", ".join(event["tasks"]), event["job_id"])
            self.launcher.stop(event["job_id"])
            raise AirflowFailException(f"job {event['job_id']} was stopped: {', '.join(event['tasks'])}, guarding "
                                       "it, failed (marked failed, out of retries, or past its timeout)")
        return self.handle(context, event)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        outcome = self._handle(context, event)
        if isinstance(outcome, Again):
            return self.watch(context, event["deadline"], outcome.history, event.get("waiting_since"))
        return outcome

    def watch_kwargs(self, context: Any) -> dict[str, Any]:
        """The trigger's arguments besides the job, the purpose and the deadline."""
        run, _ = self.run_ids(context)
        return {"window_s": duration_s("window", self.window), "dag_id": self.dag_id,
                "run_id": context["run_id"], "siblings": self.sibling_watchers(), "job": str(self.job),
                "history_run": run, "dlrover_conn_id": self.dlrover_conn_id, **self.trigger_kwargs()}

    def sibling_watchers(self) -> list[str]:
        """The other tasks watching the same job: watching tasks that share an upstream task
        (the launch) with this one."""
        if not self.has_dag():
            return []
        upstream = set(self.upstream_task_ids)
        return sorted(t.task_id for t in self.dag.tasks
                      if t.task_id != self.task_id and isinstance(t, DLRoverWatchingOperator)
                      and upstream & set(t.upstream_task_ids))

    @staticmethod
    def hand_back() -> None:
        """A sibling waits for this task's slot: reschedule (``triggers.job.Turns``)."""
        raise AirflowRescheduleException(datetime.now(timezone.utc) + timedelta(seconds=T.TURN_RESCHEDULE_S))
