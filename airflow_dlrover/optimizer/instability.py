"""Instability detectors: hot PS, straggling workers, OOM risk (DLRover-RM §6).

Input is a node-metrics table, one row per node per observation window, with the columns
``time_s, node, role ("ps" | "worker"), cpu_used, cpu_limit, memory_used_mb, memory_limit_mb``
and, for workers, ``throughput`` (samples/s). Output is a list of typed events, each with its
evidence and a proposed action; nothing here acts.

* hot PS    — mean CPU use over the last ``HOT_PS_WINDOW_S`` ≥ ``HOT_PS_UTILISATION`` of its
              limit and (with ≥ 2 PS) ≥ ``HOT_PS_SKEW`` × the median utilisation of the other
              PS. Action: more CPU, λ' = max(used / ``HOT_PS_TARGET_UTILISATION``, λ · skew) in
              half cores: at most the target at the same load, and no more loaded per core than
              the median PS, so that when the job speeds up (the hot PS held every step back) it
              is still not the slowest (used / target alone is outgrown at once, and healed again
              a window later). A job without PS (an all-reduce job) has no PS rows, and none is hot.
* straggler — a worker whose mean speed over the last ``STRAGGLER_MIN_OBSERVATIONS`` windows is
              below ``STRAGGLER_SPEED_FRACTION`` × the median of the other workers. Action:
              replace it (its shards are re-queued by the master).
* OOM risk  — the forecast of a node's memory reaches its limit within ``OOM_HORIZON_S``, or
              usage is already ≥ ``OOM_USAGE_FRACTION`` of it. The forecast is the Theil–Sen
              trend (trusted ``OOM_TREND_EXTRAPOLATION`` × its span ahead), or, for a PS whose
              tables' growth the memory model knows, its level now plus the model's growth to
              come: used(now) + G(n(t)) / p − G(n(now)) / p, which slows as the tables saturate
              where a line would not. Action: a new limit = the request
              (peak + margin, and for a PS room for a checkpoint's copy of its tables) for the
              forecast at the end of the horizon (or of the job, when its remaining time is known).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryTrend, memory_request_mb, ps_request_mb, theil_sen_many
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


_TEXT_COLUMNS = ("node", "role")
#: The types of a metrics column that ``_column`` converts without pandas.
_PLAIN_NUMBERS = {float, int, np.float64, type(None)}


class _Table(dict):
    """The metrics as numpy columns (floats, or strings for ``node`` and ``role``)."""

    def where(self, mask: np.ndarray) -> "_Table":
        return _Table({k: v[mask] for k, v in self.items()})

    def rows(self) -> int:
        return len(next(iter(self.values()))) if dict.__len__(self) else 0


def _check(metrics: pd.DataFrame | Mapping[str, Any], columns) -> _Table:
    """The columns of a DataFrame or of a mapping of column → values, checked and as numpy."""
    if isinstance(metrics, _Table):
        table = metrics
    else:
        names = list(metrics.columns) if isinstance(metrics, pd.DataFrame) else list(metrics)
        missing = [c for c in columns if c not in names]
        if missing:
            raise InvalidInputError("metrics columns", names, f"a table with {', '.join(columns)}",
                                    f"Missing: {', '.join(missing)}.")
        table = _Table({c: _column(metrics[c], c) for c in names if c in (*METRIC_COLUMNS, "throughput")})
    missing = [c for c in columns if c not in table]
    if missing:
        raise InvalidInputError("metrics columns", list(table), f"a table with {', '.join(columns)}",
                                f"Missing: {', '.join(missing)}.")
    return table


def _column(values: Any, name: str) -> np.ndarray:
    if name in _TEXT_COLUMNS:
        return np.asarray(values).astype(str)
    if isinstance(values, (list, tuple)) and {type(v) for v in values} <= _PLAIN_NUMBERS:
        return np.array(values, dtype=float)  # numbers and None (NaN): what to_numeric makes of them, without pandas
    return pd.to_numeric(pd.Series(values, dtype=object) if not isinstance(values, pd.Series) else values,
                         errors="coerce").to_numpy(dtype=float)


def _by_node(nodes: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(node, row indices in table order) per node, nodes sorted by name (as ``groupby``)."""
    names, codes = np.unique(nodes.astype(str), return_inverse=True)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return [(str(name), order[bounds[k]:bounds[k + 1]]) for k, name in enumerate(names)]


def detect_hot_ps(metrics: pd.DataFrame, window_s: float | None = None) -> list[InstabilityEvent]:
    """Hot PS events from the PS rows of the last ``window_s`` seconds (all rows when None)."""
    table = _check(metrics, ("time_s", "node", "role", "cpu_used", "cpu_limit"))
    ps = table.where(table["role"] == "ps")
    if not ps.rows():
        return []
    times, used, limits = ps["time_s"], ps["cpu_used"], ps["cpu_limit"]
    keep = times >= times.max() - window_s if window_s is not None else np.ones(ps.rows(), bool)
    groups = _by_node(ps["node"][keep])
    used, limits = used[keep], limits[keep]
    if len(groups) < 2:
        # Hot means hotter than the other PS. A lone busy PS is the configuration's own
        # bottleneck, which the planner chose knowingly: resizing it is the fine-tune's decision,
        # under the quota (our measurement: the demo's planned 1 PS × 0.5 core runs at 94 %).
        return []
    mean_used = np.array([np.nanmean(used[rows]) for _, rows in groups])
    last_limit = np.array([_last_valid(limits[rows]) for _, rows in groups])
    utilisation = mean_used / last_limit
    events = []
    for k in np.flatnonzero(utilisation >= C.HOT_PS_UTILISATION):  # the rule's first condition
        node = groups[k][0]
        median = float(np.median(np.delete(utilisation, k)))
        skew = utilisation[k] / median if median > 0 else float("inf")
        if skew >= C.HOT_PS_SKEW:
            needed = mean_used[k] / C.HOT_PS_TARGET_UTILISATION
            if np.isfinite(skew):  # else the others idle: no load of theirs to match
                needed = max(needed, last_limit[k] * skew)
            new_cpu = float(np.ceil(needed * 2) / 2)  # half cores
            events.append(InstabilityEvent(
                "hot_ps", node,
                f"PS {node} uses {mean_used[k]:.2f} of {last_limit[k]:g} cores ({utilisation[k]:.0%}), "
                f"{skew:.1f}× the median PS",
                Action("set_cpu", node, max(new_cpu, float(last_limit[k]) + 0.5)),
                {"utilisation": float(utilisation[k]), "cpu_used": float(mean_used[k]),
                 "cpu_limit": float(last_limit[k]), "skew": float(skew) if np.isfinite(skew) else None},
            ))
    return events


def _last_valid(values: np.ndarray) -> float:
    valid = values[np.isfinite(values)]
    return float(valid[-1]) if len(valid) else float("nan")


def detect_stragglers(metrics: pd.DataFrame) -> list[InstabilityEvent]:
    """Straggler events from the workers' ``throughput`` over their last observations."""
    table = _check(metrics, ("time_s", "node", "role", "throughput"))
    workers = table.where((table["role"] == "worker") & np.isfinite(table["throughput"]))
    if not workers.rows():
        return []
    times, speed = workers["time_s"], workers["throughput"]
    order = np.argsort(times, kind="stable")
    groups = _by_node(workers["node"][order])
    speed = speed[order]
    stats = [(node, float(np.mean(speed[rows[-C.STRAGGLER_MIN_OBSERVATIONS:]])), min(len(rows), C.STRAGGLER_MIN_OBSERVATIONS))
             for node, rows in groups if len(rows) >= C.STRAGGLER_MIN_OBSERVATIONS]
    if len(stats) < 2:
        return []
    means = np.array([mean for _, mean, _ in stats])
    events = []
    for k in np.flatnonzero(means < C.STRAGGLER_SPEED_FRACTION * means.max()):  # necessary: median ≤ max
        node, mean, count = stats[k]
        median_others = float(np.median(np.delete(means, k)))
        if median_others > 0 and mean < C.STRAGGLER_SPEED_FRACTION * median_others:
            events.append(InstabilityEvent(
                "straggler", node,
                f"worker {node} runs {mean:.0f} samples/s, {mean / median_others:.0%} "
                f"of the other workers' median {median_others:.0f}",
                Action("replace_node", node),
                {"throughput": mean, "median_others": median_others, "ratio": mean / median_others, "windows": count},
            ))
    return events


def detect_oom_risk(
    metrics: pd.DataFrame, horizon_s: float = C.OOM_HORIZON_S, remaining_s: float | None = None, *,
    ps_growth_mb: Callable[[float], float] | None = None, ps_transient_mb: float = 0.0,
) -> list[InstabilityEvent]:
    """OOM-risk events from each node's memory series against its limit. ``ps_growth_mb``: a PS's
    growth from now to ``s`` seconds ahead on the memory model's curve (monotone, flat past the
    job's end), which forecasts the PS rows (``role`` "ps") in place of the trend, from their
    level now (the last measurement, or the trend's value at it where higher: a GC drop is no
    level); ``ps_transient_mb``: a PS's short-lived second copy of its tables (a checkpoint), kept
    room for in its new limit as ``MemoryModel.ps_request_mb`` does."""
    table = _check(metrics, ("time_s", "node", "memory_used_mb", "memory_limit_mb"))
    table = table.where(np.isfinite(table["memory_used_mb"]))
    if not table.rows():
        return []
    times, used_all, limits = table["time_s"], table["memory_used_mb"], table["memory_limit_mb"]
    roles = table["role"] if "role" in table else np.full(table.rows(), "")
    series = []
    for node, rows in _by_node(table["node"]):
        rows = rows[np.argsort(times[rows], kind="stable")]
        series.append((node, times[rows], used_all[rows], float(limits[rows][-1]), roles[rows][-1] == "ps"))
    trends = _trends([(t, y) for _, t, y, _, _ in series])
    ahead = remaining_s if remaining_s is not None else horizon_s
    if ps_growth_mb is not None:  # the PS share one curve, often one level and limit: each forecast once
        ps_growth_mb, on_curve = _remembered(ps_growth_mb), {}
    events = []
    for (node, t, y, limit, ps), trend in zip(series, trends):
        used = float(y[-1])
        if not limit > 0:
            continue
        if ps and ps_growth_mb is not None:
            level = max(used, trend.at(trend.last_time_s)) if trend else used
            if (level, limit) not in on_curve:
                on_curve[level, limit] = _seconds_on_curve(ps_growth_mb, level, limit, (horizon_s, ahead))
            seconds = on_curve[level, limit]
            slope = float(ps_growth_mb(60.0)) / 60.0
            peak = max(used, level + float(ps_growth_mb(ahead)))
        else:
            if trend is not None:
                slope = trend.slope_mb_per_s
                rising = slope * np.ptp(t) >= C.OOM_MIN_RISE_MB
                seconds = trend.seconds_to(limit) if rising else float("inf")
                if seconds > C.OOM_TREND_EXTRAPOLATION * np.ptp(t):  # past what the line's span supports
                    seconds = float("inf")
            else:
                seconds, slope = float("inf"), 0.0
            # the new limit no further ahead than the line's span supports (as its crossing):
            # a restore's ramp read over the job's remaining minutes asked a 190 MB PS for 3.7 GB
            supported = min(ahead, C.OOM_TREND_EXTRAPOLATION * np.ptp(t)) if trend else 0.0
            peak = max(used, trend.at(trend.last_time_s + supported) if trend else used)
        near = used >= C.OOM_USAGE_FRACTION * limit
        if not near and seconds > horizon_s:
            continue
        new_limit = float(ps_request_mb(peak, ps_transient_mb) if ps else memory_request_mb(peak))
        new_limit = max(new_limit, limit + C.MEMORY_GRANULARITY_MB)
        when = "now" if near else f"in {seconds:.0f}s"
        forecast = "memory model" if ps and ps_growth_mb is not None else "trend"
        events.append(InstabilityEvent(
            "oom_risk", node,
            f"{node} uses {used:.0f} of {limit:.0f} MB, growing {slope * 60:.1f} MB/min ({forecast}): "
            f"limit reached {when}",
            Action("set_memory", node, new_limit),
            {"memory_used_mb": used, "memory_limit_mb": limit, "slope_mb_per_min": slope * 60,
             "seconds_to_limit": None if not np.isfinite(seconds) else float(seconds), "forecast_peak_mb": float(peak),
             "forecast": forecast},
        ))
    return events


def _remembered(function: Callable[[float], float]) -> Callable[[float], float]:
    """``function`` (pure) computed once per argument."""
    values: dict[float, float] = {}

    def remembered(seconds: float) -> float:
        if seconds not in values:
            values[seconds] = function(seconds)
        return values[seconds]

    return remembered


def _seconds_on_curve(growth_mb: Callable[[float], float], level: float, limit: float,
                      ends: tuple[float, ...]) -> float:
    """Seconds until ``level`` + ``growth_mb`` (monotone) reaches ``limit``, searched up to each of
    ``ends`` in turn (inf when it does not by the last)."""
    if level >= limit:
        return 0.0
    for end in sorted(ends):
        if end > 0 and level + growth_mb(end) >= limit:
            # to a tenth of a second: the reason prints whole seconds
            return float(brentq(lambda s: level + growth_mb(s) - limit, 0.0, end, xtol=0.1))
    return float("inf")


def _trends(series: list[tuple[np.ndarray, np.ndarray]]) -> list[MemoryTrend | None]:
    """``fit_trend`` of each (times, used) series with ≥ ``OOM_MIN_POINTS`` points at ≥ 2 distinct
    times (None for the others); the series of one length are fitted together (``theil_sen_many``)."""
    out: list[MemoryTrend | None] = [None] * len(series)
    by_length: dict[int, list[int]] = {}
    for i, (t, _) in enumerate(series):
        if len(t) >= C.OOM_MIN_POINTS and np.ptp(t) > 0:
            by_length.setdefault(len(t), []).append(i)
    for indices in by_length.values():
        times = np.stack([series[i][0] for i in indices])
        used = np.stack([series[i][1] for i in indices])
        slopes, intercepts = theil_sen_many(times, used)
        for k, i in enumerate(indices):
            last = int(np.argmax(times[k]))
            out[i] = MemoryTrend(float(slopes[k]), float(intercepts[k]), float(times[k, last]), float(used[k, last]))
    return out


def detect(metrics: pd.DataFrame | Mapping[str, Any], remaining_s: float | None = None, *,
           ps_growth_mb: Callable[[float], float] | None = None,
           ps_transient_mb: float = 0.0) -> list[InstabilityEvent]:
    """All detectors over one metrics table (a DataFrame, or a mapping of column → values);
    ``ps_growth_mb``, ``ps_transient_mb``: the PS's memory curve (``detect_oom_risk``)."""
    table = _check(metrics, METRIC_COLUMNS)
    events = detect_hot_ps(table, C.HOT_PS_WINDOW_S)
    events += detect_oom_risk(table, remaining_s=remaining_s, ps_growth_mb=ps_growth_mb,
                              ps_transient_mb=ps_transient_mb)
    if "throughput" in table:
        events += detect_stragglers(table)
    return events
