"""``DLRoverJobTrigger``: watches a running job from the triggerer and fires when its task must act.

One trigger, two purposes (the task that deferred to it):

- ``finetune`` — collects clean measurement windows (see ``launchers.watch``) and fires
  ``{"kind": "windows", "rows": [...]}`` after ``windows`` of them: the operator's observation;
- ``guard`` — fires ``{"kind": "observation", "usage": [...], "history": [...]}`` when the
  controller has something to decide: at once when a node failed, was OOM-killed or vanished, and
  when ``controller.step`` on a window's per-node usage (with the detectors' ``history``, carried
  across re-deferrals in the trigger's arguments) returns an action. The trigger decides nothing:
  the guard steps again on the same observation and carries out what the controller returns.

Both fire ``{"kind": "done"}`` when the job finished, ``{"kind": "turn"}`` at ``turn_ends_at`` (epoch
seconds: the task's turn spans its re-deferrals, so that a runner that executes one task at a
time, as ``airflow dags test`` does, can interleave the fine-tune and the guard) and
``{"kind": "timeout"}`` ``timeout_s`` after ``started_at`` (epoch seconds, set at the first
deferral and carried through the re-deferrals, so that they do not restart it; a bound of our
own: ``airflow dags test`` does not enforce the defer timeout). Launcher calls block, so they run
in a thread; the trigger holds no state that a triggerer restart would lose — it serializes to its
classpath and keyword arguments and starts a fresh window when re-created.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_dlrover.optimizer import constants as C

PURPOSES = ("finetune", "guard")


class DLRoverJobTrigger(BaseTrigger):
    """:param job_id: the launcher's job id
    :param purpose: ``finetune`` or ``guard`` (see the module docstring)
    :param launcher: ``local`` or ``kubernetes`` (the connection's launcher kind)
    :param jobs_dir: the local launcher's jobs folder
    :param launcher_options: the Kubernetes launcher's settings (``launchers.KUBERNETES_OPTIONS``)
    :param window_s: seconds per measurement window
    :param windows: clean windows per ``windows`` event (``finetune``)
    :param turn_ends_at: fire ``turn`` at this time, epoch seconds (None: never)
    :param poll_s: seconds between polls
    :param timeout_s: fire ``timeout`` this many seconds after ``started_at``
    :param started_at: epoch seconds of the first deferral (None: now)
    :param quota: the job's quota (``Quota.to_dict()``) the guard's controller heals within
    :param history: the detectors' rows so far (``guard``)
    """

    def __init__(self, job_id: str, purpose: str, launcher: str = "local", jobs_dir: str | None = None,
                 launcher_options: dict[str, Any] | None = None, window_s: float = 3.0, windows: int = 3,
                 turn_ends_at: float | None = None, poll_s: float = 0.5, timeout_s: float = 24 * 3600.0,
                 started_at: float | None = None, quota: dict[str, Any] | None = None,
                 history: list[dict[str, Any]] | None = None):
        super().__init__()
        if purpose not in PURPOSES:
            raise ValueError(f"purpose={purpose!r} is invalid: allowed {', '.join(PURPOSES)}")
        self.job_id, self.purpose, self.launcher, self.jobs_dir = job_id, purpose, launcher, jobs_dir
        self.launcher_options = dict(launcher_options or {})
        self.window_s, self.windows, self.turn_ends_at = float(window_s), int(windows), turn_ends_at
        self.poll_s, self.timeout_s = float(poll_s), float(timeout_s)
        self.started_at = time.time() if started_at is None else float(started_at)
        self.quota, self.history = quota, list(history or [])

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"job_id": self.job_id, "purpose": self.purpose, "launcher": self.launcher, "jobs_dir": self.jobs_dir,
             "launcher_options": self.launcher_options, "window_s": self.window_s, "windows": self.windows,
             "turn_ends_at": self.turn_ends_at, "poll_s": self.poll_s, "timeout_s": self.timeout_s,
             "started_at": self.started_at, "quota": self.quota, "history": self.history},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_dlrover.launchers import make_launcher

        launcher = await asyncio.to_thread(make_launcher, self.launcher, self.jobs_dir, self.launcher_options)
        watch = await asyncio.to_thread(_Watch, launcher, self.job_id, self.history)
        while True:
            if hasattr(launcher, "astatus"):  # Kubernetes: AsyncKubernetesHook, on this loop
                statuses = await launcher.astatus(self.job_id)
            else:
                statuses = await asyncio.to_thread(launcher.status, self.job_id)
            event = await asyncio.to_thread(self._step, watch, statuses)
            if event is not None:
                self.log.info("job %s: %s", self.job_id, event["kind"])
                yield TriggerEvent({"job_id": self.job_id, "turn_ends_at": self.turn_ends_at,
                                    "started_at": self.started_at, **event})
                return
            await asyncio.sleep(self.poll_s)

    def _step(self, watch: "_Watch", statuses: list[Any]) -> dict[str, Any] | None:
        """One poll, given the job's node statuses; the event to fire, if any."""
        failed = any(s.failed for s in statuses)
        if failed and self.purpose == "guard":
            return {"kind": "observation", "usage": [], "history": watch.history}
        try:
            status = watch.launcher.progress(self.job_id, timeout=C.MASTER_POLL_TIMEOUT_S)
        except ConnectionError:
            status = None  # the master is down: the guard sees it as a failed node
        ended = status is not None and (status["state"] == "done" or
                                        # the job's input is wrong: nothing to tune; the guard fails it
                                        (status["state"] == "failed" and self.purpose == "finetune"))
        if ended:
            return {"kind": "done", "rows": watch.rows}
        if status is not None:
            watch.meter.observe(status, healthy=not failed)
            if watch.meter.elapsed_s >= self.window_s:
                row, usage = watch.meter.close(time.time())
                if self.purpose == "finetune":
                    watch.rows += [row] if row else []
                    if len(watch.rows) >= self.windows:
                        return {"kind": "windows", "rows": watch.rows}
                elif self._controller_acts(watch, statuses, usage):
                    return {"kind": "observation", "usage": usage, "history": watch.history}
                else:
                    watch.history = list(watch.state.node_history)
        if self.turn_ends_at is not None and time.time() >= self.turn_ends_at:
            return {"kind": "turn", "rows": watch.rows, "history": watch.history}
        if time.time() - self.started_at >= self.timeout_s:
            return {"kind": "timeout", "rows": watch.rows}
        return None

    def _controller_acts(self, watch: "_Watch", statuses: list[Any], usage: list[dict[str, Any]]) -> bool:
        """Whether ``controller.step`` on this window's usage returns an action (it keeps the
        detectors' history in ``watch.state`` when it does not)."""
        from airflow_dlrover.optimizer.controller import ControllerState, Observation, step
        from airflow_dlrover.optimizer.types import Configuration, Quota

        quota = Quota(**self.quota) if self.quota else None
        config = Configuration(**watch.launcher.read_job(self.job_id)["config"])
        watch.state, actions = step(ControllerState(quota, node_history=tuple(watch.history)),
                                    Observation(time.time(), config, nodes=tuple(statuses), usage=tuple(usage)))
        return bool(actions)


class _Watch:
    """What one ``run`` of the trigger accumulates."""

    def __init__(self, launcher: Any, job_id: str, history: list[dict[str, Any]]):
        from airflow_dlrover.launchers.watch import JobMeter

        self.launcher = launcher
        self.meter = JobMeter(launcher, job_id)
        self.rows: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = list(history)
        self.state: Any = None
