"""Instability detectors: hot PS, straggling workers, OOM risk (DLRover-RM §6).

Input is a node-metrics table, one row per node per observation window, with the columns
``time_s, node, role ("ps" | "worker"), cpu_used, cpu_limit, memory_used_mb, memory_limit_mb``
and, for workers, ``throughput`` (samples/s). Output is a list of typed events, each with its
evidence and a proposed action; nothing here acts.

* hot PS    — mean CPU use over the window ≥ ``HOT_PS_UTILISATION`` of its limit and (with ≥ 2
              PS) ≥ ``HOT_PS_SKEW`` × the median utilisation of the other PS. Action: more CPU,
              to reach ``HOT_PS_TARGET_UTILISATION`` at the same load.
* straggler — a worker whose mean speed over the last ``STRAGGLER_MIN_OBSERVATIONS`` windows is
              below ``STRAGGLER_SPEED_FRACTION`` × the median of the other workers. Action:
              replace it (its shards are re-queued by the master).
* OOM risk  — the Theil–Sen trend of a node's memory reaches its limit within ``OOM_HORIZON_S``,
              or usage is already ≥ ``OOM_USAGE_FRACTION`` of it. Action: a new limit = the
              request (peak + margin) for the trend's value at the end of the horizon (or of the
              job, when its remaining time is known).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import fit_trend, memory_request_mb
from airflow_dlrover.optimizer.types import InvalidInputError

METRIC_COLUMNS = ("time_s", "node", "role", "cpu_used", "cpu_limit", "memory_used_mb", "memory_limit_mb")


@dataclass(frozen=True)
class Action:
    kind: str  # "set_cpu" | "replace_node" | "set_memory"
    node: str
    value: float | None = None  # new CPU cores or memory MB for set_*

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class InstabilityEvent:
    kind: str  # "hot_ps" | "straggler" | "oom_risk"
    node: str
    reason: str
    action: Action
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "reason": self.reason,
                "action": self.action.to_dict(), "evidence": self.evidence}


def _check(metrics: pd.DataFrame, columns) -> pd.DataFrame:
    missing = [c for c in columns if c not in metrics]
    if missing:
        raise InvalidInputError(
            "metrics columns", list(metrics.columns), f"a table with {', '.join(columns)}",
            f"Missing: {', '.join(missing)}.",
        )
    return metrics


def detect_hot_ps(metrics: pd.DataFrame, window_s: float | None = None) -> list[InstabilityEvent]:
    """Hot PS events from the PS rows of the last ``window_s`` seconds (all rows when None)."""
    table = _check(metrics, ("time_s", "node", "role", "cpu_used", "cpu_limit"))
    ps = table[table["role"] == "ps"]
    if window_s is not None and len(ps):
        ps = ps[ps["time_s"] >= ps["time_s"].max() - window_s]
    if ps.empty:
        return []
    per_node = ps.groupby("node").agg(used=("cpu_used", "mean"), limit=("cpu_limit", "last"))
    if len(per_node) < 2:
        # Hot means hotter than the other PS. A lone busy PS is the configuration's own
        # bottleneck, which the planner chose knowingly: resizing it is the fine-tune's decision,
        # under the quota (our measurement: the demo's planned 1 PS × 0.5 core runs at 94 %).
        return []
    per_node["utilisation"] = per_node["used"] / per_node["limit"]
    events = []
    for node, row in per_node.iterrows():
        others = per_node["utilisation"].drop(node)
        skew = row.utilisation / others.median() if others.median() > 0 else float("inf")
        if row.utilisation >= C.HOT_PS_UTILISATION and skew >= C.HOT_PS_SKEW:
            new_cpu = float(np.ceil(row.used / C.HOT_PS_TARGET_UTILISATION * 2) / 2)  # half cores
            events.append(InstabilityEvent(
                "hot_ps", str(node),
                f"PS {node} uses {row.used:.2f} of {row.limit:g} cores ({row.utilisation:.0%}), "
                f"{skew:.1f}× the median PS",
                Action("set_cpu", str(node), max(new_cpu, float(row.limit) + 0.5)),
                {"utilisation": float(row.utilisation), "cpu_used": float(row.used),
                 "cpu_limit": float(row.limit), "skew": float(skew) if np.isfinite(skew) else None},
            ))
    return events


def detect_stragglers(metrics: pd.DataFrame) -> list[InstabilityEvent]:
    """Straggler events from the workers' ``throughput`` over their last observations."""
    table = _check(metrics, ("time_s", "node", "role", "throughput"))
    workers = table[(table["role"] == "worker") & table["throughput"].notna()].sort_values("time_s")
    recent = workers.groupby("node").tail(C.STRAGGLER_MIN_OBSERVATIONS)
    stats = recent.groupby("node")["throughput"].agg(["mean", "count"])
    stats = stats[stats["count"] >= C.STRAGGLER_MIN_OBSERVATIONS]
    if len(stats) < 2:
        return []
    events = []
    for node, row in stats.iterrows():
        median_others = float(stats["mean"].drop(node).median())
        if median_others > 0 and row["mean"] < C.STRAGGLER_SPEED_FRACTION * median_others:
            events.append(InstabilityEvent(
                "straggler", str(node),
                f"worker {node} runs {row['mean']:.0f} samples/s, {row['mean'] / median_others:.0%} "
                f"of the other workers' median {median_others:.0f}",
                Action("replace_node", str(node)),
                {"throughput": float(row["mean"]), "median_others": median_others,
                 "ratio": float(row["mean"] / median_others), "windows": int(row["count"])},
            ))
    return events


def detect_oom_risk(
    metrics: pd.DataFrame, horizon_s: float = C.OOM_HORIZON_S, remaining_s: float | None = None
) -> list[InstabilityEvent]:
    """OOM-risk events from each node's memory series against its limit."""
    table = _check(metrics, ("time_s", "node", "memory_used_mb", "memory_limit_mb"))
    events = []
    for node, series in table.dropna(subset=["memory_used_mb"]).groupby("node"):
        series = series.sort_values("time_s")
        limit = float(series["memory_limit_mb"].iloc[-1])
        used = float(series["memory_used_mb"].iloc[-1])
        if not limit > 0:
            continue
        if len(series) >= C.OOM_MIN_POINTS and series["time_s"].nunique() >= 2:
            trend = fit_trend(series["time_s"], series["memory_used_mb"])
            slope = trend.slope_mb_per_s
            rising = slope * np.ptp(series["time_s"].to_numpy(dtype=float)) >= C.OOM_MIN_RISE_MB
            seconds = trend.seconds_to(limit) if rising else float("inf")
        else:
            trend, seconds, slope = None, float("inf"), 0.0
        near = used >= C.OOM_USAGE_FRACTION * limit
        if not near and seconds > horizon_s:
            continue
        ahead = remaining_s if remaining_s is not None else horizon_s
        peak = max(used, trend.at(trend.last_time_s + ahead) if trend else used)
        new_limit = float(memory_request_mb(peak))
        new_limit = max(new_limit, limit + C.MEMORY_GRANULARITY_MB)
        when = "now" if near else f"in {seconds:.0f}s"
        events.append(InstabilityEvent(
            "oom_risk", str(node),
            f"{node} uses {used:.0f} of {limit:.0f} MB, growing {slope * 60:.1f} MB/min: limit reached {when}",
            Action("set_memory", str(node), new_limit),
            {"memory_used_mb": used, "memory_limit_mb": limit, "slope_mb_per_min": slope * 60,
             "seconds_to_limit": None if not np.isfinite(seconds) else float(seconds), "forecast_peak_mb": float(peak)},
        ))
    return events


def detect(metrics: pd.DataFrame, remaining_s: float | None = None) -> list[InstabilityEvent]:
    """All detectors over one metrics table."""
    table = _check(metrics, METRIC_COLUMNS)
    events = detect_hot_ps(table) + detect_oom_risk(table, remaining_s=remaining_s)
    if "throughput" in table:
        events += detect_stragglers(table)
    return events
