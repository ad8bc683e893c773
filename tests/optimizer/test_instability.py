import numpy as np
import pandas as pd
import pytest

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.instability import detect, detect_hot_ps, detect_oom_risk, detect_stragglers
from airflow_dlrover.optimizer.memory import fit_trend, memory_request_mb
from airflow_dlrover.optimizer.types import InvalidInputError

pytestmark = pytest.mark.unit


def metrics(rows):
    base = dict(cpu_used=1.0, cpu_limit=2.0, memory_used_mb=1000.0, memory_limit_mb=4096.0, throughput=None)
    return pd.DataFrame([{**base, **row} for row in rows])


def ps_rows(used_by_node, limit=2.0, times=(0, 30, 60)):
    return [dict(time_s=t, node=node, role="ps", cpu_used=used, cpu_limit=limit)
            for t in times for node, used in used_by_node.items()]


def test_hot_ps_is_found_with_its_evidence_and_more_cpu():
    events = detect_hot_ps(metrics(ps_rows({"ps-0": 1.95, "ps-1": 0.8, "ps-2": 0.7})))
    assert [e.node for e in events] == ["ps-0"]
    event = events[0]
    assert event.kind == "hot_ps" and event.action.kind == "set_cpu"
    assert event.evidence["utilisation"] == pytest.approx(0.975)
    assert event.evidence["skew"] == pytest.approx(0.975 / 0.375)
    # As loaded per core as the median PS: 2 cores × 2.6 = 5.2 → 5.5 (above 1.95 / 0.7 = 2.8).
    assert event.action.value == 5.5 and event.action.value >= 1.95 / C.HOT_PS_TARGET_UTILISATION


def test_a_skewed_ps_below_saturation_is_hot_and_one_without_skew_is_not():
    # A PS whose threads do not fill its limit holds every step back at 62 % while the others run at 26 %.
    (event,) = detect_hot_ps(metrics(ps_rows({"ps-0": 2.5, "ps-1": 1.0, "ps-2": 1.05}, limit=4.0)))
    assert event.node == "ps-0" and event.action.value == 10.0  # 4 cores × skew 0.625 / 0.256 = 9.8 → 10
    assert C.HOT_PS_UTILISATION == 0.5
    assert detect_hot_ps(metrics(ps_rows({"ps-0": 1.9, "ps-1": 0.6, "ps-2": 0.6}, limit=4.0))) == []  # 48 %: below
    assert detect_hot_ps(metrics(ps_rows({"ps-0": 3.0, "ps-1": 2.1, "ps-2": 2.2}, limit=4.0))) == []  # skew 1.4
    # Idle peers (no load of theirs to match): the target utilisation alone sizes it.
    (idle,) = detect_hot_ps(metrics(ps_rows({"ps-0": 1.9, "ps-1": 0.0}, limit=2.0)))
    assert idle.action.value == 3.0 and idle.evidence["skew"] is None


def test_a_ps_that_ran_hot_lately_is_judged_on_the_rows_since_not_on_its_history():
    # A guard that observes every 30 s: ps-0 ran hot for the last two observations (90 %, 3× ps-1).
    calm = ps_rows({"ps-0": 1.0, "ps-1": 1.0}, times=range(0, 240, 30))
    hot = ps_rows({"ps-0": 1.8, "ps-1": 0.6}, times=(240, 270))
    assert detect_hot_ps(metrics(calm + hot)) == []  # the mean of all ten: skew 1.26
    [event] = [e for e in detect(metrics(calm + hot)) if e.kind == "hot_ps"]
    assert event.node == "ps-0" and event.evidence["skew"] == pytest.approx(3.0)


def test_balanced_busy_ps_are_not_hot_nor_is_a_lone_saturated_ps():
    assert detect_hot_ps(metrics(ps_rows({"ps-0": 1.9, "ps-1": 1.85}))) == []
    assert detect_hot_ps(metrics(ps_rows({"ps-0": 1.9}))) == []  # the plan's bottleneck: fine-tune's call
    assert detect_hot_ps(metrics(ps_rows({"ps-0": 1.0}))) == []


def test_straggler_against_the_median_of_the_others():
    rows = [dict(time_s=t, node=f"worker-{i}", role="worker", throughput=speed)
            for t in range(5) for i, speed in enumerate([1000, 980, 1020, 400])]
    events = detect_stragglers(metrics(rows))
    assert [e.node for e in events] == ["worker-3"]
    assert events[0].action.kind == "replace_node"
    assert events[0].evidence["ratio"] == pytest.approx(0.4)
    # Too few observations: no verdict.
    assert detect_stragglers(metrics(rows[: 4 * (C.STRAGGLER_MIN_OBSERVATIONS - 1)])) == []
    # A uniformly slow job has no straggler.
    even = [dict(time_s=t, node=f"worker-{i}", role="worker", throughput=300) for t in range(5) for i in range(4)]
    assert detect_stragglers(metrics(even)) == []


def test_oom_risk_forecasts_the_crossing_and_sizes_the_new_limit():
    # 10 MB/s growth from 2000 MB: the 4096 MB limit is ~200 s away after t=60.
    rows = [dict(time_s=t, node="ps-0", role="ps", memory_used_mb=2000 + 10 * t) for t in range(0, 61, 10)]
    events = detect_oom_risk(metrics(rows))
    assert len(events) == 1
    event = events[0]
    assert event.kind == "oom_risk" and event.action.kind == "set_memory"
    assert event.evidence["seconds_to_limit"] == pytest.approx((4096 - 2600) / 10, rel=1e-6)
    forecast = 2600 + 10 * C.OOM_HORIZON_S
    assert event.evidence["forecast_peak_mb"] == pytest.approx(forecast)
    assert event.action.value == memory_request_mb(forecast)
    # With the remaining job time known, the new limit covers as much of it as the 60 s line supports.
    longer = detect_oom_risk(metrics(rows), remaining_s=3600)[0]
    assert longer.action.value == memory_request_mb(2600 + 10 * C.OOM_TREND_EXTRAPOLATION * 60)
    shorter = detect_oom_risk(metrics(rows), remaining_s=300)[0]
    assert shorter.action.value == memory_request_mb(2600 + 10 * 300)


def test_a_short_ramp_forecasts_only_as_far_as_its_span_supports():
    # 6 MB/s from 200 MB against 2048 MB: ~300 s away. 9 s of it (a CPU-starved node's warm-up)
    # supports a line 90 s ahead, not an event; the same slope held over 30 s supports 300 s.
    ramp = lambda span: [dict(time_s=t, node="worker-0", role="worker", memory_used_mb=200 + 6 * t,
                              memory_limit_mb=2048) for t in np.linspace(0, span, 4)]
    assert detect_oom_risk(metrics(ramp(9.0))) == []
    [event] = detect_oom_risk(metrics(ramp(30.0)))
    assert event.evidence["seconds_to_limit"] == pytest.approx((2048 - 380) / 6, rel=1e-6)
    assert event.evidence["seconds_to_limit"] <= C.OOM_TREND_EXTRAPOLATION * 30.0


def test_flat_or_slow_memory_is_not_a_risk_but_a_node_at_the_limit_is():
    flat = [dict(time_s=t, node="w-0", role="worker", memory_used_mb=3000) for t in range(0, 100, 10)]
    slow = [dict(time_s=t, node="w-1", role="worker", memory_used_mb=1000 + 0.1 * t) for t in range(0, 100, 10)]
    assert detect_oom_risk(metrics(flat + slow)) == []
    full = [dict(time_s=0, node="w-2", role="worker", memory_used_mb=4000)]
    events = detect_oom_risk(metrics(full))
    assert [e.node for e in events] == ["w-2"] and "now" in events[0].reason
    assert events[0].action.value >= 4096 + C.MEMORY_GRANULARITY_MB


def test_detect_runs_every_detector_and_checks_columns():
    rows = ps_rows({"ps-0": 1.95, "ps-1": 0.5}, times=(60, 70, 80)) + [
        dict(time_s=t, node="ps-1", role="ps", memory_used_mb=2000 + 10 * t, cpu_used=0.5) for t in (90, 100, 110)
    ]
    kinds = sorted(e.kind for e in detect(metrics(rows)))
    assert kinds == ["hot_ps", "oom_risk"]
    with pytest.raises(InvalidInputError) as err:
        detect(pd.DataFrame({"time_s": [0], "node": ["x"]}))
    assert err.value.field == "metrics columns" and "cpu_used" in str(err.value)


def test_memory_noise_is_not_an_oom_risk_but_a_real_rise_is():
    """A steady worker wanders ±5 MB between windows (measured); only a real rise is a trend."""
    times = np.arange(0.0, 30.0, 3.0)
    noisy = pd.DataFrame({"time_s": times, "node": "worker-0", "memory_used_mb": 200 + 5 * (-1) ** np.arange(10) + times * 0.1,
                          "memory_limit_mb": 512.0})
    assert detect_oom_risk(noisy) == []
    rising = noisy.assign(memory_used_mb=200 + 4.0 * times)  # 4 MB/s: 512 MB in ~45 s
    [event] = detect_oom_risk(rising)
    assert event.node == "worker-0" and event.action.value > 512


def test_no_ps_no_hot_ps():
    workers = [dict(time_s=t, node=f"worker-{i}", role="worker", cpu_used=0.99, cpu_limit=1.0, memory_used_mb=500,
                    memory_limit_mb=2048, throughput=100.0) for t in (1, 2, 3) for i in range(3)]
    assert detect_hot_ps(metrics(workers)) == []
    assert [e for e in detect(metrics(workers)) if e.kind == "hot_ps"] == []


def _flattening_ps(limit, seconds=np.arange(123.0, 151.0, 3.0), speed=1000.0):
    """One PS (p = 1) whose tables grow on the memory model's curve at ``speed`` samples/s: 4 MB/s at
    first, slowing towards 1900 MB (400 MB base + tables of 1000 → 1500 MB), about 150 MB below it by
    t = 150 s, where it still rises 1.2 MB/s; and that PS's growth from t = 150 s on the curve."""
    from airflow_dlrover.optimizer.memory import MemoryModel

    model = MemoryModel(400.0, 1000.0, 900.0, 0.0, 4000.0, table_capacity_mb=1500.0)
    rows = [dict(time_s=t, node="ps-0", role="ps", memory_used_mb=float(model.ps_peak_mb(1, speed * t)),
                 memory_limit_mb=limit) for t in seconds]
    now = speed * seconds[-1]
    return metrics(rows), lambda s: float(model.ps_peak_mb(1, now + speed * s) - model.ps_peak_mb(1, now)), model


def test_a_ps_whose_tables_flatten_is_no_oom_risk_on_the_models_curve_where_a_line_would_be():
    table, growth, model = _flattening_ps(limit=2000.0)
    [line] = detect_oom_risk(table)  # 1.2 MB/s from ~1750 MB: the line reaches 2000 MB within the horizon
    assert line.evidence["forecast"] == "trend" and line.evidence["seconds_to_limit"] < C.OOM_HORIZON_S
    assert detect_oom_risk(table, ps_growth_mb=growth) == []  # the curve never passes 1900 MB
    # A worker's series is forecast by its trend whatever the PS's curve.
    worker = table.assign(node="worker-0", role="worker")
    assert [e.evidence["forecast"] for e in detect_oom_risk(worker, ps_growth_mb=growth)] == ["trend"]


def test_a_ps_whose_curve_reaches_its_limit_is_at_risk_and_its_new_limit_holds_a_checkpoint_copy():
    table, growth, model = _flattening_ps(limit=1880.0)
    [event] = detect_oom_risk(table, ps_growth_mb=growth, ps_transient_mb=1500.0)
    used = float(model.ps_peak_mb(1, 150e3))
    level = max(used, fit_trend(table["time_s"], table["memory_used_mb"]).at(150.0))  # a GC drop is no level
    assert event.evidence["forecast"] == "memory model" and level == pytest.approx(used, abs=5)
    # level + (1900 − used)·(1 − exp(−0.008·s)) = 1880 (0.008/s: 4 MB/s over the 500 MB the tables had left)
    seconds = -np.log(1 - (1880 - level) / (1900 - used)) / 0.008
    assert event.evidence["seconds_to_limit"] == pytest.approx(seconds, rel=1e-3) and seconds < C.OOM_HORIZON_S
    peak = level + growth(C.OOM_HORIZON_S)
    assert event.evidence["forecast_peak_mb"] == pytest.approx(peak) and peak < 1900 + 5
    assert event.action.value == memory_request_mb(peak, 1500.0)
    [later] = detect_oom_risk(table, remaining_s=3600, ps_growth_mb=growth)  # to the job's end, no checkpoint copy
    assert later.evidence["forecast_peak_mb"] == pytest.approx(level + growth(3600))
    assert later.action.value == memory_request_mb(level + growth(3600))
