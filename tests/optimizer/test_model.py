import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from airflow_dlrover.optimizer.job_model import JobModel, fit_job_model
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.model import (
    NO_SCALING,
    PARAMETERS,
    ThroughputModel,
    effective_cores,
    features,
    fit_throughput,
)
from airflow_dlrover.optimizer.types import InvalidInputError
from sim.synthetic import DIVERSE_CONFIGS, TRUE_THETA, model_samples, true_throughput

pytestmark = pytest.mark.unit

CPU_PARAMS = [p for p in PARAMETERS if p != "gpu_compute"]


def test_noiseless_fit_recovers_known_parameters():
    model = fit_throughput(model_samples())
    for name in CPU_PARAMS:
        assert model.params[name] == pytest.approx(TRUE_THETA[name], rel=0.01)
    assert model.params["gpu_compute"] == 0.0
    assert "gpu_compute" in model.report.pinned
    assert "no sample has a GPU" in model.report.pinned["gpu_compute"]
    assert model.report.in_sample_mape < 1e-6 and model.report.out_of_sample_mape < 1e-6
    assert model.report.out_of_sample_method == "leave-one-configuration-out"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=8, max_size=8))
def test_recovery_holds_across_parameter_space(log_factors):
    theta = dict(TRUE_THETA)
    for name, factor in zip(CPU_PARAMS, log_factors):
        theta[name] = TRUE_THETA[name] * 10.0**factor
    model = fit_throughput(model_samples(theta), leave_one_out=False)
    for name in CPU_PARAMS:
        assert model.params[name] == pytest.approx(theta[name], rel=0.01)


def test_five_percent_noise_stays_accurate_and_band_covers_truth():
    model = fit_throughput(model_samples(noise=0.05, windows=3, seed=7))
    held_out = pd.DataFrame(
        [(3, 2, 2, 2), (12, 3, 1, 2), (6, 1, 4, 4), (24, 6, 1, 1), (10, 4, 2, 0.5)],
        columns=["workers", "ps", "worker_cpu", "ps_cpu"],
    )
    predicted, lower, upper = model.predict(held_out)
    truth = true_throughput(held_out)
    assert np.mean(np.abs(predicted - truth) / truth) < 0.10
    assert np.mean((lower <= truth) & (truth <= upper)) >= 0.8
    assert 0.02 < model.relative_noise < 0.09  # it measures the 5 % it was given
    assert model.report.out_of_sample_mape < 0.12


def test_band_is_wider_far_from_the_samples():
    model = fit_throughput(model_samples(noise=0.05, windows=2, seed=1))
    near = pd.DataFrame([(4, 2, 2, 1)], columns=["workers", "ps", "worker_cpu", "ps_cpu"])
    far = pd.DataFrame([(128, 64, 32, 32)], columns=["workers", "ps", "worker_cpu", "ps_cpu"])
    (x_near,), (lo_near,), (hi_near,) = model.predict(near)
    (x_far,), (lo_far,), (hi_far,) = model.predict(far)
    assert (hi_far - lo_far) / x_far > (hi_near - lo_near) / x_near
    assert lo_near < x_near < hi_near


def test_unidentifiable_parameters_are_pinned_and_reported():
    # ps_cpu never varies: PS cores and PS links cannot be told apart.
    configs = [(w, p, lw, 1.0) for (w, p, lw, _) in DIVERSE_CONFIGS]
    model = fit_throughput(model_samples(configs=configs), leave_one_out=False)
    pinned = model.report.pinned
    assert "network" in pinned and "ps_cpu never varies" in pinned["network"]
    assert model.params["network"] == 0.0
    # Still exact on what it saw.
    assert model.report.in_sample_mape < 1e-6


def test_warm_start_needs_fewer_samples():
    yesterday = dict(TRUE_THETA, worker_compute=TRUE_THETA["worker_compute"] * 1.3)
    prior = fit_throughput(model_samples(yesterday))
    two_probes = model_samples(configs=[(2, 1, 1, 1), (8, 2, 2, 2)])
    with pytest.raises(InvalidInputError):
        fit_throughput(two_probes.iloc[:1])  # cold: one configuration is not enough
    warm = fit_throughput(two_probes, prior)
    assert warm.report.warm_start and not warm.report.pinned.get("ps_service")
    grid = pd.DataFrame(DIVERSE_CONFIGS, columns=["workers", "ps", "worker_cpu", "ps_cpu"])
    truth = true_throughput(grid)
    err_prior = np.mean(np.abs(prior.predict(grid, band=False) - truth) / truth)
    err_warm = np.mean(np.abs(warm.predict(grid, band=False) - truth) / truth)
    assert err_warm < err_prior


@pytest.mark.parametrize("leave_one_out", [True, False])
def test_a_warm_start_on_one_configuration_rescales_the_prior(leave_one_out):
    # One probe (windows of a single configuration): nothing is left to hold out, so there is no
    # out-of-sample error, and the fit must not try one on an empty table (scipy's NNLS aborted
    # the interpreter on it).
    prior = fit_throughput(model_samples(dict(TRUE_THETA, worker_compute=TRUE_THETA["worker_compute"] * 1.3)))
    one = model_samples(configs=[(8, 2, 2, 2)], windows=3)
    warm = fit_throughput(one, prior, leave_one_out=leave_one_out)
    assert warm.report.warm_start and warm.report.n_configurations == 1
    assert warm.report.out_of_sample_mape is None
    measured = float(one["throughput"].median())
    assert abs(warm.predict(one.iloc[:1], band=False)[0] / measured - 1) < abs(prior.predict(one.iloc[:1], band=False)[0] / measured - 1)


def test_recent_samples_weigh_more():
    old = model_samples(dict(TRUE_THETA, ps_service=3e-4), windows=1)
    new = model_samples(TRUE_THETA, windows=1)
    model = fit_throughput(pd.concat([old, new]), half_life=5, leave_one_out=False)
    assert abs(model.params["ps_service"] - 1.5e-4) < abs(model.params["ps_service"] - 3e-4)


def test_more_worker_cpu_never_lowers_prediction():
    model = fit_throughput(model_samples(noise=0.05, seed=3), leave_one_out=False)
    configs = pd.DataFrame({"workers": 8, "ps": 2, "worker_cpu": [0.5, 1, 2, 4, 8, 16, 32], "ps_cpu": 2})
    predicted = model.predict(configs, band=False)
    assert np.all(np.diff(predicted) >= 0)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda t: t.assign(throughput=np.nan), "samples.throughput"),
        (lambda t: t.assign(workers=-1), "samples.workers"),
        (lambda t: t.assign(worker_cpu=0), "samples.worker_cpu"),
        (lambda t: t.assign(ps=1.5), "samples.ps"),
        (lambda t: t.drop(columns=["ps_cpu"]), "samples columns"),
        (lambda t: t.iloc[:0], "samples"),
        (lambda t: t.assign(ps_memory_used_mb=-5.0), "samples.ps_memory_used_mb"),
    ],
)
def test_bad_samples_name_the_problem(mutate, field):
    with pytest.raises(InvalidInputError) as err:
        fit_throughput(mutate(model_samples()))
    assert err.value.field == field
    assert field.split(".")[-1] in str(err.value)


def test_one_configuration_only_is_refused():
    with pytest.raises(InvalidInputError, match="at least 2 distinct configurations"):
        fit_throughput(model_samples(configs=[(2, 1, 1, 1)], windows=3))


def test_job_model_round_trips_through_json(tmp_path):
    model = fit_job_model(model_samples(noise=0.02, seed=2))
    path = tmp_path / "model.json"
    model.save(path)
    loaded = JobModel.load(path)
    assert loaded.throughput.params == model.throughput.params
    assert loaded.memory == model.memory
    np.testing.assert_allclose(loaded.throughput.covariance, model.throughput.covariance)
    path.write_text('{"format": "something-else"}')
    with pytest.raises(InvalidInputError, match="format"):
        JobModel.load(path)


# ---------------------------------------------------------------------------------------------
# All-reduce jobs (ps = 0)
# ---------------------------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

from airflow_dlrover.optimizer.model import ALLREDUCE_TERMS, PS_TERMS  # noqa: E402
from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA  # noqa: E402

AR_HELD_OUT = pd.DataFrame([(3, 0, 1, 0), (12, 0, 2, 0), (5, 0, 4, 0), (24, 0, 0.5, 0), (10, 0, 1, 0)],
                           columns=["workers", "ps", "worker_cpu", "ps_cpu"])


@pytest.mark.parametrize("ps", [0, 1, 4])
def test_the_other_kinds_features_are_zero_not_inf(ps):
    w = np.array([1, 2, 8, 128])
    f = features(w, ps, 2.0, 0.0 if ps == 0 else 1.0, 0, 512)
    assert np.isfinite(f).all() and (f >= 0).all()
    ps_columns = [PARAMETERS.index(n) for n in PS_TERMS]
    ring_columns = [PARAMETERS.index(n) for n in ALLREDUCE_TERMS]
    if ps == 0:
        assert (f[:, ps_columns] == 0).all()
        assert (f[0, ring_columns] == 0).all() and (f[1:, ring_columns] > 0).all()  # one worker: no ring
        np.testing.assert_allclose(f[:, ring_columns[0]], 2 * (w - 1) / (w**2 * 512))
        np.testing.assert_allclose(f[:, ring_columns[1]], 2 * (w - 1) / (w * 512))
    else:
        assert (f[:, ring_columns] == 0).all() and (f[:, ps_columns] > 0).all()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_allreduce_fit_recovers_the_predictions_of_noisy_samples(seed):
    model = fit_throughput(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.05, windows=3, seed=seed))
    assert model.allreduce
    truth = true_throughput(AR_HELD_OUT, ALLREDUCE_THETA)
    predicted, lower, upper = model.predict(AR_HELD_OUT)
    assert np.mean(np.abs(predicted - truth) / truth) < 0.05
    assert np.mean((lower <= truth) & (truth <= upper)) >= 0.8
    assert model.report.out_of_sample_mape < 0.08
    for name in PS_TERMS:
        assert model.params[name] == 0.0 and name not in model.identified
        assert model.report.pinned[name] == "not identifiable: the job has no PS"
    assert set(ALLREDUCE_TERMS) <= set(model.identified)


def test_a_noiseless_allreduce_fit_is_exact_and_says_what_one_batch_size_cannot_tell_apart():
    model = fit_throughput(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS), sharpness=1.0)
    assert model.report.in_sample_mape < 1e-9 and model.report.out_of_sample_mape < 1e-9
    assert model.params["worker_compute"] == pytest.approx(ALLREDUCE_THETA["worker_compute"], rel=1e-6)
    assert model.params["allreduce"] == pytest.approx(ALLREDUCE_THETA["allreduce"], rel=1e-6)
    # At q = 1 with one batch size io is a combination of the ring's latency and the overhead.
    assert "io" in model.report.pinned and "batch_size never varies" in model.report.pinned["io"]
    np.testing.assert_allclose(model.predict(AR_HELD_OUT, band=False), true_throughput(AR_HELD_OUT, ALLREDUCE_THETA),
                               rtol=1e-9)


def test_a_ps_fit_reports_the_allreduce_terms_as_not_identifiable():
    model = fit_throughput(model_samples(), leave_one_out=False)
    assert not model.allreduce
    for name in ALLREDUCE_TERMS:
        assert model.params[name] == 0.0
        assert model.report.pinned[name] == "not identifiable: the job has PS (no all-reduce)"
    assert any("not identifiable: the job has PS" in line for line in model.describe())


def test_samples_with_one_worker_cannot_identify_the_ring():
    configs = [(1, 0, lw, 0.0) for lw in (0.5, 1, 2, 4)]
    model = fit_throughput(model_samples(ALLREDUCE_THETA, configs), leave_one_out=False)
    for name in ALLREDUCE_TERMS:
        assert "one worker" in model.report.pinned[name]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4096), st.sampled_from([0.5, 1, 4, 32]), st.sampled_from([0, 1, 8]), st.sampled_from([1, 64, 4096]))
def test_an_allreduce_configuration_has_a_finite_positive_throughput(workers, worker_cpu, gpu, batch):
    model = fit_throughput(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.05, seed=1), leave_one_out=False)
    config = pd.DataFrame({"workers": [workers], "ps": 0, "worker_cpu": worker_cpu, "ps_cpu": 0.0,
                           "worker_gpu": gpu, "batch_size": batch})
    x, lower, upper = model.predict(config)
    assert np.isfinite([x, lower, upper]).all() and 0 < lower[0] <= x[0] <= upper[0]


def test_more_workers_stop_helping_an_allreduce_job():
    model = fit_throughput(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.05, windows=2, seed=2))
    workers = 2 ** np.arange(0, 13)
    x = model.predict(pd.DataFrame({"workers": workers, "ps": 0, "worker_cpu": 1.0, "ps_cpu": 0.0}), band=False)
    gain = x[1:] / x[:-1]  # each doubling of the workers
    assert gain[0] > 1.5  # the first doublings pay ...
    assert gain[-1] < 1.05 and np.all(np.diff(gain[2:]) < 0)  # ... then less and less
    # The ring's latency bounds the job: X ≤ B / (2 θ_allreduce_latency) (+ io), whatever w.
    assert x.max() < 512 / (2 * model.params["allreduce_latency"])


def test_kinds_are_not_mixed():
    ps_model = fit_throughput(model_samples(), leave_one_out=False)
    ar_samples = model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS)
    with pytest.raises(InvalidInputError) as err:
        fit_throughput(ar_samples, ps_model)
    assert err.value.field == "prior" and "ps = 0" in err.value.allowed
    with pytest.raises(InvalidInputError) as err:
        ps_model.predict(AR_HELD_OUT)
    assert err.value.field == "configs.ps"
    ar_model = fit_throughput(ar_samples, leave_one_out=False)
    assert fit_throughput(ar_samples.iloc[:3], ar_model).allreduce  # a warm start of the same kind


def test_an_allreduce_model_round_trips_through_json():
    model = fit_job_model(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.02, seed=2)).throughput
    loaded = ThroughputModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert loaded.allreduce and loaded.params == model.params and loaded.report.pinned == model.report.pinned
    np.testing.assert_array_equal(loaded.predict(AR_HELD_OUT, band=False), model.predict(AR_HELD_OUT, band=False))


def test_a_model_written_before_allreduce_jobs_loads_and_predicts_as_before():
    legacy = json.loads((Path(__file__).parent / "data" / "legacy_throughput_model.json").read_text())
    assert len(legacy["model"]["params"]) == 9 and "allreduce" not in legacy["model"]
    assert np.asarray(legacy["model"]["covariance"]).shape == (9, 9)
    model = ThroughputModel.from_dict(legacy["model"])
    assert not model.allreduce and model.covariance.shape == (len(PARAMETERS),) * 2
    assert all(model.params[name] == 0.0 for name in ALLREDUCE_TERMS)
    for name in ALLREDUCE_TERMS:
        assert model.report.pinned[name] == "not identifiable: the job has PS (no all-reduce)"
    predicted, lower, upper = model.predict(pd.DataFrame(legacy["configs"]))
    np.testing.assert_allclose(predicted, legacy["predicted"], rtol=1e-12)
    np.testing.assert_allclose(lower, legacy["lower"], rtol=1e-12)
    np.testing.assert_allclose(upper, legacy["upper"], rtol=1e-12)
    assert model.describe()[: len(legacy["describe"])] == legacy["describe"]
    # It warm-starts a fit of the same (PS) job.
    assert not fit_throughput(model_samples(configs=[(2, 1, 1, 1), (8, 2, 2, 2)]), model).allreduce


# --- the core curve -----------------------------------------------------------------------------

def test_effective_cores_is_a_power_from_one_core_and_a_throttled_share_below():
    cores = np.array([0.25, 0.5, 1.0, 2.0, 4.0])
    np.testing.assert_array_equal(effective_cores(cores, 1.0, 0.0), cores)
    np.testing.assert_allclose(effective_cores(cores, 0.7, 0.4),
                               [0.25 * (1 - 0.4 * 0.75), 0.5 * (1 - 0.4 * 0.5), 1.0, 2.0**0.7, 4.0**0.7])


def _curve_samples(scaling, count=60):
    """Noise-free samples of the synthetic job's θ at q = 2 on ``count`` configurations, with
    λw and λp entering as ``scaling``'s effective cores."""
    rng = np.random.default_rng(3)
    configs = pd.DataFrame({"workers": rng.choice([1, 2, 4, 8, 16], count), "ps": rng.choice([1, 2, 4, 8], count),
                            "worker_cpu": rng.choice([0.25, 0.5, 1, 2, 4, 8], count),
                            "ps_cpu": rng.choice([0.25, 0.5, 1, 2, 4], count), "worker_gpu": 0, "batch_size": 512})
    feats = features(configs.workers, configs.ps, configs.worker_cpu, configs.ps_cpu, 0, 512, scaling=scaling)
    theta = np.array([TRUE_THETA.get(name, 0.0) for name in PARAMETERS])
    return configs.assign(throughput=(feats**2 @ theta**2) ** -0.5)


def test_a_dense_table_of_a_curved_job_gets_its_core_curve_back():
    truth = (0.7, 0.85, 0.4)
    model = fit_throughput(_curve_samples(truth), sharpness=2.0)
    assert model.scaling == truth
    assert model.report.out_of_sample_mape < 1e-6
    assert set(model.report.scaling_cv_mape) >= {"worker_cpu^0.7", "ps_cpu^0.85", "throttle 0.4"}
    whole = fit_throughput(_curve_samples(truth), sharpness=2.0, scaling=NO_SCALING)
    assert whole.scaling == NO_SCALING and whole.report.out_of_sample_mape > 0.02


def test_few_configurations_keep_whole_cores_however_curved_the_job():
    few = _curve_samples((0.55, 0.55, 0.4), count=C.SCALING_MIN_CONFIGURATIONS - 5)
    assert few[["workers", "ps", "worker_cpu", "ps_cpu"]].drop_duplicates().shape[0] < C.SCALING_MIN_CONFIGURATIONS
    model = fit_throughput(few)
    assert model.scaling == NO_SCALING and model.report.scaling_cv_mape is None


def test_a_straight_job_keeps_whole_cores():
    model = fit_throughput(_curve_samples(NO_SCALING), sharpness=2.0)
    assert model.scaling == NO_SCALING
    assert model.report.scaling_cv_mape  # tried, and not kept


def test_the_core_curve_is_stored_kept_by_a_warm_start_and_checked_on_load():
    curved = fit_throughput(_curve_samples((0.7, 1.0, 0.2)), sharpness=2.0)
    again = ThroughputModel.from_dict(json.loads(json.dumps(curved.to_dict())))
    assert again.scaling == curved.scaling
    frame = _curve_samples((0.7, 1.0, 0.2)).iloc[:8]
    np.testing.assert_allclose(again.predict(frame, band=False), curved.predict(frame, band=False), rtol=1e-12)
    assert fit_throughput(frame, prior=again).scaling == curved.scaling  # the prior's curve, not chosen again
    older = {k: v for k, v in curved.to_dict().items() if k != "scaling"}
    assert ThroughputModel.from_dict(older).scaling == NO_SCALING
    with pytest.raises(InvalidInputError, match="model.throughput"):
        ThroughputModel.from_dict({**curved.to_dict(), "scaling": [1.5, 1.0, 0.0]})
