from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.finetune import ResizeRecord, decide, resize_cost_s
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import fit_throughput
from airflow_dlrover.optimizer.planner import plan
from airflow_dlrover.optimizer.transitions import TransitionCosts
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, Quota, Reason
from sim.synthetic import TRUE_THETA, model_samples, true_throughput

pytestmark = pytest.mark.unit

MODEL = fit_throughput(model_samples(noise=0.02, windows=2, seed=5), leave_one_out=False)
MEMORY = MemoryModel(400, 8000, 900, 0.5)
QUOTA = Quota(cpu=32, memory_mb=128 * 1024)
SMALL = Configuration(2, 1, 1.0, 1.0, MEMORY.worker_request_mb(512), MEMORY.ps_request_mb(1))


def predicted(config):
    from airflow_dlrover.optimizer.model import features

    return 1 / float(features(config.workers, config.ps, config.worker_cpu, config.ps_cpu, 0, 512) @ MODEL.theta)


def test_resizes_when_the_model_says_it_pays():
    decision = decide(MODEL, MEMORY, QUOTA, SMALL, [predicted(SMALL)] * 3, remaining_samples=5e8, now_s=0)
    assert decision.action == "resize"
    best = plan(MODEL, MEMORY, QUOTA, samples=5e8)
    assert decision.target == best.config
    assert decision.predicted_saving_s >= C.RESIZE_GAIN_MULTIPLE * decision.resize_cost_s
    assert decision.predicted_speedup > 2


def test_keeps_when_little_work_remains():
    decision = decide(MODEL, MEMORY, QUOTA, SMALL, [predicted(SMALL)] * 3, remaining_samples=2e4, now_s=0)
    assert decision.action == "keep" and decision.reason == Reason.NOT_WORTH_IT


def test_keeps_at_the_best_configuration():
    best = plan(MODEL, MEMORY, QUOTA, samples=5e8).config
    decision = decide(MODEL, MEMORY, QUOTA, best, [predicted(best)] * 3, remaining_samples=5e8, now_s=0)
    assert decision.action == "keep" and decision.reason == Reason.AT_BEST


@settings(max_examples=50, deadline=None)
@given(st.floats(0, C.MIN_RESIZE_INTERVAL_S - 1e-3))
def test_never_resizes_within_the_minimum_interval(elapsed):
    last = ResizeRecord(at_s=1000.0, before=SMALL, after=SMALL, throughput_before=100.0, predicted_speedup=3.0)
    decision = decide(MODEL, MEMORY, QUOTA, SMALL, [1.0] * 5, remaining_samples=1e9, now_s=1000.0 + elapsed, last_resize=last)
    assert decision.action == "keep" and decision.reason == Reason.MIN_INTERVAL


def test_reverts_a_resize_that_did_not_deliver_and_never_returns_to_it():
    first = decide(MODEL, MEMORY, QUOTA, SMALL, [predicted(SMALL)] * 3, remaining_samples=5e8, now_s=0)
    last = ResizeRecord(0.0, SMALL, first.target, predicted(SMALL), first.predicted_speedup)
    now = C.MIN_RESIZE_INTERVAL_S + 1
    # Too early to judge:
    early = decide(MODEL, MEMORY, QUOTA, first.target, [predicted(SMALL)], 5e8, now, last)
    assert early.action == "keep" and early.reason == Reason.JUDGING
    # The new configuration runs no faster than the old one did: revert, and reject it.
    revert = decide(MODEL, MEMORY, QUOTA, first.target, [predicted(SMALL)] * 3, 5e8, now, last)
    assert revert.action == "revert" and revert.target == SMALL and revert.reject == first.target
    # Back on SMALL, with the rejected configuration excluded, the policy never proposes it again.
    after = ResizeRecord(now, first.target, SMALL, predicted(SMALL), 1.0, is_revert=True)
    again = decide(MODEL, MEMORY, QUOTA, SMALL, [predicted(SMALL)] * 3, 5e8, now + C.MIN_RESIZE_INTERVAL_S + 1,
                   after, rejected=[first.target])
    assert again.target != first.target


def test_a_resize_that_delivered_is_kept():
    first = decide(MODEL, MEMORY, QUOTA, SMALL, [predicted(SMALL)] * 3, remaining_samples=5e8, now_s=0)
    last = ResizeRecord(0.0, SMALL, first.target, predicted(SMALL), first.predicted_speedup)
    decision = decide(MODEL, MEMORY, QUOTA, first.target, [predicted(first.target)] * 3, 5e8,
                      C.MIN_RESIZE_INTERVAL_S + 1, last)
    assert decision.action == "keep"


def _run_policy(true_theta, windows=40, noise=0.03, seed=0):
    """The product's loop on a synthetic job: measure three windows, ``controller.step``, apply.
    Returns the actions, the configurations in the order they ran, and the rejected ones."""
    from airflow_dlrover.optimizer.controller import ControllerState, Observation, Resize, step
    from airflow_dlrover.optimizer.job_model import JobModel

    rng = np.random.default_rng(seed)
    profile = model_samples(true_theta, noise=noise, seed=seed)
    model = JobModel(fit_throughput(profile, leave_one_out=False), MEMORY)
    state = ControllerState(QUOTA, "throughput", model=model, profile=tuple(profile.to_dict("records")))
    current, actions, shapes = SMALL, [], [SMALL]
    for window in range(windows):
        now = window * 120.0
        measured = model_samples(true_theta, configs=[(current.workers, current.ps, current.worker_cpu, current.ps_cpu)],
                                 noise=noise, windows=3, seed=int(rng.integers(1 << 30)))
        rows = tuple(dict(r, timestamp=now) for r in measured.to_dict("records"))
        state, (action,) = step(state, Observation(now + 1.0, current, samples_done=0, samples_total=1e9, windows=rows))
        actions.append("keep" if not isinstance(action, Resize) else "revert" if action.revert else "resize")
        if isinstance(action, Resize):
            current = action.config
            shapes.append(current)
    return actions, shapes, list(state.rejected)


def test_never_oscillates_on_a_flat_curve():
    # Every configuration is equally fast: a job-wide cap binds (10k samples/s).
    flat = dict.fromkeys(TRUE_THETA, 0.0) | {"io": 1e-4}
    actions, _, _ = _run_policy(flat)
    assert actions == ["keep"] * len(actions)


def test_converges_without_oscillation_on_a_real_curve():
    actions, shapes, rejected = _run_policy(TRUE_THETA)
    assert actions[0] == "resize"
    assert actions.count("resize") + actions.count("revert") <= 4  # in 40 windows
    for bad in rejected:  # a configuration that did not deliver is never tried again
        first = next(i for i, s in enumerate(shapes) if s == bad)
        assert bad not in shapes[first + 1:]
    assert actions[-10:] == ["keep"] * 10  # settled
    truth = true_throughput(pd.DataFrame([shapes[-1].to_row()]))[0]
    assert truth > 5 * true_throughput(pd.DataFrame([SMALL.to_row()]))[0]


#: A table whose every figure differs, so that each assertion names the transition it charged.
TABLE = TransitionCosts(cold_launch_s=11, relaunch_s=13, worker_join_s=2, worker_leave_s=1, cpu_in_place_s=0.5,
                        memory_in_place_s=0.25, node_relaunch_s=7, ps_change_s=17, ps_recovery_s=5,
                        checkpoint_mb_per_s=100, restore_mb_per_s=200)


def test_resize_cost_by_kind_of_change():
    def cost(target, current=SMALL, **kwargs):
        return resize_cost_s(current, Configuration(**{**current.to_row(), **target}), transitions=TABLE, **kwargs)

    assert cost({"workers": 4}) == 2 and cost({"workers": 1}) == 1
    assert cost({"ps": 2}) == 17 and cost({"ps": 2}, state_mb=1000) == 17 + 10 + 5  # checkpoint, restore
    assert cost({"worker_cpu": 1.5}) == 0.5  # one torch thread either way: in place
    assert cost({"worker_cpu": 2.0}) == 7  # two threads: the workers relaunch
    assert cost({"worker_cpu": 1.5}, in_place=False) == 7
    assert cost({"ps_cpu": 3.0}) == 0.5 and cost({"ps_cpu": 3.0}, in_place=False) == 17  # a PS re-partitions
    assert cost({"worker_memory_mb": 4096}) == 0.25
    assert cost({"workers": 4, "ps": 2}) == 17  # the largest of what happens at once
    assert cost({"workers": 4, "worker_cpu": 2.0}) == 7
    assert resize_cost_s(None, SMALL, transitions=TABLE) == 11
    assert resize_cost_s(SMALL, Configuration(4, 1, 1.0, 1.0, 0, 0), restart_cost_s=3.0, transitions=TABLE) == 3.0
    assert TABLE.on_kubernetes(5.0).of(SMALL, Configuration(**{**SMALL.to_row(), "workers": 4})) == 7
    assert TABLE.on_kubernetes(5.0).worker_leave_s == 1  # nothing starts: no pod start


def test_the_measured_table_is_valid_and_a_bad_one_is_refused():
    from airflow_dlrover.optimizer.transitions import measured

    table = measured()
    assert table.ps_change_s > table.worker_join_s >= 0 and table.source
    with pytest.raises(InvalidInputError, match="ps_change_s"):
        replace(TABLE, ps_change_s=-1.0)
    with pytest.raises(InvalidInputError, match="restore_mb_per_s"):
        replace(TABLE, restore_mb_per_s=0.0)


def test_bad_measurements_are_refused():
    from airflow_dlrover.optimizer.types import InvalidInputError

    with pytest.raises(InvalidInputError) as err:
        decide(MODEL, MEMORY, QUOTA, SMALL, [float("nan")], 1e6, 0)
    assert err.value.field == "recent_throughput"


def test_an_efficiency_run_is_fine_tuned_to_the_knee_not_to_the_quota():
    quota = Quota(cpu=128, memory_mb=512 * 1024)
    knee = plan(MODEL, MEMORY, quota, "efficiency", samples=5e8).config
    fastest = plan(MODEL, MEMORY, quota, "throughput", samples=5e8).config
    assert knee.cores < fastest.cores == 128  # the two objectives disagree on this model
    at_knee = decide(MODEL, MEMORY, quota, knee, [predicted(knee)] * 3, 5e8, 0, objective="efficiency")
    assert at_knee.action == "keep" and at_knee.reason == Reason.AT_BEST
    assert decide(MODEL, MEMORY, quota, knee, [predicted(knee)] * 3, 5e8, 0).target == fastest
    grow = decide(MODEL, MEMORY, quota, SMALL, [predicted(SMALL)] * 3, 5e8, 0, objective="efficiency")
    assert grow.action == "resize" and grow.target == knee


def test_an_efficiency_run_past_the_knee_gives_its_cores_back_and_takes_them_again_if_they_paid():
    quota = Quota(cpu=128, memory_mb=512 * 1024)
    knee = plan(MODEL, MEMORY, quota, "efficiency", samples=5e8).config
    fastest = plan(MODEL, MEMORY, quota, "throughput", samples=5e8).config
    measured = [predicted(fastest)] * 3
    assert decide(MODEL, MEMORY, quota, fastest, measured, 5e8, 0).reason == Reason.AT_BEST  # the time rule keeps
    shrink = decide(MODEL, MEMORY, quota, fastest, measured, 5e8, 0, objective="efficiency")
    assert shrink.action == "resize" and shrink.reason == Reason.PAST_THE_KNEE and shrink.target == knee
    speedup, numbers = shrink.predicted_speedup, shrink.numbers
    assert numbers["floor"] < numbers["speedup_low"] <= speedup < 1 and numbers["saving_core_h"] > 0
    assert speedup == pytest.approx(predicted(knee) / predicted(fastest))
    assert "the knee" in Reason.PAST_THE_KNEE.describe(numbers)
    # Too little left to pay for the resize in core-seconds: kept.
    short = decide(MODEL, MEMORY, quota, fastest, measured, 2e5, 0, objective="efficiency")
    assert short.action == "keep" and short.reason == Reason.NOT_WORTH_IT
    # Judged on its own windows as the knee is: lost what the model said, kept; lost more than the
    # cores past the knee may add, back to them, and the knee rejected.
    last = ResizeRecord(0.0, fastest, knee, predicted(fastest), speedup)
    now = C.MIN_RESIZE_INTERVAL_S + 1
    kept = decide(MODEL, MEMORY, quota, knee, [predicted(knee)] * 3, 5e8, now, last, objective="efficiency")
    assert kept.action == "keep"
    lost = [0.9 * numbers["floor"] * predicted(fastest)] * 3
    back = decide(MODEL, MEMORY, quota, knee, lost, 5e8, now, last, objective="efficiency")
    assert back.action == "revert" and back.target == fastest and back.reject == knee


def test_an_efficiency_run_past_a_knee_its_model_is_unsure_of_explores_the_knee_and_is_judged_as_a_give_back():
    from airflow_dlrover.optimizer.model import features

    model, _, _ = _unsure()
    quota = Quota(cpu=12, memory_mb=128 * 1024)
    current = Configuration(5, 4, 1.0, 1.0, MEMORY.worker_request_mb(512), MEMORY.ps_request_mb(4))
    x = 1 / float(features(5, 4, 1.0, 1.0, 0, 512) @ model.theta)
    knee = plan(model, MEMORY, quota, "efficiency", samples=5e8).config
    refused = decide(model, MEMORY, quota, current, [x] * 3, 5e8, 0, objective="efficiency")
    assert refused.action == "keep" and refused.reason == Reason.NOT_WORTH_IT and refused.target == knee
    explore = decide(model, MEMORY, quota, current, [x] * 3, 5e8, 0, objective="efficiency", may_explore=True)
    assert explore.action == "resize" and explore.reason == Reason.EXPLORE_KNEE and explore.target == knee
    numbers = explore.numbers
    # Refused the give-back for its doubt alone: the pessimistic end below the floor, the mean above it.
    assert numbers["speedup_low"] <= numbers["floor"] < numbers["speedup"] == explore.predicted_speedup
    assert numbers["band"] >= C.EXPLORE_MIN_BAND and numbers["knee_cores"] < numbers["cores"] == current.cores
    assert numbers["saving_core_h"] * 3600 >= 2 * C.RESIZE_GAIN_MULTIPLE * current.cores * explore.resize_cost_s
    assert "exploring" in Reason.EXPLORE_KNEE.describe(numbers) and "the knee" in Reason.EXPLORE_KNEE.describe(numbers)
    # Not without leave (the run's explorations spent), nor where too little is left to pay it back.
    short = decide(model, MEMORY, quota, current, [x] * 3, 1e5, 0, objective="efficiency", may_explore=True)
    assert short.action == "keep"
    # Judged as a give-back: kept while it loses no more than the floor allows, else back and the knee rejected.
    last = ResizeRecord(0.0, current, knee, x, explore.predicted_speedup, exploring=True)
    now = C.MIN_RESIZE_INTERVAL_S + 1
    kept = decide(model, MEMORY, quota, knee, [1.01 * numbers["floor"] * x] * 3, 5e8, now, last, objective="efficiency")
    assert kept.action == "keep" and kept.reason == Reason.EXPLORED
    back = decide(model, MEMORY, quota, knee, [0.95 * numbers["floor"] * x] * 3, 5e8, now, last, objective="efficiency")
    assert back.action == "revert" and back.target == current and back.reject == knee


def test_a_deadline_run_keeps_to_the_cheapest_plan_on_time_and_runs_fastest_once_late():
    samples = 5e8
    on_time = plan(MODEL, MEMORY, QUOTA, "deadline", samples=samples, deadline_s=samples / predicted(SMALL) / 3).config
    decision = decide(MODEL, MEMORY, QUOTA, SMALL, [predicted(SMALL)] * 3, samples, 0,
                      objective="deadline", deadline_s=samples / predicted(SMALL) / 3)
    assert decision.target == on_time
    fastest = plan(MODEL, MEMORY, QUOTA, "throughput", samples=samples).config
    for left in (60.0, -5.0):  # too little left for any plan; already past
        late = decide(MODEL, MEMORY, QUOTA, SMALL, [predicted(SMALL)] * 3, samples, 0, objective="deadline", deadline_s=left)
        assert late.action == "resize" and late.target == fastest


def test_a_deadline_run_needs_its_deadline_and_objectives_are_checked():
    from airflow_dlrover.optimizer.types import InvalidInputError

    with pytest.raises(InvalidInputError) as err:
        decide(MODEL, MEMORY, QUOTA, SMALL, [1.0], 1e6, 0, objective="deadline")
    assert err.value.field == "deadline_s"
    with pytest.raises(InvalidInputError) as err:
        decide(MODEL, MEMORY, QUOTA, SMALL, [1.0], 1e6, 0, objective="fastest")
    assert err.value.field == "objective" and "efficiency" in err.value.allowed


# ---------------------------------------------------------------------------------------------
# All-reduce jobs (ps = 0)
# ---------------------------------------------------------------------------------------------

from airflow_dlrover.optimizer.types import InfeasibleQuotaError  # noqa: E402
from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA  # noqa: E402

AR_MODEL = fit_throughput(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.02, windows=2, seed=5),
                          leave_one_out=False)
AR_MEMORY = MemoryModel(None, None, 1500, 0.5)


def test_an_allreduce_jobs_worker_count_change_restarts_its_ring():
    ring = Configuration(4, 0, 1.0, 0.0, 2048, 0)
    assert resize_cost_s(ring, Configuration(8, 0, 1.0, 0.0, 2048, 0), transitions=TABLE) == TABLE.relaunch_s
    assert resize_cost_s(ring, Configuration(4, 0, 2.0, 0.0, 2048, 0), transitions=TABLE) == TABLE.node_relaunch_s
    assert resize_cost_s(SMALL, Configuration(4, 1, 1.0, 1.0, SMALL.worker_memory_mb, SMALL.ps_memory_mb),
                         transitions=TABLE) == TABLE.worker_join_s  # a PS job's other workers keep training


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([4, 16, 64, 256]), st.sampled_from([16, 64, 512]), st.sampled_from([1e6, 1e9]),
       st.sampled_from(["throughput", "efficiency", "deadline"]))
def test_the_fine_tune_proposes_only_the_jobs_own_kind(cpu, memory_gb, remaining, objective):
    quota = Quota(cpu=cpu, memory_mb=memory_gb * 1024)
    jobs = ((MODEL, MEMORY, SMALL), (AR_MODEL, AR_MEMORY, Configuration(1, 0, 1.0, 0.0, 2048, 0)))
    for model, memory, current in jobs:
        x = float(model.predict(pd.DataFrame([current.to_row()]), band=False)[0])
        try:
            decision = decide(model, memory, quota, current, [x] * 3, remaining, 0.0, objective=objective,
                              deadline_s=remaining / x / 4)
        except InfeasibleQuotaError:  # a quota too small for any plan of the job
            continue
        if decision.target is not None:
            assert (decision.target.ps == 0) == (current.ps == 0)
            assert (decision.target.ps_cpu == 0) == (current.ps == 0)



def test_a_job_that_restarts_as_a_whole_resizes_when_its_measured_restart_pays():
    """The same resize is not worth a table's group restart of 60 s and is worth a measured
    restart of 2 s: the saving is set between the two by the number of samples left."""
    from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA, model_samples, true_throughput

    from airflow_dlrover.optimizer.job_model import fit_job_model

    model = fit_job_model(model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.02, seed=1, worker_base_mb=1500))
    current = Configuration(1, 0, 1.0, 0.0, 2048, 0)
    quota = Quota(cpu=16, memory_mb=64 * 1024)
    x = float(true_throughput(pd.DataFrame([current.to_row()]), ALLREDUCE_THETA)[0])
    probe = decide(model.throughput, model.memory, quota, current, [x] * 3, 1e12, 0.0, restart_cost_s=1e9)
    assert probe.action == "keep" and probe.reason == Reason.NOT_WORTH_IT
    gain_per_keep_s = 1 - 1 / probe.numbers["speedup_low"]
    remaining = 30.0 / gain_per_keep_s * x  # saving = 30 s − cost
    slow = replace(TABLE, relaunch_s=60.0)
    default = decide(model.throughput, model.memory, quota, current, [x] * 3, remaining, 0.0, transitions=slow)
    measured = decide(model.throughput, model.memory, quota, current, [x] * 3, remaining, 0.0, restart_cost_s=2.0)
    assert default.action == "keep" and default.resize_cost_s == 60.0
    assert measured.action == "resize" and measured.resize_cost_s == 2.0
    assert measured.predicted_saving_s == pytest.approx(28.0, rel=1e-6)


def _unsure():
    """A model fitted on noisy probes of at most 2 workers and 2 PS: past them its band is wide."""
    from airflow_dlrover.optimizer.model import features

    small = [(w, p, lw, lp) for w in (1, 2) for p in (1, 2) for lw, lp in ((0.5, 0.5), (1.0, 0.5), (0.5, 1.0), (1.0, 1.0))]
    model = fit_throughput(model_samples(configs=small, noise=0.2, windows=2, seed=2), leave_one_out=False)
    current = Configuration(2, 1, 1.0, 1.0, MEMORY.worker_request_mb(512), MEMORY.ps_request_mb(1))
    x = 1 / float(features(2, 1, 1.0, 1.0, 0, 512) @ model.theta)
    return model, current, x


def test_an_unsure_gain_the_pessimistic_test_refuses_is_explored_when_it_pays_and_allowed():
    model, current, x = _unsure()
    quota = Quota(cpu=12, memory_mb=128 * 1024)
    refused = decide(model, MEMORY, quota, current, [x] * 3, remaining_samples=2e8, now_s=0)
    assert refused.action == "keep" and refused.reason == Reason.NOT_WORTH_IT
    assert refused.numbers["speedup_low"] < C.MIN_RESIZE_SPEEDUP <= C.EXPLORE_MIN_SPEEDUP <= refused.numbers["speedup"]
    explore = decide(model, MEMORY, quota, current, [x] * 3, remaining_samples=2e8, now_s=0, may_explore=True)
    assert explore.action == "resize" and explore.reason == Reason.EXPLORE and explore.target == refused.target
    assert explore.numbers["band"] >= C.EXPLORE_MIN_BAND
    assert explore.predicted_saving_s >= C.RESIZE_GAIN_MULTIPLE * 2 * explore.resize_cost_s
    assert "exploring" in Reason.EXPLORE.describe(explore.numbers)
    # Too little left to pay for a resize and its revert (keeping takes twice the cost): no exploration.
    short = decide(model, MEMORY, quota, current, [x] * 3, remaining_samples=2 * explore.resize_cost_s * x, now_s=0,
                   may_explore=True)
    assert short.action == "keep"


def test_an_exploration_is_judged_on_its_own_windows_kept_once_or_reverted_and_excluded():
    model, current, x = _unsure()
    quota = Quota(cpu=12, memory_mb=128 * 1024)
    explore = decide(model, MEMORY, quota, current, [x] * 3, remaining_samples=2e8, now_s=0, may_explore=True)
    last = ResizeRecord(0.0, current, explore.target, x, explore.predicted_speedup, exploring=True)
    now = C.MIN_RESIZE_INTERVAL_S + 1
    kept = decide(model, MEMORY, quota, explore.target, [x * explore.predicted_speedup] * 3, 2e8, now, last)
    assert kept.action == "keep" and kept.reason == Reason.EXPLORED
    assert kept.numbers["delivered"] == pytest.approx(explore.predicted_speedup)
    worse = decide(model, MEMORY, quota, explore.target, [0.9 * x] * 3, 2e8, now, last)
    assert worse.action == "revert" and worse.reason == Reason.DID_NOT_DELIVER and worse.numbers["explored"]
    assert worse.target == current and worse.reject == explore.target


def test_a_posterior_draw_is_reproducible_centred_on_the_fit_and_the_fit_itself_without_uncertainty():
    from dataclasses import replace

    from airflow_dlrover.optimizer.finetune import posterior_draw

    model = MODEL  # fitted on many probes: most of its terms stand well clear of 0
    q = model.sharpness
    assert posterior_draw(model, 7).params == posterior_draw(model, 7).params != posterior_draw(model, 8).params
    phi = np.array([posterior_draw(model, seed).theta ** q for seed in range(2000)])
    assert (phi >= 0).all()  # the NNLS bound holds in every draw
    sure = model.theta ** q > 6 * np.sqrt(np.diag(model.covariance))  # terms the clip at 0 cannot bias
    assert sure.any()
    assert phi.mean(axis=0)[sure] == pytest.approx((model.theta ** q)[sure], rel=0.05)
    certain = replace(model, covariance=np.zeros_like(model.covariance))
    assert posterior_draw(certain, 3).theta == pytest.approx(model.theta)


def test_a_job_at_the_means_best_explores_the_plan_of_a_posterior_draw_now_and_then():
    model, _, _ = _unsure()
    quota = Quota(cpu=12, memory_mb=128 * 1024)
    best = plan(model, MEMORY, quota, samples=2e8).config
    x = float(model.predict(pd.DataFrame([best.to_row()]), band=False)[0])
    assert decide(model, MEMORY, quota, best, [x] * 3, 2e8, now_s=0.0).reason == Reason.AT_BEST
    decisions = [decide(model, MEMORY, quota, best, [x] * 3, 2e8, now_s=float(t), may_explore=True) for t in range(60)]
    explored = [d for d in decisions if d.action == "resize"]
    assert {d.reason for d in decisions} == {Reason.AT_BEST, Reason.EXPLORE} and 0 < len(explored) < len(decisions)
    for d in explored:  # each on the same terms as the mean's: unsure there, and the draw's gain pays
        assert d.numbers["source"].startswith("a draw of the fit's posterior") and d.target != best
        assert d.numbers["band"] >= C.EXPLORE_MIN_BAND and d.predicted_speedup >= C.EXPLORE_MIN_SPEEDUP
        assert d.predicted_saving_s >= C.RESIZE_GAIN_MULTIPLE * 2 * d.resize_cost_s
        assert "a draw of the fit's posterior" in Reason.EXPLORE.describe(d.numbers)
    t = decisions.index(explored[0])  # what the decision saw chooses its draw
    assert decide(model, MEMORY, quota, best, [x] * 3, 2e8, now_s=float(t), may_explore=True) == explored[0]
    # Too little left to pay for a resize and its revert: no draw explores.
    assert all(decide(model, MEMORY, quota, best, [x] * 3, 5e5, now_s=float(t), may_explore=True).action == "keep"
               for t in range(60))
