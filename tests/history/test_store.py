"""The history store on SQLite and PostgreSQL (``conftest.py``: the ``store`` of each backend)."""

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.history.store import MAX_ID, SAMPLE_COLUMNS
from airflow_dlrover.optimizer.job_model import fit_job_model
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.operators.job import launcher_job_id
from sim.synthetic import model_samples

pytestmark = pytest.mark.unit

CTR_A = JobIdentity("dag_a", "", "ctr")
CTR_B = JobIdentity("dag_b", "", "ctr")
CTR_B_GROUP = JobIdentity("dag_b", "nightly", "ctr")


def test_runs_are_keyed_by_job_and_reopened_on_retry(store):
    first = store.start_run("ctr", "2026-11-29")
    assert store.start_run("ctr", "2026-11-29") == first  # an Airflow retry reopens its run
    other = store.start_run("ctr", "2026-11-30")
    assert other != first and store.start_run("video", "2026-11-30") not in (first, other)
    store.finish_run(first, "success", {"samples_lost": 0})
    runs = store.runs("ctr")
    assert [r["run_key"] for r in runs] == ["2026-11-29", "2026-11-30"]
    assert runs[0]["status"] == "success" and runs[0]["summary"] == {"samples_lost": 0} and runs[0]["finished"]


def test_samples_round_trip_in_the_vocabulary(store):
    table = model_samples(noise=0.02, seed=1).assign(timestamp=np.arange(12.0))
    run = store.start_run("ctr", "d1")
    assert store.add_samples(run, table) == len(table)
    store.add_samples(store.start_run("other", "d1"), table.iloc[:2])
    back = store.samples("ctr")
    assert list(back.columns) == list(SAMPLE_COLUMNS)
    pd.testing.assert_frame_equal(back[list(table.columns)].astype(float), table.astype(float), check_dtype=False)
    assert back["samples_seen"].isna().all()  # not measured: stays empty, not 0
    assert len(store.samples("ctr", stage="train")) == 0


def test_next_day_finds_yesterdays_model(store):
    yesterday = store.start_run("ctr", "2026-11-29")
    model = fit_job_model(model_samples(), leave_one_out=False)
    store.save_model(yesterday, model)
    today = store.start_run("ctr", "2026-11-30")
    found = store.latest_model("ctr", before_run=today)
    assert found is not None and found.throughput.params == model.throughput.params
    assert found.memory == model.memory
    assert store.latest_model("video") is None


def test_the_prior_is_the_newest_cold_fit_with_the_newest_memory(store):
    samples = model_samples(seed=3)
    day1 = store.start_run("ctr", "d1")
    cold = fit_job_model(samples, leave_one_out=False)
    store.save_model(day1, cold)
    for day in ("d2", "d3"):  # warm-started fits (the prior pulls them): never priors themselves
        run = store.start_run("ctr", day)
        prior = store.prior_model("ctr", before_run=run)
        assert prior.throughput.params == cold.throughput.params
        warm = fit_job_model(model_samples(seed=len(day) + int(day[1:]), noise=0.2).iloc[:6], prior, leave_one_out=False)
        assert warm.throughput.report.warm_start and warm.throughput.params != cold.throughput.params
        store.save_model(run, warm)
    today = store.start_run("ctr", "d4")
    found = store.prior_model("ctr", before_run=today)
    assert found.throughput.params == cold.throughput.params
    assert found.memory == warm.memory  # memory: the newest
    assert store.latest_model("ctr", before_run=today).throughput.params == warm.throughput.params
    recold = fit_job_model(model_samples(seed=9), leave_one_out=False)  # a new cold profile replaces it
    store.save_model(today, recold)
    assert store.prior_model("ctr").throughput.params == recold.throughput.params
    assert store.prior_model("video") is None


def test_the_priors_margins_are_what_the_jobs_oom_history_justifies(store):
    from airflow_dlrover.optimizer import constants as C
    from airflow_dlrover.optimizer.memory import margin_after_ooms

    def day(key, *killed):
        run = store.start_run("ctr", key)
        store.save_model(run, fit_job_model(model_samples(seed=3), leave_one_out=False))
        for node in killed:
            store.add(run, "event", {"event": "recovered", "reason": "oom_killed", "node": node})
        store.add(run, "event", {"event": "recovered", "reason": "node_failed", "node": "worker-1"})
        return run

    day("d0", "worker-0")  # more than MEMORY_OOM_HISTORY_RUNS runs ago by the end
    day("d1", "ps-0", "ps-1")  # two kills in one run count once
    for k in range(2, C.MEMORY_OOM_HISTORY_RUNS):
        day(f"d{k}")
    latest = day("d9", "ps-1")
    today = store.start_run("ctr", "d10")
    history = store.oom_history("ctr", before_run=today)
    assert len(history) == C.MEMORY_OOM_HISTORY_RUNS and history[0] == {"ps"} and history[-1] == {"ps"}
    assert store.oom_history("ctr", before_run=latest)[-2:] == [{"ps"}, {"worker"}]
    memory = store.prior_model("ctr", before_run=today).memory
    assert memory.ps_margin_fraction == pytest.approx(margin_after_ooms(2))  # two kills in one run count once
    assert memory.worker_margin_fraction == C.MEMORY_MARGIN_FRACTION
    assert store.oom_history("video") == []


def test_the_last_configuration_is_where_the_newest_launched_run_ended(store):
    from airflow_dlrover.optimizer.types import Configuration

    def config(workers):
        return Configuration(workers, 2, 1.0, 2.0, 1024.0, 2048.0, 0, 512)

    first = store.start_run("ctr", "d1")
    store.add(first, "event", {"event": "launched", "config": config(4).to_row()})
    store.add(first, "decision", {"action": "resize", "target": config(6).to_row()})
    store.add(first, "decision", {"action": "revert", "target": config(5).to_row()})
    store.add(first, "decision", {"action": "keep"})
    store.add(first, "event", {"event": "instability", "node": "ps-0"})
    second = store.start_run("ctr", "d2")
    store.add(second, "event", {"event": "launched", "config": config(7).to_row()})
    store.add(second, "event", {"event": "recovered", "node": "worker-0"})
    never = store.start_run("ctr", "d3")  # failed before it launched
    store.add(never, "event", {"event": "profiled"})
    today = store.start_run("ctr", "d4")
    assert store.last_configuration("ctr", before_run=second) == config(5)  # the revert's target, last
    assert store.last_configuration("ctr", before_run=today) == config(7)  # the newest run that launched
    assert store.last_configuration("ctr") == config(7)
    assert store.last_configuration("ctr", before_run=first) is None
    assert store.last_configuration("video") is None


def test_a_new_job_finds_the_priors_of_jobs_with_its_signature(store):
    from airflow_dlrover.runtime.spec import JobSpec

    signature = JobSpec("demo").signature()
    model = fit_job_model(model_samples(seed=3), leave_one_out=False)
    for job, sig in ((CTR_A, signature), (CTR_B, signature | {"lookups": 52}),
                     (CTR_B_GROUP, signature | {"trainer": "allreduce"})):
        run = store.start_run(job, "d1")
        store.add(run, "event", {"event": "profiled", "signature": sig})
        store.save_model(run, model)
    store.save_model(store.start_run(JobIdentity("dag_c", "", "unsigned"), "d1"), model)  # no signature: never a source
    new = JobIdentity("dag_new", "", "ctr_sibling")
    found = store.similar_prior(new, signature)
    assert [name for name, _ in found.sources] == [str(CTR_A), str(CTR_B)]
    assert found.similarity == 1.0 and dict(found.sources)[str(CTR_B)] == pytest.approx(0.5)
    assert found.throughput.params == pytest.approx(model.throughput.params)
    assert [name for name, _ in store.similar_prior(CTR_A, signature).sources] == [str(CTR_B)]  # never itself
    assert store.similar_prior(new, signature | {"model": "pkg.mod:build"}) is None


def test_plans_decisions_and_events(store):
    run = store.start_run("ctr", "d1")
    store.add(run, "plan", {"workers": 4, "reason": "max throughput"})
    store.add(run, "decision", {"action": "keep"})
    store.add(run, "decision", {"action": "resize"})
    assert [d["action"] for d in store.records(run, "decision")] == ["keep", "resize"]
    with pytest.raises(ValueError, match="kind='note' is invalid"):
        store.add(run, "note", {})


def test_jobs_runs_by_key_and_models_of_a_run(store):
    first = store.start_run("ctr", "manual__1")
    store.start_run("video", "manual__1")
    store.start_run("ctr", "manual__2")
    assert [(j["dag_id"], j["task_group"], j["job"]) for j in store.jobs()] == [("", "", "ctr"), ("", "", "video")]
    assert [(r["job"], r["run_key"]) for r in store.runs(run_key="manual__1")] == [("ctr", "manual__1"), ("video", "manual__1")]
    assert store.run(first)["job"] == "ctr" and store.run(first)["started"].tzinfo is not None
    assert store.run(999) is None
    fitted = fit_job_model(model_samples(), leave_one_out=False)
    store.save_model(first, fitted)
    store.save_model(first, fitted)
    [a, b] = store.models_of_run(first)
    assert a["id"] < b["id"] and a["document"] == fitted.to_dict()
    assert store.models_of_run(store.start_run("ctr", "manual__2")) == []


def test_the_same_name_in_two_dags_is_two_jobs(store):
    a, b = store.start_run(CTR_A, "scheduled__2026-11-29"), store.start_run(CTR_B, "scheduled__2026-11-29")
    assert a != b and store.start_run(CTR_A, "scheduled__2026-11-29") == a
    assert store.start_run(CTR_B_GROUP, "scheduled__2026-11-29") not in (a, b)  # another group of the same DAG
    assert launcher_job_id(CTR_A, "scheduled__2026-11-29") != launcher_job_id(CTR_B, "scheduled__2026-11-29")
    assert launcher_job_id(CTR_B, "scheduled__2026-11-29") != launcher_job_id(CTR_B_GROUP, "scheduled__2026-11-29")
    assert store.run(a)["dag_id"] == "dag_a" and store.run(b)["dag_id"] == "dag_b"
    assert [r["id"] for r in store.runs(run_key="scheduled__2026-11-29", dag_id="dag_a")] == [a]
    # priors, samples and models never cross DAGs
    model = fit_job_model(model_samples(), leave_one_out=False)
    store.save_model(a, model)
    store.add_samples(a, model_samples(seed=2))
    today = store.start_run(CTR_B, "scheduled__2026-11-30")
    assert store.prior_model(CTR_B, before_run=today) is None and store.latest_model(CTR_B) is None
    assert store.samples(CTR_B).empty and len(store.samples(CTR_A)) == len(model_samples(seed=2))
    assert store.prior_model(CTR_A).throughput.params == model.throughput.params
    # a name with a run is the run's job: what the operators' lookups pass
    assert store.prior_model("ctr", before_run=today) is None
    assert store.prior_model("ctr", before_run=store.start_run(CTR_A, "scheduled__2026-11-30")) is not None


def test_a_shared_name_alone_is_refused_with_the_candidates(store):
    store.start_run(CTR_A, "r1")
    store.start_run(CTR_B, "r1")
    store.start_run(CTR_B_GROUP, "r1")
    for lookup in (lambda: store.runs("ctr"), lambda: store.latest_model("ctr"), lambda: store.samples("ctr"),
                   lambda: store.prior_model("ctr"), lambda: store.identity("ctr", dag_id="dag_b")):
        with pytest.raises(InvalidInputError) as refused:
            lookup()
        assert refused.value.field == "job" and refused.value.value == "ctr"
        assert "dag_b//ctr" in str(refused.value) and "dag_b/nightly/ctr" in str(refused.value)
    assert store.identity("ctr", dag_id="dag_a") == CTR_A
    assert store.identity("ctr", dag_id="dag_b", task_group="nightly") == CTR_B_GROUP
    assert store.identity("ctr", dag_id="dag_c") is None and store.identity("nope") is None
    assert store.runs("nope") == [] and store.latest_model("nope") is None
    [job] = [j for j in store.jobs() if j["dag_id"] == "dag_a"]
    assert store.job(job["id"]) == CTR_A and store.job(10**6) is None


def test_identities_are_checked():
    with pytest.raises(InvalidInputError, match="name='' is invalid"):
        JobIdentity("dag", "", "")
    with pytest.raises(InvalidInputError, match="dag_id=.* at most 250 characters"):
        JobIdentity("d" * 251, "", "ctr")
    assert str(JobIdentity("", "", "ctr")) == "//ctr" and JobIdentity.of("ctr") == JobIdentity("", "", "ctr")


def test_launcher_job_ids_are_dns_labels_and_deterministic():
    long = JobIdentity("a_dag_with_a_long_name_" * 4, "group", "dlrm_daily_retrain")
    for identity in (CTR_A, long, JobIdentity("", "", "ctr")):
        job_id = launcher_job_id(identity, "scheduled__2026-11-30T00:00:00+00:00")
        assert len(job_id) <= 52 and job_id == job_id.lower() and job_id[0].isalnum() and job_id[-1].isalnum()
        assert job_id == launcher_job_id(identity, "scheduled__2026-11-30T00:00:00+00:00")
    assert launcher_job_id(JobIdentity("", "", "ctr"), "manual__1") == "ctr-manual-1"
    # past 52 characters the hash covers all four parts
    assert launcher_job_id(long, "scheduled__2026-11-30") != launcher_job_id(
        JobIdentity("another_dag_with_a_long_name" * 3, "group", "dlrm_daily_retrain"), "scheduled__2026-11-30")


def test_ids_beyond_any_row_find_nothing(store):
    run = store.start_run("ctr", "r1")
    for missing in (run + 1, 2**31, MAX_ID, MAX_ID + 1, 2**70, -1, 0):
        assert store.run(missing) is None and store.records(missing, "plan") == [] and store.job(missing) is None
        assert store.samples_of_run(missing).empty and store.models_of_run(missing) == []
        assert store.samples("ctr", run_id=missing).empty


def test_documents_and_times_read_back_alike_on_every_backend(store):
    run = store.start_run("ctr", "r1")
    document = {"x": 1.5, "nan": math.nan, "inf": [math.inf, -math.inf], "nested": {"s": "é", "n": None, "i": 2**40}}
    store.add(run, "event", document)
    assert store.records(run, "event") == [{"x": 1.5, "nan": None, "inf": [None, None],
                                            "nested": {"s": "é", "n": None, "i": 2**40}}]
    store.finish_run(run, "succeeded", {"share": math.nan})
    row = store.run(run)
    assert row["summary"] == {"share": None}
    for moment in (row["started"], row["finished"]):
        assert moment.tzinfo is not None and moment.utcoffset() == timedelta(0)
        assert abs(moment - datetime.now(timezone.utc)) < timedelta(minutes=1)
    with pytest.raises(InvalidInputError, match="run_key="):
        store.start_run("ctr", "r" * 251)


def test_tasks_that_open_one_run_at_once_share_it(store):
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    for attempt in range(3):  # a new job and run each time: the insert races
        identity, start = JobIdentity("dag", f"g{attempt}", "ctr"), Barrier(4)

        def open_run(_):
            start.wait()
            return store.start_run(identity, "manual__1")

        with ThreadPoolExecutor(4) as pool:
            assert len(set(pool.map(open_run, range(4)))) == 1
    assert len(store.runs(run_key="manual__1")) == 3
