import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel, fit_memory, fit_trend, memory_request_mb
from airflow_dlrover.optimizer.types import InvalidInputError
from synthetic import model_samples


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
    assert memory_request_mb(100) == 192  # 100 + 64 headroom → 164 → 192
    assert memory_request_mb(10000) == 11520  # ×1.15 = 11500 → 11520
    assert memory_request_mb(200, transient_mb=80) == 320  # a checkpoint's 80 MB copy: 280 → 320
    peaks = np.linspace(1, 1e5, 97)
    requests = memory_request_mb(peaks)
    assert np.all(requests >= peaks * (1 + C.MEMORY_MARGIN_FRACTION))
    assert np.all(requests >= peaks + C.MEMORY_MIN_HEADROOM_MB)
    assert np.all(requests % C.MEMORY_GRANULARITY_MB == 0)


def test_a_ps_request_holds_a_checkpoint_copy_of_its_tables():
    model = MemoryModel(ps_base_mb=136.0, table_mb=70.0, worker_base_mb=200.0, activation_mb_per_sample=0.0)
    for ps in (1, 2, 4):
        tables = 70.0 / ps
        assert model.ps_tables_mb(ps) == pytest.approx(tables)
        assert model.ps_request_mb(ps) >= 136.0 + 2 * tables  # steady tables + the copy ParameterServer.save makes
        assert model.ps_request_mb(ps) - (136.0 + 2 * tables) < C.MEMORY_GRANULARITY_MB + C.MEMORY_MIN_HEADROOM_MB
    assert model.ps_request_mb(np.array([0, 1]))[0] == 0


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
    from airflow_dlrover.optimizer.memory import MemoryModel

    model = MemoryModel(ps_base_mb=100.0, table_mb=50.0, worker_base_mb=200.0, activation_mb_per_sample=0.1,
                        table_growth_mb_per_m_samples=400.0, table_capacity_mb=250.0)
    assert model.ps_peak_mb(2, 0.0) == pytest.approx(125.0)
    assert model.ps_peak_mb(2, 0.25e6) == pytest.approx(100.0 + 150.0 / 2)  # growing ...
    assert model.ps_peak_mb(2, 1e9) == pytest.approx(100.0 + 250.0 / 2)  # ... never past every row touched
    unbounded = MemoryModel(100.0, 50.0, 200.0, 0.1, 400.0)
    assert unbounded.ps_peak_mb(2, 1e9) > 1e5
    table = model_samples()
    assert fit_memory(table, table_capacity_mb=250.0).table_capacity_mb == 250.0


# ---------------------------------------------------------------------------------------------
# All-reduce jobs (ps = 0)
# ---------------------------------------------------------------------------------------------


def allreduce_samples(**kwargs):
    import pandas as pd

    from synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA

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
    assert model.worker_peak_mb(512, 2e6) == pytest.approx(model.worker_peak_mb(512) + 100)
    assert model.worker_peak_mb(512, 1e9) == pytest.approx(model.worker_peak_mb(512) + 400)  # never past the cap
    assert model.worker_request_mb(512, 2e6) > model.worker_request_mb(512)
    assert model.with_table_growth(0).worker_peak_mb(512, 1e9) == model.worker_peak_mb(512)


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
