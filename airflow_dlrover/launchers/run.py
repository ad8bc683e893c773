"""Run one training job to completion with a launcher: faults, recovery, profile samples, summary.

This is what ``dlrover-rm train`` does. It watches the job every ``POLL_S``: a failed node is
relaunched (with more memory after a real OOM), every ``WINDOW_S`` a profile sample (the
configuration row plus measured throughput and per-node CPU / memory) is appended, and injected
faults fire on schedule. The summary accounts for every sample from the PS ledger:

    samples_trained    = Σ_shards applied(shard)
    samples_lost       = Σ_shards max(0, size(shard) − applied(shard))   (must be 0)
    samples_duplicated = Σ_shards max(0, applied(shard) − size(shard))   (≤ one shard per failure)

where applied(shard) counts the samples of the shard whose gradients the model holds (a rollback
to a checkpoint rolls the ledger back with the model).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, Configuration, InvalidInputError, parse_duration_s
from airflow_dlrover.runtime.spec import JobSpec

log = logging.getLogger(__name__)

POLL_S = 0.25
WINDOW_S = 3.0  # profile-sample window (our choice: ≥ 3 worker reports per window)
HISTORY_S = 30.0  # the instability detectors look at this much node history
NODE_WARMUP_S = 10.0  # ... from this long after a node (re)started (our measurement: torch import + first rows)
FAULT_KINDS = ("kill-worker", "kill-ps", "kill-master", "oom-worker", "slow-worker", "hot-ps")
SLOW_WORKER_CPU_FRACTION = 0.25  # slow-worker cuts the worker's CPU quota to this fraction
#: hot-ps trains on ids this skewed: with rows partitioned by id % p, the PS that holds the
#: hottest ids takes ~2× the lookups of the others at p = 2 (data.py's measurement at skew 2.0:
#: the busiest of 8 PS serves 64 % of the lookups)
HOT_PS_SKEW = 2.0


@dataclass(frozen=True)
class Fault:
    kind: str
    at_s: float
    node: str

    @classmethod
    def parse(cls, text: str) -> "Fault":
        """``kill-worker@20s``, ``kill-ps@30s``, ``kill-master@15s``, ``oom-worker@10s``,
        ``slow-worker@10s``, ``hot-ps`` (id skew ``HOT_PS_SKEW``, from the start); ``:N`` picks the node."""
        match = re.fullmatch(r"([a-z-]+)(?::(\d+))?(?:@(.+))?", text.strip())
        if not match or match.group(1) not in FAULT_KINDS:
            raise InvalidInputError("inject", text, f"one of {', '.join(f'{k}@<time>' for k in FAULT_KINDS)}")
        kind, index, when = match.groups()
        if kind != "hot-ps" and when is None:
            raise InvalidInputError("inject", text, f"{kind}@<time>, e.g. {kind}@20s")
        role = kind.split("-")[1]
        node = "master" if role == "master" else f"{role}-{index or 0}"
        return cls(kind, parse_duration_s(when, "inject") if when else 0.0, node)


def run_job(launcher: LocalLauncher, spec: JobSpec, config: Configuration, out: Path,
            faults: list[Fault] = (), resizes: list[tuple[float, Configuration]] = (),
            timeout_s: float = 3600.0) -> dict[str, Any]:
    """Launch (or adopt) the job, supervise it to the end, evaluate, and write the summary.
    ``resizes``: (seconds after the start, configuration) to resize to."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    job_id = launcher.launch(spec, config)
    pending = sorted(faults, key=lambda f: f.at_s)
    pending_resizes = sorted(resizes, key=lambda r: r[0])
    events: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    series: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []  # per-node metrics windows for the instability detectors
    first = launcher.metrics(job_id)
    window_start, window_usage = first["usage_time"], first["usage"]
    try:
        while True:
            now = time.time() - started
            while pending and pending[0].at_s <= now:
                fault = pending.pop(0)
                events.append(_inject(launcher, job_id, fault, now))
            while pending_resizes and pending_resizes[0][0] <= now:
                _, target = pending_resizes.pop(0)
                result = launcher.resize(job_id, target)
                events.append({"time_s": now, "resize": target.to_row(), **result})
            for event in launcher.recover(job_id):
                event["time_s"] = time.time() - started
                events.append(event)
            try:
                status = launcher.master_call(job_id, "/status", timeout=2.0)
            except ConnectionError:  # the master is down: the next recover() relaunches it
                time.sleep(POLL_S)
                continue
            series.append({"time_s": now, "throughput": status["throughput"], "samples_done": status["samples_done"]})
            if time.monotonic() - window_start >= WINDOW_S:
                metrics = launcher.metrics(job_id)
                snapshot = metrics["usage_time"]
                seconds = snapshot - window_start
                nodes = _node_rows(launcher, job_id, metrics, window_usage, seconds, now)
                row = _profile_row(launcher.read_job(job_id)["config"], nodes, status)
                if row:
                    rows.append(row)
                # A node's first NODE_WARMUP_S are left out of the detectors' history: its memory
                # ramps up while it imports torch and touches its first rows, which a trend reads as a leak.
                history.extend(n for n in nodes if n["age_s"] >= NODE_WARMUP_S)
                history = [h for h in history if h["time_s"] > now - HISTORY_S]
                events.extend(_heal(launcher, job_id, history, now))
                window_start, window_usage = snapshot, metrics["usage"]
            if status["state"] == "done":
                break
            if time.time() - started > timeout_s:
                raise TimeoutError(f"job {job_id} did not finish in {timeout_s:.0f}s")
            time.sleep(POLL_S)
        summary = _summarize(launcher, job_id, spec, events, series, started)
    finally:
        pd.DataFrame(rows, columns=[*CONFIG_COLUMNS, "throughput", "worker_cpu_used", "ps_cpu_used",
                                    "worker_memory_used_mb", "ps_memory_used_mb", "samples_seen", "timestamp"]
                     ).to_csv(out / "samples.csv", index=False)
        launcher.stop(job_id)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _inject(launcher: LocalLauncher, job_id: str, fault: Fault, now: float) -> dict[str, Any]:
    log.warning("injecting %s into %s at %.1fs", fault.kind, fault.node, now)
    if fault.kind.startswith("kill-"):
        launcher.kill_node(job_id, fault.node)
    elif fault.kind == "oom-worker":
        launcher.master_call(job_id, "/command", {"node": fault.node, "command": "oom"})
    elif fault.kind == "slow-worker":
        node = next(s for s in launcher.status(job_id) if s.name == fault.node)
        launcher.set_cpu(job_id, fault.node, max(0.1, node.cpu * SLOW_WORKER_CPU_FRACTION))
    return {"time_s": now, "inject": fault.kind, "node": fault.node}


def _node_rows(launcher, job_id, metrics, before, seconds, now) -> list[dict[str, Any]]:
    """One row per worker and PS for this window (CPU rate from the cgroup's CPU seconds),
    with ``age_s`` since the node (re)started."""
    started = {name: node.get("started", 0) for name, node in launcher.read_job(job_id)["nodes"].items()}
    rows = []
    for name, u in metrics["usage"].items():
        if name not in before or u["role"] not in ("worker", "ps"):
            continue
        report = metrics["nodes"].get(name, {})
        rows.append({
            "time_s": now, "node": name, "role": u["role"], "age_s": time.time() - started.get(name, 0),
            "cpu_used": (u["cpu_seconds"] - before[name]["cpu_seconds"]) / seconds, "cpu_limit": u["cpu"],
            "memory_used_mb": u["memory_mb"], "memory_limit_mb": u["memory_limit_mb"],
            "throughput": report.get("samples_per_s") if u["role"] == "worker" else None,
        })
    return rows


def _profile_row(config: dict[str, Any], nodes: list[dict[str, Any]], status: dict[str, Any]) -> dict[str, Any] | None:
    """One profile sample: the current configuration + measured throughput and per-node usage."""
    by_role = {role: [n for n in nodes if n["role"] == role] for role in ("worker", "ps")}
    if not by_role["worker"] or not by_role["ps"] or status["throughput"] <= 0:
        return None
    row = {**config, "throughput": status["throughput"], "samples_seen": status["samples_done"], "timestamp": time.time()}
    for role, group in by_role.items():
        row[f"{role}_cpu_used"] = float(np.mean([n["cpu_used"] for n in group]))
        row[f"{role}_memory_used_mb"] = float(np.mean([n["memory_used_mb"] for n in group]))
    return row


def _heal(launcher, job_id, history, now) -> list[dict[str, Any]]:
    """Run the optimizer's detectors and heal: a straggler gets a fresh worker with the planned
    CPU; a worker at OOM risk is relaunched with more memory before the kill; a hot PS gets the
    proposed CPU quota in place (cgroup, no restart). Every event is recorded with its evidence."""
    from airflow_dlrover.optimizer.instability import detect

    table = pd.DataFrame(history)
    if table.empty:
        return []
    planned = launcher.read_job(job_id)["config"]
    events = []
    for event in detect(table):
        record = event.to_dict()
        record = {"time_s": now, "instability": record.pop("kind"), **record}
        if event.kind == "straggler":
            launcher.relaunch(job_id, event.node, cpu=planned["worker_cpu"])
            record["healed"] = f"relaunched with {planned['worker_cpu']:g} CPU"
        elif event.kind == "oom_risk" and event.node.startswith("worker"):
            launcher.relaunch(job_id, event.node, memory_mb=event.action.value)
            record["healed"] = f"relaunched with {event.action.value:g} MB"
        elif event.kind == "hot_ps":
            launcher.set_cpu(job_id, event.node, event.action.value)  # in place: the PS keeps its rows
            record["healed"] = f"CPU quota raised to {event.action.value:g} in place"
        events.append(record)
        history[:] = [h for h in history if h["node"] != event.node]  # judge the new node afresh
    return events


def _summarize(launcher, job_id, spec, events, series, started) -> dict[str, Any]:
    from airflow_dlrover.runtime.evaluate import evaluate

    status = launcher.master_call(job_id, "/status")
    ledger = np.array(launcher.master_call(job_id, "/ledger"), dtype=np.int64)
    sizes = np.array([spec.shard_range(s)[1] - spec.shard_range(s)[0] for s in range(spec.num_shards)])
    job = launcher.read_job(job_id)
    evaluation = evaluate(spec, status["ps"], status["generation"])
    losses = [m.get("loss") for m in launcher.metrics(job_id)["nodes"].values() if m.get("role") == "worker"]
    throughput = [s["throughput"] for s in series if s["throughput"] > 0]
    return {
        "job_id": job_id,
        "samples_expected": int(spec.samples),
        "samples_trained": int(ledger.sum()),
        "samples_lost": int(np.maximum(sizes - ledger, 0).sum()),
        "samples_duplicated": int(np.maximum(ledger - sizes, 0).sum()),
        "restarts": int(sum(n.get("restarts", 0) for n in job["nodes"].values())),
        "resizes": int(job.get("resizes", 0)),
        "checkpoints": status["counters"]["checkpoints"],
        "restores": status["counters"]["restores"],
        "final_train_loss": float(np.nanmean([l for l in losses if l is not None])) if losses else None,
        "eval_loss": evaluation["loss"],
        "eval_auc": evaluation["auc"],
        "eval_samples": evaluation["samples"],
        "wall_s": time.time() - started,
        "median_throughput": float(np.median(throughput)) if throughput else 0.0,
        "config": job["config"],
        "events": events + job["events"],
        "throughput_series": series[:: max(1, len(series) // 200)],
    }
