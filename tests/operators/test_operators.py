"""Each operator, the sensor and the trigger against the local launcher, called as the task runner
calls them (``execute`` with a context; ``TaskDeferred`` carries the trigger)."""

import asyncio
import importlib
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowRescheduleException, TaskDeferred

from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.history.store import HistoryStore
from airflow_dlrover.operators import (
    DLRoverFineTuneOperator, DLRoverFitOperator, DLRoverLaunchOperator, DLRoverProfileOperator,
)
from airflow_dlrover.operators.job import build_spec, launcher_job_id, parse_faults, parse_quota
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, Quota
from airflow_dlrover.sensors import DLRoverInstabilitySensor, DLRoverNodeFailure
from airflow_dlrover.triggers.job import DLRoverJobTrigger

pytestmark = pytest.mark.unit

QUOTA = {"cpu": 1.5, "memory": "4Gi"}
CRITEO = Path(__file__).resolve().parents[1] / "data" / "criteo_sample.csv"
JOB_ARGS = {"samples": 3_000_000, "table_size": 5000}


class TI:
    try_number = 1
    start_date = None

    @staticmethod
    def get_first_reschedule_date(context):
        return None


def context(run_id):
    return {"run_id": run_id, "ti": TI()}


@pytest.mark.parametrize("quota, field", [
    ({"cpu": 2, "memory": "12XB"}, "quota.memory"), ({"cpu": -1, "memory": "4Gi"}, "quota.cpu"),
    ({"memory": "4Gi"}, "quota.cpu"), ({"cpu": 2, "memory": "4Gi", "gpus": 1}, "quota.gpus"), (None, "quota"),
])
def test_a_bad_quota_is_a_user_error_naming_the_field(airflow_db, quota, field):
    task = DLRoverProfileOperator(task_id="profile", job="bad", job_args=JOB_ARGS, quota=quota)
    with pytest.raises(AirflowFailException, match=rf"^{field}="):
        task.execute(context("bad-quota"))


@pytest.mark.parametrize("args, field", [
    ({"data": "/no/such.tsv"}, "job_args.data"), ({"samples": "many"}, "job_args.samples"),
    ({"table_size": 1}, "job_args.table_size"), ({"epoch": 2}, "job_args.epoch"), ({"samples": 1.5}, "job_args.samples"),
    ({"tables": 0}, "job_args.tables"), ({"zipf_skew": -1}, "job_args.zipf_skew"), ({"seed": -1}, "job_args.seed"),
    ({"checkpoint_interval_s": 0}, "job_args.checkpoint_interval_s"),
    ({"checkpoint_interval_s": float("nan")}, "job_args.checkpoint_interval_s"),
    ({"zipf_skew": "inf"}, "job_args.zipf_skew"),
    ({"data": str(CRITEO), "samples": 200}, "job_args.samples"),  # the file has 200 rows: none held out
])
def test_bad_job_args_name_the_field(args, field):
    with pytest.raises(InvalidInputError) as err:
        build_spec("j", args)
    assert err.value.field == field
    with pytest.raises(InvalidInputError, match="^job_args="):
        build_spec("j", "samples=5")


def test_a_criteo_file_long_enough_is_accepted():
    assert build_spec("j", {"data": str(CRITEO), "samples": 160}).samples == 160


def test_a_misspelt_baseline_and_a_fault_on_a_missing_worker_are_user_errors():
    from airflow_dlrover.operators.job import check_fault_nodes, parse_configuration
    from airflow_dlrover.optimizer.types import Configuration

    row = {"workers": 2, "ps": 1, "worker_cpu": 0.5, "ps_cpu": 0.5}
    assert parse_configuration("baseline", row) == Configuration(2, 1, 0.5, 0.5)
    for bad, field in (({**row, "worker_mem": 512}, "baseline.worker_mem"), ({"workers": 2}, "baseline.ps"),
                       ({**row, "workers": 0}, "baseline.workers"), ("2w", "baseline")):
        with pytest.raises(InvalidInputError) as err:
            parse_configuration("baseline", bad)
        assert err.value.field == field
    check_fault_nodes(parse_faults("kill-worker:1@3s"), Configuration(2, 1, 0.5, 0.5))
    with pytest.raises(InvalidInputError, match="a worker index < 2"):
        check_fault_nodes(parse_faults("oom-worker:5@3s"), Configuration(2, 1, 0.5, 0.5))


def test_job_args_faults_and_ids():
    spec = build_spec("j", {"samples": "5000", "table_size": 100, "tables": 3, "embedding_dim": 8})
    assert (spec.samples, spec.table_sizes, spec.bottom_mlp[-1]) == (5000, (100, 100, 100), 8)
    assert parse_faults("kill-worker@30s, oom-worker:1@1m") == [
        {"kind": "kill-worker", "node": "worker-0", "at_s": 30.0}, {"kind": "oom-worker", "node": "worker-1", "at_s": 60.0}]
    with pytest.raises(InvalidInputError, match="inject='kill-ps@3s'"):
        parse_faults("kill-ps@3s")
    assert parse_quota(None, Quota(4, 8192)) == Quota(4, 8192)
    daily = JobIdentity("dlrm_daily_retrain", "", "dlrm_daily_retrain")
    long = launcher_job_id(daily, "scheduled__2026-11-30T00:00:00+00:00")
    assert len(long) <= 52 and long.startswith("dlrm-daily-retrain-scheduled-2026") and long == long.lower()
    j = JobIdentity("dag", "", "j")
    assert launcher_job_id(j, "manual__1") != launcher_job_id(j, "manual__2")


def test_two_dags_with_one_job_name_get_their_own_runs_and_job_ids():
    from airflow.sdk import DAG, TaskGroup

    tasks = []
    for dag_id in ("retrain_a", "retrain_b"):
        with DAG(dag_id, schedule=None):
            tasks.append(DLRoverFitOperator(task_id="fit", job="shared"))
            with TaskGroup("nightly"):
                tasks.append(DLRoverFitOperator(task_id="fit", job="shared"))
    assert [t.job_identity() for t in tasks] == [
        JobIdentity(d, g, "shared") for d in ("retrain_a", "retrain_b") for g in ("", "nightly")]
    ids = [t.run_ids(context("scheduled__2026-11-29")) for t in tasks]
    assert len({run for run, _ in ids}) == len({job_id for _, job_id in ids}) == 4
    assert tasks[3].run_ids(context("scheduled__2026-11-29")) == ids[3]  # a retry, or the next task of the run
    runs = HistoryStore().runs(run_key="scheduled__2026-11-29", dag_id="retrain_b")
    assert [(r["task_group"], r["id"]) for r in runs] == [("", ids[2][0]), ("nightly", ids[3][0])]


#: A trainer that keeps the contract (docs/trainers.md) and whose speed is a known function of its
#: allocation — worker compute in series with an all-reduce cost growing with the workers — so that
#: profile → fit → plan through the launcher can be checked exactly. No torch: each probe's
#: restart costs a Python start only.
TRAINER = textwrap.dedent("""
    import json, os, signal, sys, time
    w, cpu = int(os.environ["DLROVER_WORKERS"]), float(os.environ["DLROVER_CPU"])
    job_rate = 1 / (1 / (2000 * w * cpu) + 2e-5 * (w - 1))
    total = int(os.environ["DLROVER_SAMPLES"])
    state = os.path.join(os.environ["DLROVER_CHECKPOINT_DIR"], "done")
    os.makedirs(os.environ["DLROVER_CHECKPOINT_DIR"], exist_ok=True)
    done = float(open(state).read()) if os.path.exists(state) else 0.0
    def stop(*_):
        if os.environ["RANK"] == "0":
            open(state, "w").write(str(done))
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    while done < total:
        time.sleep(0.1)
        done = min(total, done + job_rate * 0.1)
        with open(os.environ["DLROVER_METRICS_FILE"], "a") as f:
            f.write(json.dumps({"throughput": job_rate / w, "samples_done": int(done), "samples_total": total}) + "\\n")
""")


def write_trainer(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    return {"command": [sys.executable, str(script)], "grace_s": 5}


@pytest.mark.jobs
def test_a_trainer_of_your_own_is_profiled_fitted_planned_and_launched(airflow_db, tmp_path):
    """Through the launcher: one process per node and probe, its reports and cgroup measured."""
    job, ctx = "byo", context("manual__byo")
    job_args = {"trainer": write_trainer(tmp_path), "samples": 50_000_000}
    launcher = DLRoverLaunchOperator(task_id="l", job=job).launcher
    # cold, as it asserts, whatever the session profiled before (its jobs would give it a similar start)
    profiled = DLRoverProfileOperator(task_id="profile", job=job, quota=QUOTA, probe_window="1s",
                                      job_args=job_args, similar_jobs=False).execute(ctx)
    try:  # profiling leaves the job running (the launch resizes it)
        samples = HistoryStore().samples_of_run(profiled["run"])
        assert profiled["measured"] == len(samples) >= 3 and (samples.ps == 0).all()
        expected = 1 / (1 / (2000 * samples.workers * samples.worker_cpu) + 2e-5 * (samples.workers - 1))
        assert (abs(samples.throughput / expected - 1) < 0.05).all()  # the mean of each window's reports
        fitted = DLRoverFitOperator(task_id="fit", job=job).execute(ctx)
        assert fitted["in_sample_mape"] < 0.05
        launched = DLRoverLaunchOperator(task_id="launch", job=job, quota=QUOTA, job_args=job_args).execute(ctx)
        config = launched["config"]
        assert config["ps"] == 0 and config["workers"] * config["worker_cpu"] <= QUOTA["cpu"] + 1e-9
        assert launched["adopted"]  # profiling left the job running: the launch resized it to the plan
        assert launcher.read_job(launched["job_id"])["config"] == config
        # a plan past the probes is checked in windows of the probes' length, the user's 1 s
        checks = [e for e in HistoryStore().records(profiled["run"], "event") if e["event"] == "plan_checked"]
        assert checks and all(check["window_s"] == C.PLAN_CHECK_WINDOWS * 1.0 for check in checks)
        nodes = [s for s in launcher.status(launched["job_id"]) if s.state == "running"]
        assert len(nodes) == config["workers"] and {s.role for s in nodes} == {"worker"}
    finally:
        launcher.stop(profiled["job_id"])


@pytest.mark.jobs
def test_a_job_whose_state_is_dear_to_move_is_profiled_on_its_stand_in_and_launched_fresh(airflow_db, monkeypatch):
    """Through the launcher: the profile and the plan's checks run a stand-in of the job, which the
    launch on the plan stops; the job itself starts on the plan."""
    from airflow_dlrover.launchers.local import LocalLauncher
    from airflow_dlrover.lifecycle.profiling import stand_in_id
    from airflow_dlrover.optimizer.transitions import measured

    # a PS change writes and reads back the 5 MB the job starts from at 0.01 MB/s: far dearer than a stand-in
    slow = replace(measured(), checkpoint_mb_per_s=0.01, restore_mb_per_s=0.01)
    monkeypatch.setattr(LocalLauncher, "transition_costs", lambda self: slow)
    monkeypatch.setattr("airflow_dlrover.runtime.export.starting_tables_mb", lambda spec: 5.0)
    job, ctx = "apart", context("manual__apart")
    launcher = DLRoverLaunchOperator(task_id="l", job=job).launcher
    profiled = DLRoverProfileOperator(task_id="profile", job=job, quota=QUOTA, job_args=JOB_ARGS,
                                      similar_jobs=False).execute(ctx)
    job_id, stand_in = profiled["job_id"], stand_in_id(profiled["job_id"])
    try:
        assert profiled["measured"] >= C.MIN_PROBES_COLD
        assert not launcher.exists(job_id) and launcher.exists(stand_in)  # the probes ran on the stand-in
        assert launcher.spec(stand_in).init_from == "" and launcher.spec(stand_in).export == ""
        events = HistoryStore().records(profiled["run"], "event")
        (event,) = [e for e in events if e["event"] == "profiled"]
        assert event["apart"] and event["samples_trained"] == 0.0  # the stand-in's samples are not the job's
        DLRoverFitOperator(task_id="fit", job=job).execute(ctx)
        launched = DLRoverLaunchOperator(task_id="launch", job=job, quota=QUOTA, job_args=JOB_ARGS).execute(ctx)
        assert not launched["adopted"] and launcher.read_job(job_id)["config"] == launched["config"]
        assert launcher.stopped(stand_in)  # the launch on the plan stopped it
        assert launcher.progress(job_id)["samples_done"] < launcher.progress(job_id)["samples_total"]
        checks = [e for e in HistoryStore().records(profiled["run"], "event") if e["event"] == "plan_checked"]
        assert all(check["samples_trained"] == 0.0 for check in checks)
    finally:
        for name in (job_id, stand_in):
            if launcher.exists(name):
                launcher.stop(name)


@pytest.mark.parametrize("command, why", [
    ("print('hello')", "exited 0 without a report"),
    ("import sys; print('no --lr'); sys.exit(3)", "exited 3 before its first report"),
])
@pytest.mark.jobs
def test_a_trainer_that_breaks_the_contract_fails_the_profile_without_retry(airflow_db, tmp_path, command, why):
    job_args = {"trainer": {"command": [sys.executable, "-c", command]}}
    operator = DLRoverProfileOperator(task_id="profile", job="byo-bad", quota=QUOTA, probe_window="1s", job_args=job_args)
    with pytest.raises(AirflowFailException, match=why):
        operator.execute(context(f"manual__{why[:8].replace(' ', '')}"))


def test_job_args_of_a_trainer_are_checked():
    spec = build_spec("j", {"trainer": {"command": ["python", "t.py", "--rank={rank}"], "kind": "allreduce"},
                            "samples": "1000"})
    assert spec.trainer["command"] == ["python", "t.py", "--rank={rank}"] and spec.samples == 1000
    for job_args, field in (({"trainer": {"command": ["t", "{world}"]}}, "job_args.trainer.command[1]"),
                            ({"trainer": {"command": "python t.py"}}, "job_args.trainer.command"),
                            ({"trainer": {"command": ["t"]}, "table_size": 10}, "job_args.table_size"),
                            ({"trainer": '{"command": ["t"], "kind": "mpi"}'}, "job_args.trainer.kind")):
        with pytest.raises(InvalidInputError) as err:
            build_spec("j", job_args)
        assert err.value.field == field


def test_fit_without_profile_samples_is_a_user_error(airflow_db):
    with pytest.raises(AirflowFailException, match="run the profile task first"):
        DLRoverFitOperator(task_id="fit", job="never-profiled").execute(context("r1"))


def test_trigger_serializes_to_its_classpath_and_kwargs():
    trigger = DLRoverJobTrigger("job-1", "guard", jobs_dir="/tmp/jobs", window_s=2.0, deadline=1.8e9,
                                dag_id="d", run_id="r", siblings=["fine_tune"], job="j", history_run=7)
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    with pytest.raises(ValueError, match="purpose"):
        DLRoverJobTrigger("job-1", "watch")


@pytest.mark.jobs
def test_operators_against_a_running_job(airflow_db):
    """profile (on the job itself) → fit → launch; a retried launch adopts; the fine-tune and the
    guard defer to triggers that fire on the real job; a failed-node event is a retryable failure."""
    job, ctx = "operators", context("manual__ops")
    # cold, though the session's earlier jobs share its layout (they would give it a similar start)
    profiled = DLRoverProfileOperator(task_id="profile", job=job, job_args=JOB_ARGS, quota=QUOTA,
                                      similar_jobs=False).execute(ctx)
    # 5 designed under 1.5 cores; a job of ~2 minutes measures the minimum (PROFILE_BUDGET_FRACTION)
    assert profiled["probes"] == 5 and profiled["measured"] == C.MIN_PROBES_COLD and not profiled["warm_start"]
    assert profiled["similar_to"] == []
    fitted = DLRoverFitOperator(task_id="fit", job=job).execute(ctx)
    assert fitted["samples"] == C.MIN_PROBES_COLD and set(fitted["parameters"]) >= {"overhead", "ps_service"}
    launch = DLRoverLaunchOperator(task_id="launch", job=job, job_args=JOB_ARGS, quota=QUOTA)
    first = launch.execute(ctx)
    launcher = launch.launcher
    job_id = first["job_id"]
    try:
        assert first["adopted"]  # profiling left the job running: the launch resized it to the plan
        pids = {n: node["pid"] for n, node in launcher.read_job(job_id)["nodes"].items() if node.get("state") == "running"}
        retry = DLRoverLaunchOperator(task_id="launch", job=job, job_args=JOB_ARGS, quota=QUOTA).execute(ctx)
        assert retry["adopted"] and retry["config"] == first["config"]
        after = {n: node["pid"] for n, node in launcher.read_job(job_id)["nodes"].items() if node.get("state") == "running"}
        assert after == pids  # adopted: not one process started twice
        history = HistoryStore()
        assert [e["adopted"] for e in history.records(first["run"], "event") if e["event"] == "launched"] == [True, True]

        finetune = DLRoverFineTuneOperator(task_id="fine_tune", job=job, quota=QUOTA, window="2s", windows=2,
                                       deferrable=True)
        with pytest.raises(TaskDeferred) as deferred:
            finetune.execute(ctx)
        event = asyncio.run(_first_event(deferred.value.trigger))
        assert event["kind"] == "windows" and len(event["rows"]) == 2
        assert all(row["workers"] == first["config"]["workers"] for row in event["rows"])
        with pytest.raises(TaskDeferred):  # decides, records, and defers again
            finetune.execute_complete(ctx, event)
        [decision] = history.records(first["run"], "decision")
        assert decision["action"] in ("keep", "resize") and decision["reason"]

        late = DLRoverJobTrigger(job_id, "finetune", jobs_dir=deferred.value.trigger.jobs_dir, deadline=time.time())
        timeout = asyncio.run(_first_event(late))
        assert timeout["kind"] == "timeout"
        with pytest.raises(AirflowFailException, match="timeout"):  # not retried: the guard goes on watching
            finetune.execute_complete(ctx, timeout)
        with pytest.raises(AirflowRescheduleException):  # a sibling waits for a slot: hand it back
            finetune.execute_complete(ctx, {"kind": "turn", "rows": [], "deadline": None})
        blocking = DLRoverFineTuneOperator(task_id="fine_tune", job=job, quota=QUOTA, window="2s", windows=2,
                                           deferrable=False)
        started = time.monotonic()
        with pytest.raises(AirflowFailException, match="timeout"):  # the same watch, on the worker
            blocking.watch(ctx, time.time() + 5)
        assert 4 < time.monotonic() - started < 30

        guard = DLRoverInstabilitySensor(task_id="guard", job=job, window="2s", deferrable=True)
        with pytest.raises(TaskDeferred) as deferred:
            guard.execute(ctx)
        launcher.kill_node(job_id, "worker-0")
        event = asyncio.run(_first_event(deferred.value.trigger))
        assert event["kind"] == "observation"  # the failure wakes the guard, whose step reports it
        with pytest.raises(DLRoverNodeFailure) as failure:
            guard.execute_complete(ctx, event)
        assert isinstance(failure.value, AirflowException) and not isinstance(failure.value, AirflowFailException)
        [failed] = [e for e in history.records(first["run"], "event") if e["event"] == "node_failed"]
        assert [(n["name"], n["restarts"]) for n in failed["nodes"]] == [("worker-0", 0)] and failed["retryable"]
        TI.try_number = 2
        with pytest.raises(TaskDeferred) as watching:  # the retry recovers, then watches again
            guard.execute(ctx)
        [recovered] = [e for e in history.records(first["run"], "event") if e["event"] == "recovered"]
        assert recovered["node"] == "worker-0" and recovered["try_number"] == 2
        assert {s.name: s.state for s in launcher.status(job_id)}["worker-0"] == "running"
        pids = [node["pid"] for node in launcher.read_job(job_id)["nodes"].values() if node.get("pid")]
        asyncio.run(watching.value.trigger.on_kill())  # the user killed the deferred guard: no orphans
        assert all(n.state == "stopped" for n in launcher.status(job_id))
        assert not [pid for pid in pids if _alive(pid)]
        # the fine-tune watching beside it learns at once, and fails without retry
        with pytest.raises(AirflowFailException, match="was stopped"):
            DLRoverFineTuneOperator(task_id="fine_tune", job=job, quota=QUOTA, deferrable=False).watch(ctx, time.time() + 60)
    finally:
        TI.try_number = 1
        launcher.stop(job_id)


@pytest.mark.jobs
def test_a_plan_past_the_probes_is_measured_refitted_and_planned_again_before_the_launch(airflow_db):
    """Probes under 1.5 cores, a launch under 3: the plan has more than the probes ran, so the
    launch measures it on the running job, refits on the profile with that window, plans again.
    Cold, whatever the session ran before (a similar job's prior would plan without extrapolating)."""
    job, ctx = "checked", context("manual__checked")
    job_args = {**JOB_ARGS, "samples": 10_000_000}  # still training through both checks at the runtime's speed
    DLRoverProfileOperator(task_id="profile", job=job, job_args=job_args, quota=QUOTA,
                           similar_jobs=False).execute(ctx)
    DLRoverFitOperator(task_id="fit", job=job).execute(ctx)
    history = HistoryStore()
    profiled = len(history.samples(job, stage="profile"))
    launch = DLRoverLaunchOperator(task_id="launch", job=job, job_args=job_args, quota={"cpu": 3, "memory": "6Gi"})
    first = launch.execute(ctx)
    try:
        events = history.records(first["run"], "event")
        checks = [e for e in events if e["event"] == "plan_checked"]
        assert 1 <= len(checks) <= C.PLAN_CHECK_PROBES and checks[0]["extrapolation"]
        profile = history.samples(job, run_id=first["run"], stage="profile")
        assert len(profile) == profiled + len(checks)
        keys = ("workers", "ps", "worker_cpu", "ps_cpu")
        for check, row in zip(checks, profile.tail(len(checks)).to_dict("records")):
            assert {k: row[k] for k in keys} == {k: check["config"][k] for k in keys}
            assert row["throughput"] == pytest.approx(check["measured_throughput"])
        [plan] = history.records(first["run"], "plan")
        assert plan["extrapolation"] == {} or len(checks) == C.PLAN_CHECK_PROBES
        assert {k: plan[k] for k in keys} == {k: checks[-1]["replanned"][k] for k in keys}
        assert {k: first["config"][k] for k in keys} == {k: plan[k] for k in keys}
        assert history.latest_model(job).throughput.report.n_samples == len(profile)  # the refit is the run's model
        assert [e["event"] for e in events].index("plan_checked") < [e["event"] for e in events].index("launched")
    finally:
        launch.launcher.stop(first["job_id"])


#: Saves, reports once, then raises: the same bug on every start.
CRASHES_AFTER_ONE_REPORT = """
import json, os, time
with open(os.path.join(os.environ["DLROVER_CHECKPOINT_DIR"], "ckpt.json"), "w") as f:
    json.dump({"samples_done": 512}, f)
with open(os.environ["DLROVER_METRICS_FILE"], "a") as f:
    f.write(json.dumps({"throughput": 1000.0, "samples_done": 512, "samples_total": 10**6}) + "\\n")
time.sleep(0.5)
raise ValueError("embedding row 7 is out of range: the trainer's own bug")
"""


@pytest.mark.jobs
def test_the_guard_fails_without_retry_when_a_trainer_crashes_the_same_way_again(airflow_db, tmp_path):
    """The first crash fails the guard's try (retryable); its retry relaunches the trainer, which
    crashes again before any progress: the guard fails for good, showing the trainer's traceback."""
    script = tmp_path / "train.py"
    script.write_text(CRASHES_AFTER_ONE_REPORT)
    ctx = context("manual__crashes")
    guard = DLRoverInstabilitySensor(task_id="guard", job="crashes", window="1s", deferrable=False)
    run, job_id = guard.run_ids(ctx)
    spec = build_spec(job_id, {"trainer": {"command": [sys.executable, str(script)]}, "samples": 10**6})
    guard.launcher.launch(spec, Configuration(1, 0, 0.5, 0.0, 512.0, 0.0))
    started = time.monotonic()
    try:
        with pytest.raises(DLRoverNodeFailure, match="worker-0 failed: exited 1"):
            guard.execute(ctx)
        TI.try_number = 2
        with pytest.raises(AirflowFailException) as stopped:
            guard.execute(ctx)
        assert "exited 1 again before the job trained any sample more" in str(stopped.value)
        assert "ValueError: embedding row 7 is out of range" in str(stopped.value)
        assert time.monotonic() - started < 60
        failures = [e for e in HistoryStore().records(run, "event") if e["event"] == "node_failed"]
        assert [f["retryable"] for f in failures] == [True, False]
    finally:
        TI.try_number = 1
        guard.launcher.stop(job_id)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def _first_event(trigger):
    async for event in trigger.run():
        return event.payload


def test_job_args_take_a_dataset_a_layout_as_json_text_a_model_and_an_export(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"y": [0, 1] * 500, "price": [1.0, 2.0] * 500, "user": list(range(1000))}),
                   tmp_path / "day.parquet", row_group_size=300)
    layout = {"label": "y", "dense": ["price"], "sparse": [{"name": "user", "table_size": 64, "dim": 8}]}
    spec = build_spec("j", {"data": str(tmp_path / "day.parquet"), "layout": json.dumps(layout),  # as a template renders it
                            "export": str(tmp_path / "models" / "2026-12-01"), "eval_fraction": 0.1})
    assert spec.samples == 900 and spec.held_out == (900, 1000) and spec.dataset.fragment_rows == (300, 300, 300, 100)
    assert spec.layout.dims == (8,) and spec.bottom_mlp[-1] == 8 and spec.export.endswith("2026-12-01")
    for args, field in (({"data": str(tmp_path / "day.parquet"), "layout": {**layout, "dense": ["cost"]}},
                         "job_args.layout column 'cost'"),
                        ({"data": str(tmp_path / "day.parquet"), "layout": "{not json"}, "job_args.layout"),
                        ({"layout": layout, "table_size": 10}, "job_args.layout"),
                        ({"model": "not an import path"}, "job_args.model")):
        with pytest.raises(InvalidInputError) as err:
            build_spec("j", args)
        assert err.value.field == field


def test_a_warm_launch_takes_the_configuration_the_last_run_ended_on(airflow_db):
    """The launch task's state carries the last run's configuration from the history store: the
    warm plan (a prior that ran only 4-core PS, a 1.5-core quota) gives way to it."""
    from airflow_dlrover.optimizer.job_model import fit_job_model
    from sim.synthetic import model_samples

    job, history = "warm-past-the-probes", HistoryStore()
    model = fit_job_model(model_samples(seed=3), leave_one_out=False)
    report = replace(model.throughput.report, probed_range={"ps_cpu": (4.0, 4.0)})
    fit = DLRoverFitOperator(task_id="fit", job=job)
    yesterday = history.start_run(fit.job_identity(), "manual__yesterday")
    history.save_model(yesterday, replace(model, throughput=replace(model.throughput, report=report)))
    last = Configuration(1, 1, 1.0, 0.5, 999.0, 999.0)
    history.add(yesterday, "event", {"event": "launched", "config": last.to_row()})
    history.add(yesterday, "decision", {"action": "keep"})
    ctx, quota = context("manual__today"), {"cpu": 1.5, "memory": "64Gi"}
    fit.execute(ctx)
    planned = DLRoverLaunchOperator(task_id="launch", job=job, job_args=JOB_ARGS, quota=quota,
                                    plan_only=True).execute(ctx)
    keys = ("workers", "ps", "worker_cpu", "ps_cpu")
    assert {k: planned["config"][k] for k in keys} == {k: getattr(last, k) for k in keys}
    assert "the last run ended on" in planned["reason"] and planned["config"]["ps_memory_mb"] != 999.0
