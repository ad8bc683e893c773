"""Watching a running job: profile samples in windows and per-node usage, the observations the
controller (``optimizer.controller.step``) decides on.

Shared by ``run_job`` (the CLI's supervisor), the profiling stage and the Airflow triggers.

A window's throughput is Σ_workers Δsamples / Δt between each worker's last report before the
window opened and its last report before it closed (cumulative counters: no lag from the
workers' own rate windows, exact over any span); a node's CPU is Δ(cgroup CPU seconds) / Δt;
memory is the last reading. A window is *clean* when the configuration, the set of nodes and
their restarts did not change during it, no node failed and every active worker reported in it:
only clean windows become profile samples (a window across a resize or a relaunch mixes two
configurations).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from airflow_dlrover.launchers.base import FAILED_STATES, RUNNING
from airflow_dlrover.optimizer import constants as C

WINDOW_S = C.MEASUREMENT_WINDOW_S



def _fingerprint(job: dict[str, Any]) -> tuple:
    nodes = tuple(sorted((n, node.get("restarts", 0), node.get("state")) for n, node in job["nodes"].items()))
    return tuple(sorted(job["config"].items())), nodes


class JobMeter:
    """Accumulates one window at a time: ``observe(status)`` at each poll, ``close()`` at the end."""

    def __init__(self, launcher: Any, job_id: str):
        self.launcher, self.job_id = launcher, job_id
        self._open()

    def _open(self) -> None:
        metrics = self.launcher.metrics(self.job_id)
        job = self.launcher.read_job(self.job_id)
        self.opened, self.usage = metrics["usage_time"], metrics["usage"]
        self.fingerprint, self.reports = _fingerprint(job), worker_reports(job, metrics)
        self.healthy = True
        self.samples_done = 0
        self._interval_from = self.reports

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.opened

    def observe(self, status: dict[str, Any], healthy: bool = True) -> None:
        """One poll: the master's ``/status`` and whether every node runs."""
        self.healthy &= healthy
        self.samples_done = status["samples_done"]

    def interval_rate(self) -> float | None:
        """The job's rate over the interval since the last one ended (the window's start, first):
        once every worker has reported again (:func:`job_throughput`), else None."""
        now = worker_reports(self.launcher.read_job(self.job_id), self.launcher.metrics(self.job_id))
        rate = job_throughput(self._interval_from, now)
        if rate is not None:
            self._interval_from = now
        return rate

    def reported(self) -> bool:
        """Whether every active worker has reported since the window opened (a rate exists)."""
        job, metrics = self.launcher.read_job(self.job_id), self.launcher.metrics(self.job_id)
        return job_throughput(self.reports, worker_reports(job, metrics)) is not None

    def close(self, now_s: float) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """End the window, open the next; returns (profile sample or None when the window was not
        clean, per-node usage rows for the detectors)."""
        metrics = self.launcher.metrics(self.job_id)
        job = self.launcher.read_job(self.job_id)
        seconds = metrics["usage_time"] - self.opened
        nodes = node_rows(job, metrics, self.usage, seconds, now_s)
        reports = worker_reports(job, metrics)
        throughput = job_throughput(self.reports, reports)
        clean = self.healthy and _fingerprint(job) == self.fingerprint and throughput is not None
        row = profile_row(job["config"], nodes, throughput, self.samples_done) if clean else None
        self.opened, self.usage = metrics["usage_time"], metrics["usage"]
        self.fingerprint, self.reports, self.healthy = _fingerprint(job), reports, True
        self._interval_from = reports
        return row, nodes


def worker_reports(job: dict[str, Any], metrics: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each active worker's (cumulative numerator, cumulative denominator) of its throughput: our
    runtime's (samples, report time), so that a window's rate is Δsamples / Δt; a trainer's
    (Σ reported throughput, number of reports), so that it is the mean of the window's reports."""
    active = {n for n, node in job["nodes"].items() if node["role"] == "worker" and node.get("state") != "stopped"}
    reports = {}
    for name, m in metrics.get("nodes", {}).items():
        if name not in active:
            continue
        if "throughput_sum" in m and m.get("reports"):
            reports[name] = (float(m["throughput_sum"]), float(m["reports"]))
        elif "samples" in m and "reported_at" in m:
            reports[name] = (float(m["samples"]), float(m["reported_at"]))
    return reports


def job_throughput(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> float | None:
    """Σ_workers Δnumerator / Δdenominator (:func:`worker_reports`); None unless every worker
    reported, without a restart, in between."""
    if not after or set(after) != set(before):
        return None
    rates = []
    for name, (samples, at) in after.items():
        samples0, at0 = before[name]
        if at <= at0 or samples < samples0:
            return None
        rates.append((samples - samples0) / (at - at0))
    return float(sum(rates))


def node_rows(job: dict[str, Any], metrics: dict[str, Any], before: dict[str, Any], seconds: float,
              now_s: float) -> list[dict[str, Any]]:
    """One row per worker and PS for a window (CPU rate from the cgroup's CPU seconds), with
    ``age_s`` since the node (re)started."""
    started = {name: node.get("started", 0) for name, node in job["nodes"].items()}
    rows = []
    for name, u in metrics["usage"].items():
        if name not in before or u["role"] not in ("worker", "ps"):
            continue
        report = metrics["nodes"].get(name, {})
        rows.append({
            "time_s": now_s, "node": name, "role": u["role"], "age_s": time.time() - started.get(name, 0),
            "cpu_used": _cpu_used(u, before[name], seconds), "cpu_limit": u["cpu"],
            "memory_used_mb": u["memory_mb"], "memory_limit_mb": u["memory_limit_mb"],
            "throughput": report.get("samples_per_s") if u["role"] == "worker" else None,
        })
    return rows


def _cpu_used(usage: dict[str, Any], before: dict[str, Any], seconds: float) -> float:
    """Cores used over the window: Δ CPU seconds of the node's cgroup (local), or the metrics API's
    rate (Kubernetes: metrics-server averages over its own ~15 s window)."""
    if "cpu_rate" in usage:
        return float(usage["cpu_rate"])
    return (usage["cpu_seconds"] - before["cpu_seconds"]) / max(seconds, 1e-9)


def profile_row(config: dict[str, Any], nodes: list[dict[str, Any]], throughput: float,
                samples_done: int) -> dict[str, Any] | None:
    """One profile sample: the configuration + measured throughput, mean per-role usage and each
    role's largest node's memory (a job without PS has none to measure: its PS columns stay empty)."""
    by_role = {role: [n for n in nodes if n["role"] == role] for role in ("worker", "ps")}
    if not by_role["worker"] or (config["ps"] and not by_role["ps"]) or throughput <= 0:
        return None
    row = {**config, "throughput": throughput, "samples_seen": samples_done, "timestamp": time.time()}
    for role, group in by_role.items():
        if group:
            row[f"{role}_cpu_used"] = float(np.mean([n["cpu_used"] for n in group]))
            row[f"{role}_memory_used_mb"] = float(np.mean([n["memory_used_mb"] for n in group]))
            row[f"{role}_memory_peak_mb"] = float(max(n["memory_used_mb"] for n in group))
    return row


def failed_nodes(statuses: list[Any]) -> list[dict[str, Any]]:
    """The failed, OOM-killed, lost or unschedulable nodes among a job's ``launcher.status()``, as
    JSON-able records (events, XCom, history)."""
    return [{"name": s.name, "state": s.state, "reason": s.reason, "memory_mb": s.memory_mb}
            for s in statuses if s.state in FAILED_STATES]


def all_running(statuses: list[Any]) -> bool:
    return all(s.state == RUNNING for s in statuses if s.state != "stopped")
