"""Invariants of the discrete-event PS training simulation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.queueing import (
    CONFIG_COLUMNS,
    SAMPLE_COLUMNS,
    Physics,
    simulate_config,
    simulate_samples,
)

pytestmark = pytest.mark.unit

QUIET = Physics(noise_cv=0.0, zipf_skew=0.0)  # deterministic service times, uniform PS shares


def config(**overrides):
    row = dict(workers=1, ps=1, worker_cpu=1.0, ps_cpu=1.0)
    row.update(overrides)
    return row


def throughput(physics=QUIET, steps=60, seed=0, **overrides) -> float:
    return simulate_config(config(**overrides), physics, steps_per_worker=steps, seed=seed)["throughput"]


# --------------------------------------------------------------------------------------------
# The event pipeline adds up
# --------------------------------------------------------------------------------------------


def test_single_worker_matches_the_serial_path_exactly():
    """One worker, one PS, no noise: no queueing, so a step is the sum of its stages."""
    ph = QUIET
    b = 512
    rows = b * ph.rows_per_sample
    compute = b * ph.dense_core_s_per_sample + ph.step_overhead_s
    lookup = ph.ps_core_s_per_request + rows * ph.ps_core_s_per_row
    update = ph.ps_core_s_per_request + rows * ph.ps_update_core_s_per_row
    transfer = rows * ph.bytes_per_row / ph.ps_bandwidth_bytes_s
    step = compute + lookup + transfer + ph.rpc_latency_s + transfer + update + ph.rpc_latency_s

    row = simulate_config(config(batch_size=b), ph, steps_per_worker=50)
    assert row["throughput"] == pytest.approx(b / step, rel=1e-9)
    assert row["worker_cpu_used"] == pytest.approx(compute / step, rel=1e-9)
    assert row["ps_cpu_used"] == pytest.approx((lookup + update) / step, rel=1e-9)


def test_fractional_ps_cpu_slows_service_and_is_fully_accounted():
    """Half a core serves at half speed: the PS time per step doubles, its busy cores stay ≤ 0.5."""
    ph = QUIET
    full = simulate_config(config(), ph, steps_per_worker=50)
    half = simulate_config(config(ps_cpu=0.5), ph, steps_per_worker=50)
    rows = 512 * ph.rows_per_sample
    ps_work = 2 * ph.ps_core_s_per_request + rows * (ph.ps_core_s_per_row + ph.ps_update_core_s_per_row)
    assert 512 / half["throughput"] - 512 / full["throughput"] == pytest.approx(ps_work, rel=1e-9)
    assert half["ps_cpu_used"] == pytest.approx(ps_work * half["throughput"] / 512, rel=1e-9)
    assert half["ps_cpu_used"] <= 0.5


def test_gpu_worker_runs_faster_and_uses_less_cpu():
    cpu = simulate_config(config(worker_cpu=4), QUIET, steps_per_worker=50)
    gpu = simulate_config(config(worker_cpu=4, worker_gpu=1), QUIET, steps_per_worker=50)
    assert gpu["throughput"] > 1.5 * cpu["throughput"]
    assert 0 < gpu["worker_cpu_used"] < cpu["worker_cpu_used"]


# --------------------------------------------------------------------------------------------
# Determinism and seeds
# --------------------------------------------------------------------------------------------

GRID = pd.DataFrame(
    [config(workers=w, ps=p, worker_cpu=c, ps_cpu=c) for w, p, c in [(1, 1, 1), (4, 2, 0.5), (8, 3, 2)]]
)


def test_deterministic_for_a_seed():
    first = simulate_samples(GRID, steps_per_worker=40, seed=7, windows=2)
    second = simulate_samples(GRID, steps_per_worker=40, seed=7, windows=2)
    pd.testing.assert_frame_equal(first, second)


def test_different_seeds_differ():
    a = simulate_samples(GRID, steps_per_worker=40, seed=1)
    b = simulate_samples(GRID, steps_per_worker=40, seed=2)
    assert (a["throughput"] != b["throughput"]).all()
    assert (a["ps_memory_used_mb"] != b["ps_memory_used_mb"]).all()


def test_windows_are_distinct_measurements_and_window_zero_is_simulate_config():
    table = simulate_samples(GRID, steps_per_worker=40, seed=3, windows=3)
    assert len(table) == 3 * len(GRID)
    assert list(table.columns) == list(SAMPLE_COLUMNS)
    for i, record in enumerate(GRID.to_dict("records")):
        block = table.iloc[3 * i : 3 * i + 3]
        assert block["throughput"].nunique() == 3
        for column in CONFIG_COLUMNS[:4]:
            assert (block[column] == record[column]).all()
        single = simulate_config(record, steps_per_worker=40, seed=3)
        assert block.iloc[0].to_dict() == pytest.approx(single)
    # the noise of repeated windows is of the documented size: a few percent, not zero, not wild
    spread = table.groupby(table.index // 3)["throughput"].agg(lambda s: s.std() / s.mean())
    assert (spread > 0).all() and (spread < 0.1).all()


def test_samples_table_types_and_defaults():
    table = simulate_samples(pd.DataFrame([config(workers=2, ps=2)]), steps_per_worker=20)
    row = table.iloc[0]
    assert row["worker_memory_mb"] == 4096 and row["ps_memory_mb"] == 4096
    assert row["worker_gpu"] == 0 and row["batch_size"] == 512
    for column in ("workers", "ps", "worker_gpu", "batch_size"):
        assert table[column].dtype == np.int64
    # NaN in an optional column means "use the default", like a missing column
    with_nan = simulate_samples(
        pd.DataFrame([dict(config(workers=2, ps=2), batch_size=np.nan)]), steps_per_worker=20
    )
    pd.testing.assert_frame_equal(with_nan, table)


# --------------------------------------------------------------------------------------------
# Physics: monotonicity, bottlenecks, skew, crowding
# --------------------------------------------------------------------------------------------


def test_more_worker_cpu_never_lowers_single_worker_throughput():
    curve = [throughput(worker_cpu=c) for c in (0.25, 0.5, 1, 1.5, 2, 4, 8, 16)]
    assert all(b > a for a, b in zip(curve, curve[1:]))
    # ... with diminishing returns (Amdahl on the worker, the PS round trip stays)
    assert curve[-1] / curve[-2] < 1.2  # doubling 8 → 16 cores buys ~10 %


def test_doubling_ps_cpu_raises_throughput_when_ps_bound():
    one = throughput(workers=16, ps=1, ps_cpu=1)
    two = throughput(workers=16, ps=1, ps_cpu=2)
    assert two > 1.6 * one
    # ... and hardly matters when the job is worker-bound
    assert throughput(workers=1, ps=4, ps_cpu=2) < 1.1 * throughput(workers=1, ps=4, ps_cpu=1)


def test_skew_lowers_throughput_when_ps_bound():
    flat = throughput(QUIET, workers=24, ps=4)
    skewed = throughput(Physics(noise_cv=0.0, zipf_skew=1.1), workers=24, ps=4)
    assert skewed < 0.85 * flat
    # skew 0 splits the rows evenly, so every PS is equally busy and adding PS helps linearly
    assert throughput(QUIET, workers=32, ps=4) > 1.8 * throughput(QUIET, workers=32, ps=2)


def test_default_curves_rise_saturate_and_sag_when_crowded():
    ph = Physics()
    curve = {w: throughput(ph, steps=40, workers=w, ps=1) for w in (1, 2, 4, 8, 32)}
    assert 2000 < curve[1] < 5000  # a few thousand samples/s for 1 worker × 1 core, B = 512
    assert curve[2] > 1.8 * curve[1] and curve[4] > 1.6 * curve[2]  # worker-bound: near linear
    peak = max(curve.values())
    assert curve[8] > 0.95 * peak  # the 1-core PS saturates around 4-8 workers
    assert 0.7 * peak < curve[32] < 0.97 * peak  # crowding 32 workers on it costs a bit
    # the sag is the PS contention: without it a saturated PS just plateaus
    calm = Physics(ps_contention=0.0)
    plateau = throughput(calm, steps=40, workers=32, ps=1) / throughput(calm, steps=40, workers=8, ps=1)
    assert plateau == pytest.approx(1.0, abs=0.02)
    # more PS move the saturation point: 4 PS carry 16 workers nearly linearly
    assert throughput(ph, steps=40, workers=16, ps=4) > 3 * curve[8]


def test_memory_model():
    small = simulate_config(config(ps=1, batch_size=256), steps_per_worker=20)
    large = simulate_config(config(ps=4, batch_size=1024), steps_per_worker=20)
    assert large["worker_memory_used_mb"] > small["worker_memory_used_mb"]
    assert large["ps_memory_used_mb"] < small["ps_memory_used_mb"]  # the tables are split


# --------------------------------------------------------------------------------------------
# Allocation bounds, on random configurations
# --------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(
    workers=st.integers(1, 12),
    ps=st.integers(1, 6),
    worker_cpu=st.sampled_from([0.3, 0.5, 1.0, 1.5, 2.0, 4.0, 8.0]),
    ps_cpu=st.sampled_from([0.3, 0.5, 1.0, 1.5, 2.0, 4.0, 8.0]),
    worker_gpu=st.sampled_from([0, 0, 1, 2]),
    batch_size=st.sampled_from([1, 64, 512, 2048]),
    seed=st.integers(0, 2**31),
)
def test_usage_is_positive_and_within_the_allocation(workers, ps, worker_cpu, ps_cpu, worker_gpu, batch_size, seed):
    row = simulate_config(
        dict(workers=workers, ps=ps, worker_cpu=worker_cpu, ps_cpu=ps_cpu, worker_gpu=worker_gpu,
             batch_size=batch_size),
        steps_per_worker=10,
        seed=seed,
    )
    assert math.isfinite(row["throughput"]) and row["throughput"] > 0
    assert 0 < row["worker_cpu_used"] <= worker_cpu
    assert 0 < row["ps_cpu_used"] <= ps_cpu
    assert row["worker_memory_used_mb"] > 0 and row["ps_memory_used_mb"] > 0


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "column, value",
    [
        ("workers", 0),
        ("workers", 2.5),
        ("ps", 0),
        ("worker_cpu", 0),
        ("ps_cpu", -1.0),
        ("ps_cpu", float("inf")),
        ("batch_size", 0),
        ("worker_gpu", -1),
        ("worker_memory_mb", 0),
        ("workers", "many"),
    ],
)
def test_bad_values_raise_naming_the_column(column, value):
    with pytest.raises(ValueError, match=rf"^{column}="):
        simulate_config(config(**{column: value}))
    with pytest.raises(ValueError, match=rf"^{column}=.*\(row 1\)"):
        simulate_samples(pd.DataFrame([config(), config(**{column: value})]))


def test_missing_required_column_is_named():
    with pytest.raises(ValueError, match="ps_cpu"):
        simulate_config(dict(workers=1, ps=1, worker_cpu=1))
    with pytest.raises(ValueError, match="ps_cpu"):
        simulate_samples(pd.DataFrame([dict(workers=1, ps=1, worker_cpu=1)]))


def test_bad_arguments_and_physics_raise():
    with pytest.raises(ValueError, match="steps_per_worker"):
        simulate_config(config(), steps_per_worker=1)
    with pytest.raises(ValueError, match="windows"):
        simulate_samples(GRID, windows=0)
    with pytest.raises(ValueError, match="noise_cv"):
        Physics(noise_cv=-0.1)
    with pytest.raises(ValueError, match="warmup_fraction"):
        Physics(warmup_fraction=1.0)
