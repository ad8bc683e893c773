"""``DLRoverJobTrigger``: watches a running job from the triggerer and fires when its task must act.

One trigger, two purposes (the task that deferred to it):

- ``finetune`` — collects clean measurement windows (see ``launchers.watch``) and fires
  ``{"kind": "windows", "rows": [...]}`` after ``windows`` of them, so the operator refits and
  decides;
- ``guard`` — fires ``{"kind": "failed", "nodes": [...]}`` as soon as a node failed, was
  OOM-killed or vanished, and ``{"kind": "instability", "events": [...]}`` when the optimizer's
  detectors (hot PS, straggler, OOM risk) see one in the node history.

Both fire ``{"kind": "done"}`` when the job finished, ``{"kind": "turn"}`` at ``turn_ends_at`` (epoch
seconds: the task's turn spans its re-deferrals, so that a runner that executes one task at a
time, as ``airflow dags test`` does, can interleave the fine-tune and the guard) and ``{"kind": "timeout"}`` after ``timeout_s`` (a bound of our own:
``airflow dags test`` does not enforce the defer timeout). Launcher calls block, so they run in a
thread; the trigger holds no state that a triggerer restart would lose — it serializes to its
classpath and keyword arguments and starts a fresh window when re-created.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

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
    :param timeout_s: fire ``timeout`` after this many seconds
    """

    def __init__(self, job_id: str, purpose: str, launcher: str = "local", jobs_dir: str | None = None,
                 launcher_options: dict[str, Any] | None = None, window_s: float = 3.0, windows: int = 3, turn_ends_at: float | None = None, poll_s: float = 0.5,
                 timeout_s: float = 24 * 3600.0):
        super().__init__()
        if purpose not in PURPOSES:
            raise ValueError(f"purpose={purpose!r} is invalid: allowed {', '.join(PURPOSES)}")
        self.job_id, self.purpose, self.launcher, self.jobs_dir = job_id, purpose, launcher, jobs_dir
        self.launcher_options = dict(launcher_options or {})
        self.window_s, self.windows, self.turn_ends_at = float(window_s), int(windows), turn_ends_at
        self.poll_s, self.timeout_s = float(poll_s), float(timeout_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"job_id": self.job_id, "purpose": self.purpose, "launcher": self.launcher, "jobs_dir": self.jobs_dir,
             "launcher_options": self.launcher_options,
             "window_s": self.window_s, "windows": self.windows, "turn_ends_at": self.turn_ends_at, "poll_s": self.poll_s,
             "timeout_s": self.timeout_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_dlrover.launchers import make_launcher

        launcher = await asyncio.to_thread(make_launcher, self.launcher, self.jobs_dir, self.launcher_options)
        watch = await asyncio.to_thread(_Watch, launcher, self.job_id)
        started = time.monotonic()
        while True:
            if hasattr(launcher, "astatus"):  # Kubernetes: AsyncKubernetesHook, on this loop
                statuses = await launcher.astatus(self.job_id)
            else:
                statuses = await asyncio.to_thread(launcher.status, self.job_id)
            event = await asyncio.to_thread(self._step, watch, statuses, time.monotonic() - started)
            if event is not None:
                self.log.info("job %s: %s", self.job_id, event["kind"])
                yield TriggerEvent({"job_id": self.job_id, "turn_ends_at": self.turn_ends_at, **event})
                return
            await asyncio.sleep(self.poll_s)

    def _step(self, watch: "_Watch", statuses: list[Any], elapsed_s: float) -> dict[str, Any] | None:
        """One poll, given the job's node statuses; the event to fire, if any."""
        from airflow_dlrover.launchers.watch import detect_instability, detector_history, failed_nodes

        failed = failed_nodes(statuses)
        if failed and self.purpose == "guard":
            return {"kind": "failed", "nodes": failed}
        try:
            status = watch.launcher.master_call(self.job_id, "/status", timeout=5.0)
        except ConnectionError:
            status = None  # the master is down: the guard sees it as a failed node
        if status is not None and status["state"] == "done":
            return {"kind": "done", "rows": watch.rows}
        if status is not None:
            watch.meter.observe(status, healthy=not failed)
            if watch.meter.elapsed_s >= self.window_s:
                row, nodes = watch.meter.close(elapsed_s)
                if self.purpose == "finetune":
                    watch.rows += [row] if row else []
                    if len(watch.rows) >= self.windows:
                        return {"kind": "windows", "rows": watch.rows}
                else:
                    watch.history = detector_history(watch.history, nodes, elapsed_s)
                    events = detect_instability(watch.history, elapsed_s)
                    if events:
                        return {"kind": "instability", "events": events}
        if self.turn_ends_at is not None and time.time() >= self.turn_ends_at:
            return {"kind": "turn", "rows": watch.rows}
        if elapsed_s >= self.timeout_s:
            return {"kind": "timeout", "rows": watch.rows}
        return None


class _Watch:
    """What one ``run`` of the trigger accumulates."""

    def __init__(self, launcher: Any, job_id: str):
        from airflow_dlrover.launchers.watch import JobMeter

        self.launcher = launcher
        self.meter = JobMeter(launcher, job_id)
        self.rows: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []
