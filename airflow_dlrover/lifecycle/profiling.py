"""The profiling stage: measure the probe configurations the optimizer chose.

``profile_job`` profiles our DLRM runtime *on the job itself*: the job starts on the first probe
and is resized through the others — those that identify the model's parameters in the order that
changes the PS least, then, while the profile stays within its share of the job's run time
(``probes.profile_continues``), the rest in the design's order; each probe is measured for
``PROBE_WINDOW_S`` once every worker has reported on it. The samples trained while profiling count
for the job — nothing is thrown away, as DLRover-RM profiles on the job's first steps — so the
launch that follows is a resize of the running job.

A trainer of the user's (``spec.trainer``, ``launchers.contract``) is profiled the same way: each
probe is a group restart from its checkpoint; a window's throughput is the mean of its workers'
reports, each node's CPU and memory its own cgroup's (or pod's). A trainer that breaks the
contract while profiling is the user's mistake; a probe node killed for memory is recovered as
the guard recovers it (the controller's step: more memory) and the probe measured after.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pandas as pd

from airflow_dlrover.lifecycle.observer import recover
from airflow_dlrover.launchers.watch import JobMeter, all_running
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.probes import next_probe, probes_always_measured, profile_continues
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, Configuration, InvalidInputError, Quota
from airflow_dlrover.runtime.spec import JobSpec

log = logging.getLogger(__name__)



def order_probes(probes: pd.DataFrame) -> list[Configuration]:
    """The cheapest order to visit the probes on one running job: a PS count change costs a
    checkpoint and a PS restart, a new worker a process start (~4 s: torch import), a CPU or
    memory change nothing (in place). So: by PS count; within it by worker count, ascending and
    descending in turn (a snake: the job keeps its workers across the PS change); then by CPU."""
    table = probes.reindex(columns=list(CONFIG_COLUMNS))
    groups = []
    for turn, (_, group) in enumerate(table.groupby("ps", sort=True)):
        groups.append(group.sort_values(["workers", "ps_cpu", "worker_cpu", "ps_memory_mb", "worker_memory_mb"],
                                        ascending=[turn % 2 == 0, True, True, True, True], kind="stable"))
    return [Configuration(**row) for row in pd.concat(groups).to_dict("records")]


def visiting_order(probes: pd.DataFrame) -> list[Configuration]:
    """The order a profile measures the design's probes in: those it always measures
    (``probes.probes_always_measured``) in the cheapest order (:func:`order_probes`), the rest in
    the design's own order (the most informative first), so that wherever the budget ends the
    profile (``probes.profile_continues``) it has measured a prefix of the design."""
    always = probes_always_measured(len(probes))
    head = order_probes(probes.iloc[:always]) if always else []
    tail = probes.iloc[always:].reindex(columns=list(CONFIG_COLUMNS)).to_dict("records")
    return head + [Configuration(**row) for row in tail]


def profile_job(launcher: Any, spec: JobSpec, probes: pd.DataFrame, quota: Quota,
                window_s: float = C.PROBE_WINDOW_S) -> pd.DataFrame:
    """Launch (or adopt) the job and measure it on the design's probes (``probes``, in the
    design's order) in :func:`visiting_order`, while ``probes.profile_continues`` keeps the profile
    within its share of the job's run time, each probe's memory raised to what the job used on
    the probes before it (``probes.next_probe``: one that then passes ``quota`` leaves the design);
    returns the sample table with ``probe_s`` (seconds the probe took, resize included)."""
    rows: list[dict[str, Any]] = []
    order = visiting_order(probes)
    started = time.monotonic()
    index = 0
    while index < len(order):
        if index and not _budget_allows(rows, index, len(order), time.monotonic() - started, spec.samples):
            log.info("the profile ends after %d of %d probes: one more would pass %.0f %% of the job's run time",
                     index, len(order), 100 * C.PROFILE_BUDGET_FRACTION)
            break
        config = next_probe(order, index, pd.DataFrame(rows), quota)
        if config is None:
            break
        if index == 0:
            launcher.launch(spec, config)
        try:
            row = measure_probe(launcher, spec.job_id, config, window_s, quota)
        except JobFinished:
            log.info("the job finished while profiling: %d of %d probes measured", index, len(order))
            break
        if row is not None:
            rows.append(row)
            log.info("probe %d/%d %s: %.0f samples/s", index + 1, len(order), config.describe(), row["throughput"])
        index += 1
    return pd.DataFrame(rows)


def _budget_allows(rows: list[dict[str, Any]], measured: int, designed: int, elapsed_s: float,
                   samples: float | None) -> bool:
    """``probes.profile_continues`` on what the probes so far measured: the best throughput, and
    the samples the job has left (a job of no known size measures every probe)."""
    if not rows or samples is None:
        return True
    trained = max(float(row.get("samples_seen") or 0.0) for row in rows)
    best = max(float(row["throughput"]) for row in rows)
    return profile_continues(measured, designed, elapsed_s, samples - trained, best)


class JobFinished(Exception):
    """The job trained its last sample before a probe could be measured."""


def measure_probe(launcher: Any, job_id: str, config: Configuration, window_s: float,
                  quota: Quota) -> dict[str, Any] | None:
    """Resize the running job to ``config`` (when it is not on it), wait until every worker reported
    on it, and measure it for ``window_s``: a sample row with ``probe_s`` (seconds, resize
    included); None when it was not measured cleanly. Raises :class:`JobFinished`. ``quota`` bounds
    the memory a node killed for it is relaunched with."""
    started = time.monotonic()
    if Configuration(**launcher.read_job(job_id)["config"]) != config:
        launcher.resize(job_id, config)
    if not _settle(launcher, job_id, time.time(), quota):
        raise JobFinished(job_id)
    meter = JobMeter(launcher, job_id)
    status = {"state": "training"}
    while status["state"] != "done" and (meter.elapsed_s < window_s or not _window_reported(meter, window_s)):
        status = launcher.progress(job_id, timeout=T.MASTER_POLL_TIMEOUT_S)
        meter.observe(status, healthy=all_running(launcher.status(job_id)))
        time.sleep(T.SUPERVISOR_POLL_S)
    row, _ = meter.close(time.monotonic() - started)
    if row is None:
        log.warning("probe %s was not measured cleanly (a node failed or the job ended)", config.describe())
        return None
    return {**row, "probe_s": time.monotonic() - started}


def _window_reported(meter: JobMeter, window_s: float) -> bool:
    """A window lasts ``window_s`` and until every worker reported in it (a trainer that reports
    less often than the window, or a worker slowed by a busy node), at most
    ``PROBE_WINDOW_REPORT_FACTOR`` × ``window_s`` (then it is measured as not clean)."""
    return meter.elapsed_s >= C.PROBE_WINDOW_REPORT_FACTOR * window_s or meter.reported()


def _settle(launcher: Any, job_id: str, since: float, quota: Quota) -> bool:
    """Wait until every active worker reported ``PROBE_REPORT_AFTER_S`` after ``since``;
    False when the job is done."""
    trainer = launcher.trainer(job_id)
    timeout = C.PROBE_SETTLE_TIMEOUT_S + (trainer.report_timeout_s if trainer else 0.0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = launcher.metrics(job_id)
        if metrics.get("status") and metrics["status"]["state"] == "done":
            return False
        nodes = launcher.status(job_id)
        broken = next((s for s in nodes if s.failed and s.exit_code == C.USER_ERROR_EXIT_CODE), None)
        if broken is not None:
            raise InvalidInputError("trainer" if trainer else "job", broken.name, "a job that keeps the contract "
                                    "(docs/trainers.md)", broken.reason)
        if any(s.failed for s in nodes):  # a probe too small for the job (an OOM kill): recovered as the guard does
            for record in recover(launcher, job_id, quota):
                log.warning("while profiling: %s", record.get("text") or record)
            since = time.time()
            continue
        workers = [s.name for s in nodes if s.role == "worker" and s.state == "running"]
        reports = metrics["nodes"]
        if workers and all(reports.get(w, {}).get("reported_at", 0) >= since + C.PROBE_REPORT_AFTER_S for w in workers):
            return True
        time.sleep(T.SUPERVISOR_POLL_S)
    raise TimeoutError(f"job {job_id}: workers did not report within {timeout:.0f}s of a probe resize")
