"""The truth families: outside the model's form where they claim to be, and the moving hot shard."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from sim.fit_error import QUOTA, fit_error, grid_configs, own_formula
from sim.truth import AllReduce, MovingHotShard, QueueingTable, Roofline, Truth, measured_roofline
from sim.workload import _truth

pytestmark = pytest.mark.unit

#: The threshold of a form error: the simulator's window noise (cv 5 %). A family the model fits
#: better than its own measurements scatter would be inside its span for every practical purpose.
#: Measured (``benchmarks/fit_error.py``, 128 cores, 300 dense points, seeds 0–2, also with 1000
#: points): queueing 6.6–17 %, moving_shard 5.9–18 %; the model's own formula ~1e-16.
FORM_ERROR_FLOOR = 0.05

OUTSIDE = {
    "queueing:default": QueueingTable("default"),
    "queueing:hot_shard": QueueingTable("hot_shard"),
    "queueing:net_bound": QueueingTable("net_bound"),
    "moving_shard day 0": MovingHotShard(seed=5, day=0),
    "moving_shard day 1": MovingHotShard(seed=5, day=1),
}


@pytest.mark.parametrize("name", OUTSIDE)
def test_families_outside_the_models_form_are_not_fitted_even_on_a_dense_noise_free_grid(name):
    error = fit_error(OUTSIDE[name])
    assert error.dense >= FORM_ERROR_FLOOR, error


def test_the_model_fits_its_own_formula_exactly():
    # The same measurement tells the two apart: samples from a fitted model's own predict are refitted
    # to < 1 % (in practice to rounding), from the dense grid and from noise-free probes alike.
    own = own_formula(MovingHotShard(seed=5))
    error = fit_error(own)
    assert error.dense < 0.01 and error.probes_exact < 0.01, error


def test_every_family_is_finite_positive_and_uses_at_most_its_allocation():
    configs = grid_configs(QUOTA, False, 200, seed=3)
    w, p, lw, lp = (configs[c].to_numpy(float) for c in ("workers", "ps", "worker_cpu", "ps_cpu"))
    truths: list[Truth] = [*(t for t in OUTSIDE.values()), Roofline(), measured_roofline()[0],
                           MovingHotShard(seed=2, n_hot=3, io=2e5)]
    for truth in truths:
        x = truth.throughput(w, p, lw, lp)
        assert np.all(np.isfinite(x)) and np.all(x > 0), truth
        worker, ps = truth.cpu_used(w, p, lw, lp)
        assert np.all(worker <= lw + 1e-9) and np.all(ps <= lp + 1e-9), truth
        assert np.all(worker > 0) and np.all(ps > 0), truth
        assert truth.throughput(64, 16, 1.0, 1.0) > truth.throughput(1, 1, 1.0, 1.0)  # more of everything
    ar = AllReduce()
    worker, ps = ar.cpu_used(w, 0, lw, 0.0)
    assert np.all(worker <= lw + 1e-9) and np.all(ps == 0)
    assert measured_roofline()[1] < 0.25  # the measured grid is reproduced within 25 %


def test_past_one_over_h_more_ps_do_not_help_the_hot_shard():
    truth = MovingHotShard(seed=5, n_hot=1, lock_cores=2.0)
    (h,), _ = truth.hot_ranges()
    p = np.arange(1, 65)
    x = truth.throughput(128, p, 8.0, 32.0)  # enough workers and PS cores: the hot PS binds
    cap = truth.lock_cores / (truth.kappa * truth.rows * h)  # X ≤ c_lock / (κ·rows·h) for every p
    assert np.all(x <= cap)
    first = math.ceil(1 / h)
    assert 64 / first > 5 and x[-1] < 1.1 * x[first - 1]  # 5× more PS past 1/h, < 10 % more throughput
    assert x[first - 1] > 1.2 * x[0]  # before 1/h they did help
    # A hot range's updates use at most lock_cores cores: more PS cores do not lift the cap.
    assert truth.throughput(128, 64, 8.0, 32.0) < 1.1 * truth.throughput(128, 64, 8.0, 4.0)
    np.testing.assert_allclose(truth.hot_ps_share(p)[-1], 64 * (h + (1 - h) / 64))


def test_the_hot_shard_moves_between_days():
    base = MovingHotShard(seed=5)
    p = np.arange(1, 33)
    days = {d: replace(base, day=d) for d in range(3)}
    curves = {d: t.throughput(128, p, 8.0, 8.0) for d, t in days.items()}
    np.testing.assert_array_equal(curves[0], MovingHotShard(seed=5).throughput(128, p, 8.0, 8.0))  # deterministic
    # Where the hot ranges collide on one PS, one more PS slows the job; that set moves with the day.
    drops = {d: frozenset(int(v) for v in p[1:][x[1:] < 0.9 * x[:-1]]) for d, x in curves.items()}
    assert all(drops.values()) and len(set(drops.values())) == 3, drops
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert not np.allclose(days[a].hot_ranges()[0], days[b].hot_ranges()[0])
        assert np.max(np.abs(np.log(curves[a] / curves[b]))) > 0.1
    assert MovingHotShard(seed=6).hot_ranges()[1].tolist() != base.hot_ranges()[1].tolist()  # another family
    np.testing.assert_allclose(replace(base, scale=2.0).throughput(8, 2, 2.0, 2.0), 2 * base.throughput(8, 2, 2.0, 2.0))


def test_the_trace_draws_moving_shard_families():
    rng = np.random.default_rng(0)
    kinds = [type(_truth(rng)).__name__ for _ in range(400)]
    share = kinds.count("MovingHotShard") / len(kinds)
    assert 0.05 < share < 0.16
    assert 0.33 < kinds.count("QueueingTable") / len(kinds) < 0.47  # the queueing share is kept


def test_the_hot_shards_kept_loads_equal_the_per_count_ones():
    """``_hottest`` of whole PS counts (kept per truth) equals its loop over each distinct count,
    exactly; other values (fractions, past the kept counts) take the loop."""
    from sim.truth import _hottest_of

    rng = np.random.default_rng(0)
    for seed in range(12):
        truth = MovingHotShard(seed=seed, day=seed % 3, n_hot=1 + seed % 4)
        for p in (rng.integers(0, 300, 2000).astype(float), np.array([0.0, 1.0, 256.0]), rng.uniform(0, 40, 50),
                  np.arange(1.0, 257.0), np.array([7.0])):
            at = np.maximum(p, 1.0)
            for got, want in zip(truth._hottest(p), _hottest_of(truth, np.unique(at), at)):
                np.testing.assert_array_equal(got, want)


def test_the_kept_max_share_equals_the_per_count_one():
    """``max_share`` of whole PS counts (kept per skew) equals ``_max_share`` of each count, exactly."""
    from sim.truth import _max_share, max_share

    rng = np.random.default_rng(1)
    for skew in (0.8, 1.1, 0.35):
        for p in (rng.integers(1, 257, 3000).astype(float), np.array([1.0, 256.0]), rng.uniform(1, 40, 30),
                  np.array([300.0, 2.0])):
            want = np.array([_max_share(int(v), skew) for v in p])
            np.testing.assert_array_equal(max_share(p, skew), want)
