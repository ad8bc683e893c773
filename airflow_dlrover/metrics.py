"""Metrics to Airflow's StatsD / OpenTelemetry pipeline (``[metrics]`` in ``airflow.cfg``).

Each metric is named ``dlrover.<name>`` and tagged with the job's identity (``dag_id``, ``job``);
OpenTelemetry keeps the tags as attributes, StatsD keeps them where ``statsd_datadog_enabled`` or
``statsd_influxdb_enabled`` is set. Nothing is sent when metrics are off (Airflow's no-op logger).

Gauges, each measurement window: ``throughput`` (samples/s), ``progress`` (fraction of the samples
done), ``{worker,ps}_{cpu,memory}_utilisation`` (used ÷ limit, mean over the role's nodes).
Counters: ``resizes``, ``instabilities`` (seen, healed in place or kept), ``node_failures`` (reported),
``recoveries`` (relaunched).
"""

from __future__ import annotations

from typing import Any

PREFIX = "dlrover"


def _stats():
    from airflow.sdk.observability.stats import Stats

    return Stats


def gauge(name: str, value: float, tags: dict[str, str]) -> None:
    _stats().gauge(f"{PREFIX}.{name}", float(value), tags=tags)


def incr(name: str, tags: dict[str, str], count: int = 1) -> None:
    if count:
        _stats().incr(f"{PREFIX}.{name}", count, tags=tags)


def window(tags: dict[str, str], throughput: float | None, progress: float | None,
           usage: list[dict[str, Any]]) -> None:
    """The gauges of one measurement window (``usage``: the window's node rows,
    ``launchers.watch.node_rows``)."""
    if throughput is not None:
        gauge("throughput", throughput, tags)
    if progress is not None:
        gauge("progress", progress, tags)
    for role, resource, used, limit in (("worker", "cpu", "cpu_used", "cpu_limit"),
                                        ("worker", "memory", "memory_used_mb", "memory_limit_mb"),
                                        ("ps", "cpu", "cpu_used", "cpu_limit"),
                                        ("ps", "memory", "memory_used_mb", "memory_limit_mb")):
        shares = [row[used] / row[limit] for row in usage if row["role"] == role and row.get(limit)]
        if shares:
            gauge(f"{role}_{resource}_utilisation", sum(shares) / len(shares), tags)
