import numpy as np
import pandas as pd
import pytest

from airflow_dlrover.history.store import SAMPLE_COLUMNS, HistoryStore
from airflow_dlrover.optimizer.job_model import fit_job_model
from synthetic import model_samples


@pytest.fixture()
def store(tmp_path):
    return HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")


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
    assert store.jobs() == ["ctr", "video"]
    assert [(r["job"], r["run_key"]) for r in store.runs(run_key="manual__1")] == [("ctr", "manual__1"), ("video", "manual__1")]
    assert store.run(first)["job"] == "ctr" and store.run(first)["started"].tzinfo is not None
    assert store.run(999) is None
    fitted = fit_job_model(model_samples(), leave_one_out=False)
    store.save_model(first, fitted)
    store.save_model(first, fitted)
    [a, b] = store.models_of_run(first)
    assert a["id"] < b["id"] and a["document"] == fitted.to_dict()
    assert store.models_of_run(store.start_run("ctr", "manual__2")) == []
