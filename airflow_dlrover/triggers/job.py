"""``DLRoverJobTrigger``: watches a running job and fires when its task must act.

One watch, two purposes (the task that waits on it):

- ``finetune`` — collects clean measurement windows (see ``launchers.watch``) and fires
  ``{"kind": "windows", "rows": [...]}`` after ``windows`` of them: the operator's observation;
- ``guard`` — fires ``{"kind": "observation", "usage": [...], "history": [...]}`` when the
  controller has something to decide: at once when a node failed, was OOM-killed or vanished, and
  when ``controller.step`` on a window's per-node usage returns an action — the step the guard
  takes, on the state the guard rebuilds (``history.control.controller_state`` of the run, with
  the detectors' ``history`` carried across re-deferrals in the trigger's arguments) and the one
  observer's observation (``lifecycle.observer``). The watch decides nothing: the guard steps
  again on the same observation and carries out what the controller returns.

Both fire ``{"kind": "done"}`` when the job finished, ``{"kind": "stopped"}`` when it was
stopped (a sibling task was killed), ``{"kind": "timeout"}`` at ``deadline``
(epoch seconds: the task's ``timeout`` from its first try, so that re-deferrals do not restart
it; Airflow enforces the same bound on each deferral, except under ``airflow dags test``) and
``{"kind": "turn"}`` when a sibling task watching the same job has waited too long for a worker
slot, and the fine-tune's ``{"kind": "sibling_failed"}`` when its guard has failed (:class:`Turns`).
Each window also logs a progress line and sends the window's metrics.

The same watch runs in the triggerer (deferrable tasks: :meth:`DLRoverJobTrigger.run`) and on
the worker (:meth:`DLRoverJobTrigger.wait`). Launcher calls block, so the triggerer runs them in
a thread; the trigger holds no state that a triggerer restart would lose — it serializes to its
classpath and keyword arguments and starts a fresh window when re-created. A user who kills the
deferred task (mark failed, clear) stops the job (:meth:`DLRoverJobTrigger.on_kill`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_dlrover import metrics
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C

PURPOSES = ("finetune", "guard")
#: Task states in which a sibling waits for a worker slot (``Turns``).
WAITING_STATES = frozenset({"scheduled", "queued", "up_for_reschedule", "up_for_retry"})


class DLRoverJobTrigger(BaseTrigger):
    """:param job_id: the launcher's job id
    :param purpose: ``finetune`` or ``guard`` (see the module docstring)
    :param launcher: ``local`` or ``kubernetes`` (the connection's launcher kind)
    :param jobs_dir: the local launcher's jobs folder
    :param launcher_options: the Kubernetes launcher's settings (``launchers.KUBERNETES_OPTIONS``)
    :param window_s: seconds per measurement window
    :param windows: clean windows per ``windows`` event (``finetune``)
    :param poll_s: seconds between polls
    :param deadline: fire ``timeout`` at this time, epoch seconds (None: never)
    :param quota: the job's quota (``Quota.to_dict()``) the guard's controller heals within
    :param history: the detectors' rows so far (``guard``)
    :param dag_id: the DAG of the task, for ``siblings`` and the metrics' tags
    :param run_id: the DAG run of the task
    :param siblings: task ids of the other tasks watching the job (``Turns``)
    :param job: the job's name (the metrics' tag)
    :param waiting_since: since when a sibling has waited for a slot, epoch seconds (``Turns``;
        carried across events, each of which ends a trigger)
    :param history_run: the job's run in the history store (``guard``: the controller's state)
    :param dlrover_conn_id: the connection that names the history store
    """

    def __init__(self, job_id: str, purpose: str, launcher: str = "local", jobs_dir: str | None = None,
                 launcher_options: dict[str, Any] | None = None, window_s: float = C.MEASUREMENT_WINDOW_S,
                 windows: int = 3, poll_s: float = 0.5, deadline: float | None = None,
                 quota: dict[str, Any] | None = None, history: list[dict[str, Any]] | None = None,
                 dag_id: str = "", run_id: str = "", siblings: list[str] | None = None, job: str = "",
                 waiting_since: float | None = None, history_run: int | None = None,
                 dlrover_conn_id: str = "dlrover_default"):
        super().__init__()
        if purpose not in PURPOSES:
            raise ValueError(f"purpose={purpose!r} is invalid: allowed {', '.join(PURPOSES)}")
        self.job_id, self.purpose, self.launcher, self.jobs_dir = job_id, purpose, launcher, jobs_dir
        self.launcher_options = dict(launcher_options or {})
        self.window_s, self.windows, self.poll_s = float(window_s), int(windows), float(poll_s)
        self.deadline = None if deadline is None else float(deadline)
        self.quota, self.history = quota, list(history or [])
        self.dag_id, self.run_id, self.siblings, self.job = dag_id, run_id, list(siblings or []), job
        self.waiting_since = waiting_since
        self.history_run, self.dlrover_conn_id = history_run, dlrover_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"job_id": self.job_id, "purpose": self.purpose, "launcher": self.launcher, "jobs_dir": self.jobs_dir,
             "launcher_options": self.launcher_options, "window_s": self.window_s, "windows": self.windows,
             "poll_s": self.poll_s, "deadline": self.deadline, "quota": self.quota, "history": self.history,
             "dag_id": self.dag_id, "run_id": self.run_id, "siblings": self.siblings, "job": self.job,
             "waiting_since": self.waiting_since, "history_run": self.history_run,
             "dlrover_conn_id": self.dlrover_conn_id},
        )

    def _make_launcher(self) -> Any:
        from airflow_dlrover.launchers import make_launcher

        return make_launcher(self.launcher, self.jobs_dir, self.launcher_options)

    def _history_store(self) -> Any:
        """The history store of the guard's run (None for the fine-tune, or outside a run)."""
        if self.purpose != "guard" or self.history_run is None:
            return None
        from airflow_dlrover.hooks.dlrover import DLRoverHook

        return DLRoverHook(self.dlrover_conn_id).get_history()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async

        launcher = await asyncio.to_thread(self._make_launcher)
        # The task SDK's calls (the connection, the siblings' states) go through the triggerer's
        # comms, which sync_to_async bridges.
        store = await sync_to_async(self._history_store)()
        watch = await asyncio.to_thread(JobWatch, launcher, self, store)
        turns = self._turns()
        states = sync_to_async(lambda: task_states(self.dag_id, self.run_id, self.siblings))
        while True:
            if hasattr(launcher, "astatus"):  # Kubernetes: AsyncKubernetesHook, on this loop
                statuses = await launcher.astatus(self.job_id)
            else:
                statuses = await asyncio.to_thread(launcher.status, self.job_id)
            event = await asyncio.to_thread(watch.poll, statuses) or self._deadline_event(watch)
            if event is None and turns.due(time.time()):
                # shielded: asgiref drops the message of a cancellation that reaches it, and the
                # triggerer calls on_kill only for one whose message says the user acted
                event = turns.event(await asyncio.shield(states()), time.time(), watch)
            if event is not None:
                yield TriggerEvent(self._payload(event, turns))
                return
            await asyncio.sleep(self.poll_s)

    def wait(self, launcher: Any) -> dict[str, Any]:
        """The same watch, blocking on this worker (a task that does not defer); the event."""
        watch = JobWatch(launcher, self, self._history_store())
        turns = self._turns()
        while True:
            event = watch.poll(launcher.status(self.job_id)) or self._deadline_event(watch)
            if event is None and turns.due(time.time()):
                event = turns.event(task_states(self.dag_id, self.run_id, self.siblings), time.time(), watch)
            if event is not None:
                return self._payload(event, turns)
            time.sleep(self.poll_s)

    def _turns(self) -> "Turns":
        """The siblings' watch of this task: the fine-tune's also watches its guard (``Turns``)."""
        return Turns(self.siblings, self.waiting_since, guarded=self.purpose == "finetune")

    def _deadline_event(self, watch: "JobWatch") -> dict[str, Any] | None:
        if self.deadline is not None and time.time() >= self.deadline:
            return {"kind": "timeout", "rows": watch.rows}
        return None

    def _payload(self, event: dict[str, Any], turns: "Turns") -> dict[str, Any]:
        self.log.info("job %s: %s", self.job_id, event["kind"])
        return {"job_id": self.job_id, "deadline": self.deadline, "waiting_since": turns.waiting_since, **event}

    async def on_kill(self) -> None:
        """The user killed the deferred task: stop its job (no orphan process or pod), as the
        task's own ``on_kill`` does on a worker."""
        def stop() -> None:
            launcher = self._make_launcher()
            if launcher.exists(self.job_id):
                self.log.warning("task killed: stopping job %s", self.job_id)
                launcher.stop(self.job_id)

        await asyncio.to_thread(stop)


class JobWatch:
    """What one watch of the job accumulates, and one poll of it (``poll``)."""

    def __init__(self, launcher: Any, trigger: DLRoverJobTrigger, store: Any = None):
        from airflow_dlrover.launchers.watch import JobMeter

        self.launcher, self.trigger, self.job_id, self.store = launcher, trigger, trigger.job_id, store
        self.meter = JobMeter(launcher, self.job_id)
        self.rows: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = list(trigger.history)
        self.tags = {"dag_id": trigger.dag_id, "job": trigger.job}

    def poll(self, statuses: list[Any]) -> dict[str, Any] | None:
        """One poll, given the job's node statuses; the event to fire, if any."""
        purpose = self.trigger.purpose
        failed = any(s.failed for s in statuses)
        if failed and purpose == "guard":
            return {"kind": "observation", "usage": [], "history": self.history}
        from airflow_dlrover.lifecycle.observer import job_progress

        status = job_progress(self.launcher, self.job_id, statuses)  # None: the master is down, a failed node
        ended = status is not None and (status["state"] == "done" or
                                        # the job's input is wrong: nothing to tune; the guard fails it
                                        (status["state"] == "failed" and purpose == "finetune"))
        if ended:
            return {"kind": "done", "rows": self.rows}
        if status is None:  # the master is down: relaunched, or the job was stopped
            return {"kind": "stopped"} if self.launcher.stopped(self.job_id) else None
        self.meter.observe(status, healthy=not failed)
        if self.meter.elapsed_s < self.trigger.window_s:
            return None
        row, usage = self.meter.close(time.time())
        self._report(status, row, usage)
        if purpose == "finetune":
            self.rows += [row] if row else []
            return {"kind": "windows", "rows": self.rows} if len(self.rows) >= self.trigger.windows else None
        if self._controller_acts(status, usage):
            return {"kind": "observation", "usage": usage, "history": self.history}
        return None

    def _report(self, status: dict[str, Any], row: dict[str, Any] | None, usage: list[dict[str, Any]]) -> None:
        """A progress line in the task's log and the window's metrics (only the fine-tune's, when a
        guard watches the same job, so that each window is counted once)."""
        done, total = status.get("samples_done") or 0, status.get("samples_total")
        throughput = row["throughput"] if row else sum(r["throughput"] or 0 for r in usage if r["role"] == "worker")
        line = progress_line(done, total, throughput)
        self.trigger.log.info("job %s: %s", self.job_id, line)
        if self.trigger.purpose == "finetune" or not self.trigger.siblings:
            metrics.window(self.tags, throughput or None, done / total if total else None, usage)

    def controller_state(self) -> Any:
        """The state the guard steps on: its run's (``history.control.controller_state``, as the
        guard rebuilds it), with the detectors' history of this watch; outside a recorded run, the
        quota and that history alone."""
        from airflow_dlrover.optimizer.controller import ControllerState
        from airflow_dlrover.optimizer.types import Quota

        quota = Quota(**self.trigger.quota) if self.trigger.quota else None
        if self.store is None:
            return ControllerState(quota, node_history=tuple(self.history))
        from airflow_dlrover.history.control import controller_state

        return controller_state(self.store, self.trigger.job, self.trigger.history_run, quota, self.history)

    def _controller_acts(self, status: dict[str, Any], usage: list[dict[str, Any]]) -> bool:
        """Whether ``controller.step`` on this window's usage returns an action, on the guard's own
        state (:meth:`controller_state`) and observation; it keeps the detectors' history when it
        does not."""
        from airflow_dlrover.lifecycle.observer import observe
        from airflow_dlrover.optimizer.controller import step

        state, actions = step(self.controller_state(),
                              observe(self.launcher, self.job_id, status=status, usage=usage))
        if not actions:
            self.history = list(state.node_history)
        return bool(actions)


def progress_line(done: int, total: int | None, throughput: float | None) -> str:
    """``41,200 samples/s · 35.2 % (5,632,000 of 16,000,000) · ETA 4m12s`` (ETA = left ÷ rate)."""
    parts = [f"{throughput:,.0f} samples/s" if throughput else "no rate yet"]
    if total:
        parts.append(f"{100 * done / total:.1f} % ({done:,} of {total:,})")
        if throughput:
            eta = max(total - done, 0) / throughput
            parts.append(f"ETA {int(eta // 60)}m{int(eta % 60):02d}s")
    else:
        parts.append(f"{done:,} samples")
    return " · ".join(parts)


def task_states(dag_id: str, run_id: str, task_ids: list[str]) -> dict[str, str]:
    """The states of ``task_ids`` in one DAG run, through the task SDK (a worker's or the
    triggerer's supervisor); ``{}`` without one (outside Airflow)."""
    if not task_ids:
        return {}
    from airflow.sdk.execution_time import task_runner

    if getattr(task_runner, "SUPERVISOR_COMMS", None) is None:
        return {}
    found = task_runner.RuntimeTaskInstance.get_task_states(dag_id=dag_id, task_ids=task_ids, run_ids=[run_id])
    return {task: state_name(state) for task, state in (found.get(run_id) or {}).items() if state is not None}


def state_name(state: Any) -> str:
    """``up_for_reschedule`` whether a state arrives as text, as the core enum or as the task SDK's
    generated enum (whose ``str()`` is ``TaskInstanceState.UP_FOR_RESCHEDULE``)."""
    return str(getattr(state, "value", state))


class Turns:
    """When a task watching a job hands its worker slot back, so that a sibling can run.

    ``airflow dags test`` runs one task at a time and a deferred task's trigger inline, and a full
    pool holds a task back the same way: the fine-tune and the guard must then take turns, or the
    guard never sees a failure while the fine-tune holds the slot. A task hands its slot back
    (``{"kind": "turn"}``: it reschedules) once a sibling has waited for one (``WAITING_STATES``)
    for ``T.SIBLING_WAIT_S`` without a break. Under a scheduler with a triggerer no sibling waits
    that long, and no turn is taken: no knob to set.

    The fine-tune (``guarded``) also watches its guard: a guard found ``failed`` — marked failed by
    a user between two deferrals, where no ``on_kill`` runs, out of retries, or past its timeout —
    leaves the job unguarded in a failed run: ``{"kind": "sibling_failed"}``, on which the fine-tune
    stops the job and fails, as the trigger's ``on_kill`` would. Not the other way round: a
    fine-tune ends failed by its own timeout while the job trains on under its guard.
    """

    def __init__(self, siblings: list[str], waiting_since: float | None = None, guarded: bool = False):
        self.siblings = list(siblings)
        self.checked_at = 0.0
        self.waiting_since = waiting_since
        self.guarded = guarded

    def due(self, now: float) -> bool:
        return bool(self.siblings) and now - self.checked_at >= T.SIBLING_CHECK_S

    def event(self, states: dict[str, str], now: float, watch: JobWatch) -> dict[str, Any] | None:
        self.checked_at = now
        if self.guarded and (failed := [task for task in self.siblings if states.get(task) == "failed"]):
            return {"kind": "sibling_failed", "tasks": failed}
        if not any(states.get(task) in WAITING_STATES for task in self.siblings):
            self.waiting_since = None
            return None
        self.waiting_since = self.waiting_since or now
        if now - self.waiting_since < T.SIBLING_WAIT_S:
            return None
        return {"kind": "turn", "rows": watch.rows, "history": watch.history}
