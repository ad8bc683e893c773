"""Per-DAG authorization of the /dlrover app, with the SimpleAuthManager in multi-team mode: each
user reads the DAGs of their team. A run, a job or a DAG the user may not read answers exactly as
an unknown one (404), and every list leaves it out."""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

import pytest

from airflow_dlrover.plugins.app import get_store
from airflow_dlrover.history.store import HistoryStore
from history_data import record_run
from ui_settings import DAG_A, DAG_B, TEAM_A, TEAM_B, USER

#: user → (role, team): alice reads DAG_A, bob DAG_B, carol (no role) nothing, admin everything.
USERS = {"alice": ("viewer", TEAM_A), "bob": ("viewer", TEAM_B), "carol": ("", None)}
#: The history: job → [(run key, DAG)]; "shared" is one job name used by both DAGs, "cli" ran outside any DAG.
RUNS = {"ctr_a": [("scheduled__1", DAG_A)], "ctr_b": [("scheduled__1", DAG_B)],
        "shared": [("scheduled__2", DAG_A), ("scheduled__3", DAG_B)], "cli": [("cli__1", "")]}


@pytest.fixture(scope="module")
def history(tmp_path_factory, ui_dags):
    """The runs of :data:`RUNS` (ids by (job, DAG)) in a store of their own."""
    store = HistoryStore(f"sqlite:///{tmp_path_factory.mktemp('auth') / 'history.db'}")
    ids = {}
    for seed, (job, runs) in enumerate(RUNS.items()):
        for run_key, dag_id in runs:
            ids[job, dag_id] = record_run(store, job, run_key, dag_id, seed=seed)[0]
    return store, ids


@pytest.fixture(scope="module")
def tokens(dlrover_client, auth_env, history):
    """Multi-team mode and the users of :data:`USERS` beside the admin; a token for each."""
    passwords_file = Path(auth_env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    saved_passwords = passwords_file.read_text()
    passwords = {**json.loads(saved_passwords), **{name: secrets.token_urlsafe(12) for name in USERS}}
    passwords_file.write_text(json.dumps(passwords))
    users = ",".join([f"{USER}:admin", *(":".join(filter(None, (n, r, t))) if r else f"{n}:" for n, (r, t) in USERS.items())])
    env = {"AIRFLOW__CORE__MULTI_TEAM": "True", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    dlrover_client.app_state.dependency_overrides[get_store] = lambda: history[0]
    try:
        out = {USER: dlrover_client.token}
        for name in USERS:
            response = dlrover_client.post("/auth/token", json={"username": name, "password": passwords[name]})
            assert response.status_code == 201, response.text
            out[name] = response.json()["access_token"]
        yield out
    finally:
        dlrover_client.app_state.dependency_overrides.clear()
        passwords_file.write_text(saved_passwords)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture()
def as_user(dlrover_client, tokens):
    def get(user: str, path: str, **params):
        return dlrover_client.get(path, params=params, headers={"Authorization": f"Bearer {tokens[user]}"})

    return get


def run_routes(app) -> list[str]:
    """Every route of one run, API and page."""
    return [route.path for route in app.routes if "{run}" in getattr(route, "path", "")]


def unknown(answer, value) -> dict:
    """The 404's detail with the value it names taken out (to compare two refusals)."""
    assert answer.status_code == 404, answer.text
    detail = answer.json()["detail"]
    assert detail["value"] == value
    return {**detail, "value": None, "message": detail["message"].replace(repr(value), "?")}


def test_the_job_list_shows_what_the_user_may_read(as_user, history):
    _, ids = history

    def listed(user):
        return {j["job"]: (j["dag_id"], j["runs"], j["last_run"]["id"]) for j in as_user(user, "/dlrover/api/jobs").json()}

    assert listed("alice") == {"ctr_a": (DAG_A, 1, ids["ctr_a", DAG_A]), "shared": (DAG_A, 1, ids["shared", DAG_A]),
                               "cli": ("", 1, ids["cli", ""])}
    assert listed("bob") == {"ctr_b": (DAG_B, 1, ids["ctr_b", DAG_B]), "shared": (DAG_B, 1, ids["shared", DAG_B]),
                             "cli": ("", 1, ids["cli", ""])}
    assert listed("carol") == {}
    assert listed(USER) == {"ctr_a": (DAG_A, 1, ids["ctr_a", DAG_A]), "ctr_b": (DAG_B, 1, ids["ctr_b", DAG_B]),
                            "shared": (DAG_B, 2, ids["shared", DAG_B]), "cli": ("", 1, ids["cli", ""])}


def test_every_route_of_a_run_answers_404_for_a_dag_the_user_may_not_read(as_user, history, dlrover_client):
    _, ids = history
    routes = run_routes(dlrover_client.app_state)
    assert len(routes) == 10  # 9 under /api, and the run's page
    for route in routes:
        path = "/dlrover" + route

        def at(run):
            return path.replace("{run}", str(run))

        for user, readable, refused in (("alice", ids["ctr_a", DAG_A], ids["ctr_b", DAG_B]),
                                        ("bob", ids["shared", DAG_B], ids["shared", DAG_A]),
                                        (USER, ids["cli", ""], None), ("carol", None, ids["cli", ""])):
            if readable is not None:
                assert as_user(user, at(readable)).status_code == 200, (user, route)
            if refused is not None:  # the same answer as an id that names no run
                assert unknown(as_user(user, at(refused)), refused) == unknown(as_user(user, at(999)), 999), (user, route)


def test_a_job_the_user_may_not_read_is_unknown_to_them(as_user, history):
    _, ids = history
    refused = as_user("alice", "/dlrover/api/jobs/ctr_b/runs")
    assert unknown(refused, "ctr_b") == unknown(as_user("alice", "/dlrover/api/jobs/nope/runs"), "nope")
    assert refused.json()["detail"]["allowed"] == "one of the recorded jobs: 'cli', 'ctr_a', 'shared'"  # alice's
    assert "none recorded yet" in as_user("carol", "/dlrover/api/jobs/cli/runs").json()["detail"]["allowed"]
    assert [r["id"] for r in as_user("alice", "/dlrover/api/jobs/shared/runs").json()] == [ids["shared", DAG_A]]
    assert [r["id"] for r in as_user(USER, "/dlrover/api/jobs/shared/runs").json()] == [ids["shared", DAG_A],
                                                                                      ids["shared", DAG_B]]
    assert as_user("alice", "/dlrover/jobs/ctr_b").status_code == 404
    assert as_user("alice", "/dlrover/jobs/ctr_a").status_code == 200


def test_the_what_if_planner_plans_only_jobs_the_user_may_read_whole(as_user):
    quota = {"cpu": "16", "memory": "64Gi"}
    assert as_user("alice", "/dlrover/api/jobs/ctr_a/what-if", **quota).status_code == 200
    assert unknown(as_user("alice", "/dlrover/api/jobs/ctr_b/what-if", **quota), "ctr_b")["field"] == "job"
    # the newest model of "shared" may be bob's run's: alice may not plan with it, the admin may
    shared = as_user("alice", "/dlrover/api/jobs/shared/what-if", **quota)
    assert unknown(shared, "shared")["allowed"] == "one of the recorded jobs: 'cli', 'ctr_a'"
    assert as_user(USER, "/dlrover/api/jobs/shared/what-if", **quota).status_code == 200
    jobs = re.compile(r'<select name="job" required>(.*?)</select>')
    assert re.findall(r">([^<]+)</option>", jobs.search(as_user("alice", "/dlrover/what-if").text)[1]) == ["cli", "ctr_a"]
    assert re.findall(r">([^<]+)</option>", jobs.search(as_user(USER, "/dlrover/what-if").text)[1]) == [
        "cli", "ctr_a", "ctr_b", "shared"]


def test_a_dag_run_shows_only_runs_of_dags_the_user_may_read(as_user, history):
    _, ids = history
    [found] = as_user("alice", f"/dlrover/api/dag-runs/{DAG_A}/scheduled__1").json()
    assert found["id"] == ids["ctr_a", DAG_A]  # not DAG_B's run of the same run id
    assert len(as_user(USER, f"/dlrover/api/dag-runs/{DAG_A}/scheduled__1").json()) == 2
    for path in (f"/dlrover/api/dag-runs/{DAG_B}/scheduled__1", f"/dlrover/dag-runs/{DAG_B}/scheduled__1",
                 f"/dlrover/dag-runs/{DAG_B}/scheduled__1/tasks/fine_tune"):
        refused = unknown(as_user("alice", path), DAG_B)
        assert refused["field"] == "dag_id"
        assert refused == unknown(as_user("alice", path.replace(DAG_B, "no_such_dag")), "no_such_dag")
    page = as_user("alice", f"/dlrover/dag-runs/{DAG_A}/scheduled__1")
    assert page.status_code == 200 and f'data-run="{ids["ctr_a", DAG_A]}"' in page.text
    assert as_user("bob", f"/dlrover/dag-runs/{DAG_B}/scheduled__1/tasks/fine_tune").status_code == 200
