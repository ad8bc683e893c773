"""The drop-in task group, the watch's turns, progress lines, metrics and extra links — without a
running job (the DAG tests run the group end to end)."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

import pytest

from airflow_dlrover.groups import DLRoverRetrainGroup, model_asset
from airflow_dlrover.operators.job import parse_configuration, parse_quota, rendered
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.triggers.job import Turns, progress_line

pytestmark = pytest.mark.unit


def test_the_group_drops_into_a_dag_in_a_few_lines_with_every_dependency_rule_and_retry():
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("fresh", schedule=None, start_date=datetime(2026, 12, 1)) as dag:
        group = DLRoverRetrainGroup(job="ctr", job_args={"samples": 1000}, quota={"cpu": 2, "memory": "4Gi"})
    ids = {t: f"ctr.{t}" for t in ("profile", "fit", "launch", "fine_tune", "guard", "report")}
    assert set(dag.task_dict) == set(ids.values())
    tasks = {t: dag.task_dict[i] for t, i in ids.items()}
    assert tasks["fit"].upstream_task_ids == {ids["profile"]}
    assert tasks["launch"].upstream_task_ids == {ids["fit"]}
    assert tasks["fine_tune"].upstream_task_ids == tasks["guard"].upstream_task_ids == {ids["launch"]}
    assert tasks["report"].upstream_task_ids == {ids["fine_tune"], ids["guard"]}
    assert tasks["report"].trigger_rule == "all_done" and tasks["report"].outlets == [group.model]
    assert tasks["guard"].retries == 4 and tasks["launch"].retries == 2 and tasks["fine_tune"].retries == 3
    # one source for the shared arguments
    assert {t.job for t in tasks.values()} == {"ctr"}
    assert {json.dumps(t.quota) for t in tasks.values() if t.quota} == {'{"cpu": 2, "memory": "4Gi"}'}
    assert tasks["profile"].job_args is tasks["launch"].job_args
    # the watchers know each other (turns), and the guard's node failures retry quickly
    assert tasks["fine_tune"].sibling_watchers() == [ids["guard"]]
    assert tasks["guard"].sibling_watchers() == [ids["fine_tune"]]
    from airflow_dlrover.sensors.guard import DLRoverNodeFailure

    decision = tasks["guard"].retry_policy.evaluate(DLRoverNodeFailure("worker-0 failed"), 1, 5)
    assert decision.action.value == "retry" and decision.retry_delay == timedelta(seconds=2)
    assert tasks["guard"].retry_policy.evaluate(ValueError("x"), 1, 5).action.value == "default"
    assert group.model == model_asset("ctr", dag_id="fresh", task_group="ctr")
    assert group.model.uri == "dlrover://fresh/ctr"
    DagSerialization.to_dict(dag)  # the scheduler can store it


def test_the_group_works_from_the_taskflow_api_between_other_tasks():
    from airflow.sdk import dag, task

    @task
    def extract():
        return 1

    @task
    def deploy():
        return 2

    @dag(schedule=None, start_date=datetime(2026, 12, 1))
    def taskflow():
        extract() >> DLRoverRetrainGroup(job="tf", trainer={"command": ["python", "t.py"]},
                                         job_args={"samples": 10}) >> deploy()

    built = taskflow()
    assert built.task_dict["tf.profile"].upstream_task_ids == {"extract"}
    assert built.task_dict["deploy"].upstream_task_ids == {"tf.report"}
    assert built.task_dict["tf.launch"].job_args == {"samples": 10, "trainer": {"command": ["python", "t.py"]}}


@pytest.mark.parametrize("job", ["{{ params.job }}", "a b", "", None])
def test_the_group_refuses_a_job_that_is_not_a_literal_name(job):
    from airflow.sdk import DAG

    with DAG("refusal", schedule=None, start_date=datetime(2026, 12, 1)):
        with pytest.raises(ValueError, match=r"^job=.* is invalid: allowed a literal name"):
            DLRoverRetrainGroup(job=job)


def test_rendered_text_becomes_the_value_the_template_meant_without_native_rendering():
    row = {"workers": 2, "ps": 1, "worker_cpu": 0.5, "ps_cpu": 0.5}
    assert parse_configuration("baseline", repr(row)) == parse_configuration("baseline", json.dumps(row))
    assert parse_configuration("baseline", "None") is None and parse_configuration("baseline", "") is None
    assert parse_quota("{'cpu': '2.0', 'memory': '4Gi'}", None).cpu == 2.0
    with pytest.raises(InvalidInputError, match="^layout="):  # literals only: nothing is executed
        rendered("layout", "__import__('os').system('true')")
    for bad, field in (("__import__('os').getcwd()", "baseline"), ("{'workers': 2", "baseline"), ("2w", "baseline")):
        with pytest.raises(InvalidInputError) as err:
            parse_configuration(field, bad)
        assert err.value.field == field


def test_a_sibling_waiting_for_a_slot_gets_a_turn_only_after_waiting_without_a_break():
    class Watch:
        rows, history = [{"throughput": 1.0}], [{"node": "ps-0"}]

    turns = Turns(["g.guard"])
    t0 = 1000.0
    assert turns.due(t0)
    assert turns.event({"g.guard": "deferred"}, t0, Watch) is None
    assert not turns.due(t0 + T.SIBLING_CHECK_S / 2) and turns.due(t0 + T.SIBLING_CHECK_S)
    assert turns.event({"g.guard": "scheduled"}, t0 + 2, Watch) is None  # waiting starts
    assert turns.event({"g.guard": "running"}, t0 + 6, Watch) is None  # it got a slot: the wait resets
    assert turns.event({"g.guard": "queued"}, t0 + 8, Watch) is None
    assert turns.event({"g.guard": "up_for_retry"}, t0 + 8 + T.SIBLING_WAIT_S - 0.1, Watch) is None
    event = turns.event({"g.guard": "up_for_reschedule"}, t0 + 8 + T.SIBLING_WAIT_S, Watch)
    assert event == {"kind": "turn", "rows": Watch.rows, "history": Watch.history}
    assert not Turns([]).due(t0)  # nothing to wait for: never asks Airflow
    # the wait outlives the trigger: each event ends one, and the next starts from the carried time
    carried = Turns(["g.guard"], waiting_since=t0)
    assert carried.event({"g.guard": "up_for_reschedule"}, t0 + T.SIBLING_WAIT_S, Watch)["kind"] == "turn"
    # the fine-tune's guard marked failed between its deferrals (no on_kill ran) leaves the job unguarded ...
    assert Turns(["g.guard", "g.x"], guarded=True).event({"g.guard": "failed", "g.x": "deferred"}, t0, Watch) == {
        "kind": "sibling_failed", "tasks": ["g.guard"]}
    assert Turns(["g.guard"], guarded=True).event({"g.guard": "success"}, t0, Watch) is None
    # ... while the guard watches on past a fine-tune that failed (its own timeout ends it so)
    assert Turns(["g.fine_tune"]).event({"g.fine_tune": "failed"}, t0, Watch) is None


def test_a_fine_tune_whose_guard_failed_stops_the_job_and_fails_without_retry():
    from airflow.exceptions import AirflowFailException

    from airflow_dlrover.operators import DLRoverFineTuneOperator

    class Launcher:
        def __init__(self):
            self.stopped = []

        def stop(self, job_id):
            self.stopped.append(job_id)

    finetune = DLRoverFineTuneOperator(task_id="fine_tune", job="j")
    launcher = finetune.__dict__["launcher"] = Launcher()
    with pytest.raises(AirflowFailException, match="g.guard, guarding it, failed"):
        finetune.execute_complete({}, {"kind": "sibling_failed", "tasks": ["g.guard"], "job_id": "j-1"})
    assert launcher.stopped == ["j-1"]


def test_a_state_is_named_alike_whichever_enum_it_arrives_as():
    from airflow.sdk.api.datamodels._generated import TaskInstanceState as SdkState
    from airflow.utils.state import TaskInstanceState as CoreState

    from airflow_dlrover.triggers.job import WAITING_STATES, state_name

    for state in (SdkState.UP_FOR_RESCHEDULE, CoreState.UP_FOR_RESCHEDULE, "up_for_reschedule"):
        assert state_name(state) == "up_for_reschedule" and state_name(state) in WAITING_STATES


def test_progress_lines_give_rate_share_and_eta():
    assert progress_line(5_632_000, 16_000_000, 41_200.0) == \
        "41,200 samples/s · 35.2 % (5,632,000 of 16,000,000) · ETA 4m11s"
    assert progress_line(0, None, None) == "no rate yet · 0 samples"


def test_the_extra_link_opens_the_plugins_task_view_of_the_run():
    from airflow.models.taskinstancekey import TaskInstanceKey

    from airflow_dlrover.links import DLRoverRunLink

    key = TaskInstanceKey("dag a", "g.guard", "scheduled__2026-12-01T00:00:00+00:00", 1)
    assert DLRoverRunLink().get_link(None, ti_key=key) == \
        "/dlrover/dag-runs/dag%20a/scheduled__2026-12-01T00%3A00%3A00%2B00%3A00/tasks/g.guard"


@pytest.mark.jobs
def test_metrics_reach_a_statsd_server():
    """A real UDP StatsD listener and Airflow's own StatsD client, configured as a user would."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(20)
    code = textwrap.dedent("""
        from airflow_dlrover import metrics
        tags = {"dag_id": "d", "job": "j"}
        metrics.window(tags, 41200.0, 0.5, [
            {"role": "worker", "cpu_used": 0.4, "cpu_limit": 0.5, "memory_used_mb": 300, "memory_limit_mb": 600},
            {"role": "ps", "cpu_used": 0.5, "cpu_limit": 0.5, "memory_used_mb": 100, "memory_limit_mb": 400}])
        metrics.incr("recoveries", tags)
    """)
    env = {**os.environ, "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(server.getsockname()[1]), "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    packets = set()
    while len(packets) < 8:
        packets.add(server.recv(4096).decode())
    lines = {line for packet in packets for line in packet.splitlines()}
    assert "airflow.dlrover.throughput:41200.0|g" in lines
    assert "airflow.dlrover.progress:0.5|g" in lines
    assert "airflow.dlrover.worker_cpu_utilisation:0.8|g" in lines
    assert "airflow.dlrover.ps_memory_utilisation:0.25|g" in lines
    assert "airflow.dlrover.recoveries:1|c" in lines


def test_a_cancellation_keeps_its_message_while_the_trigger_asks_for_its_siblings(monkeypatch):
    """The triggerer calls ``on_kill`` only for a cancellation whose message says the user acted;
    asgiref's ``sync_to_async`` (the siblings' states) drops it unless shielded."""
    import asyncio
    import time as clock

    from airflow_dlrover.triggers import job as trigger_module

    class Launcher:
        def status(self, job_id):
            return []

    class Watch:
        rows, history = [], []

        def __init__(self, launcher, trigger, store=None):
            pass

        def poll(self, statuses):
            return None

    monkeypatch.setattr(trigger_module, "JobWatch", Watch)
    monkeypatch.setattr(trigger_module.DLRoverJobTrigger, "_make_launcher", lambda self: Launcher())
    monkeypatch.setattr(trigger_module, "task_states", lambda *args: clock.sleep(2) or {})
    trigger = trigger_module.DLRoverJobTrigger("j", "guard", siblings=["g.fine_tune"], poll_s=0.01)

    async def cancelled_while_asking() -> tuple:
        task = asyncio.create_task(anext(trigger.run()))
        await asyncio.sleep(0.5)  # inside the 2 s call for the siblings' states
        task.cancel("__airflow_user_action__")
        try:
            await task
        except asyncio.CancelledError as err:
            return err.args
        return ()

    assert asyncio.run(cancelled_while_asking()) == ("__airflow_user_action__",)
