"""The controller's state rebuilt from a run's records: the fine-tune's explorations."""

from dataclasses import replace

import pytest

from airflow_dlrover.history.control import controller_state, decision_record, failure_record
from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.history.store import HistoryStore
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.controller import ControllerState, Fail, Observation, Resize, step
from airflow_dlrover.optimizer.job_model import JobModel
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import fit_throughput
from airflow_dlrover.optimizer.types import Configuration, NodeState, NodeStatus, Quota, Reason
from sim.synthetic import model_samples

pytestmark = pytest.mark.unit

MEMORY = MemoryModel(400, 8000, 900, 0.5)
QUOTA = Quota(cpu=12, memory_mb=128 * 1024)
SMALL = [(w, p, lw, lp) for w in (1, 2) for p in (1, 2) for lw, lp in ((0.5, 0.5), (1.0, 0.5), (0.5, 1.0), (1.0, 1.0))]


def _explore_on_a_job_that_never_delivers(store=None, run=None, steps=40):
    """An unsure model (noisy probes of ≤ 2 workers and PS) on a job whose every other shape runs
    no faster than the one it starts on: each exploration is judged and reverted. With a store,
    each step's state is rebuilt from the records the fine-tune leaves (as the tasks do)."""
    profile = model_samples(configs=SMALL, noise=0.2, windows=2, seed=2)
    model = JobModel(fit_throughput(profile, leave_one_out=False), MEMORY)
    start = Configuration(2, 1, 1.0, 1.0, MEMORY.worker_request_mb(512), MEMORY.ps_request_mb(1))
    x = float(model_samples(configs=[(2, 1, 1.0, 1.0)])["throughput"][0])
    state = ControllerState(QUOTA, "throughput", model=model, profile=tuple(profile.to_dict("records")), since_s=0.0)
    if store is not None:
        store.add_samples(run, profile, stage="profile")
        store.save_model(run, model)
        store.add(run, "plan", {**start.to_row(), "objective": "throughput", "time": 0.0})
    current, actions = start, []
    for k in range(steps):
        now = 100.0 + 400.0 * k
        rows = tuple(dict(current.to_row(), throughput=x * (1 + 0.01 * i), timestamp=now - 10 * i) for i in range(3))
        if store is not None:
            state = replace(controller_state(store, JobIdentity("", "", "explore"), run, QUOTA), model=model)
        state, (action,) = step(state, Observation(now, current, samples_done=0, samples_total=5e8, windows=rows))
        actions.append(action)
        if store is not None:
            import pandas as pd

            store.add_samples(run, pd.DataFrame(list(rows)), stage="finetune")
            store.add(run, "decision", decision_record(action, current, [r["throughput"] for r in rows], 0) | {"time": now})
        if isinstance(action, Resize):
            current = action.config
    return actions, state


def test_explorations_are_bounded_judged_on_their_windows_reverted_and_never_repeated():
    actions, state = _explore_on_a_job_that_never_delivers()
    reasons = [a.reason for a in actions]
    explored = [a.config for a in actions if a.reason == Reason.EXPLORE]
    assert len(explored) == C.EXPLORE_MAX_PER_RUN == state.explorations
    assert len(set(explored)) == len(explored)  # a reverted shape is excluded from later plans
    reverts = [a for a in actions if isinstance(a, Resize) and a.revert and a.numbers["explored"]]
    assert [a.reject for a in reverts] == explored and set(explored) <= set(state.rejected)
    assert Reason.EXPLORED not in reasons
    last = max(i for i, r in enumerate(reasons) if r == Reason.EXPLORE)
    # past the bound the model still sees an unsure gain, and keeps
    assert any(a.reason == Reason.NOT_WORTH_IT and a.numbers["speedup"] >= C.EXPLORE_MIN_SPEEDUP for a in actions[last:])
    assert all(isinstance(a, Resize) is False for a in actions[last + 2:])


def test_the_exploration_count_and_the_unjudged_exploration_survive_the_tasks_rebuilding_the_state(tmp_path):
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    run = store.start_run(JobIdentity("", "", "explore"), "manual__explore")
    actions, state = _explore_on_a_job_that_never_delivers(store, run)
    assert [a.reason for a in actions] == [a.reason for a in _explore_on_a_job_that_never_delivers()[0]]
    rebuilt = controller_state(store, JobIdentity("", "", "explore"), run, QUOTA)
    assert rebuilt.explorations == C.EXPLORE_MAX_PER_RUN and set(rebuilt.rejected) == set(state.rejected)
    decisions = store.records(run, "decision")
    first = next(i for i, d in enumerate(decisions) if d["reason"] == Reason.EXPLORE)
    mid = controller_state(_Upto(store, first + 1), JobIdentity("", "", "explore"), run, QUOTA)
    assert mid.last_resize.exploring and mid.explorations == 1
    assert rebuilt.last_run_config is None  # an earlier run's: none
    tomorrow = store.start_run(JobIdentity("", "", "explore"), "manual__tomorrow")
    ended = [a.config for a in actions if isinstance(a, Resize)][-1]  # the last revert's target
    assert controller_state(store, JobIdentity("", "", "explore"), tomorrow, QUOTA).last_run_config == ended


class _Upto:
    """The store as it was after its first ``n`` decisions."""

    def __init__(self, store, n):
        self.store, self.n = store, n

    def records(self, run, kind):
        records = self.store.records(run, kind)
        return records[: self.n] if kind == "decision" else records

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_the_failures_reported_survive_the_tasks_rebuilding_the_state(tmp_path):
    """The guard's tries rebuild the restart budget's log from its ``node_failed`` events."""
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    run = store.start_run(JobIdentity("", "", "crash"), "manual__crash")
    node = NodeStatus("worker-0", "worker", 0, NodeState.FAILED, 1.0, 1024, restarts=0, exit_code=1, reason="exited 1")
    fail = Fail(Reason.NODE_FAILED, {"node": "worker-0", "samples_done": 4096.0}, nodes=("worker-0",))
    store.add(run, "event", failure_record(fail, [node], try_number=1))
    rebuilt = controller_state(store, JobIdentity("", "", "crash"), run, QUOTA, restart_budget=(3, 600.0))
    assert rebuilt.failures_reported == {("worker-0", 0)} and rebuilt.restart_budget == (3, 600.0)
    [entry] = rebuilt.failure_log
    assert entry["exit_codes"] == {"worker-0": 1} and entry["samples_done"] == 4096.0


def test_a_failure_the_fine_tune_saw_is_no_resize_when_the_state_is_rebuilt(tmp_path):
    """The fine-tune's step may return the guard's failure (a node died between its windows): it is
    recorded as a decision, but the last resize, the tasks' rebuilt state and the counts skip it."""
    from airflow_dlrover.history.report import build_report

    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    run = store.start_run(JobIdentity("", "", "failing"), "manual__failing")
    actions, _ = _explore_on_a_job_that_never_delivers(store, run, steps=12)
    resized = [d for d in store.records(run, "decision") if d["action"] in ("resize", "revert")]
    fail = Fail(Reason.NODE_FAILED, {"node": "worker-0", "samples_done": 4096.0}, nodes=("worker-0",))
    store.add(run, "decision", decision_record(fail, Configuration(2, 1, 1.0, 1.0), [], 4096.0))
    rebuilt = controller_state(store, JobIdentity("", "", "failing"), run, QUOTA)
    assert resized and rebuilt.last_resize.after == Configuration(**resized[-1]["target"])
    report = build_report(store, run, None, {"state": "failed"})
    assert report["resizes"] == sum(d["action"] in ("resize", "revert") for d in store.records(run, "decision"))


def test_a_knee_exploration_counts_and_awaits_its_judgement_after_the_state_is_rebuilt(tmp_path):
    store = HistoryStore(f"sqlite:///{tmp_path / 'h.db'}")
    job = JobIdentity("", "", "knee")
    run = store.start_run(job, "manual__knee")
    current = Configuration(6, 4, 1.0, 1.0, MEMORY.worker_request_mb(512), MEMORY.ps_request_mb(4))
    knee = Configuration(3, 3, 1.0, 0.5, MEMORY.worker_request_mb(512), MEMORY.ps_request_mb(3))
    store.add(run, "plan", {**current.to_row(), "objective": "efficiency", "time": 0.0})
    explore = Resize(Reason.EXPLORE_KNEE, {"target": knee.describe()}, config=knee, expected_speedup=0.9)
    store.add(run, "decision", decision_record(explore, current, [1e5] * 3, 0) | {"time": 400.0})
    rebuilt = controller_state(store, job, run, QUOTA)
    assert rebuilt.explorations == 1 and rebuilt.objective == "efficiency"
    last = rebuilt.last_resize
    assert last.exploring and last.after == knee and last.predicted_speedup == 0.9
