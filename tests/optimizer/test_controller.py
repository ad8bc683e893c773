"""``controller.step``: recovery, healing and fine-tuning decisions, driven directly."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.controller import (
    ControllerState, Fail, Heal, Keep, Observation, Relaunch, Resize, step,
)
from airflow_dlrover.optimizer.types import Configuration, NodeState, NodeStatus, Phase, Quota, Reason

pytestmark = pytest.mark.unit

CONFIG = Configuration(2, 2, 1.0, 0.5, 2048, 1024)
QUOTA = Quota(cpu=4.0, memory_mb=8192)


def nodes(**overrides):
    """master, 2 PS and 2 workers of CONFIG, all running; ``overrides``: name → NodeStatus fields."""
    out = [NodeStatus("master", "master", 0, NodeState.RUNNING, 0.5, 512)]
    out += [NodeStatus(f"ps-{i}", "ps", i, NodeState.RUNNING, 0.5, 1024) for i in range(2)]
    out += [NodeStatus(f"worker-{i}", "worker", i, NodeState.RUNNING, 1.0, 2048) for i in range(2)]
    return tuple(NodeStatus(**{**n.__dict__, **overrides.get(n.name.replace("-", "_"), {})}) for n in out)


def observe(**kwargs):
    return Observation(now_s=100.0, config=CONFIG, samples_done=1e5, samples_total=1e6, **kwargs)


def test_a_failure_fails_the_attempt_once_and_the_next_step_relaunches_the_node():
    state = ControllerState(QUOTA)
    lost = nodes(worker_1={"state": NodeState.LOST, "reason": "process vanished"})
    state, actions = step(state, observe(nodes=lost))
    assert actions == [Fail(Reason.NODE_FAILED, actions[0].numbers, retryable=True, nodes=("worker-1",))]
    state, actions = step(state, observe(nodes=lost))  # the retry
    assert [(type(a), a.node, a.memory_mb) for a in actions] == [(Relaunch, "worker-1", None)]
    relaunched = nodes(worker_1={"restarts": 1, "state": NodeState.LOST})  # the new incarnation fails too
    _, actions = step(state, observe(nodes=relaunched))
    assert isinstance(actions[0], Fail) and actions[0].retryable


def test_a_node_that_stopped_on_a_user_error_fails_the_attempt_without_retry():
    wrong = nodes(worker_0={"state": NodeState.FAILED, "exit_code": C.USER_ERROR_EXIT_CODE,
                            "reason": "data='/d' is invalid: ... the first: /d/a.csv: row 9, column I5: 'x'"})
    state, actions = step(ControllerState(QUOTA), observe(nodes=wrong))
    assert actions == [Fail(Reason.USER_ERROR, actions[0].numbers, retryable=False, nodes=("worker-0",))]
    assert "row 9, column I5" in actions[0].describe()
    _, again = step(state, observe(nodes=wrong))  # never relaunched: the same input fails the same way
    assert again == actions


def test_an_oom_kill_grows_the_node_once_by_the_growth_factor_and_only_within_the_quota():
    killed = nodes(ps_0={"state": NodeState.OOM_KILLED, "reason": "OOM"})
    state, _ = step(ControllerState(QUOTA), observe(nodes=killed))
    _, (relaunch,) = step(state, observe(nodes=killed))
    assert relaunch == Relaunch(Reason.OOM_KILLED, relaunch.numbers, node="ps-0",
                                memory_mb=1024 * C.OOM_MEMORY_GROWTH)
    # The quota leaves 8192 − (1024 + 2·2048) = 3072 MB: a 3000 MB PS grows to the 64 MB grid under it.
    big = nodes(ps_0={"state": NodeState.OOM_KILLED, "memory_mb": 3000.0})
    state, _ = step(ControllerState(QUOTA), observe(nodes=big))
    _, (capped,) = step(state, observe(nodes=big))
    assert capped.memory_mb == 3072 - 3072 % C.MEMORY_GRANULARITY_MB and capped.memory_mb > 3000
    # No room at all: a failure no retry can fix, naming the node.
    full = nodes(ps_0={"state": NodeState.OOM_KILLED, "memory_mb": 3072.0})
    state, _ = step(ControllerState(QUOTA), observe(nodes=full))
    _, (fail,) = step(state, observe(nodes=full))
    assert fail == Fail(Reason.OOM_PAST_QUOTA, fail.numbers, retryable=False, nodes=("ps-0",))
    assert "ps-0" in fail.describe()


def test_a_worker_the_cluster_cannot_place_leaves_the_job():
    stuck = nodes(worker_1={"state": NodeState.UNSCHEDULABLE, "reason": "Unschedulable for 400 s"})
    state, _ = step(ControllerState(QUOTA), observe(nodes=stuck))
    _, (resize,) = step(state, observe(nodes=stuck))
    assert isinstance(resize, Resize) and resize.remove == ("worker-1",) and resize.config.workers == 1


def usage(t, node, role, cpu_used, cpu_limit, memory_used_mb, memory_limit_mb, throughput=None):
    return {"time_s": t, "node": node, "role": role, "cpu_used": cpu_used, "cpu_limit": cpu_limit,
            "memory_used_mb": memory_used_mb, "memory_limit_mb": memory_limit_mb, "throughput": throughput,
            "age_s": 60.0}


def test_a_hot_ps_gets_cpu_in_place_within_the_quota_and_is_refused_past_it():
    # ps-0 at 98 % of 0.5 core, 2.45× ps-1: as loaded per core as ps-1 at 0.5 · 2.45 → 1.5 cores.
    rows = tuple(usage(t, f"ps-{i}", "ps", 0.49 if i == 0 else 0.2, 0.5, 500, 1024) for t in (1, 2, 3) for i in (0, 1))
    _, (heal,) = step(ControllerState(Quota(cpu=5.0, memory_mb=8192)), observe(nodes=nodes(), usage=rows))
    assert isinstance(heal, Heal) and heal.node == "ps-0" and heal.cpu == 1.5
    # The other nodes hold 2.5 cores: a quota of 3.5 leaves ps-0 1 core, more than its 0.5: a partial heal.
    _, (partial,) = step(ControllerState(Quota(cpu=3.5, memory_mb=8192)), observe(nodes=nodes(), usage=rows))
    assert isinstance(partial, Heal) and partial.cpu == 1.0 and partial.numbers["value"] == 1.0
    _, (refused,) = step(ControllerState(Quota(cpu=3.0, memory_mb=8192)), observe(nodes=nodes(), usage=rows))
    assert refused == Keep(Reason.PAST_QUOTA, refused.numbers) and refused.numbers["total"] == 4.0
    assert (refused.numbers["event"], refused.numbers["node"]) == ("hot_ps", "ps-0")  # what was refused, on whom
    assert refused.describe() == "ps-0 at 1.5 would make 4 cores, past the quota's 3: not healed"


def test_a_node_at_oom_risk_grows_its_whole_role_and_is_judged_afresh():
    rows = tuple(usage(3 * t, "worker-0", "worker", 0.9, 1.0, 1960 + t % 2, 2048, 100.0) for t in range(8))
    state, (resize,) = step(ControllerState(QUOTA), observe(nodes=nodes(), usage=rows))
    assert isinstance(resize, Resize) and resize.reason == Reason.OOM_RISK
    assert resize.config == Configuration(2, 2, 1.0, 0.5, 2256, 1024)  # the request for 1961 MB: +15 %, on 16 MB
    _, (refused,) = step(ControllerState(Quota(cpu=4.0, memory_mb=6000)), observe(nodes=nodes(), usage=rows))
    assert refused.reason == Reason.PAST_QUOTA
    assert not [r for r in state.node_history if r["role"] == "worker"]


def test_nothing_is_healed_once_every_sample_is_trained():
    """The finishing worker's evaluation and export ramp its memory for seconds: no trend of the job's."""
    rows = tuple(usage(3 * t, "worker-0", "worker", 0.9, 1.0, 1960 + t % 2, 2048, 100.0) for t in range(8))
    finished = Observation(now_s=100.0, config=CONFIG, samples_done=1e6, samples_total=1e6, nodes=nodes(), usage=rows)
    done, actions = step(ControllerState(QUOTA), finished)
    assert done.phase == Phase.DONE and [a.reason for a in actions] == [Reason.NO_SAMPLES_REMAIN]
    lost = nodes(worker_0={"state": NodeState.LOST})  # a failure is still recovered
    _, (fail,) = step(ControllerState(QUOTA), Observation(now_s=100.0, config=CONFIG, samples_done=1e6,
                                                          samples_total=1e6, nodes=lost, usage=rows))
    assert isinstance(fail, Fail) and fail.retryable


def test_a_straggler_is_replaced_with_the_planned_cpu():
    rows = tuple(usage(t, f"worker-{i}", "worker", 0.2, 0.25 if i == 0 else 1.0, 900, 2048, 20.0 if i == 0 else 100.0)
                 for t in (1, 2, 3) for i in (0, 1))
    _, actions = step(ControllerState(QUOTA), observe(nodes=nodes(worker_0={"cpu": 0.25}), usage=rows))
    assert [(type(a), a.node, a.cpu) for a in actions] == [(Relaunch, "worker-0", CONFIG.worker_cpu)]


def test_a_fresh_node_is_not_judged_during_its_warm_up():
    rows = tuple(dict(usage(t, "worker-0", "worker", 0.9, 1.0, 1000 + 200 * t, 2048, 100.0), age_s=1.0)
                 for t in range(5))
    state, actions = step(ControllerState(QUOTA), observe(nodes=nodes(), usage=rows))
    assert actions == [] and state.node_history == ()


def test_every_action_is_a_json_record_with_its_reason_as_data():
    killed = nodes(ps_0={"state": NodeState.OOM_KILLED})
    state, (fail,) = step(ControllerState(QUOTA), observe(nodes=killed))
    _, (relaunch,) = step(state, observe(nodes=killed))
    for action in (fail, relaunch):
        record = json.loads(json.dumps(action.to_record()))
        assert Reason(record["reason"]) == action.reason and record["action"] == action.kind
        assert record["text"] == action.describe()


def test_a_deadline_run_needs_its_deadline():
    from airflow_dlrover.optimizer.types import InvalidInputError

    with pytest.raises(InvalidInputError):
        ControllerState(QUOTA, "fastest")


def test_nodes_killed_together_share_what_the_quota_leaves():
    # Both PS killed at 1024 MB; the workers hold 2 × 2048 of 6656 MB: 2560 MB remain for the PS.
    both = nodes(ps_0={"state": NodeState.OOM_KILLED}, ps_1={"state": NodeState.OOM_KILLED})
    quota = Quota(cpu=4.0, memory_mb=6656)
    state, _ = step(ControllerState(quota), observe(nodes=both))
    _, actions = step(state, observe(nodes=both))
    assert [(a.node, a.memory_mb) for a in actions] == [("ps-0", 1280), ("ps-1", 1280)]  # not 2 × 1536
    assert sum(a.memory_mb for a in actions) + 2 * 2048 <= quota.memory_mb


def test_an_oom_kill_gets_at_least_the_memory_models_forecast_for_the_job():
    from airflow_dlrover.optimizer.job_model import JobModel
    from airflow_dlrover.optimizer.memory import MemoryModel
    from airflow_dlrover.optimizer.model import fit_throughput
    from sim.synthetic import model_samples

    memory = MemoryModel(ps_base_mb=400, table_mb=8000, worker_base_mb=900, activation_mb_per_sample=0.5)
    killed = nodes(ps_0={"state": NodeState.OOM_KILLED})
    state = ControllerState(Quota(cpu=4.0, memory_mb=64 * 1024), model=JobModel(fit_throughput(model_samples(), leave_one_out=False), memory))
    state, _ = step(state, observe(nodes=killed))
    _, (relaunch,) = step(state, observe(nodes=killed))
    assert relaunch.memory_mb == memory.ps_request_mb(CONFIG.ps) > 1024 * C.OOM_MEMORY_GROWTH


def test_an_oom_killed_nodes_ramp_is_not_read_as_a_leak_of_its_next_incarnation():
    """The rows before an OOM kill climb at ~1 GB/s; once the node is relaunched with ×1.5 they
    describe a process that is gone, so the next usage step must not size its role for that trend."""
    ramp = tuple(usage(t, "worker-0", "worker", 0.9, 1.0, 300 + 900 * t, 2048, 100.0) for t in (0, 1, 2))
    calm = tuple(usage(t, "worker-1", "worker", 0.9, 1.0, 300, 2048, 100.0) for t in (0, 1, 2))
    state, _ = step(ControllerState(QUOTA), observe(nodes=nodes(), usage=ramp[:2] + calm[:2]))
    killed = nodes(worker_0={"state": NodeState.OOM_KILLED, "reason": "OOM", "oom_kills": 1})
    state, _ = step(state, observe(nodes=killed, usage=ramp[2:] + calm[2:]))  # reported
    state, (relaunch,) = step(state, observe(nodes=killed))
    assert isinstance(relaunch, Relaunch) and relaunch.memory_mb == 3072
    assert not [r for r in state.node_history if r["node"] == "worker-0"]
    back = nodes(worker_0={"memory_mb": 3072, "restarts": 1})
    later = tuple(usage(t, "worker-1", "worker", 0.9, 1.0, 300, 2048, 100.0) for t in (12, 15))
    _, actions = step(state, observe(nodes=back, usage=later))
    assert not [a for a in actions if isinstance(a, Resize)]


def test_a_node_that_left_the_job_is_not_judged():
    """A window spanning a PS change still carries the old PS set's rows: a hot ps-1 that no
    longer exists gets no heal (there is nothing to apply it to)."""
    rows = tuple(usage(t, f"ps-{i}", "ps", 0.49 if i == 1 else 0.2, 0.5, 500, 1024) for t in (1, 2, 3) for i in (0, 1))
    one_ps = tuple(n for n in nodes() if n.name != "ps-1")
    state, actions = step(ControllerState(Quota(cpu=5.0, memory_mb=8192)), observe(nodes=one_ps, usage=rows))
    assert not [a for a in actions if not isinstance(a, Keep)]
    assert not [r for r in state.node_history if r["node"] == "ps-1"]
    _, (heal,) = step(ControllerState(Quota(cpu=5.0, memory_mb=8192)), observe(nodes=nodes(), usage=rows))
    assert isinstance(heal, Heal) and heal.node == "ps-1"  # while it exists, it is healed


# ---------------------------------------------------------------------------------------------
# All-reduce jobs (ps = 0)
# ---------------------------------------------------------------------------------------------


def _allreduce_job_model():
    from airflow_dlrover.optimizer.job_model import fit_job_model
    from sim.synthetic import ALLREDUCE_CONFIGS, ALLREDUCE_THETA, model_samples

    profile = model_samples(ALLREDUCE_THETA, ALLREDUCE_CONFIGS, noise=0.03, seed=4, worker_base_mb=1500)
    return profile, fit_job_model(profile)


@pytest.mark.parametrize("quota", [Quota(cpu=16, memory_mb=64 * 1024), Quota(cpu=64, memory_mb=512 * 1024, max_nodes=40)])
def test_an_allreduce_job_is_only_ever_resized_to_no_ps(quota):
    import numpy as np

    from sim.synthetic import ALLREDUCE_THETA, true_throughput

    profile, model = _allreduce_job_model()
    assert model.allreduce and model.memory.allreduce
    config = Configuration(2, 0, 1.0, 0.0, 2048, 0, 0, 512)
    state = ControllerState(quota, model=model, profile=tuple(profile.to_dict("records")))
    rng = np.random.default_rng(0)
    resizes, now = [], 0.0
    for _ in range(12):
        x = float(true_throughput(pd.DataFrame([config.to_row()]), ALLREDUCE_THETA)[0])
        windows = tuple(dict(config.to_row(), throughput=x * (1 + 0.02 * rng.standard_normal()), timestamp=now + k)
                        for k in range(3))
        state, actions = step(state, Observation(now + 3, config, samples_done=1e6, samples_total=1e9, windows=windows))
        for action in actions:
            if isinstance(action, Resize):
                resizes.append(action.config)
                config = action.config
        now += C.MIN_RESIZE_INTERVAL_S + 10
    assert resizes, "the fine-tune never resized the 2-worker job"
    assert all((c.ps, c.ps_cpu, c.ps_memory_mb) == (0, 0.0, 0.0) for c in resizes)
    assert all(c.cores <= quota.cpu and c.memory_mb <= quota.memory_mb for c in resizes)
    assert state.model.allreduce  # the refits stayed of the job's kind


def test_an_allreduce_jobs_stray_ps_rows_are_not_judged_and_its_worker_memory_forecast_is_the_models():
    _, model = _allreduce_job_model()
    config = Configuration(2, 0, 1.0, 0.0, 2048, 0)
    workers = tuple(NodeStatus(f"worker-{i}", "worker", i, NodeState.RUNNING, 1.0, 2048) for i in range(2))
    hot = tuple(usage(t, f"ps-{i}", "ps", 0.49 if i == 0 else 0.2, 0.5, 900 + 300 * t, 1024) for t in (1, 2, 3) for i in (0, 1))
    state, actions = step(ControllerState(QUOTA, model=model),
                          Observation(100.0, config, samples_done=1e5, samples_total=1e6, usage=hot))
    assert actions == [] and state.node_history == ()
    killed = tuple(NodeStatus(**{**n.__dict__, "state": NodeState.OOM_KILLED}) if n.name == "worker-0" else n
                   for n in workers)
    big = ControllerState(Quota(cpu=4.0, memory_mb=64 * 1024), model=model)
    obs = Observation(100.0, config, samples_done=1e5, samples_total=1e6, nodes=killed)
    state, _ = step(big, obs)
    _, (relaunch,) = step(state, obs)
    assert isinstance(relaunch, Relaunch) and relaunch.memory_mb >= model.memory.worker_request_mb(512, 1e6)


def test_a_model_of_the_other_kind_is_refused_not_planned_with():
    from airflow_dlrover.optimizer.finetune import decide
    from airflow_dlrover.optimizer.types import InvalidInputError

    _, model = _allreduce_job_model()
    with pytest.raises(InvalidInputError) as err:
        decide(model.throughput, model.memory, QUOTA, CONFIG, [100.0] * 3, 1e8, 0.0)
    assert err.value.field == "model" and "ps ≥ 1" in err.value.allowed


def test_a_resize_leaves_room_for_what_a_healed_node_holds_above_its_role():
    """A hot PS healed in place keeps its extra cores through a resize that does not touch the PS
    (launchers.base.resize), so the fine-tune plans in the quota less that extra."""
    import numpy as np

    from airflow_dlrover.optimizer.job_model import fit_job_model
    from sim.synthetic import DIVERSE_CONFIGS, model_samples, true_throughput

    profile = model_samples(configs=DIVERSE_CONFIGS, noise=0.02, seed=5)
    quota, extra = Quota(cpu=24.0, memory_mb=256 * 1024), 3.0
    config = Configuration(2, 1, 1.0, 1.0, 2048, 4096, 0, 512)
    state = ControllerState(quota, model=fit_job_model(profile), profile=tuple(profile.to_dict("records")))
    rng, now, resizes = np.random.default_rng(1), 0.0, []
    for _ in range(10):
        healed = tuple(
            [NodeStatus("ps-0", "ps", 0, NodeState.RUNNING, config.ps_cpu + extra, config.ps_memory_mb)]
            + [NodeStatus(f"ps-{i}", "ps", i, NodeState.RUNNING, config.ps_cpu, config.ps_memory_mb) for i in range(1, config.ps)]
            + [NodeStatus(f"worker-{i}", "worker", i, NodeState.RUNNING, config.worker_cpu, config.worker_memory_mb)
               for i in range(config.workers)])
        x = float(true_throughput(pd.DataFrame([config.to_row()]))[0])
        windows = tuple(dict(config.to_row(), throughput=x * (1 + 0.02 * rng.standard_normal()), timestamp=now + k)
                        for k in range(3))
        state, actions = step(state, Observation(now + 3, config, samples_done=1e6, samples_total=1e10,
                                                 windows=windows, nodes=healed))
        for action in actions:
            if isinstance(action, Resize):
                resizes.append(action.config)
                config = action.config
        now += C.MIN_RESIZE_INTERVAL_S + 10
    assert resizes, "the fine-tune never resized the small job"
    assert all(c.cores + extra <= quota.cpu + 1e-9 for c in resizes)
    assert max(c.cores for c in resizes) > quota.cpu - extra - 4  # it did use what was left


def test_a_revert_that_a_heal_since_would_take_past_the_quota_is_planned_anew_without_the_shape():
    """A resize that gave cores back is judged, and its revert would take them again; a hot PS
    healed meanwhile keeps its extra cores through the revert (it leaves the PS as they are), so
    where the job's old size and the heal pass the quota, the fine-tune plans again in what the
    heal leaves, without the shape that did not deliver."""
    from airflow_dlrover.optimizer.finetune import ResizeRecord, shape
    from airflow_dlrover.optimizer.job_model import fit_job_model
    from sim.synthetic import DIVERSE_CONFIGS, model_samples

    profile = model_samples(configs=DIVERSE_CONFIGS, noise=0.02, seed=5)
    quota = Quota(cpu=24.0, memory_mb=256 * 1024)
    before = Configuration(10, 2, 2.0, 2.0, 2048, 4096, 0, 512)
    after = Configuration(8, 2, 1.0, 2.0, 2048, 4096, 0, 512)
    assert before.cores == quota.cpu > after.cores
    last = ResizeRecord(0.0, before, after, throughput_before=1e5, predicted_speedup=0.8, exploring=True)
    state = ControllerState(quota, model=fit_job_model(profile), profile=tuple(profile.to_dict("records")),
                            last_resize=last, since_s=0.0)
    now = C.MIN_RESIZE_INTERVAL_S + 10
    windows = tuple(dict(after.to_row(), throughput=2e4, timestamp=now - 3 + k) for k in range(3))  # ×0.2

    def running(extra):
        return tuple([NodeStatus("ps-0", "ps", 0, NodeState.RUNNING, after.ps_cpu + extra, after.ps_memory_mb),
                      NodeStatus("ps-1", "ps", 1, NodeState.RUNNING, after.ps_cpu, after.ps_memory_mb)]
                     + [NodeStatus(f"worker-{i}", "worker", i, NodeState.RUNNING, after.worker_cpu,
                                   after.worker_memory_mb) for i in range(after.workers)])

    observe = dict(samples_done=1e6, samples_total=1e10, windows=windows)
    _, (revert,) = step(state, Observation(now, after, nodes=running(0.0), **observe))
    assert isinstance(revert, Resize) and revert.revert and revert.config.cores == before.cores
    _, (planned,) = step(state, Observation(now, after, nodes=running(1.0), **observe))
    assert isinstance(planned, Resize) and planned.reason == Reason.PAYS and not planned.revert
    assert planned.config.cores + 1.0 <= quota.cpu and shape(planned.config) not in (shape(after), shape(before))

# ---------------------------------------------------------------------------------------------
# The memory model refitted from the running job
# ---------------------------------------------------------------------------------------------


def _tables(n, table=8000.0, asymptote=12000.0, growth=4000.0):
    """The tables (sum over PS) after n samples: a saturating curve, 4000 MB per 10⁶ samples at first."""
    headroom = asymptote - table
    return table + headroom * (1 - np.exp(-growth * n / (1e6 * headroom)))


def _flattening_job(capacity=20_000.0):
    """A profile over the first 50,000 samples (where the tables still grow as a line) and the
    model fitted on it, bounded by the layout's capacity."""
    from airflow_dlrover.optimizer.job_model import fit_job_model
    from sim.synthetic import model_samples

    profile = model_samples(noise=0.02, seed=3)
    profile["samples_seen"] = np.linspace(0, 5e4, len(profile))
    profile["ps_memory_used_mb"] = 400 + _tables(profile["samples_seen"]) / profile["ps"]
    return profile, fit_job_model(profile, table_capacity_mb=capacity, leave_one_out=False)


def _memory_windows(config, seen, now):
    from sim.synthetic import true_throughput

    x = float(true_throughput(pd.DataFrame([config.to_row()]))[0])
    return tuple(dict(config.to_row(), throughput=x, timestamp=now + k, samples_seen=n, worker_memory_used_mb=1156.0,
                      ps_memory_used_mb=400 + _tables(n) / config.ps) for k, n in enumerate(seen))


def test_a_refit_on_windows_whose_ps_memory_flattened_forecasts_a_lower_peak_and_keeps_the_capacity():
    profile, fitted = _flattening_job()
    assert fitted.memory.table_asymptote_mb is None and fitted.memory.table_capacity_mb == 20_000.0
    config = Configuration(2, 2, 1.0, 1.0, 4096, 12288, 0, 512)
    state = ControllerState(Quota(cpu=64, memory_mb=512 * 1024), model=fitted,
                            profile=tuple(profile.to_dict("records")))
    total = 1e8
    state, _ = step(state, Observation(100.0, config, samples_done=1.02e6, samples_total=total,
                                       windows=_memory_windows(config, (1e6, 1.01e6, 1.02e6), 90.0)))
    memory = state.model.memory
    assert memory.table_capacity_mb == 20_000.0  # carried through the refit
    assert memory.table_asymptote_mb == pytest.approx(12_000, rel=0.02)
    assert memory.ps_peak_mb(2, total) == pytest.approx(400 + 12_000 / 2, rel=0.02)
    assert memory.ps_peak_mb(2, total) < fitted.memory.ps_peak_mb(2, total) - 3000  # the profile's: 400 + 20,000 / 2
    assert memory.ps_request_mb(2, total) < fitted.memory.ps_request_mb(2, total)


def test_the_memory_model_is_refitted_alone_each_time_the_samples_trained_double():
    profile, fitted = _flattening_job()
    config = Configuration(2, 2, 1.0, 1.0, 4096, 12288, 0, 512)
    state = ControllerState(Quota(cpu=64, memory_mb=512 * 1024), model=fitted,
                            profile=tuple(profile.to_dict("records")))
    fitted_at = []
    for k, seen in enumerate([(1e5, 1.1e5), (1.2e5, 1.3e5), (1.4e5, 1.5e5), (1.6e5,), (4e5,), (5e5,), (9e5,), (3e6,)]):
        state, _ = step(state, Observation(100.0 * k, config, samples_done=seen[-1], samples_total=1e8,
                                           windows=_memory_windows(config, seen, 100.0 * k - 10)))
        fitted_at.append(state.model.memory.fitted_samples_seen)
    # Refits: the configuration's first windows (1.1e5) and its sixth (1.5e5, the throughput's), then the
    # memory alone at twice the samples of its last fit (4e5, 9e5, 3e6), not between.
    assert fitted_at == [1.1e5, 1.1e5, 1.5e5, 1.5e5, 4e5, 4e5, 9e5, 3e6]
    assert state.model.memory.table_asymptote_mb == pytest.approx(12_000, rel=0.02)


def _ps_growing_on_the_curve(limit):
    """Two PS whose tables (1000 MB, every row: 2000 MB) grow at 8000 MB per 10⁶ samples at first, at
    1000 samples/s: by t = 150 s each PS holds ~1250 MB, still rising 1.2 MB/s, 150 MB below its
    asymptote (1400 MB); the state holds the model and the windows that measured the speed."""
    from airflow_dlrover.optimizer.job_model import JobModel
    from airflow_dlrover.optimizer.memory import MemoryModel
    from airflow_dlrover.optimizer.model import fit_throughput
    from sim.synthetic import model_samples

    memory = MemoryModel(400.0, 1000.0, 900.0, 0.5, 8000.0, table_capacity_mb=2000.0)
    config = Configuration(2, 2, 1.0, 0.5, 2048, limit)
    model = JobModel(fit_throughput(model_samples(), leave_one_out=False), memory)
    windows = tuple(dict(config.to_row(), throughput=1000.0, timestamp=float(t)) for t in (100, 110, 120))
    rows = tuple(usage(float(t), f"ps-{i}", "ps", 0.3, 0.5, float(memory.ps_peak_mb(2, 1000.0 * t)), limit)
                 for t in range(123, 151, 3) for i in range(2))
    ps = {f"ps_{i}": {"memory_mb": limit} for i in range(2)}
    obs = Observation(150.0, config, samples_done=1.5e5, samples_total=1e6, nodes=nodes(**ps), usage=rows)
    return ControllerState(Quota(cpu=8.0, memory_mb=64 * 1024), model=model, windows=windows), obs, memory


def test_a_ps_whose_tables_flatten_below_its_limit_is_not_grown_for_a_line():
    state, obs, _ = _ps_growing_on_the_curve(limit=1500.0)
    _, actions = step(replace(state, model=None), obs)  # no memory model: the trend, a line, reaches 1500 MB
    assert [a.reason for a in actions if isinstance(a, Resize)] == [Reason.OOM_RISK, Reason.OOM_RISK]
    _, actions = step(state, obs)  # the model's curve stays under 1400 MB
    assert not [a for a in actions if isinstance(a, Resize)]


def test_a_ps_whose_curve_reaches_its_limit_grows_to_the_models_request_for_the_job():
    state, obs, memory = _ps_growing_on_the_curve(limit=1380.0)
    _, actions = step(state, obs)
    resize = next(a for a in actions if isinstance(a, Resize))
    assert resize.reason == Reason.OOM_RISK and resize.numbers["forecast"] == "memory model"
    # The PS's level is the model's, so its forecast to the job's end is the model's request for the job.
    assert resize.config.ps_memory_mb == memory.ps_request_mb(2, 1e6)
    copy = memory.ps_tables_mb(2, 1e6)  # the checkpoint's
    assert resize.config.ps_memory_mb >= memory.ps_peak_mb(2, 1e6) + copy


def test_a_ps_whose_tables_were_seen_not_growing_is_grown_from_its_level_not_from_a_steep_line():
    """The demo's PS: its allocator took it from ~180 to 215 MB of 224 within seconds, a line at
    ~320 MB/min; its model, refitted over millions of samples, saw the tables not grow."""
    from airflow_dlrover.optimizer.job_model import JobModel
    from airflow_dlrover.optimizer.memory import MemoryModel, ps_request_mb
    from airflow_dlrover.optimizer.model import fit_throughput
    from sim.synthetic import model_samples

    config = Configuration(3, 1, 0.5, 0.5, 320, 224)
    flat = MemoryModel(25.0, 150.0, 214.0, 0.0, 0.0, table_capacity_mb=71.4, largest_table_mb=2.75)
    rows = tuple(usage(float(t), "ps-0", "ps", 0.45, 0.5, used, 224.0)
                 for t, used in zip(range(160, 184, 3), (180, 180, 181, 190, 200, 208, 212, 215)))
    obs = Observation(184.0, config, samples_done=9e6, samples_total=16e6,
                      nodes=nodes(ps_0={"memory_mb": 224.0}, ps_1={"state": NodeState.STOPPED}), usage=rows)
    windows = tuple(dict(config.to_row(), throughput=50_000.0, timestamp=float(t)) for t in (150, 160, 170))
    model = JobModel(fit_throughput(model_samples(), leave_one_out=False), flat)
    state = ControllerState(Quota(cpu=2.0, memory_mb=8192), model=model, windows=windows)
    _, actions = step(state, obs)
    [resize] = [a for a in actions if isinstance(a, Resize)]
    assert resize.numbers["forecast"] == "memory model" and resize.numbers["when"] == "now"
    assert resize.config.ps_memory_mb == ps_request_mb(215.0, flat.ps_transient_mb(1, 16e6)) == 256
    # The same model with its growth unknown (no samples_seen varied): the line forecasts, far past it.
    unknown = replace(flat, pinned={"table_growth_mb_per_m_samples": "no samples_seen that varies"})
    _, actions = step(replace(state, model=JobModel(state.model.throughput, unknown)), obs)
    [line] = [a for a in actions if isinstance(a, Resize)]
    assert line.numbers["forecast"] == "trend" and line.config.ps_memory_mb > 400


def test_a_cold_plan_is_checked_where_it_extrapolates():
    from dataclasses import replace as copy

    from airflow_dlrover.optimizer.controller import plan_needs_check
    from airflow_dlrover.optimizer.types import Plan

    planned = Plan(CONFIG, 1200.0, 1000.0, 1400.0, "throughput", "")
    assert not plan_needs_check(planned)
    assert plan_needs_check(copy(planned, extrapolation={"workers": 1.5}))


def crashed(restarts: int, code: int = 1):
    """worker-0's ``restarts``-th incarnation, exited ``code``."""
    return nodes(worker_0={"state": NodeState.FAILED, "exit_code": code, "restarts": restarts,
                           "reason": f"exited {code}; output tail:\nValueError: zipf_skew must be finite"})


def test_the_same_crash_before_any_progress_stops_the_job_at_once():
    state, (fail,) = step(ControllerState(QUOTA), observe(nodes=crashed(0)))
    assert fail.retryable and state.failure_log[-1]["exit_codes"] == {"worker-0": 1}
    state, (relaunch,) = step(state, observe(nodes=crashed(0)))
    assert isinstance(relaunch, Relaunch)
    _, (stop,) = step(state, observe(nodes=crashed(1)))  # the same exit, no sample trained since
    assert stop.reason == Reason.CRASH_LOOP and not stop.retryable and "zipf_skew must be finite" in stop.describe()
    progressed = Observation(now_s=200.0, config=CONFIG, samples_done=2e5, samples_total=1e6, nodes=crashed(1))
    _, (again,) = step(state, progressed)  # it trained meanwhile: a crash like any other
    assert again.reason == Reason.NODE_FAILED and again.retryable
    _, (other,) = step(state, observe(nodes=crashed(1, code=2)))  # another crash: not the same one
    assert other.retryable


@pytest.mark.parametrize("code", [*C.SIGKILL_EXIT_CODES, C.UNREACHABLE_EXIT_CODE])
def test_a_killed_node_is_never_a_crash_loop(code):
    """Nor one that gave up on its unreachable master: the workers of a job whose master stays down
    exit one after another, before any progress, with the same code."""
    state, _ = step(ControllerState(QUOTA), observe(nodes=crashed(0, code)))
    state, _ = step(state, observe(nodes=crashed(0, code)))
    _, (fail,) = step(state, observe(nodes=crashed(1, code)))
    assert fail.reason == Reason.NODE_FAILED and fail.retryable


def test_a_trainer_past_its_restart_budget_stops_and_old_failures_do_not_count():
    state = ControllerState(QUOTA, restart_budget=(2, 100.0))
    for restarts, now in enumerate((0.0, 10.0, 20.0)):
        progress = Observation(now_s=now, config=CONFIG, samples_done=1e4 * (restarts + 1), samples_total=1e6,
                               nodes=crashed(restarts, code=-9))
        state, actions = step(state, progress)
        if restarts < 2:
            assert actions[0].retryable
            state, _ = step(state, progress)  # the retry relaunches
    assert actions[0].reason == Reason.RESTART_BUDGET and not actions[0].retryable
    assert "max_restarts=2" in actions[0].describe()
    later = ControllerState(QUOTA, restart_budget=(2, 100.0), failure_log=state.failure_log[:2])
    late = Observation(now_s=150.0, config=CONFIG, samples_done=5e4, samples_total=1e6, nodes=crashed(2, code=-9))
    _, (fail,) = step(later, late)  # the first two failures left the window
    assert fail.retryable


def test_a_repeated_failure_is_relaunched_after_a_doubling_backoff():
    from airflow_dlrover.optimizer.controller import restart_backoff_s

    assert [restart_backoff_s(k) for k in range(1, 8)] == [0.0, 5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    state = ControllerState(QUOTA)
    for restarts, failed_at, backoff_s in ((0, 0.0, 0.0), (1, 100.0, 5.0), (2, 200.0, 10.0)):
        seen = Observation(now_s=failed_at, config=CONFIG, samples_done=1e4 * (restarts + 1), samples_total=1e6,
                           nodes=crashed(restarts, code=-9))
        state, (fail,) = step(state, seen)
        assert fail.reason == Reason.NODE_FAILED and fail.retryable
        if backoff_s:
            _, (wait,) = step(state, replace(seen, now_s=failed_at + backoff_s - 1))
            assert isinstance(wait, Keep) and wait.reason == Reason.RESTART_BACKOFF
            assert wait.numbers["wait_s"] == pytest.approx(1.0) and wait.numbers["failures"] == restarts + 1
        state, (relaunch,) = step(state, replace(seen, now_s=failed_at + backoff_s))
        assert isinstance(relaunch, Relaunch) and relaunch.node == "worker-0"


def test_ranks_that_fail_while_their_group_awaits_its_restart_are_part_of_the_reported_failure():
    group = Configuration(3, 0, 0.5, 0.0, 2048, 0)
    ranks = [NodeStatus(f"worker-{i}", "worker", i, NodeState.RUNNING, 0.5, 2048) for i in range(3)]
    killed = NodeStatus(**{**ranks[0].__dict__, "state": NodeState.FAILED, "exit_code": -9, "reason": "killed"})
    reset = [NodeStatus(**{**r.__dict__, "state": NodeState.FAILED, "exit_code": 1,
                           "reason": "RuntimeError: Connection reset by peer"}) for r in ranks[1:]]
    seen = Observation(now_s=100.0, config=group, samples_done=1e5, samples_total=1e6, nodes=(killed, *ranks[1:]))
    reported, (fail,) = step(ControllerState(QUOTA), seen)
    assert fail.retryable and fail.nodes == ("worker-0",)
    # the retry finds the other ranks failed too: no second failure, one relaunch restarts the group
    state, actions = step(reported, replace(seen, now_s=103.0, nodes=(killed, *reset)))
    assert [(type(a), a.node) for a in actions] == [(Relaunch, "worker-0")]
    assert len(state.failure_log) == 1
    # in a PS job the same failures are separate: each is reported
    _, (other,) = step(reported, replace(seen, config=CONFIG, nodes=(killed, *reset)))
    assert isinstance(other, Fail) and other.nodes == ("worker-1", "worker-2")


def test_a_refit_on_windows_of_near_ps_counts_keeps_the_tables_the_job_started_from():
    """Windows of 89 and 87 PS cannot tell the tables from a PS's base: within the memory's noise
    the fit puts them in the base (T₀ = 0), and a plan on it would size 10 PS for no tables. The
    tables the job started from stay its floor, through every refit."""
    _, fitted = _flattening_job()
    start = 40_000.0
    before, after = (Configuration(2, p, 1.0, 1.0, 4096, 8192, 0, 512) for p in (89, 87))
    # each PS holds 600 MB + its share of the tables (1,049 and 1,060 MB), measured ±1 %
    state = ControllerState(Quota(cpu=256, memory_mb=1024 * 1024), model=fitted, prior=fitted, table_start_mb=start,
                            windows=tuple(dict(w, ps_memory_used_mb=1052.0)
                                          for w in _memory_windows(before, (1e5, 1.1e5), 80.0)))
    windows = tuple(dict(w, ps_memory_used_mb=1049.0) for w in _memory_windows(after, (1.2e5, 1.3e5), 90.0))
    state, _ = step(state, Observation(100.0, after, samples_done=1.3e5, samples_total=1e8, windows=windows))
    memory = state.model.memory
    assert memory.fitted_samples_seen == 1.3e5  # refitted on the windows
    assert memory.table_mb >= start and memory.ps_request_mb(10, 1.3e5) >= start / 10
