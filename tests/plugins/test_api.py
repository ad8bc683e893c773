"""The /dlrover JSON API: login required on every data route; the JSON of a synthetic history and of
a run recorded by the real example DAG; errors that name the field, the value and what is allowed."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.history.store import HistoryStore
from airflow_dlrover.optimizer.planner import plan
from airflow_dlrover.optimizer.types import Quota
from airflow_dlrover.plugins.app import get_store
from airflow_dlrover.plugins.queries import MAX_ID
from history_data import T0, hot_evidence, record_run
from ui_settings import DAG_A, DAG_B

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory, ui_dags):
    """A finished run of the DAG ``DAG_A`` in a store of its own (``history_data.record_run``)."""
    store = HistoryStore(f"sqlite:///{tmp_path_factory.mktemp('ui') / 'history.db'}")
    run, model, chosen = record_run(store, "ctr", "scheduled__2026-11-29", DAG_A)
    return store, run, model, chosen


@pytest.fixture()
def synthetic_client(dlrover_client, synthetic):
    dlrover_client.app_state.dependency_overrides[get_store] = lambda: synthetic[0]
    yield dlrover_client
    dlrover_client.app_state.dependency_overrides.clear()


def data_routes(app) -> list[str]:
    """Every GET route under /api, with its path parameters filled in."""
    fill = {"job": "1", "run": "1", "dag_id": DAG_A, "run_id": "r"}
    return ["/dlrover" + re.sub(r"\{(\w+)\}", lambda m: fill[m.group(1)], route.path)
            for route in app.routes if getattr(route, "path", "").startswith("/api")]


def get(client, path: str, **params):
    return client.get(path, params=params, headers={"Authorization": f"Bearer {client.token}"})


def test_every_data_route_requires_a_login(synthetic_client):
    routes = data_routes(synthetic_client.app_state)
    assert len(routes) == 13
    for path in routes:
        query = {"cpu": "8", "memory": "32Gi"} if path.endswith("what-if") else {}
        assert synthetic_client.get(path, params=query).status_code == 401, path
        assert synthetic_client.get(path, params=query, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
        assert get(synthetic_client, path, **query).status_code == 200, path
    # the UI's cookie is a login too (the views fetch with it)
    assert synthetic_client.get("/dlrover/api/jobs", cookies={"_token": synthetic_client.token}).status_code == 200


def test_pages_redirect_to_the_login_and_openapi_is_public(synthetic_client):
    page = synthetic_client.get("/dlrover/runs/1", follow_redirects=False)
    assert page.status_code == 303 and "/auth/login?next=" in page.headers["location"]
    assert get(synthetic_client, "/dlrover/runs/1").status_code == 200
    spec = synthetic_client.get("/dlrover/openapi.json").json()
    assert {"/api/jobs", "/api/runs/{run}/curves", "/api/jobs/{job}/what-if"} <= set(spec["paths"])
    assert synthetic_client.get("/dlrover/static/chart.umd.min.js").text.startswith("/*!\n * Chart.js v4")


def test_jobs_and_runs(synthetic_client, synthetic):
    store, run, _, chosen = synthetic
    [job] = get(synthetic_client, "/dlrover/api/jobs").json()
    assert (job["job"], job["dag_id"], job["task_group"], job["identity"]) == ("ctr", DAG_A, "", f"{DAG_A}//ctr")
    assert job["runs"] == 1 and store.job(job["id"]) == JobIdentity(DAG_A, "", "ctr")
    last = job["last_run"]
    assert last["id"] == run and last["status"] == "succeeded" and last["measured_throughput"] == 1050.0
    assert last["plan"]["workers"] == chosen.config.workers and last["recoveries"] == 1
    [row] = get(synthetic_client, f"/dlrover/api/jobs/{job['id']}/runs").json()
    assert row["run_key"] == "scheduled__2026-11-29" and row["started"].endswith("+00:00")
    assert (row["dag_id"], row["task_group"], row["job_ref"]) == (DAG_A, "", job["id"])
    detail = get(synthetic_client, f"/dlrover/api/runs/{run}").json()
    assert detail["counts"] == {"samples": len(store.samples_of_run(run)), "models": 2, "plans": 1, "decisions": 2,
                                "events": 4}


def test_samples_models_plans_decisions_events(synthetic_client, synthetic):
    store, run, model, chosen = synthetic
    samples = get(synthetic_client, f"/dlrover/api/runs/{run}/samples").json()
    assert len(samples) == len(store.samples_of_run(run))
    assert len(get(synthetic_client, f"/dlrover/api/runs/{run}/samples", stage="finetune").json()) == 12
    assert sum(s["ps_memory_used_mb"] is None for s in samples) == 1  # not measured: null, not NaN
    models = get(synthetic_client, f"/dlrover/api/runs/{run}/models").json()
    assert models[0]["document"]["throughput"]["params"] == pytest.approx(model.throughput.params)
    plans = get(synthetic_client, f"/dlrover/api/runs/{run}/plans").json()
    assert plans["chosen"]["predicted_throughput"] == pytest.approx(chosen.predicted_throughput)
    assert len(plans["alternatives"]) == len(chosen.alternatives) and len(plans["pareto_front"]) == len(chosen.pareto_front)
    assert plans["baseline"]["predicted_throughput"] == 1234.0
    assert [d["action"] for d in get(synthetic_client, f"/dlrover/api/runs/{run}/decisions").json()] == ["keep", "resize"]
    assert len(get(synthetic_client, f"/dlrover/api/runs/{run}/events").json()) == 4
    [failure] = get(synthetic_client, f"/dlrover/api/runs/{run}/events", event="node_failed").json()
    assert failure["nodes"][0]["state"] == "oom_killed"
    rows = get(synthetic_client, f"/dlrover/api/runs/{run}/instability").json()
    assert [(r["kind"], r["node"]) for r in rows] == [("node_failed", "worker-1"), ("recovered", "worker-1"),
                                                      ("hot_ps", "ps-0")]
    assert rows[2]["evidence"] == hot_evidence() and rows[2]["action"] == {"kind": "heal", "cpu": 3.0}
    assert rows[2]["outcome"] == "ps-0 set to 3 CPU in place" and rows[2]["reason"].startswith("ps-0 uses 1.94 of 2")
    assert rows[1]["action"] == {"kind": "relaunch", "memory_mb": 768}
    assert rows[1]["reason"] == "worker-1 OOM-killed at 512 MB: relaunched with 768 MB"


def test_curves_follow_the_model_through_the_plan(synthetic_client, synthetic):
    store, run, model, chosen = synthetic
    curves = get(synthetic_client, f"/dlrover/api/runs/{run}/curves").json()
    assert curves["base_from"] == "plan" and curves["model_index"] == 0 and curves["models"] == 2
    for axis, curve in curves["axes"].items():
        x, mean = np.array(curve["x"]), np.array(curve["mean"])
        assert np.all(np.array(curve["lower"]) <= mean) and np.all(mean <= np.array(curve["upper"]))
        assert getattr(chosen.config, axis) in curve["x"]  # the plan lies on each curve
        grid = pd.DataFrame({**{a: getattr(chosen.config, a) for a in ("workers", "ps", "worker_cpu", "ps_cpu")},
                             axis: x, "batch_size": chosen.config.batch_size})
        assert mean == pytest.approx(model.throughput.predict(grid, band=False))
        assert len(curve["points"]) == len(store.samples_of_run(run))
    # on-slice points share the plan's other three coordinates
    for p in curves["axes"]["workers"]["points"]:
        same = all(p["config"][a] == getattr(chosen.config, a) for a in ("ps", "worker_cpu", "ps_cpu"))
        assert p["on_slice"] == same
    latest = get(synthetic_client, f"/dlrover/api/runs/{run}/curves", model=-1).json()
    assert latest["model_index"] == 1 and latest["axes"]["workers"]["mean"] != curves["axes"]["workers"]["mean"]


def test_timeline_totals_per_role_and_marks(synthetic_client, synthetic):
    store, run, _, chosen = synthetic
    timeline = get(synthetic_client, f"/dlrover/api/runs/{run}/timeline").json()
    started = store.run(run)["started"].timestamp()
    rows = timeline["samples"]
    assert len(rows) == len(store.samples_of_run(run)) and [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    last, c = rows[-1], chosen.config
    assert last["t"] == pytest.approx(T0 + 70 + 33 - started)
    assert last["worker_cpu_allocated"] == pytest.approx(c.workers * c.worker_cpu)
    assert last["worker_cpu_used"] == pytest.approx(0.8 * c.workers * c.worker_cpu)
    assert last["ps_memory_allocated_mb"] == pytest.approx(c.ps * c.ps_memory_mb)
    assert [d["action"] for d in timeline["decisions"]] == ["keep", "resize"]
    assert timeline["decisions"][1]["t"] == pytest.approx(T0 + 100 - started)
    assert [e["event"] for e in timeline["events"]] == ["launched", "node_failed", "recovered", "instability"]


def test_what_if_is_the_planner(synthetic_client, synthetic):
    answer = get(synthetic_client, "/dlrover/api/jobs/1/what-if", cpu="32", memory="128Gi", objective="efficiency")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    model = synthetic[0].latest_model("ctr")
    expected = plan(model.throughput, model.memory, Quota(cpu=32, memory_mb=128 * 1024), "efficiency",
                    batch_size=model.throughput.batch_size)
    assert body["plan"]["workers"] == expected.config.workers and body["plan"]["ps"] == expected.config.ps
    assert body["plan"]["predicted_throughput"] == pytest.approx(expected.predicted_throughput)
    assert body["plan"]["cores"] <= 32 and body["quota"]["memory_mb"] == 128 * 1024
    assert body["identity"] == f"{DAG_A}//ctr"
    deadline = get(synthetic_client, "/dlrover/api/jobs/1/what-if", cpu="32", memory="128Gi",
                   objective="deadline", samples="1e7", deadline="3h").json()
    assert deadline["deadline_s"] == 3 * 3600 and deadline["plan"]["objective"] == "deadline"


@pytest.mark.parametrize(("path", "params", "status", "field", "allowed"), [
    ("/dlrover/api/runs/999", {}, 404, "run", "the id of a recorded run"),
    ("/dlrover/api/jobs/999/runs", {}, 404, "job", f"the id of a recorded job: 1 ({DAG_A}//ctr)"),
    ("/dlrover/api/jobs/999/what-if", {"cpu": "8", "memory": "32Gi"}, 404, "job", "the id of a recorded job"),
    ("/dlrover/api/jobs/1/what-if", {"cpu": "eight", "memory": "32Gi"}, 422, "cpu", "a number"),
    ("/dlrover/api/jobs/1/what-if", {"cpu": "-2", "memory": "32Gi"}, 422, "cpu", "a number > 0"),
    ("/dlrover/api/jobs/1/what-if", {"cpu": "8", "memory": "12XB"}, 422, "memory", "a quantity like 512Mi"),
    ("/dlrover/api/jobs/1/what-if", {"cpu": "0.6", "memory": "32Gi"}, 422, "cpu", "a quota of at least cpu=1"),
    ("/dlrover/api/jobs/1/what-if", {"cpu": "8", "memory": "32Gi", "max_nodes": "1"}, 422, "max_nodes", "≥ 2"),
    ("/dlrover/api/jobs/1/what-if", {"cpu": "8", "memory": "32Gi", "objective": "deadline", "samples": "1e9",
                                       "deadline": "1s"}, 422, "deadline", "≥"),
    ("/dlrover/api/jobs/1/what-if", {"cpu": "8", "memory": "32Gi", "deadline": "soon"}, 422, "deadline",
     "a duration like"),
    ("/dlrover/api/runs/1/curves", {"model": "5"}, 422, "model", "an index into the run's 2 models"),
])
def test_bad_input_names_the_field_the_value_and_what_is_allowed(synthetic_client, path, params, status, field, allowed):
    answer = get(synthetic_client, path, **params)
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert detail["field"] == field and allowed in detail["allowed"]
    assert detail["message"].startswith(f"{field}=")


def test_fastapi_validation_names_the_field_too(synthetic_client):
    for path, params, name in (("/dlrover/api/runs/abc", {}, "run"),
                               ("/dlrover/api/jobs/1/what-if", {"cpu": "8", "memory": "1Gi", "objective": "fast"},
                                "objective"),
                               ("/dlrover/api/jobs/ctr/runs", {}, "job"),
                               ("/dlrover/api/runs/1/samples", {"stage": "train"}, "stage")):
        answer = get(synthetic_client, path, **params)
        assert answer.status_code == 422
        [error] = answer.json()["detail"]
        assert error["loc"][-1] == name and error["input"] in ("abc", "fast", "train", "ctr")


@pytest.mark.parametrize(("name", "routes"), [("run", 10), ("job", 3)])
@pytest.mark.parametrize("value", [0, -1, MAX_ID + 1, 2**63, 2**64, 99999999999999999999])
def test_an_id_no_store_can_hold_is_refused_on_every_route(synthetic_client, name, routes, value):
    """A run or job id beyond a store's integer (2**63 overflowed SQLite: a server error) is bad
    input, on every route that takes one (API and page), and the OpenAPI says so."""
    paths = [route.path for route in synthetic_client.app_state.routes if f"{{{name}}}" in getattr(route, "path", "")]
    assert len(paths) == routes
    for path in paths:
        query = {"cpu": "8", "memory": "32Gi"} if path.endswith("what-if") else {}
        answer = get(synthetic_client, "/dlrover" + path.replace(f"{{{name}}}", str(value)), **query)
        assert answer.status_code == 422, (path, answer.text)
        [error] = answer.json()["detail"]
        assert error["loc"] == ["path", name] and error["type"] in ("greater_than_equal", "less_than_equal")
    # the what-if page's preselected job is bounded too
    answer = get(synthetic_client, "/dlrover/what-if", job=str(value))
    assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["query", "job"]
    spec = synthetic_client.get("/dlrover/openapi.json").json()
    declared = [p["schema"] for item in spec["paths"].values()
                for p in item["get"].get("parameters", []) if p["name"] == name]
    assert len(declared) == routes - 1  # every API route (the page is not in the OpenAPI)
    assert all((d["minimum"], d["maximum"]) == (1, MAX_ID) for d in declared)


def test_the_dag_run_view_resolves_the_airflow_run(synthetic_client, synthetic):
    _, run, _, _ = synthetic
    [found] = get(synthetic_client, f"/dlrover/api/dag-runs/{DAG_A}/scheduled__2026-11-29").json()
    assert found["id"] == run and found["job"] == "ctr"
    page = get(synthetic_client, f"/dlrover/dag-runs/{DAG_A}/scheduled__2026-11-29")
    assert page.status_code == 200 and f'data-run="{run}"' in page.text
    none = get(synthetic_client, f"/dlrover/dag-runs/{DAG_A}/manual__1")
    assert none.status_code == 200 and 'id="none-recorded"' in none.text


@pytest.fixture()
def two_dags(dlrover_client, tmp_path, ui_dags):
    """Two DAGs whose jobs share a name and a run id, one with the job in a task group as well."""
    store = HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")
    runs = {identity: store.start_run(identity, "scheduled__2026-11-29") for identity in (
        JobIdentity(DAG_A, "", "ctr"), JobIdentity(DAG_B, "", "ctr"), JobIdentity(DAG_B, "nightly", "ctr"))}
    dlrover_client.app_state.dependency_overrides[get_store] = lambda: store
    yield dlrover_client, store, runs
    dlrover_client.app_state.dependency_overrides.clear()


def test_a_dag_run_never_shows_another_dags_run_of_the_same_job_and_run_id(two_dags):
    client, store, runs = two_dags
    x, y, y_nightly = runs.values()
    [found] = get(client, f"/dlrover/api/dag-runs/{DAG_A}/scheduled__2026-11-29").json()
    assert found["id"] == x
    assert [r["id"] for r in get(client, f"/dlrover/api/dag-runs/{DAG_B}/scheduled__2026-11-29").json()] == [y, y_nightly]
    assert f'data-run="{x}"' in get(client, f"/dlrover/dag-runs/{DAG_A}/scheduled__2026-11-29").text
    listed = get(client, f"/dlrover/dag-runs/{DAG_B}/scheduled__2026-11-29").text  # two jobs: a list of both
    assert f'/runs/{y}"' in listed and f'/runs/{y_nightly}"' in listed and f'/runs/{x}"' not in listed
    # every job has its own page and its own runs
    jobs = get(client, "/dlrover/api/jobs").json()
    assert [j["identity"] for j in jobs] == [f"{DAG_A}//ctr", f"{DAG_B}//ctr", f"{DAG_B}/nightly/ctr"]
    for job, run in zip(jobs, runs.values()):
        assert [r["id"] for r in get(client, f"/dlrover/api/jobs/{job['id']}/runs").json()] == [run]
        assert "Runs of ctr" in get(client, f"/dlrover/jobs/{job['id']}").text


def test_a_task_opens_the_run_of_its_own_group(two_dags, monkeypatch):
    from airflow_dlrover.plugins import app

    client, store, runs = two_dags
    x, y, y_nightly = runs.values()
    groups = {"guard": None, "nightly.guard": "nightly"}
    monkeypatch.setattr(app, "serialized_task", lambda dag_id, task_id: SimpleNamespace(
        task_type="DLRoverInstabilitySensor", task_group=SimpleNamespace(group_id=groups[task_id])))
    page = get(client, f"/dlrover/dag-runs/{DAG_B}/scheduled__2026-11-29/tasks/nightly.guard").text
    assert f'data-run="{y_nightly}"' in page and 'data-section="instability"' in page
    assert f'data-run="{y}"' in get(client, f"/dlrover/dag-runs/{DAG_B}/scheduled__2026-11-29/tasks/guard").text
    assert f'data-run="{x}"' in get(client, f"/dlrover/dag-runs/{DAG_A}/scheduled__2026-11-29/tasks/guard").text


# --------------------------------------------------------------------------------------------
# A run recorded by the real example DAG
# --------------------------------------------------------------------------------------------


@pytest.mark.dag
def test_the_json_of_a_run_recorded_by_the_example_dag(dlrover_client, recorded_run):
    store = HistoryStore()  # the one the DAG's tasks wrote (the default connection)
    run = recorded_run["id"]
    assert recorded_run["state"] == "success"
    detail = get(dlrover_client, f"/dlrover/api/runs/{run}").json()
    assert detail["status"] == "succeeded" and detail["run_key"] == recorded_run["run_id"]
    assert detail["summary"]["samples_lost"] == 0
    samples = store.samples_of_run(run)
    assert detail["counts"]["samples"] == len(samples) > 0
    profile = get(dlrover_client, f"/dlrover/api/runs/{run}/samples", stage="profile").json()
    checks = sum(e["event"] == "plan_checked" for e in store.records(run, "event"))
    assert len(profile) == (samples["stage"] == "profile").sum() == detail["summary"]["probes"] + checks

    plans = get(dlrover_client, f"/dlrover/api/runs/{run}/plans").json()
    recorded_plan = store.records(run, "plan")[-1]
    job = detail["summary"]["job"]
    assert plans["chosen"]["workers"] == recorded_plan["workers"]
    assert job["config"]["workers"] == recorded_plan["workers"] or job["resizes"] > 0  # the fine-tune may resize
    assert plans["chosen"]["reason"] == detail["summary"]["plan"]["reason"]
    assert plans["chosen"]["cores"] <= 1.5 + 1e-9 and plans["pareto_front"]
    assert plans["baseline"] == recorded_plan["baseline"]

    curves = get(dlrover_client, f"/dlrover/api/runs/{run}/curves").json()
    assert curves["models"] == len(store.models_of_run(run)) >= 1 and curves["base_from"] == "plan"
    for axis in ("workers", "ps", "worker_cpu", "ps_cpu"):
        assert recorded_plan[axis] in curves["axes"][axis]["x"]
        assert sum(p["stage"] == "profile" for p in curves["axes"][axis]["points"]) == len(profile)

    timeline = get(dlrover_client, f"/dlrover/api/runs/{run}/timeline").json()
    assert len(timeline["samples"]) == len(samples)
    assert all(0 <= r["t"] < detail["summary"]["run_seconds"] + 1 for r in timeline["samples"])
    assert {"profiled", "launched", "node_failed", "recovered"} <= {e["event"] for e in timeline["events"]}
    assert len(timeline["decisions"]) == len(store.records(run, "decision"))
    used = [r["worker_cpu_used"] for r in timeline["samples"] if r["stage"] == "finetune"]
    assert used and all(u is not None and u > 0 for u in used)

    rows = get(dlrover_client, f"/dlrover/api/runs/{run}/instability").json()
    failure = next(r for r in rows if r["kind"] == "node_failed")
    recovery = next(r for r in rows if r["kind"] == "recovered")
    assert failure["node"] == recovery["node"] == "worker-0"
    assert recovery["evidence"]["try_number"] == failure["evidence"]["try_number"] + 1

    [job] = [j for j in get(dlrover_client, "/dlrover/api/jobs").json()
             if (j["dag_id"], j["job"]) == ("dlrm_daily_retrain", "dlrm_daily_retrain")]
    assert job["task_group"] == "dlrm_daily_retrain"  # DLRoverRetrainGroup's group is named after the job
    assert job["last_run"]["id"] == store.runs("dlrm_daily_retrain")[-1]["id"]
    what_if = get(dlrover_client, f"/dlrover/api/jobs/{job['id']}/what-if", cpu="1.5", memory="4Gi").json()
    model = store.latest_model("dlrm_daily_retrain")
    expected = plan(model.throughput, model.memory, Quota(cpu=1.5, memory_mb=4096), batch_size=model.throughput.batch_size)
    assert what_if["plan"]["predicted_throughput"] == pytest.approx(expected.predicted_throughput)
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(curves))


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value
