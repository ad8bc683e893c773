"""``controller.step`` before training: the probes, the fit, the plan and its check, as phases."""

from dataclasses import replace

import pandas as pd
import pytest

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.controller import (
    ControllerState, Fail, Keep, Launch, Observation, Probe, Relaunch, begin, step,
)
from airflow_dlrover.optimizer.finetune import shape
from airflow_dlrover.optimizer.job_model import JobModel, choose_prior, fit_job_model
from airflow_dlrover.optimizer.probes import design_probes, probes_always_measured, visiting_order
from airflow_dlrover.optimizer.similarity import SimilarPrior, similar_probe_count
from airflow_dlrover.optimizer.types import Configuration, NodeState, NodeStatus, Phase, Quota, Reason
from sim.synthetic import true_throughput

pytestmark = pytest.mark.unit

QUOTA = Quota(cpu=32.0, memory_mb=128 * 1024)
SAMPLES = 5e9  # a long job: the budget lets every probe be measured


def measured(config: Configuration, samples_seen: float, probe_s: float = 30.0) -> dict:
    """One probe window of ``config`` on the synthetic truth (``sim.synthetic``)."""
    x = float(true_throughput(pd.DataFrame([config.to_row()]))[0])
    return dict(config.to_row(), throughput=x, worker_cpu_used=0.8 * config.worker_cpu,
                ps_cpu_used=0.6 * config.ps_cpu if config.ps else float("nan"), worker_memory_used_mb=1200.0,
                ps_memory_used_mb=400.0 + 2000.0 / config.ps if config.ps else float("nan"),
                samples_seen=samples_seen, probe_s=probe_s, timestamp=samples_seen)


def drive(state: ControllerState, samples: float = SAMPLES, probe_s: float = 30.0):
    """Step the controller as the tasks do until it launches: every probe measured as asked.
    Returns the final state, the probes asked for (in order) and the phases seen."""
    asked, phases, done, now = [], [state.phase], 0.0, 0.0
    observation = Observation(now, samples_total=samples)
    while True:
        state, actions = step(state, observation)
        phases.append(state.phase)
        assert not any(isinstance(a, Fail) for a in actions), actions
        if any(isinstance(a, Launch) for a in actions):
            return state, asked, phases, next(a for a in actions if isinstance(a, Launch))
        probe = next((a for a in actions if isinstance(a, Probe)), None)
        windows = ()
        if probe is not None:
            asked.append(probe)
            now += probe_s
            row = measured(probe.config, done, probe_s)
            done = min(done + row["throughput"] * probe_s, samples)
            windows = (row,)
        observation = Observation(now, config=probe.config if probe else None, samples_done=done,
                                  samples_total=samples, windows=windows)


def test_a_cold_job_is_probed_in_the_visiting_order_then_fitted_planned_checked_and_launched():
    state = begin(QUOTA, table_mb=2000.0)
    design = design_probes(QUOTA, table_mb=2000.0)
    assert state.phase == Phase.PROFILING and state.probes == tuple(visiting_order(design))
    state, asked, phases, launch = drive(state)
    profile_probes = [p for p in asked if p.reason == Reason.PROBE]
    checks = [p for p in asked if p.reason == Reason.PLAN_CHECK]
    # every probe, in the visiting order, each sized to what the probes before it used
    assert [p.config.to_row() | {"worker_memory_mb": 0, "ps_memory_mb": 0} for p in profile_probes] == [
        c.to_row() | {"worker_memory_mb": 0, "ps_memory_mb": 0} for c in visiting_order(design)]
    assert all(p.window_s == C.PROBE_WINDOW_S for p in profile_probes)
    # the phases in their order, each once
    order = [Phase.PROFILING, Phase.FITTING, Phase.PLANNING, Phase.TRAINING]
    assert [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]] == order
    # a plan past the probes is measured (a longer window) at most PLAN_CHECK_PROBES times, then launched
    assert len(checks) == state.plan_checks <= C.PLAN_CHECK_PROBES
    assert all(c.window_s == C.PLAN_CHECK_WINDOWS * C.PROBE_WINDOW_S for c in checks)
    if checks:
        assert len(state.profile) == len(asked)  # the checks' windows joined the profile
    assert launch.plan == state.plan and launch.reason == Reason.PLANNED
    assert state.model is not None and state.model.memory.table_capacity_mb == 2000.0  # the layout bounds the fit


def test_the_budget_ends_a_short_jobs_profile_after_the_probes_that_identify_the_model():
    state = begin(QUOTA)
    designed = len(state.probes)
    state, asked, _, _ = drive(state, samples=5e7, probe_s=60.0)
    profiled = [p for p in asked if p.reason == Reason.PROBE]
    assert len(profiled) == probes_always_measured(designed) < designed
    assert not state.model.throughput.report.partial and choose_prior([state.model]) is not None


def test_a_job_too_short_for_the_identifying_probes_runs_on_a_partial_fit_no_later_run_starts_from():
    full, *_ = drive(begin(QUOTA), samples=5e7, probe_s=60.0)
    state = begin(QUOTA)
    designed = len(state.probes)
    state, asked, _, launch = drive(state, samples=5e6, probe_s=60.0)
    profiled = [p for p in asked if p.reason == Reason.PROBE]
    assert C.MIN_PROBES_COLD <= len(profiled) < probes_always_measured(designed)
    assert state.model.throughput.report.partial and launch.plan is not None  # it plans its own run
    assert choose_prior([state.model]) is None  # but starts no later one
    assert choose_prior([state.model, full.model]).throughput is full.model.throughput  # the full fit does


def test_a_warm_start_probes_nothing_and_plans_on_its_prior():
    cold_state, *_ = drive(begin(QUOTA))
    prior = choose_prior([cold_state.model])
    state = begin(QUOTA, prior=prior)
    assert state.probes == ()
    state, asked, phases, launch = drive(state)
    assert asked == [] and state.model is prior and Phase.FITTING in phases
    assert launch.plan.config.cores <= QUOTA.cpu


def test_a_new_job_like_another_profiles_a_few_probes_and_fits_toward_the_others_model():
    other, *_ = drive(begin(QUOTA))
    similar = SimilarPrior(other.model.throughput, 0.8, (("dag/other", 0.8),))
    state = begin(QUOTA, similar=similar)
    assert state.prior.memory is None and state.prior_sources == similar.sources
    assert state.prior_weight == pytest.approx(C.WARM_START_PRIOR_WEIGHT * 0.8)
    cold = len(begin(QUOTA).probes)
    assert len(state.probes) == similar_probe_count(0.8, cold) < cold
    state, asked, _, launch = drive(state)
    assert len([p for p in asked if p.reason == Reason.PROBE]) == len(state.probes)
    assert state.model.throughput.report.warm_start and state.model.memory is not None  # its own memory
    assert launch.plan.config.cores <= QUOTA.cpu
    own = choose_prior([other.model])
    assert begin(QUOTA, prior=own, similar=similar).prior is own  # a job's own history comes first
    _, (fail,) = step(replace(begin(QUOTA, similar=similar), probes=()), Observation(0.0, samples_total=SAMPLES))
    assert isinstance(fail, Fail) and fail.reason == Reason.NOT_PROFILED  # no memory model to plan with


def test_a_job_that_starts_from_an_export_plans_its_ps_memory_for_the_tables_it_starts_with():
    cold_state, *_ = drive(begin(QUOTA))
    prior = choose_prior([cold_state.model])  # of a run that started empty
    start = prior.memory.table_mb + 3000.0
    state, *_, launch = drive(begin(QUOTA, prior=prior, table_start_mb=start))
    assert state.model.memory.table_mb == start
    assert launch.plan.config.ps_memory_mb >= state.model.memory.ps_base_mb + start / launch.plan.config.ps
    fitted, *_ = drive(begin(QUOTA, table_start_mb=start))  # and a fit on probes of an empty start
    assert fitted.model.memory.table_mb >= start


@pytest.mark.parametrize("start_mb, apart", [(20_000.0, True), (50.0, False)])
def test_a_job_with_large_tables_to_start_from_is_profiled_on_its_stand_in(start_mb, apart):
    state, asked, _, launch = drive(begin(QUOTA, table_start_mb=start_mb))
    assert state.apart is apart and all(p.apart is apart for p in asked)  # the probes and the plan's checks
    design = design_probes(QUOTA)
    on = 0.0 if apart else start_mb  # the order of a stand-in's probes: PS changes that move no tables
    ordered = visiting_order(design, state_mb=on)
    assert [shape(p.config) for p in asked if p.reason == Reason.PROBE] == [shape(c) for c in ordered]
    assert state.model.memory.table_mb >= start_mb  # the plan holds the tables the job starts from
    assert launch.plan.config.ps_memory_mb >= state.model.memory.ps_base_mb + start_mb / launch.plan.config.ps


def test_nothing_measured_and_no_prior_fails_retryably():
    state = replace(begin(QUOTA), probes=())
    _, (fail,) = step(state, Observation(0.0, samples_total=SAMPLES))
    assert isinstance(fail, Fail) and fail.retryable and fail.reason == Reason.NOT_PROFILED
    _, (fail,) = step(ControllerState(QUOTA, phase=Phase.FITTING), Observation(0.0))
    assert isinstance(fail, Fail) and fail.reason == Reason.NOT_PROFILED


def test_a_job_that_trained_every_sample_while_profiling_ends_its_profile():
    state, (probe,) = step(begin(QUOTA), Observation(0.0, samples_total=1e6))
    finished = Observation(30.0, config=probe.config, samples_done=1e6, samples_total=1e6,
                           windows=(measured(probe.config, 1e6),))
    state, (keep,) = step(state, finished)
    assert state.phase == Phase.FITTING and keep.reason == Reason.PROFILED
    assert "trained every sample" in keep.describe()


def test_a_probe_node_killed_for_memory_is_relaunched_at_once_not_reported_first():
    """A probe is not a task's try: its failures are recovered in the same step."""
    state, (probe,) = step(begin(QUOTA), Observation(0.0, samples_total=SAMPLES))
    config = probe.config
    killed = (NodeStatus("worker-0", "worker", 0, NodeState.OOM_KILLED, config.worker_cpu, config.worker_memory_mb,
                         reason="OOM"),)
    after, (relaunch,) = step(state, Observation(10.0, config=config, samples_total=SAMPLES, nodes=killed))
    assert isinstance(relaunch, Relaunch) and relaunch.memory_mb > config.worker_memory_mb
    assert after.phase == Phase.PROFILING and after.probes_issued == state.probes_issued
    # a probe's whole role killed at once is one too-small probe: every node is relaunched grown
    many = tuple(replace(killed[0], name=f"worker-{i}", index=i) for i in range(2 * C.FAILURES_BEFORE_TRAINING))
    _, relaunches = step(state, Observation(10.0, config=config, samples_total=SAMPLES, nodes=many))
    assert [type(a) for a in relaunches] == [Relaunch] * len(many)
    # a node that keeps failing fails the task, retryably, past FAILURES_BEFORE_TRAINING
    for restarts in range(1, C.FAILURES_BEFORE_TRAINING + 1):
        again = (replace(killed[0], restarts=restarts),)
        after, actions = step(after, Observation(20.0 + restarts, config=config, samples_total=SAMPLES, nodes=again))
    assert [(type(a), a.retryable) for a in actions] == [(Fail, True)] and "before training" in actions[0].describe()


def test_training_ends_when_every_sample_is_trained():
    config = Configuration(2, 1, 1.0, 1.0, 2048, 2048)
    state, (keep,) = step(ControllerState(QUOTA), Observation(0.0, config=config, samples_done=10, samples_total=10))
    assert state.phase == Phase.DONE and keep == Keep(Reason.NO_SAMPLES_REMAIN)


def test_the_prior_is_the_newest_cold_fits_throughput_with_the_newest_memory():
    cold = fit_job_model(pd.DataFrame([measured(c, 0.0) for c in visiting_order(design_probes(QUOTA))]))
    warm = fit_job_model(pd.DataFrame([measured(c, 1e6) for c in visiting_order(design_probes(QUOTA))[:3]]), cold)
    assert warm.throughput.report.warm_start and not cold.throughput.report.warm_start
    prior = choose_prior([warm, cold])  # newest first
    assert prior.throughput is cold.throughput and prior.memory is warm.memory
    assert choose_prior([]) is None and choose_prior([warm]) == JobModel(warm.throughput, warm.memory)


def test_a_warm_start_launches_where_the_last_run_ended_not_on_its_priors_plan():
    cold_state, *_ = drive(begin(QUOTA))
    prior = choose_prior([cold_state.model])
    throughput = prior.throughput
    narrow = replace(prior, throughput=replace(throughput, report=replace(throughput.report,
                                                                          probed_range={"workers": (1.0, 1.0)})))
    last = Configuration(3, 2, 2.0, 4.0, 999.0, 999.0, 0, 512)  # its memory was that run's

    def launched(prior, objective="throughput", last_run_config=last, quota=QUOTA):
        state = begin(quota, objective, prior=prior, last_run_config=last_run_config,
                      deadline_at_s=1e9 if objective == "deadline" else None)
        return drive(state)[-1].plan

    planned = launched(narrow, last_run_config=None)
    assert planned.extrapolation and shape(planned.config) != shape(last)
    plan = launched(narrow)
    assert shape(plan.config) == shape(last) and "the last run ended on" in plan.reason
    memory = narrow.memory  # sized for this run, as any plan: not the last run's sizes
    assert plan.config.ps_memory_mb == float(memory.ps_request_mb(2, SAMPLES))
    assert plan.config.worker_memory_mb == float(memory.worker_request_mb(512, SAMPLES))
    assert plan.predicted_throughput == pytest.approx(
        float(narrow.throughput.predict_features(narrow.throughput.features(plan.config), band=False)[0]))
    inside = launched(prior)  # a plan inside the probes forgets the fine-tunes' windows all the same
    assert shape(inside.config) == shape(last) and not launched(prior, last_run_config=None).extrapolation
    assert shape(launched(narrow, "deadline").config) != shape(last)  # the last configuration may miss it
    small = replace(QUOTA, cpu=last.cores - 1.0)  # it no longer fits
    assert shape(launched(narrow, quota=small).config) != shape(last)
