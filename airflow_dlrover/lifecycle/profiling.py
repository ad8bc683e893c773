"""The phases before training, as a task drives them: ``controller.step`` decides, this applies.

:func:`advance` loops ``step`` on the one observer's observations while the controller's phase
stays the one it started in — profiling (the profile task), fitting (the fit task), planning (the
launch task) — and carries out what ``step`` asks: a ``Probe`` is measured on the job itself (the
first one starts or adopts it), recovery actions go to the launcher, a ``Fail`` raises.

Our DLRM runtime is profiled *on the job itself*: it starts on the first probe and is resized
through the others, and the samples it trains meanwhile count — nothing is thrown away, as
DLRover-RM profiles on the job's first steps — so the launch that follows is a resize of the running
job. A trainer of the user's (``spec.trainer``, ``launchers.contract``) is profiled the same way:
each probe is a group restart from its checkpoint; a window's throughput is the mean of its
workers' reports, each node's CPU and memory its own cgroup's (or pod's). A trainer that breaks the
contract while profiling is the user's mistake; a probe node killed for memory is recovered as the
guard recovers it (the controller's step: more memory) and the probe measured after.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import replace
from typing import Any, Callable

import pandas as pd

from airflow_dlrover.lifecycle.observer import job_progress, observe, recover
from airflow_dlrover.launchers.base import statuses
from airflow_dlrover.launchers.watch import JobMeter, all_running
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.controller import Action, ControllerState, Fail, Observation, Probe, begin, step
from airflow_dlrover.optimizer.probes import visiting_order, window_settled
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, JobFailed, Quota
from airflow_dlrover.runtime.auth import MasterRejected
from airflow_dlrover.runtime.spec import JobSpec, check_job_id

log = logging.getLogger(__name__)

#: what a task that drives the controller is told of each step: (state before, state after,
#: actions, the observation stepped on)
StepCallback = Callable[[ControllerState, ControllerState, list, Observation], None]


def advance(launcher: Any, job_id: str, state: ControllerState, *, spec: JobSpec | None = None,
            on_step: StepCallback | None = None) -> tuple[ControllerState, list[Action]]:
    """Step the controller while its phase is ``state.phase`` (see the module docstring); returns
    the state in its next phase and the actions of the step that changed it. A ``Fail`` raises:
    ``JobFailed`` for what no retry fixes, a ``RuntimeError`` (retryable) otherwise. ``spec``: the
    job's, for a phase that may start it (a probe)."""
    phase, started = state.phase, False
    measured_id, measured_spec = job_id, spec  # the job, or its stand-in once a probe is apart
    observation = observe(launcher, job_id, before_launch=True, spec=spec)
    try:
        while True:
            before = state
            state, actions = step(state, observation)
            if on_step is not None:
                on_step(before, state, actions, observation)
            _raise_on_fail(job_id, actions)
            if state.phase != phase:
                return state, actions
            probe = next((a for a in actions if isinstance(a, Probe)), None)
            if probe is None:
                for record in launcher.apply(measured_id, actions):
                    log.warning("while %s: %s", phase.value, record.get("text") or record)
                observation = _observe(launcher, measured_id, measured_spec, job_id)
                continue
            log.info("%s: %s%s", probe.config.describe(), probe.describe(), " (on the job's stand-in)" * probe.apart)
            if probe.apart and measured_id == job_id:
                measured_id, measured_spec = stand_in_id(job_id), stand_in(spec) if spec is not None else None
            if not started:
                launcher.launch(measured_spec, probe.config)  # adopts a running job
                started = True
                _report_every(launcher, measured_id, T.PROBE_REPORT_INTERVAL_S)
            try:
                row = measure_probe(launcher, measured_id, probe.config, probe.window_s, state.quota, probe.halfwidth)
            except JobFinished:
                log.info("the job finished while %s", phase.value)
                row = None
            observation = _observe(launcher, measured_id, measured_spec, job_id, windows=(row,) if row else ())
    finally:
        if started:
            _report_every(launcher, measured_id, T.REPORT_INTERVAL_S)


def _report_every(launcher: Any, job_id: str, seconds: float) -> None:
    """Ask our runtime's master for the workers' reports every ``seconds`` (``timings``:
    ``PROBE_REPORT_INTERVAL_S`` while a phase measures probes); a trainer of the user's reports as
    it does. A master that does not take it keeps its interval: probes then wait longer, no more."""
    if launcher.trainer(job_id) is not None:
        return
    try:
        launcher.master_call(job_id, "/report_interval", {"seconds": seconds}, timeout=T.MASTER_POLL_TIMEOUT_S)
    except (OSError, MasterRejected) as err:  # unreachable, refused, or a master without the route
        log.info("reports of %s stay at their interval (not %g s): %s", job_id, seconds, err)


def _observe(launcher: Any, measured_id: str, spec: JobSpec | None, job_id: str,
             windows: tuple[dict, ...] = ()) -> Observation:
    """The observation of the job measured: the job's own, or its stand-in's, whose samples are
    not the job's (the whole job remains)."""
    observation = observe(launcher, measured_id, before_launch=True, spec=spec, windows=windows)
    return observation if measured_id == job_id else replace(observation, samples_done=0.0)


def stand_in_id(job_id: str) -> str:
    """The id of the job's stand-in (``Probe.apart``): as short as the launcher's ids (52 characters,
    ``operators.job.launcher_job_id``), its digest its own."""
    digest = hashlib.sha1(f"stand-in\0{job_id}".encode()).hexdigest()[:8]
    return check_job_id(f"{job_id[:43].rstrip('-._')}-{digest}")


def stand_in(spec: JobSpec) -> JobSpec:
    """The job's stand-in, which a profile apart measures (``probes.profile_apart``): the same job
    under its own id and key, started without the state it continues (``init_from``), exporting
    nothing; the launch on the plan stops it (:func:`stop_stand_in`)."""
    return replace(spec, job_id=stand_in_id(spec.job_id), init_from="", export="", authkey=secrets.token_hex(16))


def stop_stand_in(launcher: Any, job_id: str) -> bool:
    """Stop the stand-in of job ``job_id`` where one runs; whether one did."""
    if not launcher.exists(stand_in_id(job_id)) or launcher.stopped(stand_in_id(job_id)):
        return False
    launcher.stop(stand_in_id(job_id))
    return True


def profile_job(launcher: Any, spec: JobSpec, quota: Quota, *, window_s: float = C.PROBE_WINDOW_S,
                probes: pd.DataFrame | None = None, **design: Any) -> pd.DataFrame:
    """Profile the job from a shell (``dlrover-rm profile``, benchmarks): the controller's profiling
    phase from :func:`controller.begin` (``design``: its keyword arguments; ``probes``: a design to
    measure instead of the optimizer's), driven by :func:`advance`; returns the sample table."""
    state = begin(quota, batch_size=spec.batch_size, window_s=window_s, **design)
    if probes is not None:
        state = replace(state, probes=tuple(visiting_order(probes)))
    try:
        state, _ = advance(launcher, spec.job_id, state, spec=spec)
    finally:
        stop_stand_in(launcher, spec.job_id)
    return pd.DataFrame(list(state.profile))


def _raise_on_fail(job_id: str, actions: list[Action]) -> None:
    fail = next((a for a in actions if isinstance(a, Fail)), None)
    if fail is None:
        return
    raise (RuntimeError if fail.retryable else JobFailed)(f"job {job_id}: {fail.describe()}")


class JobFinished(Exception):
    """The job trained its last sample before a probe could be measured."""


def measure_probe(launcher: Any, job_id: str, config: Configuration, window_s: float,
                  quota: Quota, halfwidth: float = 0.0) -> dict[str, Any] | None:
    """Resize the running job to ``config`` (when it is not on it), wait until every worker reported
    on it, and measure it for ``window_s`` — or less, once its interval rates settle within
    ``halfwidth`` (``probes.window_settled``) —: a sample row with ``probe_s`` (seconds, resize
    included) and ``samples_trained`` (meanwhile; None where the job did not answer before); None
    when it was not measured cleanly. Raises :class:`JobFinished`. ``quota`` bounds the memory a
    node killed for it is relaunched with."""
    started = time.monotonic()
    before = job_progress(launcher, job_id, launcher.status(job_id))
    if Configuration(**launcher.read_job(job_id)["config"]) != config:
        launcher.resize(job_id, config)
    if not _settle(launcher, job_id, time.time(), quota):
        raise JobFinished(job_id)
    meter = JobMeter(launcher, job_id)
    status = {"state": "training"}
    rates: list[float] = []
    while status["state"] != "done" and not window_settled(rates, halfwidth) and (
            meter.elapsed_s < window_s or not _window_reported(meter, window_s)):
        status = launcher.progress(job_id, timeout=T.MASTER_POLL_TIMEOUT_S)
        meter.observe(status, healthy=all_running(launcher.status(job_id)))
        rate = meter.interval_rate() if halfwidth > 0 else None
        if rate is not None:
            rates.append(rate)
        time.sleep(T.SUPERVISOR_POLL_S)
    row, _ = meter.close(time.monotonic() - started)
    if row is None:
        log.warning("probe %s was not measured cleanly (a node failed or the job ended)", config.describe())
        return None
    trained = row["samples_seen"] - before["samples_done"] if before else None
    return {**row, "probe_s": time.monotonic() - started, "samples_trained": trained}


def _window_reported(meter: JobMeter, window_s: float) -> bool:
    """A window lasts ``window_s`` and until every worker reported in it (a trainer that reports
    less often than the window, or a worker slowed by a busy node), at most
    ``PROBE_WINDOW_REPORT_FACTOR`` × ``window_s`` (then it is measured as not clean)."""
    return meter.elapsed_s >= C.PROBE_WINDOW_REPORT_FACTOR * window_s or meter.reported()


def _settle(launcher: Any, job_id: str, since: float, quota: Quota) -> bool:
    """Wait until every running worker that reports (``Launcher.reporters``: rank 0 alone for a
    rank-0 trainer) reported ``PROBE_REPORT_AFTER_S`` after ``since``; False when the job is done."""
    trainer = launcher.trainer(job_id)
    timeout = C.PROBE_SETTLE_TIMEOUT_S + (trainer.report_timeout_s if trainer else 0.0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = launcher.metrics(job_id)
        if metrics.get("status") and metrics["status"]["state"] == "done":
            return False
        record = launcher.read_job(job_id)
        nodes = statuses(record)
        broken = next((s for s in nodes if s.failed and s.exit_code == C.USER_ERROR_EXIT_CODE), None)
        if broken is not None:
            raise InvalidInputError("trainer" if trainer else "job", broken.name, "a job that keeps the contract "
                                    "(docs/trainers.md)", broken.reason)
        if any(s.failed for s in nodes):  # a probe too small for the job (an OOM kill): recovered as the guard does
            for record in recover(launcher, job_id, quota):
                log.warning("while profiling: %s", record.get("text") or record)
            since = time.time()
            continue
        running = {s.name for s in nodes if s.state == "running"}
        workers = [w for w in launcher.reporters(job_id, record) if w in running]
        reports = metrics["nodes"]
        if workers and all(reports.get(w, {}).get("reported_at", 0) >= since + C.PROBE_REPORT_AFTER_S for w in workers):
            return True
        time.sleep(T.SUPERVISOR_POLL_S)
    raise TimeoutError(f"job {job_id}: workers did not report within {timeout:.0f}s of a probe resize")
