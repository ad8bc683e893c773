"""Run one training job to completion with a launcher: faults, recovery, profile samples, summary.

This is what ``dlrover-rm train`` does. It watches the job every ``SUPERVISOR_POLL_S`` and hands what it
sees to the controller (``optimizer.controller.step``: the node statuses every poll, the per-node
usage every ``WINDOW_S``) and carries out its actions — a failed node is relaunched (with more
memory after a real OOM) on the step after the one that reported it, instability is healed in
place — while every clean window becomes a profile sample (the configuration row plus measured
throughput and per-node CPU / memory) and injected faults fire on schedule. Without a quota
healing is unbounded; the configuration is only changed by the ``resizes`` asked for. The summary
accounts for every sample from the PS journals, per batch (``runtime.accounting``: samples_trained,
samples_lost, samples_duplicated and by which failure, duplicates refused).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from airflow_dlrover.launchers.base import statuses
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.launchers.watch import WINDOW_S, JobMeter
from airflow_dlrover import timings as T
from airflow_dlrover.lifecycle.observer import job_progress, observe, restart_budget
from airflow_dlrover.optimizer.controller import ControllerState, Fail, step
from airflow_dlrover.optimizer.types import (
    CONFIG_COLUMNS, SAMPLE_TABLE_COLUMNS, Configuration, Fault, FaultKind, InvalidInputError, JobFailed,
)
from airflow_dlrover.runtime.spec import JobSpec

log = logging.getLogger(__name__)

SLOW_WORKER_CPU_FRACTION = 0.25  # slow-worker cuts the worker's CPU quota to this fraction
#: hot-ps trains on ids this skewed: with rows partitioned by id % p, the PS that holds the
#: hottest ids takes ~2× the lookups of the others at p = 2 (data.py's measurement at skew 2.0:
#: the busiest of 8 PS serves 64 % of the lookups)
HOT_PS_SKEW = 2.0


def run_job(launcher: LocalLauncher, spec: JobSpec, config: Configuration, out: Path,
            faults: list[Fault] = (), resizes: list[tuple[float, Configuration]] = (),
            timeout_s: float = 3600.0, interventions: Sequence[tuple[float, Callable[..., dict]]] = (),
            series_points: int | None = 200) -> dict[str, Any]:
    """Launch (or adopt) the job, supervise it to the end, evaluate, and write the summary.
    ``resizes``: (seconds after the start, configuration) to resize to; ``interventions``: (seconds
    after the start, ``f(launcher, job_id) -> event``) for what a benchmark does to the job besides;
    ``series_points``: how many throughput points the summary keeps (None: all)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    job_id = launcher.launch(spec, config)
    spec = launcher.spec(job_id)  # as launched: its dataset indexed
    pending = sorted(faults, key=lambda f: f.at_s)
    pending_resizes = sorted(resizes, key=lambda r: r[0])
    pending_interventions = sorted(interventions, key=lambda i: i[0])
    events: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    series: list[dict[str, Any]] = []
    meter = JobMeter(launcher, job_id)
    state = ControllerState(quota=None, restart_budget=restart_budget(launcher, job_id))
    try:
        while True:
            now = time.time() - started
            while pending and pending[0].at_s <= now:
                fault = pending.pop(0)
                events.append(inject(launcher, job_id, fault, now))
            while pending_resizes and pending_resizes[0][0] <= now:
                _, target = pending_resizes.pop(0)
                result = launcher.resize(job_id, target)
                events.append({"time_s": now, "resize": target.to_row(), **result})
            while pending_interventions and pending_interventions[0][0] <= now:
                _, intervene = pending_interventions.pop(0)
                events.append({"time_s": now, **intervene(launcher, job_id)})
            usage: list[dict[str, Any]] = []
            record = launcher.read_job(job_id)  # once a poll: it reads every node's process and cgroup
            nodes = tuple(statuses(record))
            status = job_progress(launcher, job_id, nodes)
            if status is not None and meter.elapsed_s >= WINDOW_S:
                row, usage = meter.close(time.time())
                if row:
                    rows.append(row)
            state, actions = step(state, observe(launcher, job_id, record=record, status=status, usage=usage))
            for action in (a for a in actions if isinstance(a, Fail)):
                events.append({**action.to_record(), "time_s": now})
                if not action.retryable:
                    raise JobFailed(f"job {job_id}: {action.describe()}")
            done = launcher.apply(job_id, actions)
            events += [{**record, "time_s": time.time() - started} for record in done]
            if status is None:
                time.sleep(T.SUPERVISOR_POLL_S)
                continue
            meter.observe(status, healthy=not any(n.failed for n in nodes) and not done)
            series.append({"time_s": now, "throughput": status["throughput"], "samples_done": status["samples_done"]})
            if status["state"] == "done":
                break
            if time.time() - started > timeout_s:
                raise TimeoutError(f"job {job_id} did not finish in {timeout_s:.0f}s")
            time.sleep(T.SUPERVISOR_POLL_S)
        summary = _summarize(launcher, job_id, spec, events, series, started, series_points)
    finally:  # the job stops first, whatever failed (a full disk too); then what was measured is kept
        try:
            launcher.stop(job_id)
        finally:
            _keep_samples(out, rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _keep_samples(out: Path, rows: list[dict[str, Any]]) -> None:
    """Write the sample table; a disk that cannot take it is logged, not raised over the error that
    ended the run."""
    try:
        pd.DataFrame(rows, columns=[*CONFIG_COLUMNS, *SAMPLE_TABLE_COLUMNS]).to_csv(out / "samples.csv", index=False)
    except OSError as err:
        log.error("the sample table was not written to %s: %s", out, err)


def inject(launcher: LocalLauncher, job_id: str, fault: Fault, now: float) -> dict[str, Any]:
    log.warning("injecting %s into %s at %.1fs", fault.kind, fault.node, now)
    if fault.kind == FaultKind.KILL_WORKER or (fault.kind in (FaultKind.KILL_PS, FaultKind.KILL_MASTER)
                                               and not launcher.trainer(job_id)):
        launcher.kill_node(job_id, fault.node)
    elif fault.kind in (FaultKind.OOM_WORKER, FaultKind.KILL_MASTER, FaultKind.KILL_PS) and launcher.trainer(job_id):
        raise InvalidInputError("inject", fault.kind.value, "kill-worker or slow-worker for a trainer of your own "
                                "(its memory and its master, if any, are its own)")
    elif fault.kind == FaultKind.OOM_WORKER:
        launcher.master_call(job_id, "/command", {"node": fault.node, "command": "oom"})
    elif fault.kind == FaultKind.SLOW_WORKER:
        node = next(s for s in launcher.status(job_id) if s.name == fault.node)
        launcher.set_limits(job_id, fault.node, cpu=max(0.1, node.cpu * SLOW_WORKER_CPU_FRACTION))
    return {"time_s": now, "inject": fault.kind.value, "node": fault.node}


def _summarize(launcher, job_id, spec, events, series, started, series_points) -> dict[str, Any]:
    job = launcher.read_job(job_id)
    throughput = [s["throughput"] for s in series if s["throughput"] > 0]
    summary = trainer_summary(launcher, job_id) if launcher.trainer(job_id) else job_summary(launcher, job_id, spec)
    return {
        **summary,
        "wall_s": time.time() - started,
        "median_throughput": float(np.median(throughput)) if throughput else 0.0,
        "events": events + job["events"],
        "throughput_series": series if series_points is None else series[:: max(1, len(series) // series_points)],
    }


def trainer_summary(launcher: LocalLauncher, job_id: str) -> dict[str, Any]:
    """What a trainer of the user's did, as it reported it: its own progress counter (restored
    from its checkpoint after each restart, so a trainer that lost samples ends short of
    ``samples_total``), loss and AUC, with the launcher's restarts and the measured cost of each
    group restart. The keys our runtime's summary shares mean the same: ``samples_trained`` is the
    counter's last value, ``samples_lost`` what it fell short of the total."""
    progress = launcher.progress(job_id)
    job = launcher.read_job(job_id)
    restarts = [e for e in job["events"] if e.get("event") == "restart"]
    done, total = progress["samples_done"], progress["samples_total"]
    return {
        "job_id": job_id, "trainer": True, "samples_total": total, "samples_done": done,
        "samples_expected": total, "samples_trained": done,
        "samples_lost": None if total is None else max(0, total - done),
        "restarts": sum(1 for e in job["events"] if e.get("event") == "relaunch"
                        or (e.get("event") == "restart" and e["reason"] != "resize")),
        "resizes": int(job.get("resizes", 0)),
        "restart_s": [e["restart_s"] for e in restarts],
        "loss": progress.get("loss"), "auc": progress.get("auc"), "config": job["config"],
    }


def job_summary(launcher: LocalLauncher, job_id: str, spec: JobSpec) -> dict[str, Any]:
    """What the finished job did, from its master and PS: the exactly-once accounting from the PS
    journals, restarts, resizes, checkpoints, unreadable rows, and the held-out loss and AUC and the
    export, which the job computed and wrote itself (its finishing worker); ``previous_model``: the
    held-out loss and AUC, on the same rows, of the export the job started from (None: none)."""
    status = launcher.master_call(job_id, "/status")
    accounting = launcher.master_call(job_id, "/accounting")
    job = launcher.read_job(job_id)
    evaluation = status.get("result") or {"loss": None, "auc": None, "samples": 0}
    losses = [m.get("loss") for m in launcher.metrics(job_id)["nodes"].values() if m.get("role") == "worker"]
    losses = [l for l in losses if l is not None]
    return {
        "job_id": job_id,
        **{k: accounting[k] for k in ("samples_expected", "samples_trained", "samples_lost", "samples_duplicated",
                                      "duplicated_by", "duplicates_refused", "duplicates_refused_by",
                                      "samples_by_epoch")},
        "restarts": int(sum(n.get("restarts", 0) for n in job["nodes"].values())),
        "resizes": int(job.get("resizes", 0)),
        "checkpoints": status["counters"]["checkpoints"],
        "restores": status["counters"]["restores"],
        "final_train_loss": float(np.mean(losses)) if losses else None,
        "eval_loss": evaluation["loss"],
        "eval_auc": evaluation["auc"],
        "eval_samples": evaluation["samples"],
        "export": evaluation.get("export"),
        "previous_model": evaluation.get("previous"),
        "bad_rows": status.get("bad_rows", 0),
        "config": job["config"],
    }
