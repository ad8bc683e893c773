"""The planner's structured search against the exhaustive one (issue 20): the same plan, alternatives,
Pareto front and knee on random models and quotas; the search range comes from the quota."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer import planner
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import NO_SCALING, PARAMETERS, ThroughputModel, features, kind_parameters
from airflow_dlrover.optimizer.planner import Configurations, configurations, plan, predicted_throughput, search_range
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, Quota

pytestmark = pytest.mark.unit

#: A typical size of each θ (the synthetic job's, sim/synthetic.py); drawn models scale each by 10^±1.5.
SCALE = dict(overhead=0.02, worker_compute=4e-4, gpu_compute=2e-5, ps_latency=3e-5, ps_service=1.5e-4,
             ps_request=2e-3, network=2e-5, contention=1e-5, io=5e-6, allreduce=0.05, allreduce_latency=2e-3)


def make_model(params: dict, q: float, *, allreduce=False, gpu=False, largest=None, batch=512,
               scaling=NO_SCALING) -> ThroughputModel:
    from airflow_dlrover.optimizer.model import FitReport

    identified = tuple(n for n in kind_parameters(allreduce) if gpu or n != "gpu_compute")
    report = FitReport(n_samples=20, n_configurations=10, in_sample_mape=0.01, out_of_sample_mape=0.02,
                       out_of_sample_method="test", relative_noise=0.03, pinned={}, warm_start=False,
                       largest_node_cpu=largest)
    full = {name: float(params.get(name, 0.0)) if name in identified else 0.0 for name in PARAMETERS}
    return ThroughputModel(params=full, sharpness=q, covariance=np.zeros((len(PARAMETERS),) * 2),
                           relative_noise=0.05, batch_size=batch, report=report, identified=identified,
                           allreduce=allreduce, scaling=scaling)


@st.composite
def cases(draw, max_cpu: float = 48.0):
    allreduce = draw(st.booleans()) and draw(st.booleans())  # a quarter: data-parallel, no PS
    gpu = draw(st.booleans())
    flat_ps = not allreduce and draw(st.integers(0, 7)) == 0  # no PS term: X flat in p and λp (ties)
    params = {}
    for name in kind_parameters(allreduce):
        if flat_ps and name in ("ps_latency", "ps_service", "ps_request", "network", "contention"):
            continue
        if draw(st.integers(0, 3)) == 0 and name not in ("worker_compute", "gpu_compute"):
            continue  # pinned to 0
        params[name] = SCALE[name] * 10 ** draw(st.floats(-1.5, 1.5))
    q = draw(st.sampled_from(C.SHARPNESS_CANDIDATES))
    largest = draw(st.sampled_from([None, {"worker_cpu": 1.0, "ps_cpu": 4.0}, {"worker_cpu": 8.0, "ps_cpu": 0.5},
                                    {"worker_cpu": 32.0, "ps_cpu": 32.0}]))
    scaling = draw(st.sampled_from([NO_SCALING, NO_SCALING, (0.7, 0.85, 0.4), (1.0, 0.55, 0.2)]))
    model = make_model(params, q, allreduce=allreduce, gpu=gpu, largest=largest, scaling=scaling)
    memory_kind = draw(st.sampled_from(["model", "model", "none", "given"]))
    memory, sizes = None, {}
    if memory_kind == "model":
        memory = MemoryModel(
            None if allreduce else draw(st.floats(100, 1000)), None if allreduce else draw(st.floats(0, 60_000)),
            draw(st.floats(200, 3000)), draw(st.floats(0, 2)), draw(st.sampled_from([0.0, 5.0, 50.0])),
            table_capacity_mb=draw(st.sampled_from([None, 20_000.0])))
    elif memory_kind == "given":
        sizes = dict(worker_memory_mb=draw(st.sampled_from([None, 1024.0, 3000.0])))
        if not allreduce:
            sizes["ps_memory_mb"] = draw(st.sampled_from([None, 2048.0, 8192.0]))
    cpu = draw(st.sampled_from([1.0, 1.5, 3.0, 8.0, 13.5, 24.0, max_cpu]))
    # Memory from tight (a few nodes) to none binding; nodes and GPUs sometimes bounded.
    memory_mb = draw(st.sampled_from([3000.0, 12_000.0, 40_000.0, 150_000.0, 1e9]))
    quota = Quota(cpu, memory_mb, gpu=draw(st.sampled_from([0, 0, 3, 16])),
                  max_nodes=draw(st.sampled_from([None, None, 2, 7, 40])),
                  price_per_core_hour=draw(st.sampled_from([None, 0.0, 2.0])),
                  price_per_gb_hour=draw(st.sampled_from([None, 0.0, 0.5])))
    objective = draw(st.sampled_from(["throughput", "efficiency", "deadline"]))
    samples = draw(st.sampled_from([None, 1e7, 2e9]))
    extra = dict(samples=samples, **sizes)
    if objective == "deadline":
        extra["samples"] = samples or 1e8
        extra["deadline_fraction"] = draw(st.sampled_from([0.3, 0.8, 1.0, 1.5]))  # of the fastest; > 1: too soon
    extra["exclude"] = draw(st.sampled_from(["none", "best", "best and next"]))
    return model, memory, quota, objective, extra


def outcome(model, memory, quota, objective, **kwargs):
    """The plan, or the refusal (its type and message)."""
    try:
        return plan(model, memory, quota, objective, **kwargs)
    except InvalidInputError as err:
        return type(err).__name__, str(err)


def compare(model, memory, quota, objective, extra) -> object:
    extra = dict(extra)
    fraction = extra.pop("deadline_fraction", None)
    exclusions = extra.pop("exclude")
    reference = dict(extra)
    fastest = outcome(model, memory, quota, "throughput", exhaustive=True, **reference)
    if isinstance(fastest, tuple):  # refused: so is every objective, alike
        assert outcome(model, memory, quota, objective, **reference, **_deadline(fraction, None, extra)) == \
            outcome(model, memory, quota, objective, exhaustive=True, **reference, **_deadline(fraction, None, extra))
        return fastest
    if exclusions != "none":
        excluded = [fastest.config]
        if exclusions == "best and next" and fastest.alternatives:
            row = fastest.alternatives[0]
            excluded.append(Configuration(row["workers"], row["ps"], row["worker_cpu"], row["ps_cpu"],
                                          worker_gpu=row["worker_gpu"], batch_size=fastest.config.batch_size))
        reference["exclude"] = excluded
    reference.update(_deadline(fraction, fastest, extra))
    exhaustive = outcome(model, memory, quota, objective, exhaustive=True, **reference)
    structured = outcome(model, memory, quota, objective, **reference)
    assert structured == exhaustive
    return exhaustive


def _deadline(fraction, fastest, extra) -> dict:
    if fraction is None:
        return {}
    speed = fastest.predicted_throughput if fastest is not None else 1.0
    return dict(deadline_s=extra["samples"] / (speed * fraction))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_structured_search_plans_as_the_exhaustive_one(case):
    """Plan, band, reason, alternatives, Pareto front (so the knee) or the same refusal: ps = 0, GPUs,
    flat models (ties), tight memory, node and GPU limits, exclusions, every objective."""
    compare(*case)


@pytest.mark.parametrize("cpu, gpu", [(160.0, 0), (96.0, 6), (300.0, 0)])
@pytest.mark.parametrize("objective", ["throughput", "efficiency", "deadline"])
def test_the_structured_search_plans_as_the_exhaustive_one_past_today_s_grid(cpu, gpu, objective):
    """Quotas whose range passes the old grid's 128 workers or 64 PS (seeded models)."""
    rng = np.random.default_rng(int(cpu) + gpu)
    for _ in range(2):
        params = {name: SCALE[name] * 10 ** rng.uniform(-1, 1) for name in kind_parameters(False)}
        model = make_model(params, float(rng.choice(C.SHARPNESS_CANDIDATES)), gpu=gpu > 0)
        memory = MemoryModel(400.0, float(rng.uniform(0, 40_000)), 900.0, 0.5, 20.0)
        quota = Quota(cpu, float(rng.choice([2e5, 1e9])), gpu=gpu)
        extra = dict(samples=1e8, exclude="none")
        if objective == "deadline":
            extra["deadline_fraction"] = 0.7
        result = compare(model, memory, quota, objective, extra)
        assert not isinstance(result, tuple)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_throughput_ceiling_bounds_every_plan_and_is_the_fastest_where_only_cores_and_nodes_bind(case):
    """``throughput_ceiling`` is at least the predicted throughput of every plan, alternative and
    front point under the quota (any memory, GPUs, exclusion); with memory and GPUs out of the way
    it is the fastest configuration's."""
    model, memory, quota, _, extra = case
    ceiling = planner.throughput_ceiling(model, quota)
    sizes = {k: extra[k] for k in ("samples", "worker_memory_mb", "ps_memory_mb") if k in extra}
    for objective in ("throughput", "efficiency"):
        chosen = outcome(model, memory, quota, objective, **sizes)
        if not isinstance(chosen, tuple):
            rows = [chosen.predicted_throughput] + [r["predicted_throughput"]
                                                    for r in chosen.alternatives + chosen.pareto_front]
            assert max(rows) <= ceiling
    free = Quota(quota.cpu, 1e9, gpu=0, max_nodes=quota.max_nodes)
    fastest = outcome(model, None, free, "throughput", exhaustive=True)
    if isinstance(fastest, tuple):
        assert fastest[0] == "InfeasibleQuotaError"
        return
    best = max([fastest.predicted_throughput] + [r["predicted_throughput"] for r in fastest.alternatives])
    assert best == pytest.approx(planner.throughput_ceiling(model, free), rel=1e-12)


def test_the_search_range_comes_from_the_quota():
    small = search_range(64.0)
    assert (small.max_workers, small.max_ps) == (127, 127)  # 0.5-core nodes, one of the other role
    large = search_range(4096.0, gpu_values=(0, 1, 2))
    assert (large.max_workers, large.max_ps, large.worker_gpu) == (C.PLAN_MAX_WORKERS, C.PLAN_MAX_PS, (0, 1, 2))
    assert large.size == 1024 * 256 * 7 * 7 * 3
    nodes = search_range(4096.0, max_nodes=40)
    assert (nodes.max_workers, nodes.max_ps) == (39, 39)
    trusted = search_range(64.0, largest_node_cpu={"worker_cpu": 2.0, "ps_cpu": 1.0})
    assert trusted.worker_cpu == (0.5, 1.0, 2.0, 4.0) and trusted.ps_cpu == (0.5, 1.0, 2.0)
    allreduce = search_range(8.0, allreduce=True)
    assert (allreduce.max_workers, allreduce.max_ps, allreduce.ps_cpu) == (16, 0, (0.0,))
    with pytest.raises(InvalidInputError) as err:
        search_range(64.0, largest_node_cpu={"worker_cpu": 0.1, "ps_cpu": 1.0})
    assert err.value.field == "model.largest_node_cpu.worker_cpu" and "0.25 cores" in str(err.value)


def test_configurations_are_every_one_within_the_cores_in_the_planners_order():
    rng = search_range(6.0)
    grid = configurations(rng, 6.0)
    expected = sorted((w * lw + p * lp, w, p, lw, lp) for w in range(1, rng.max_workers + 1)
                      for p in range(1, rng.max_ps + 1) for lw in rng.worker_cpu for lp in rng.ps_cpu
                      if w * lw + p * lp <= 6.0)
    assert list(zip(grid.cores.tolist(), grid.workers.tolist(), grid.ps.tolist(), grid.worker_cpu.tolist(),
                    grid.ps_cpu.tolist())) == expected


def test_the_planners_evaluation_is_the_models_equation():
    """The separable form (module docstring) and ``ThroughputModel.predict_features`` agree to rounding."""
    rng = np.random.default_rng(4)
    for allreduce, gpu in ((False, False), (False, True), (True, True)):
        params = {name: SCALE[name] * 10 ** rng.uniform(-1, 1) for name in kind_parameters(allreduce)}
        scaling = (float(rng.choice(C.SCALING_CANDIDATES)), float(rng.choice(C.SCALING_CANDIDATES)),
                   float(rng.choice(C.THROTTLE_CANDIDATES)))
        model = make_model(params, float(rng.choice(C.SHARPNESS_CANDIDATES)), allreduce=allreduce, gpu=gpu,
                           scaling=scaling)
        search = search_range(300.0, allreduce=allreduce, gpu_values=(0, 1, 4) if gpu else (0,))
        grid = configurations(search, 300.0)
        pick = grid.take(rng.choice(len(grid), 3000, replace=False))
        ours = predicted_throughput(model, pick, 512)
        feats = features(pick.workers, pick.ps, pick.worker_cpu, pick.ps_cpu, pick.worker_gpu, 512, scaling=scaling)
        np.testing.assert_allclose(ours, model.predict_features(feats, band=False), rtol=1e-12)


def test_a_large_quota_is_planned_without_enumerating_and_uses_the_range(monkeypatch):
    """4,096 cores: past 128 workers and 64 PS, and the structured search never builds the range."""
    params = dict(SCALE, gpu_compute=0.0, overhead=0.002, io=1e-7, contention=1e-7, ps_service=1e-3,
                  allreduce=0.0, allreduce_latency=0.0)
    model = make_model(params, 2.0)
    memory = MemoryModel(400.0, 200_000.0, 900.0, 0.5)  # 200 GB of tables: many PS
    quota = Quota(4096.0, 64 * 1024 * 1024)

    def enumerate_everything(*args):
        raise AssertionError("the structured search enumerated the range")

    monkeypatch.setattr(planner, "configurations", enumerate_everything)
    start = time.process_time()
    chosen = plan(model, memory, quota, "throughput")
    seconds = time.process_time() - start
    assert chosen.config.workers > 128 and chosen.config.ps > 64
    assert chosen.config.cores <= 4096 and len(chosen.pareto_front) > 100
    assert seconds < 10  # the exhaustive search of this range takes minutes of memory and time
    with pytest.raises(AssertionError, match="enumerated the range"):
        plan(model, memory, quota, exhaustive=True)


def test_the_structured_search_evaluates_a_small_part_of_the_range():
    params = {name: SCALE[name] for name in kind_parameters(False)}
    model = make_model(params, 2.0)
    quota = Quota(1024.0, 1e9)
    search = search_range(quota.cpu)
    memory = MemoryModel(400.0, 8000.0, 900.0, 0.5)
    grid = planner._Grid(search, quota, memory, 512, None, None, None, ())
    sep = planner._Separable.of(model, search, 512)
    found = planner._branch_and_bound(sep, search, quota, grid, "efficiency", None, None)
    assert isinstance(found, Configurations)
    assert 0 < len(found) < 0.01 * search.size


def _monotone_chain(c, t):
    """Andrew's monotone chain (the upper hull, collinear points dropped), one point at a time."""
    hull: list[int] = []
    for i in range(len(c)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (c[b] - c[a]) * (t[i] - t[a]) - (t[b] - t[a]) * (c[i] - c[a]) >= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    return hull


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 400)), min_size=1, max_size=80))
def test_the_knees_hull_is_the_monotone_chains(points):
    """The parallel upper hull (every point under its neighbours' segment at once) keeps the vertices
    Andrew's sequential chain keeps, collinear and integer (tie-prone) points included."""
    c = np.asarray(sorted({p for p, _ in points}), dtype=float) / 2
    t = np.cumsum(np.asarray([v for _, v in points][: len(c)], dtype=float))  # a front: both grow
    assert planner._upper_hull(c, t).tolist() == _monotone_chain(c, t)
