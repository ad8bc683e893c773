"""The one observer: what ``controller.step`` sees of a running job, built the same way for every
caller — the launch and profile tasks, the fine-tune, the guard and its trigger, ``dlrover-rm
train`` and the profiling supervisor.

An ``Observation`` holds, on the wall clock (``time.time()``):

* the running configuration and every node's status with its exit reason, from the launcher's
  record of the job read with its live states (one read: it queries every process or pod);
* the progress the job reports (our master's, or the trainer's reports: samples done and in all),
  unless its master node has failed or does not answer (``MASTER_POLL_TIMEOUT_S``): the failure is
  then in the node statuses, and the step decides on them;
* the windows and per-node usage rows the caller's meter closed since its last step;
* what one restart of the whole job measured (a trainer's group; None for our runtime).

``recover`` is the step a retry takes on a job's failures, on that observation.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from airflow_dlrover.launchers.base import statuses
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer.controller import ControllerState, Fail, Observation, step
from airflow_dlrover.optimizer.types import Configuration, Quota


def observe(launcher: Any, job_id: str, *, before_launch: bool = False, spec: Any = None,
            record: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
            windows: Iterable[dict] = (), usage: Iterable[dict] = ()) -> Observation:
    """The controller's observation of job ``job_id`` now (see the module docstring).
    ``before_launch``: the job may not run yet (the tasks before training), then only its size is
    known (``spec.total_samples``, where given); ``record``: the launcher's record with live states,
    when the caller has just read it; ``status``: the job's progress, when the caller has just
    asked for it."""
    if before_launch and record is None and not launcher.exists(job_id):
        return Observation(time.time(), samples_total=spec.total_samples if spec else None, windows=tuple(windows),
                           transitions=launcher.transition_costs(), in_place=launcher.can_resize_in_place())
    record = launcher.read_job(job_id) if record is None else record
    nodes = tuple(statuses(record))
    if status is None:
        status = job_progress(launcher, job_id, nodes)
    progress = {key: status[key] for key in ("samples_done", "samples_total")
                if status and status.get(key) is not None}
    return Observation(time.time(), Configuration(**record["config"]), nodes=nodes, windows=tuple(windows),
                       usage=tuple(usage), restart_cost_s=launcher.restart_cost_s(job_id),
                       transitions=launcher.transition_costs(), in_place=launcher.can_resize_in_place(), **progress)


def job_progress(launcher: Any, job_id: str, nodes: Iterable[Any]) -> dict[str, Any] | None:
    """The job's progress (``Launcher.progress``), or None when its master has failed or does not
    answer within ``MASTER_POLL_TIMEOUT_S`` (a dead master is not waited for)."""
    if any(node.role == "master" and node.failed for node in nodes):
        return None
    try:
        return launcher.progress(job_id, timeout=T.MASTER_POLL_TIMEOUT_S)
    except ConnectionError:
        return None


def restart_budget(launcher: Any, job_id: str) -> tuple[int, float] | None:
    """The controller's ``restart_budget`` of a trainer of the user's (its ``max_restarts`` within
    ``restart_window_s``); None for our runtime."""
    trainer = launcher.trainer(job_id)
    return None if trainer is None else (trainer.max_restarts, trainer.restart_window_s)


def recover(launcher: Any, job_id: str, quota: Quota | None = None) -> list[dict[str, Any]]:
    """Recover every failed node now, as a retry does: ``controller.step`` on the job's
    observation with its failures taken as reported, its actions applied by the launcher;
    ``quota`` bounds an OOM-killed node's growth. Returns the records of what was done (and of a
    failure no retry can fix)."""
    observation = observe(launcher, job_id)
    failed = frozenset((n.name, n.restarts) for n in observation.nodes if n.failed)
    if not failed:
        return []
    _, actions = step(ControllerState(quota, failures_reported=failed), observation)
    return [a.to_record() for a in actions if isinstance(a, Fail)] + launcher.apply(job_id, actions)
