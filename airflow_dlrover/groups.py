"""``DLRoverRetrainGroup``: the whole DLRover-RM loop as one task group to drop into a DAG.

::

    profile ──► fit ──► launch ──► [fine_tune ‖ guard] ──► report ──► the model's Asset

The group holds the arguments every task shares (``job``, ``quota``, ``job_args``, ``kubernetes``,
the connection) once, and sets what each task needs to be right: the report runs
``all_done`` (it also stops the job of a failed run), the launch retries a cluster fault, the
fine-tune a lost try, and the guard retries each node failure quickly — the retry is the recovery — through a ``retry_policy``
(other errors keep the task's own ``retry_delay``). It works in a classic DAG, in a ``@dag``
function (TaskFlow) and between other tasks: ``extract >> DLRoverRetrainGroup(...) >> deploy``.

The report emits :func:`model_asset` with the exported model's URI, its held-out AUC and log loss
(and those of the model it continued from) and the run, so that a deploy DAG can be scheduled on it.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, TaskGroup

#: The guard's retries: each is one recovery (a failed, OOM-killed or lost node). (ours: the
#: chaos tests need at most 3 in one run)
GUARD_RETRIES = 4
#: A node failure is retried (recovered) this soon: the job waits for it.
RECOVERY_DELAY = timedelta(seconds=2)
#: The launch's retries (a cluster fault while starting the job; the retry adopts it).
LAUNCH_RETRIES = 2
#: The fine-tune's retries: a retry watches the job again. Airflow 3.3.2 can fail a resumed try
#: with the stale executor event of its deferral (apache/airflow#67287, #72716; once in 4 runs of
#: tests/scheduler), and the fine-tune re-defers at every decision.
FINETUNE_RETRIES = 3
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"


def model_asset(job: str, *, dag_id: str, task_group: str = "") -> Asset:
    """The Asset a retrain group's report emits for ``job`` of ``dag_id`` (a deploy DAG schedules
    on it: ``schedule=[model_asset("dlrm_daily_retrain", dag_id="dlrm_daily_retrain")]``). Each
    event's ``extra``: ``uri`` (the export, None when the job exports nothing), ``auc``,
    ``log_loss`` (held-out), ``previous_uri``, ``previous_auc``, ``previous_log_loss`` (the model
    the job continued from, ``job_args.init_from``, on the same held-out rows; None without one),
    ``samples_trained``, ``dag_run``, ``run`` (the history store's run id)."""
    path = "/".join(part for part in (dag_id, task_group if task_group != job else "", job) if part)
    return Asset(name=f"dlrover.{path.replace('/', '.')}.model", uri=f"dlrover://{path}", group="model")


def recovery_retry_policy():
    """Retry a node failure after ``RECOVERY_DELAY``; anything else as the task's ``retry_delay``."""
    from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryRule

    return ExceptionRetryPolicy(rules=[RetryRule(
        exception="airflow_dlrover.sensors.guard.DLRoverNodeFailure", action=RetryAction.RETRY,
        retry_delay=RECOVERY_DELAY, reason="a node failed: the retry relaunches it and resumes the job")])


class DLRoverRetrainGroup(TaskGroup):
    """Profile, fit, plan and launch the job, fine-tune and guard it while it trains, report.

    :param job: the job's name, stable across days: yesterday's model is its prior (letters,
        digits, ``_ . -``); the group's id by default
    :param job_args: what to train: ``operators.job.JOB_ARGS`` (templated: a mapping, or its text)
    :param quota: ``{"cpu", "memory", "gpu", "max_nodes"}`` the job may use; the connection's when None
    :param trainer: a trainer of your own (``launchers.contract.TrainerSpec`` mapping); None: ours
    :param objective: ``throughput``, ``deadline`` (with ``deadline``) or ``efficiency``
    :param deadline: for the ``deadline`` objective, e.g. ``2h``
    :param baseline: the configuration the job would run without us (the report compares)
    :param inject: demo faults, e.g. ``kill-worker@30s``
    :param start_on: launch on this configuration row instead of the plan (the fine-tune moves it
        when that pays)
    :param probe_window: seconds each profiling probe is measured for; None: the default
    :param similar_jobs: a job with no history of its own starts from the models of jobs like it
        (``DLRoverProfileOperator``); False: it profiles cold
    :param kubernetes: Kubernetes launcher settings over the connection's
    :param dlrover_conn_id: the ``dlrover`` connection
    :param deferrable: the fine-tune and the guard watch from the triggerer; None: ``[operators]
        default_deferrable``
    :param window: measurement window of the fine-tune and the guard
    :param windows: windows per fine-tune decision
    :param timeout: the job must finish this long after the fine-tune and the guard start
        (seconds or a ``timedelta``); None: ``[sensors] default_timeout``
    :param group_id: the task group's id; default ``job``
    :param group_kwargs: ``TaskGroup``'s (``tooltip``, ``default_args``, ``prefix_group_id``, ...)

    Its tasks are attributes: ``profile``, ``fit``, ``launch``, ``fine_tune``, ``guard``,
    ``report``; ``model`` is the Asset the report emits.
    """

    def __init__(self, *, job: str, job_args: dict[str, Any] | str | None = None,
                 quota: dict[str, Any] | str | None = None, trainer: dict[str, Any] | None = None,
                 objective: str = "throughput", deadline: str | None = None,
                 baseline: dict[str, Any] | str | None = None, inject: str | None = None,
                 start_on: dict[str, Any] | str | None = None, probe_window: str | float | None = None,
                 similar_jobs: bool = True,
                 kubernetes: dict[str, Any] | None = None, dlrover_conn_id: str = "dlrover_default",
                 deferrable: bool | None = None, window: str | float | None = None, windows: int | str = 3,
                 timeout: timedelta | float | None = None, group_id: str | None = None, **group_kwargs: Any):
        from airflow_dlrover.operators import (
            DLRoverFineTuneOperator, DLRoverFitOperator, DLRoverLaunchOperator, DLRoverProfileOperator,
            DLRoverReportOperator,
        )
        from airflow_dlrover.sensors import DLRoverInstabilitySensor

        if not isinstance(job, str) or not re.fullmatch(_NAME, job):
            raise ValueError(f"job={job!r} is invalid: allowed a literal name of letters, digits, '_', '.', '-' "
                             "(it keys the job's history; put what varies by day in job_args)")
        if trainer is not None:
            if not isinstance(job_args, (dict, type(None))):
                raise ValueError("job_args is invalid with trainer=: allowed a mapping (the trainer joins it)")
            job_args = {**(job_args or {}), "trainer": trainer}
        group_kwargs.setdefault("tooltip", f"DLRover-RM: profile, plan, train and guard {job}")
        super().__init__(group_id=group_id or job, **group_kwargs)
        shared = {"job": job, "quota": quota, "kubernetes": kubernetes, "dlrover_conn_id": dlrover_conn_id}
        watching: dict[str, Any] = {}
        if deferrable is not None:
            watching["deferrable"] = deferrable
        if window is not None:
            watching["window"] = window
        if timeout is not None:
            watching["timeout"] = timeout
        if self.dag is None:
            raise ValueError("DLRoverRetrainGroup is invalid outside a DAG: allowed inside `with DAG(...)` or a @dag function")
        self.model = model_asset(job, dag_id=self.dag.dag_id, task_group=self.group_id or "")
        with self:
            self.profile = DLRoverProfileOperator(task_id="profile", job_args=job_args, probe_window=probe_window,
                                                  similar_jobs=similar_jobs, **shared)
            self.fit = DLRoverFitOperator(task_id="fit", **shared)
            self.launch = DLRoverLaunchOperator(task_id="launch", job_args=job_args, objective=objective,
                                                deadline=deadline, baseline=baseline, inject=inject, start_on=start_on,
                                                retries=LAUNCH_RETRIES, **shared)
            self.fine_tune = DLRoverFineTuneOperator(task_id="fine_tune", windows=windows, retries=FINETUNE_RETRIES,
                                                     **watching, **shared)
            self.guard = DLRoverInstabilitySensor(task_id="guard", retries=GUARD_RETRIES,
                                                  retry_policy=recovery_retry_policy(), **watching, **shared)
            self.report = DLRoverReportOperator(task_id="report", trigger_rule="all_done", model_asset=self.model,
                                                **shared)
            self.profile >> self.fit >> self.launch >> [self.fine_tune, self.guard] >> self.report
