import itertools

import numpy as np

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import features, fit_throughput
from airflow_dlrover.optimizer.planner import plan
from airflow_dlrover.optimizer.types import Configuration, InfeasibleQuotaError, InvalidInputError, Quota
from sim.synthetic import TRUE_THETA, model_samples

pytestmark = pytest.mark.unit

MODEL = fit_throughput(model_samples(), leave_one_out=False)
MEMORY = MemoryModel(ps_base_mb=400, table_mb=8000, worker_base_mb=900, activation_mb_per_sample=0.5,
                     table_growth_mb_per_m_samples=20)

quotas = st.builds(
    Quota,
    cpu=st.sampled_from([1, 2, 3, 8, 16, 40, 64, 200, 1000]),
    memory_mb=st.sampled_from([4096, 16384, 65536, 262144, 10**7]),
    max_nodes=st.one_of(st.none(), st.integers(2, 200)),
)


def _fits(config: Configuration, quota: Quota) -> bool:
    return (config.cores <= quota.cpu + 1e-9 and config.memory_mb <= quota.memory_mb
            and (quota.max_nodes is None or config.nodes <= quota.max_nodes) and config.gpus <= quota.gpu)


@settings(max_examples=60, deadline=None)
@given(quotas, st.sampled_from(["throughput", "efficiency"]), st.sampled_from([None, 1e8, 1e10]))
def test_plans_never_exceed_the_quota_and_memory_covers_the_peak(quota, objective, samples):
    try:
        result = plan(MODEL, MEMORY, quota, objective, samples=samples)
    except InfeasibleQuotaError as err:
        assert err.field in ("cpu", "memory") and err.minimum["cpu"] == 1.0
        assert err.minimum["memory_mb"] > quota.memory_mb or err.minimum["cpu"] > quota.cpu
        return
    config = result.config
    assert _fits(config, quota)
    ps_peak = MEMORY.ps_peak_mb(config.ps, samples or 0.0)
    worker_peak = MEMORY.worker_peak_mb(config.batch_size)
    for allocated, peak in ((config.ps_memory_mb, ps_peak), (config.worker_memory_mb, worker_peak)):
        assert allocated >= peak * (1 + C.MEMORY_MARGIN_FRACTION) - 1e-6
        assert allocated >= peak + C.MEMORY_MIN_HEADROOM_MB - 1e-6
        assert allocated % C.MEMORY_GRANULARITY_MB == 0
    for alternative in result.alternatives + result.pareto_front:
        assert alternative["cores"] <= quota.cpu + 1e-9 and alternative["memory_mb"] <= quota.memory_mb


@settings(max_examples=60, deadline=None)
@given(quotas, st.floats(1.0, 4.0), st.floats(1.0, 4.0))
def test_more_quota_never_lowers_predicted_throughput(quota, cpu_factor, memory_factor):
    bigger = Quota(quota.cpu * cpu_factor, quota.memory_mb * memory_factor, max_nodes=quota.max_nodes)
    try:
        small = plan(MODEL, MEMORY, quota)
    except InfeasibleQuotaError:
        return
    large = plan(MODEL, MEMORY, bigger)
    fastest = max(a["predicted_throughput"] for a in large.alternatives + [{"predicted_throughput": large.predicted_throughput}])
    assert fastest >= small.predicted_throughput
    assert large.predicted_throughput >= (1 - C.PLAN_TIE_FRACTION) * fastest


def test_exact_search_matches_brute_force():
    quota = Quota(cpu=12, memory_mb=64 * 1024)
    found = []
    for w, p, lw, lp in itertools.product(range(1, 25), range(1, 25), C.GRID_CPU_VALUES, C.GRID_CPU_VALUES):
        if w * lw + p * lp > quota.cpu:
            continue
        memory = w * MEMORY.worker_request_mb(512) + p * MEMORY.ps_request_mb(p)
        if memory > quota.memory_mb:
            continue
        found.append((-1 / float(features(w, p, lw, lp, 0, 512) @ MODEL.theta), w * lw + p * lp, (w, p, lw, lp)))
    fastest = sorted(found)[: C.PLAN_ALTERNATIVES + 1]
    near = [(x, shape) for x, _, shape in fastest if -x >= (1 - C.PLAN_TIE_FRACTION) * -fastest[0][0]]
    lower = [MODEL.predict_features(features(*shape, 0, 512)[None, :])[1][0] for _, shape in near]
    best_x, best = near[int(np.argmax(lower))]
    result = plan(MODEL, MEMORY, quota)
    c = result.config
    assert (c.workers, c.ps, c.worker_cpu, c.ps_cpu) == best
    assert result.predicted_throughput == pytest.approx(-best_x)
    assert result.lower_throughput == pytest.approx(max(lower))
    assert result.lower_throughput < result.predicted_throughput < result.upper_throughput
    assert "highest predicted throughput" in result.reason and "90 % band" in result.reason


def test_pareto_front_is_strictly_increasing_and_knee_is_cheaper():
    quota = Quota(cpu=256, memory_mb=10**6)
    fast = plan(MODEL, MEMORY, quota)
    knee = plan(MODEL, MEMORY, quota, "efficiency")
    front = fast.pareto_front
    assert len(front) > 10
    assert all(a["cores"] < b["cores"] and a["predicted_throughput"] < b["predicted_throughput"]
               for a, b in zip(front, front[1:]))
    assert front[-1]["predicted_throughput"] >= fast.predicted_throughput >= (1 - C.PLAN_TIE_FRACTION) * front[-1]["predicted_throughput"]
    assert knee.config.cores <= front[-1]["cores"]
    assert knee.predicted_throughput / knee.config.cores >= fast.predicted_throughput / fast.config.cores


def test_deadline_objective_is_cheapest_on_time():
    quota = Quota(cpu=64, memory_mb=256 * 1024)
    samples, deadline = 2e8, 4 * 3600
    result = plan(MODEL, MEMORY, quota, "deadline", samples=samples, deadline_s=deadline)
    assert samples / result.predicted_throughput <= deadline
    fastest = plan(MODEL, MEMORY, quota)
    assert result.config.cores <= fastest.config.cores

    def cost(row):
        return (row["cores"] * C.DEFAULT_PRICE_PER_CORE_HOUR + row["memory_mb"] / 1024 * C.DEFAULT_PRICE_PER_GB_HOUR) \
            * samples / row["predicted_throughput"]

    chosen = dict(cores=result.config.cores, memory_mb=result.config.memory_mb,
                  predicted_throughput=result.predicted_throughput)
    for alternative in result.alternatives:
        assert cost(alternative) >= cost(chosen) - 1e-6


def test_deadline_out_of_reach_names_the_fastest_time():
    with pytest.raises(InvalidInputError) as err:
        plan(MODEL, MEMORY, Quota(8, 65536), "deadline", samples=1e8, deadline_s=60)
    assert err.value.field == "deadline" and "the fastest plan under this quota" in str(err.value)


def test_table_growth_over_a_long_job_can_exhaust_memory():
    quota = Quota(8, 65536)
    plan(MODEL, MEMORY, quota, samples=1e6)
    with pytest.raises(InfeasibleQuotaError) as err:
        plan(MODEL, MEMORY, quota, samples=1e10)
    assert err.value.field == "memory" and "PS tables grow" in str(err.value)
    assert err.value.minimum["memory_mb"] > quota.memory_mb


def test_infeasible_quota_names_the_minimum():
    with pytest.raises(InfeasibleQuotaError) as err:
        plan(MODEL, MEMORY, Quota(cpu=0.5, memory_mb=10**6))
    assert err.value.field == "cpu" and err.value.minimum["cpu"] == 1.0
    with pytest.raises(InfeasibleQuotaError) as err:
        plan(MODEL, MEMORY, Quota(cpu=64, memory_mb=2048))
    assert err.value.field == "memory"
    assert err.value.minimum["memory_mb"] == MEMORY.worker_request_mb(512) + MEMORY.ps_request_mb(1)
    assert "memory_mb=19744" in str(err.value)  # 1344 worker + 18400 PS (8000 MB of tables + 1.25× them: a restore)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(objective="fastest"), "objective"),
        (dict(objective="deadline"), "deadline"),
        (dict(samples=-5), "samples"),
    ],
)
def test_bad_plan_arguments(kwargs, field):
    with pytest.raises(InvalidInputError) as err:
        plan(MODEL, MEMORY, Quota(64, 65536), **kwargs)
    assert err.value.field == field


def test_without_a_memory_model_each_node_gets_an_equal_share_of_the_quota_and_the_plan_says_so():
    quota = Quota(64, 65536)
    chosen = plan(MODEL, None, quota)
    c = chosen.config
    share = (65536 // c.nodes) // C.MEMORY_GRANULARITY_MB * C.MEMORY_GRANULARITY_MB
    assert c.worker_memory_mb == c.ps_memory_mb == share
    assert c.memory_mb <= quota.memory_mb and c.memory_mb > quota.memory_mb - c.nodes * C.MEMORY_GRANULARITY_MB
    assert "equal share of the quota's memory (no memory model)" in chosen.reason
    # the throughput choice is the model's: memory never binds an equal share
    assert (c.workers, c.ps, c.worker_cpu, c.ps_cpu) == _config_key(plan(MODEL, MEMORY, Quota(64, 10**7)).config)


def _config_key(c: Configuration) -> tuple:
    return c.workers, c.ps, c.worker_cpu, c.ps_cpu


def test_explicit_memory_per_node_is_used_as_given_and_binds_the_plan():
    chosen = plan(MODEL, None, Quota(64, 16 * 1024), worker_memory_mb=1024, ps_memory_mb=4096)
    c = chosen.config
    assert (c.worker_memory_mb, c.ps_memory_mb) == (1024, 4096)
    assert c.workers * 1024 + c.ps * 4096 <= 16 * 1024
    assert "as given" in chosen.reason
    one = plan(MODEL, None, Quota(64, 65536), ps_memory_mb=8192)  # the workers share what the PS leave
    assert one.config.ps_memory_mb == 8192
    assert one.config.worker_memory_mb * one.config.workers <= 65536 - 8192 * one.config.ps
    over = plan(MODEL, MEMORY, Quota(64, 10**7), worker_memory_mb=3000)  # a given size beats the model's
    assert over.config.worker_memory_mb == 3000 and over.config.ps_memory_mb > 0


@pytest.mark.parametrize("kwargs, field", [(dict(worker_memory_mb=0), "worker_memory"),
                                           (dict(ps_memory_mb=float("nan")), "ps_memory")])
def test_bad_memory_per_node_is_refused_by_name(kwargs, field):
    with pytest.raises(InvalidInputError) as err:
        plan(MODEL, None, Quota(64, 65536), **kwargs)
    assert err.value.field == field


def test_memory_per_node_that_no_configuration_fits_names_the_smallest_need():
    with pytest.raises(InfeasibleQuotaError) as err:
        plan(MODEL, None, Quota(64, 4096), worker_memory_mb=3072, ps_memory_mb=2048)
    assert err.value.field == "memory"


def test_gpus_are_searched_only_when_the_model_knows_them():
    result = plan(MODEL, MEMORY, Quota(64, 256 * 1024, gpu=8))
    assert result.config.worker_gpu == 0 and "GPUs not searched" in result.reason
    gpu_samples = model_samples(dict(TRUE_THETA, gpu_compute=2e-5), gpu=1)
    cpu_samples = model_samples()
    gpu_model = fit_throughput(pd.concat([cpu_samples, gpu_samples]), leave_one_out=False)
    result = plan(gpu_model, MEMORY, Quota(64, 256 * 1024, gpu=8))
    assert result.config.gpus <= 8
    assert result.config.worker_gpu > 0


def test_excluded_configurations_are_skipped():
    quota = Quota(cpu=16, memory_mb=65536)
    first = plan(MODEL, MEMORY, quota)
    second = plan(MODEL, MEMORY, quota, exclude=[first.config])
    assert (second.config.workers, second.config.ps, second.config.worker_cpu, second.config.ps_cpu) != (
        first.config.workers, first.config.ps, first.config.worker_cpu, first.config.ps_cpu)
    assert second.predicted_throughput <= first.predicted_throughput


def test_node_sizes_stay_near_those_the_model_was_fitted_on():
    small_nodes = [(w, p, lw, lp) for w, p in ((1, 1), (2, 1), (4, 2), (8, 2), (8, 4)) for lw, lp in ((0.5, 0.5), (1, 1), (0.5, 1))]
    model = fit_throughput(model_samples(configs=small_nodes), leave_one_out=False)
    assert model.report.largest_node_cpu == {"worker_cpu": 1.0, "ps_cpu": 1.0}
    quota = Quota(cpu=256, memory_mb=1024 * 1024)
    chosen = plan(model, MEMORY, quota).config
    assert max(chosen.worker_cpu, chosen.ps_cpu) <= C.NODE_CPU_TRUST_MULTIPLE * 1.0
    # A model written before the range was recorded (no largest_node_cpu) searches every size.
    from dataclasses import replace

    legacy = replace(model, report=replace(model.report, largest_node_cpu=None))
    assert max(plan(legacy, MEMORY, quota).config.ps_cpu, plan(legacy, MEMORY, quota).config.worker_cpu) > 2.0
    # The range survives the JSON round trip, and a warm fit keeps its prior's.
    from airflow_dlrover.optimizer.model import ThroughputModel

    assert ThroughputModel.from_dict(model.to_dict()).report.largest_node_cpu == model.report.largest_node_cpu
    warm = fit_throughput(model_samples(configs=[(2, 1, 0.5, 0.5), (4, 1, 0.5, 0.5)]), model)
    assert warm.report.largest_node_cpu == {"worker_cpu": 1.0, "ps_cpu": 1.0}


# ---------------------------------------------------------------------------------------------
# All-reduce jobs (ps = 0)
# ---------------------------------------------------------------------------------------------

from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA  # noqa: E402

AR_MODEL = fit_throughput(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.02, windows=2, seed=3),
                          leave_one_out=False)
AR_MEMORY = MemoryModel(None, None, worker_base_mb=3000, activation_mb_per_sample=0.5,
                        table_growth_mb_per_m_samples=20, table_capacity_mb=6000)


@settings(max_examples=60, deadline=None)
@given(quotas, st.sampled_from(["throughput", "efficiency", "deadline"]), st.sampled_from([None, 1e8, 1e10]))
def test_allreduce_plans_have_no_ps_and_fit_the_quota(quota, objective, samples):
    deadline = dict(samples=samples or 1e8, deadline_s=86400.0) if objective == "deadline" else dict(samples=samples)
    try:
        result = plan(AR_MODEL, AR_MEMORY, quota, objective, **deadline)
    except InfeasibleQuotaError as err:
        assert err.field in ("cpu", "memory") and err.minimum["cpu"] == 0.5 and err.minimum["nodes"] == 1
        return
    except InvalidInputError as err:
        assert objective == "deadline" and err.field == "deadline"
        return
    config = result.config
    assert (config.ps, config.ps_cpu, config.ps_memory_mb) == (0, 0.0, 0.0)
    assert _fits(config, quota)
    peak = AR_MEMORY.worker_peak_mb(config.batch_size, deadline["samples"] or 0.0)
    assert config.worker_memory_mb >= peak * (1 + C.MEMORY_MARGIN_FRACTION) - 1e-6
    assert config.memory_mb == config.workers * config.worker_memory_mb
    assert "no PS (all-reduce)" in result.reason
    for row in result.alternatives + result.pareto_front:
        assert row["ps"] == 0 and row["ps_cpu"] == 0.0
        assert row["cores"] <= quota.cpu + 1e-9 and row["memory_mb"] <= quota.memory_mb


def test_allreduce_exact_search_matches_brute_force_and_the_front_is_increasing():
    quota = Quota(cpu=64, memory_mb=10**6)
    q, candidates = AR_MODEL.sharpness, []
    for w, lw in itertools.product(range(1, int(quota.cpu / min(C.GRID_CPU_VALUES)) + 1), C.GRID_CPU_VALUES):
        if w * lw > quota.cpu or w * AR_MEMORY.worker_request_mb(512) > quota.memory_mb:
            continue
        x = float(features(w, 0, lw, 0.0, 0, 512) ** q @ AR_MODEL.theta**q) ** (-1 / q)
        candidates.append((-round(x, 6), w * lw, (w, lw), x))
    _, _, best, best_x = min(candidates)
    result = plan(AR_MODEL, AR_MEMORY, quota)
    assert (result.config.workers, result.config.worker_cpu) == best
    assert result.predicted_throughput == pytest.approx(best_x)
    assert result.lower_throughput < result.predicted_throughput < result.upper_throughput
    front = result.pareto_front
    assert all(a["cores"] < b["cores"] and a["predicted_throughput"] < b["predicted_throughput"]
               for a, b in zip(front, front[1:]))
    knee = plan(AR_MODEL, AR_MEMORY, quota, "efficiency")
    assert knee.config.ps == 0 and knee.config.cores <= result.config.cores


def test_an_allreduce_plan_sizes_the_workers_for_the_tables_the_job_will_grow():
    quota = Quota(cpu=16, memory_mb=10**6)
    short = plan(AR_MODEL, AR_MEMORY, quota, samples=1e6).config
    long = plan(AR_MODEL, AR_MEMORY, quota, samples=1e9).config
    assert long.worker_memory_mb == AR_MEMORY.worker_request_mb(512, 1e9) > short.worker_memory_mb
    with pytest.raises(InfeasibleQuotaError) as err:
        plan(AR_MODEL, AR_MEMORY, Quota(cpu=16, memory_mb=8192), samples=1e9)
    assert err.value.field == "memory" and "each worker's tables grow" in str(err.value)
    assert err.value.minimum["memory_mb"] == AR_MEMORY.worker_request_mb(512, 1e9)


def test_a_memory_model_of_the_other_kind_is_refused():
    with pytest.raises(InvalidInputError) as err:
        plan(AR_MODEL, MEMORY, Quota(64, 65536))
    assert err.value.field == "model.memory"
    with pytest.raises(InvalidInputError) as err:
        plan(MODEL, AR_MEMORY, Quota(64, 65536))
    assert err.value.field == "model.memory"


def test_a_plan_says_how_far_it_extrapolates_past_the_probes():
    small = [(w, p, lw, lp) for w in (1, 2) for p in (1, 2) for lw, lp in ((0.5, 0.5), (1.0, 0.5), (0.5, 1.0))]
    model = fit_throughput(model_samples(configs=small), leave_one_out=False)
    assert model.report.probed_range == {"workers": [1, 2], "ps": [1, 2], "worker_cpu": [0.5, 1.0], "ps_cpu": [0.5, 1.0]}
    wide = plan(model, MEMORY, Quota(cpu=16, memory_mb=10**6))
    assert wide.extrapolation["workers"] == pytest.approx(wide.config.workers / 2) and wide.config.workers > 2
    assert all(factor > 1 for factor in wide.extrapolation.values())
    assert f"workers {wide.config.workers / 2:.2g}× (1–2 probed)" in wide.reason
    assert wide.to_dict()["extrapolation"] == wide.extrapolation
    inside = plan(model, MEMORY, Quota(cpu=2, memory_mb=10**6), exclude=[])
    assert inside.extrapolation == {} and "inside the probed range" in inside.reason


def test_of_the_near_ties_the_plan_is_the_one_the_model_is_surest_of():
    model = fit_throughput(model_samples(noise=0.05, windows=2, seed=3), leave_one_out=False)
    chosen = plan(model, MEMORY, Quota(cpu=24, memory_mb=10**6))
    fastest = max([chosen.predicted_throughput] + [a["predicted_throughput"] for a in chosen.alternatives])
    assert fastest > chosen.predicted_throughput >= (1 - C.PLAN_TIE_FRACTION) * fastest  # not the fastest: a surer one
    for other in chosen.alternatives:
        if other["predicted_throughput"] >= (1 - C.PLAN_TIE_FRACTION) * fastest:
            row = features(other["workers"], other["ps"], other["worker_cpu"], other["ps_cpu"], 0, 512)[None, :]
            assert model.predict_features(row)[1][0] <= chosen.lower_throughput + 1e-6


def test_a_memory_the_quota_cannot_hold_names_the_growth_on_the_tables_curve():
    saturating = MemoryModel(400, 8000, 900, 0.5, table_growth_mb_per_m_samples=20, table_capacity_mb=9000)
    with pytest.raises(InfeasibleQuotaError) as err:
        plan(MODEL, saturating, Quota(64, 4096), samples=1e10)
    assert "the PS tables grow by 1,000 MB over 1e+10 samples" in str(err.value)  # not the line's 200,000 MB


def test_a_running_jobs_plan_sizes_the_ps_for_its_tables_at_the_end_of_the_run_not_from_its_start():
    growing = MemoryModel(400, 8000, 900, 0.5, table_growth_mb_per_m_samples=20, table_capacity_mb=40000)
    quota = Quota(cpu=8, memory_mb=10**6)
    fresh = plan(MODEL, growing, quota, samples=1e8)
    late = plan(MODEL, growing, quota, samples=1e8, samples_done=9e8)
    p = late.config.ps
    assert late.config.ps_memory_mb == growing.ps_request_mb(p, 1e9) > growing.ps_request_mb(p, 1e8)
    assert fresh.config.ps_memory_mb == growing.ps_request_mb(fresh.config.ps, 1e8)
