from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import (MemoryModel, fit_memory, fit_trend, margin_after_ooms,
                                              memory_request_mb, ps_request_mb)
from airflow_dlrover.optimizer.types import InvalidInputError
from sim.synthetic import model_samples

pytestmark = pytest.mark.unit


def test_fit_recovers_table_and_base():
    model = fit_memory(model_samples(ps_table_mb=12000, ps_base_mb=300, worker_base_mb=700, activation_mb=0.25))
    assert model.table_mb == pytest.approx(12000) and model.ps_base_mb == pytest.approx(300)
    # One batch size only: the activation term is pinned and the base absorbs it.
    assert model.activation_mb_per_sample == 0 and "batch_size never varies" in model.pinned["activation_mb_per_sample"]
    assert model.worker_peak_mb(512) == pytest.approx(700 + 0.25 * 512)


def test_table_growth_is_fitted_from_samples_seen_and_raises_the_ps_peak():
    table = model_samples(ps_table_mb=8000, ps_base_mb=400)
    table["samples_seen"] = np.arange(len(table)) * 1e6  # 1M samples between windows
    table["ps_memory_used_mb"] += 300 * table["samples_seen"] / 1e6 / table["ps"]  # +300 MB per M samples
    model = fit_memory(table)
    assert model.table_growth_mb_per_m_samples == pytest.approx(300)
    assert model.table_mb == pytest.approx(8000) and model.ps_base_mb == pytest.approx(400)
    assert "table_growth_mb_per_m_samples" not in model.pinned
    assert model.ps_peak_mb(4, samples=2e6) == pytest.approx(model.ps_peak_mb(4) + 600 / 4)
    assert model.with_table_growth(-5).table_growth_mb_per_m_samples == 0
    assert "samples_seen" in fit_memory(model_samples()).pinned["table_growth_mb_per_m_samples"]


def test_request_adds_the_margin_or_the_headroom_and_rounds_up():
    assert memory_request_mb(100) == 208  # 100 + 96 headroom → 196 → 208
    assert memory_request_mb(10000) == 11504  # ×1.15 = 11500 → 11504
    assert memory_request_mb(200, transient_mb=120) == 320  # a checkpoint's 120 MB copy, more than the headroom
    peaks = np.linspace(1, 1e5, 97)
    requests = memory_request_mb(peaks)
    assert np.all(requests >= peaks * (1 + C.MEMORY_MARGIN_FRACTION))
    assert np.all(requests >= peaks + C.MEMORY_MIN_HEADROOM_MB)
    assert np.all(requests % C.MEMORY_GRANULARITY_MB == 0)


def test_a_ps_needs_less_headroom_than_a_worker_and_every_request_covers_its_margin():
    assert ps_request_mb(176) == 208  # 176 + 32 (a PS's floor; 15 % is 26.4) → 208
    assert memory_request_mb(176) == 272  # a worker's: 176 + 96 → 272
    assert ps_request_mb(176, margin=0.725) == 304  # after an OOM kill: 176 × 1.725 = 303.6 → 304
    peaks = np.linspace(1, 1e5, 97)
    least = np.maximum(peaks * (1 + C.MEMORY_MARGIN_FRACTION), peaks + C.PS_MIN_HEADROOM_MB)
    assert np.all(ps_request_mb(peaks) >= least)


def test_the_margin_grows_with_each_run_that_had_an_oom_kill():
    assert margin_after_ooms(0) == C.MEMORY_MARGIN_FRACTION
    assert margin_after_ooms(1) == pytest.approx(1.15 * C.OOM_MEMORY_GROWTH - 1)
    assert margin_after_ooms(2) == pytest.approx(1.15 * C.OOM_MEMORY_GROWTH ** 2 - 1)
    with pytest.raises(InvalidInputError, match="runs_with_kills"):
        margin_after_ooms(-1)


def test_requests_cover_the_largest_node_and_the_largest_peak_above_the_fit():
    table = model_samples(ps_table_mb=2000, ps_base_mb=100, worker_base_mb=300)
    means = fit_memory(table)
    hot = table.assign(ps_memory_peak_mb=table["ps_memory_used_mb"] * 1.2,  # a hot PS holds a fifth more
                       worker_memory_peak_mb=table["worker_memory_used_mb"])
    hot.loc[3, "worker_memory_peak_mb"] += 40.0  # one window caught a worker 40 MB above the rest
    peaks = fit_memory(hot)
    for ps in (1, 2, 4):
        assert float(peaks.ps_peak_mb(ps)) + peaks.ps_peak_excess_mb >= 1.2 * float(means.ps_peak_mb(ps)) - 1e-6
    assert peaks.worker_peak_excess_mb == pytest.approx(40.0 - 40.0 / len(table), abs=1.0)
    assert peaks.worker_request_mb(512) >= float(hot["worker_memory_peak_mb"].max()) + C.MEMORY_MIN_HEADROOM_MB
    assert means.ps_peak_excess_mb == pytest.approx(0.0, abs=1e-6)  # noise-free means: on the fit
    older = table.assign(ps_memory_peak_mb=np.nan, worker_memory_peak_mb=np.nan)  # rows before peaks were kept
    assert fit_memory(older) == means


def test_a_refit_keeps_the_margins_its_history_gave_it():
    prior = fit_memory(model_samples()).with_oom_history([{"worker", "ps"}, set(), {"worker"}])
    assert (prior.worker_margin_fraction, prior.ps_margin_fraction) == (margin_after_ooms(2), margin_after_ooms(1))
    old = [set()] * C.MEMORY_OOM_HISTORY_RUNS + [{"ps"}]  # a kill longer ago than the history counts
    assert fit_memory(model_samples()).with_oom_history(old).ps_margin_fraction == C.MEMORY_MARGIN_FRACTION
    refit = fit_memory(model_samples(seed=5), base_from=prior)
    assert (refit.worker_margin_fraction, refit.ps_margin_fraction) == (margin_after_ooms(2), margin_after_ooms(1))
    assert refit.worker_request_mb(512) > replace(refit, worker_margin_fraction=0.15).worker_request_mb(512)
    assert MemoryModel.from_dict({k: v for k, v in refit.to_dict().items() if "margin" not in k and "excess" not in k}
                                 ).ps_margin_fraction == C.MEMORY_MARGIN_FRACTION  # a model stored before margins


def test_a_ps_request_holds_a_second_copy_of_its_largest_table_or_of_all_when_the_layout_is_unknown():
    unknown = MemoryModel(ps_base_mb=136.0, table_mb=700.0, worker_base_mb=200.0, activation_mb_per_sample=0.0)
    known = replace(unknown, largest_table_mb=100.0)
    for ps in (1, 2, 4):
        tables = 700.0 / ps
        assert unknown.ps_tables_mb(ps) == known.ps_tables_mb(ps) == pytest.approx(tables)
        assert unknown.ps_transient_mb(ps) == pytest.approx(C.PS_TABLE_COPY_FACTOR * tables)
        assert known.ps_transient_mb(ps) == pytest.approx(C.PS_TABLE_COPY_FACTOR * 100.0 / ps)  # one table at a time
        for model in (unknown, known):
            peak = 136.0 + tables
            wanted = peak + max(float(model.ps_transient_mb(ps)), C.PS_MIN_HEADROOM_MB, C.MEMORY_MARGIN_FRACTION * peak)
            assert wanted <= model.ps_request_mb(ps) < wanted + C.MEMORY_GRANULARITY_MB
    assert unknown.ps_request_mb(np.array([0, 1]))[0] == 0


def test_trend_is_robust_to_a_gc_drop():
    t = np.arange(0, 200, 10.0)
    used = 1000 + 2 * t
    used[10] = 400  # one collection
    trend = fit_trend(t, used)
    assert trend.slope_mb_per_s == pytest.approx(2.0)
    assert trend.seconds_to(1000 + 2 * 190 + 200) == pytest.approx(100)
    assert fit_trend(t, np.full_like(t, 500)).seconds_to(1000) == float("inf")


def test_missing_memory_columns_are_named():
    with pytest.raises(InvalidInputError) as err:
        fit_memory(model_samples().drop(columns=["ps_memory_used_mb"]))
    assert err.value.field == "samples.ps_memory_used_mb"
    with pytest.raises(InvalidInputError):
        fit_trend([0], [1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.floats(0, 1e4)), min_size=2, max_size=12))
@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")  # scipy's interval, unused
def test_theil_sen_is_scipys(points):
    from scipy.stats import theilslopes

    from airflow_dlrover.optimizer.memory import theil_sen

    x, y = (np.array(v, dtype=float) for v in zip(*points))
    if np.ptp(x) == 0:
        return
    slope, intercept, _, _ = theilslopes(y, x)
    assert theil_sen(x, y) == pytest.approx((slope, intercept), rel=1e-9, abs=1e-9)


def test_ps_memory_saturates_at_the_layouts_tables():
    model = MemoryModel(ps_base_mb=100.0, table_mb=50.0, worker_base_mb=200.0, activation_mb_per_sample=0.1,
                        table_growth_mb_per_m_samples=400.0, table_capacity_mb=250.0)
    assert model.ps_peak_mb(2, 0.0) == pytest.approx(125.0)
    # G(n) = 50 + 200·(1 − exp(−400·n / (10⁶·200))): growing, slower than the line 50 + 400·n/10⁶ ...
    assert model.ps_peak_mb(2, 0.25e6) == pytest.approx(100.0 + (50.0 + 200.0 * (1 - np.exp(-0.5))) / 2)
    assert model.ps_peak_mb(2, 0.25e6) < 100.0 + 150.0 / 2
    assert model.ps_peak_mb(2, 1e9) == pytest.approx(100.0 + 250.0 / 2)  # ... never past every row touched
    unbounded = MemoryModel(100.0, 50.0, 200.0, 0.1, 400.0)  # no capacity, no asymptote: the line, as before
    assert unbounded.ps_peak_mb(2, 1e9) == pytest.approx(100.0 + (50.0 + 400.0 * 1e3) / 2)
    table = model_samples()
    assert fit_memory(table, table_capacity_mb=250.0).table_capacity_mb == 250.0
    below = MemoryModel(100.0, 300.0, 200.0, 0.1, 400.0, table_capacity_mb=250.0)  # measured past the layout's bound
    assert below.ps_peak_mb(2, 1e9) == pytest.approx(250.0)  # no growth


@settings(max_examples=80, deadline=None)
@given(st.floats(0, 1e5), st.floats(0, 1e5), st.floats(1e-3, 1e5), st.sampled_from([1, 2, 7]), st.booleans())
def test_the_curve_starts_with_slope_g_rises_and_never_passes_its_asymptote(table, headroom, growth, ps, fitted):
    asymptote = table + headroom
    model = MemoryModel(100.0, table, 200.0, 0.0, growth,
                        table_capacity_mb=None if fitted else asymptote,
                        table_asymptote_mb=asymptote if fitted else None)
    n = np.concatenate([[0.0], np.geomspace(1.0, 1e12, 200)])
    tables = model.ps_tables_mb(ps, n) * ps
    assert tables[0] == pytest.approx(table)
    assert np.all(np.diff(tables) >= -1e-9 * max(asymptote, 1.0))  # monotone
    assert np.all(tables <= asymptote * (1 + 1e-12) + 1e-9)  # bounded by A
    if headroom > 1e-3:  # the initial slope is g (MB per 10⁶ samples)
        n0 = 1e-6 * headroom / growth * 1e6
        assert model.table_growth_mb(n0) / n0 * 1e6 == pytest.approx(growth, rel=1e-5)


def saturating(n, table=8000.0, asymptote=12000.0, growth=4000.0):
    """G(n) of the module docstring."""
    headroom = asymptote - table
    return table + headroom * (1 - np.exp(-growth * n / (1e6 * headroom)))


def saturating_samples(seen, noise=0.0, seed=0, **curve):
    """The synthetic profile's rows (PS base 400 MB), measured at ``seen`` samples trained."""
    rng = np.random.default_rng(seed)
    table = model_samples()
    table = table.loc[np.arange(len(seen)) % len(table)].reset_index(drop=True)
    table["samples_seen"] = seen
    table["ps_memory_used_mb"] = 400.0 + saturating(table["samples_seen"].to_numpy(), **curve) / table["ps"]
    table["ps_memory_used_mb"] += noise * rng.standard_normal(len(table))
    return table


@pytest.mark.parametrize("capacity", [20_000.0, None])
def test_a_fit_on_a_saturating_curve_recovers_its_asymptote_below_the_capacity(capacity):
    table = saturating_samples(np.linspace(0, 3e6, 27))
    model = fit_memory(table, table_capacity_mb=capacity)
    assert model.table_asymptote_mb == pytest.approx(12000, rel=1e-3)
    assert model.table_growth_mb_per_m_samples == pytest.approx(4000, rel=1e-3)
    assert model.table_mb == pytest.approx(8000, rel=1e-3) and model.ps_base_mb == pytest.approx(400, abs=1)
    assert "table_asymptote_mb" not in model.pinned and model.fitted_samples_seen == 3e6
    # the same initial slope, bent only by the capacity
    line = MemoryModel(400.0, 8000.0, 900.0, 0.0, 4000.0, table_capacity_mb=capacity)
    assert model.ps_peak_mb(4, 1e8) == pytest.approx(400 + 12000 / 4, rel=1e-3)
    assert model.ps_peak_mb(4, 1e8) < line.ps_peak_mb(4, 1e8) - 1000


@pytest.mark.parametrize("capacity", [20_000.0, None])
def test_a_run_on_one_ps_count_keeps_the_earlier_base_and_divides_its_tables_over_another_count(capacity):
    profile = fit_memory(saturating_samples(np.linspace(0, 3e6, 27)), table_capacity_mb=capacity)
    run = saturating_samples(np.linspace(3e6, 2.4e7, 27))
    run["ps"] = 8  # a warm run's windows: one PS count
    run["ps_memory_used_mb"] = 400.0 + saturating(run["samples_seen"].to_numpy()) / 8
    alone = fit_memory(run, table_capacity_mb=capacity)
    assert alone.table_mb == 0 and "ps never varies" in alone.pinned["table_mb"]
    refit = fit_memory(run, table_capacity_mb=capacity, base_from=profile)
    assert "table_mb" not in refit.pinned and refit.ps_base_mb == pytest.approx(400, abs=1)
    for ps in (2, 8, 32):  # the truth at 3·10⁷ samples, at the count run and at others
        truth = 400.0 + saturating(np.array([3e7]))[0] / ps
        assert refit.ps_peak_mb(ps, 3e7) == pytest.approx(truth, rel=0.02)
    assert alone.ps_peak_mb(2, 3e7) < 0.5 * (400.0 + saturating(np.array([3e7]))[0] / 2)  # 8 PS's share for 2
    # an earlier model that could not tell its base either gives nothing to keep
    assert fit_memory(run, table_capacity_mb=capacity, base_from=alone).pinned["table_mb"] == alone.pinned["table_mb"]


def test_a_noisy_saturating_curve_is_recovered_and_a_noisy_line_stays_a_line():
    seen = np.repeat(np.linspace(0, 3e6, 9), 3)
    model = fit_memory(saturating_samples(seen, noise=5.0, seed=1), table_capacity_mb=20_000.0)
    assert model.table_asymptote_mb == pytest.approx(12000, rel=0.03)
    line = saturating_samples(seen, noise=5.0, seed=1, asymptote=1e9, growth=300.0)  # 300 MB / 10⁶, no bend
    fitted = fit_memory(line, table_capacity_mb=20_000.0)
    assert fitted.table_asymptote_mb is None and "F-test" in fitted.pinned["table_asymptote_mb"]
    assert fitted.table_growth_mb_per_m_samples == pytest.approx(300, rel=0.05)
    few = fit_memory(saturating_samples(np.repeat([0.0, 3e6], 9)), table_capacity_mb=20_000.0)  # two points
    assert few.table_asymptote_mb is None and "distinct samples_seen" in few.pinned["table_asymptote_mb"]


def test_a_model_stored_before_the_curve_still_loads():
    old = {"ps_base_mb": 400.0, "table_mb": 8000.0, "worker_base_mb": 900.0, "activation_mb_per_sample": 0.5,
           "table_growth_mb_per_m_samples": 300.0, "pinned": {}, "table_capacity_mb": 20_000.0}
    model = MemoryModel.from_dict(old)
    assert model.table_asymptote_mb is None and model.fitted_samples_seen == 0.0
    assert model.asymptote_mb == 20_000.0 and model.ps_peak_mb(4, 1e12) == pytest.approx(400 + 20_000 / 4)
    assert MemoryModel.from_dict(model.to_dict()) == model


# ---------------------------------------------------------------------------------------------
# All-reduce jobs (ps = 0)
# ---------------------------------------------------------------------------------------------


def allreduce_samples(**kwargs):
    import pandas as pd

    from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA

    return pd.concat([model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, batch=batch, **kwargs) for batch in (256, 1024)],
                     ignore_index=True)


def test_an_allreduce_fit_has_no_ps_part_and_sizes_the_workers_that_hold_the_whole_model():
    # Every worker holds the replicated model: a base of 3 GB, where a PS job's worker had 900 MB.
    model = fit_memory(allreduce_samples(worker_base_mb=3000, activation_mb=0.25))
    assert model.allreduce and model.ps_base_mb is None and model.table_mb is None
    assert model.pinned["ps_base_mb"] == model.pinned["table_mb"] == "not identifiable: the job has no PS"
    assert model.worker_base_mb == pytest.approx(3000) and model.activation_mb_per_sample == pytest.approx(0.25)
    assert model.worker_peak_mb(512) == pytest.approx(3000 + 0.25 * 512)
    assert model.ps_peak_mb(0) == 0 and model.ps_request_mb(0) == 0
    np.testing.assert_array_equal(model.ps_request_mb(np.zeros(3), 1e9), np.zeros(3))
    with pytest.raises(InvalidInputError) as err:
        model.ps_request_mb(1)
    assert err.value.field == "ps" and "all-reduce" in err.value.allowed


def test_an_allreduce_workers_tables_grow_with_the_samples_up_to_the_layouts_capacity():
    table = allreduce_samples(worker_base_mb=2000)
    table["samples_seen"] = np.arange(len(table)) * 1e6
    table["worker_memory_used_mb"] += 50 * table["samples_seen"] / 1e6  # the whole tables' growth, on each worker
    model = fit_memory(table, table_capacity_mb=400.0)
    assert model.table_growth_mb_per_m_samples == pytest.approx(50)
    assert model.table_asymptote_mb is None  # a line: the curve's asymptote is the capacity
    assert model.worker_peak_mb(512, 2e6) == pytest.approx(model.worker_peak_mb(512) + 400 * (1 - np.exp(-100 / 400)))
    assert model.worker_peak_mb(512, 1e9) == pytest.approx(model.worker_peak_mb(512) + 400)  # never past the cap
    assert model.worker_request_mb(512, 2e6) > model.worker_request_mb(512)
    assert model.with_table_growth(0).worker_peak_mb(512, 1e9) == model.worker_peak_mb(512)


def test_a_rise_within_a_nodes_wander_is_no_growth_where_nothing_bounds_the_tables():
    """A trainer of the user's (no layout, no capacity) profiled over 30k samples: its workers'
    memory wanders by ~10 MB, a slope that, extrapolated to 50 M samples, asked 1.7 GB a node."""
    table = allreduce_samples(worker_base_mb=100)
    table["samples_seen"] = np.linspace(0, 3e4, len(table))
    wander = table.assign(worker_memory_used_mb=table["worker_memory_used_mb"] + 10 * table["samples_seen"] / 3e4)
    model = fit_memory(wander)
    assert model.table_growth_mb_per_m_samples == 0 and "wander" in model.pinned["table_growth_mb_per_m_samples"]
    assert model.worker_request_mb(512, 5e7) == model.worker_request_mb(512)
    assert model.worker_peak_excess_mb == pytest.approx(10)  # the request covers the wander's top
    # A rise past the wander grows the line; under a capacity a small one stays bounded by it.
    rising = table.assign(worker_memory_used_mb=table["worker_memory_used_mb"] + 40 * table["samples_seen"] / 3e4)
    assert fit_memory(rising).table_growth_mb_per_m_samples == pytest.approx(40 / 0.03, rel=0.01)
    bounded = fit_memory(wander, table_capacity_mb=50.0)
    assert bounded.table_growth_mb_per_m_samples > 0
    assert bounded.worker_peak_mb(512, 5e7) <= bounded.worker_peak_mb(512) + 50


def test_a_ps_model_needs_nothing_for_no_ps_and_its_workers_do_not_grow():
    model = fit_memory(model_samples())
    assert not model.allreduce
    np.testing.assert_array_equal(model.ps_request_mb(np.array([0, 1, 2])),
                                  [0, model.ps_request_mb(1), model.ps_request_mb(2)])
    grown = model.with_table_growth(100.0)
    assert grown.worker_peak_mb(512, 1e9) == grown.worker_peak_mb(512)  # a PS job's tables are on the PS


def test_an_allreduce_fit_needs_only_the_workers_memory():
    table = allreduce_samples().drop(columns=["ps_memory_used_mb"])
    assert fit_memory(table).allreduce
    with pytest.raises(InvalidInputError) as err:
        fit_memory(table.drop(columns=["worker_memory_used_mb"]))
    assert err.value.field == "samples.worker_memory_used_mb"


def test_an_allreduce_job_model_round_trips_and_kinds_are_not_mixed(tmp_path):
    from airflow_dlrover.optimizer.job_model import JobModel, fit_job_model

    job = fit_job_model(allreduce_samples(noise=0.02))
    assert job.allreduce and job.memory is not None and job.memory.allreduce
    job.save(tmp_path / "model.json")
    loaded = JobModel.load(tmp_path / "model.json")
    assert loaded.memory == job.memory and loaded.throughput.allreduce
    ps_job = fit_job_model(model_samples())
    with pytest.raises(InvalidInputError) as err:
        JobModel(ps_job.throughput, job.memory)
    assert err.value.field == "model.memory"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.booleans())
def test_the_curves_error_floor_is_at_most_the_error_of_any_curve(seed, start, capacity):
    """``_curve_sse_floor`` (which lets the fit skip a curve the F-test would refuse anyway) is at
    most the squared error of every admissible curve, at the line's and at random parameters."""
    from airflow_dlrover.optimizer.memory import _curve_sse_floor

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 30))
    x = np.column_stack([np.ones(n), rng.choice([256.0, 512.0, 1024.0], n)])
    share = 1.0 / rng.integers(1, 9, n) if start else np.ones(n)
    seen = np.round(rng.uniform(0, 5e8, n), -int(rng.integers(0, 8)))
    y = x @ [rng.uniform(100, 3000), rng.uniform(0, 1)] + share * 300 * (1 - np.exp(-seen / 2e8))  # a curve
    noise = rng.normal(0, rng.choice([0.0, 1.0, 30.0]), n)
    floor = _curve_sse_floor(x, share, seen, y + noise, start)
    assert floor <= np.sum(noise ** 2)
    y = y + noise
    top = rng.uniform(100, 5000) if capacity else np.inf
    for _ in range(50):
        c = rng.uniform(0, [3000, 1]) * rng.integers(0, 2, 2)
        t0 = min(rng.uniform(0, 500), top) if start else 0.0
        g = rng.exponential(500) * rng.integers(0, 2)
        headroom = rng.uniform(0, 1) * (top - t0) if capacity else rng.exponential(1000)
        curve = x @ c + share * (t0 - headroom * np.expm1(-g * seen / (1e6 * max(headroom, 1e-12))))
        assert floor <= np.sum((curve - y) ** 2)


@settings(max_examples=60, deadline=None)
@given(st.booleans(), st.booleans(), st.floats(0.05, 0.95), st.floats(0.1, 3.0), st.integers(0, 2**31))
def test_the_memory_curves_jacobian_is_its_derivative(bounded, start, s, g_scale, seed):
    """The curve fit's analytic Jacobian against central differences, with and without a
    capacity and a fitted T₀ (the least-squares fit takes it in place of its own differences)."""
    from scipy.optimize._numdiff import approx_derivative

    from airflow_dlrover.optimizer.memory import _Curve

    rng = np.random.default_rng(seed)
    rows = 12
    seen = np.sort(rng.uniform(0, 5e7, rows))
    share = 1.0 / rng.integers(1, 9, rows)
    x = np.column_stack([np.ones(rows), rng.uniform(0.5, 1.5, rows)])
    curve = _Curve(x, share, seen, 40_000.0 if bounded else None, start)
    theta = np.concatenate([rng.uniform(100, 1000, 2), [rng.uniform(0, 20_000)] if start else [],
                            [g_scale * 200.0, s if bounded else s * 30_000.0]])
    numeric = approx_derivative(curve.predict, theta, method="3-point")
    np.testing.assert_allclose(curve.jacobian(theta), numeric, rtol=1e-5, atol=1e-6 * np.abs(numeric).max())
