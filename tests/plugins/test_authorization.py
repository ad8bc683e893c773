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

pytestmark = pytest.mark.unit

#: user → (role, team): alice reads DAG_A, bob DAG_B, carol (no role) nothing, admin everything.
USERS = {"alice": ("viewer", TEAM_A), "bob": ("viewer", TEAM_B), "carol": ("", None)}
#: The history: (job name, DAG) → run keys. "shared" is one name used in both DAGs (two jobs, one
#: per DAG), "cli" ran outside any DAG.
RUNS = {("ctr_a", DAG_A): ["scheduled__1"], ("ctr_b", DAG_B): ["scheduled__1"], ("shared", DAG_A): ["scheduled__2"],
        ("shared", DAG_B): ["scheduled__3"], ("cli", ""): ["cli__1"]}


@pytest.fixture(scope="module")
def history(tmp_path_factory, ui_dags):
    """The runs of :data:`RUNS` in a store of their own: the store, the run ids by (job, DAG) and
    the store's job ids by (job, DAG)."""
    store = HistoryStore(f"sqlite:///{tmp_path_factory.mktemp('auth') / 'history.db'}")
    runs = {}
    for seed, ((job, dag_id), run_keys) in enumerate(RUNS.items()):
        for run_key in run_keys:
            runs[job, dag_id] = record_run(store, job, run_key, dag_id, seed=seed)[0]
    jobs = {(j["job"], j["dag_id"]): j["id"] for j in store.jobs()}
    assert set(jobs) == set(RUNS) and len(set(jobs.values())) == len(RUNS)  # "shared": two jobs, two ids
    return store, runs, jobs


def identities(*jobs: tuple[str, str]) -> list[str]:
    """The identities (``dag_id//name``) of these jobs, in the store's order (name, then DAG)."""
    return [f"{dag_id}//{job}" for job, dag_id in sorted(jobs)]


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
    named = f"{detail['field']}={value!r} "
    assert detail["message"].startswith(named), detail["message"]
    return {**detail, "value": None, "message": detail["message"][len(named):]}


def test_the_job_list_shows_what_the_user_may_read(as_user, history):
    _, runs, jobs = history

    def listed(user):
        return {(j["job"], j["dag_id"]): (j["id"], j["runs"], j["last_run"]["id"])
                for j in as_user(user, "/dlrover/api/jobs").json()}

    def expected(*keys):
        return {key: (jobs[key], 1, runs[key]) for key in keys}

    # the same name in two DAGs is two jobs: each user sees only their DAG's
    assert listed("alice") == expected(("ctr_a", DAG_A), ("shared", DAG_A), ("cli", ""))
    assert listed("bob") == expected(("ctr_b", DAG_B), ("shared", DAG_B), ("cli", ""))
    assert listed("carol") == {}
    assert listed(USER) == expected(*RUNS)


def test_every_route_of_a_run_answers_404_for_a_dag_the_user_may_not_read(as_user, history, dlrover_client):
    _, ids, _ = history
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


def test_a_job_the_user_may_not_read_is_unknown_to_them(as_user, history, dlrover_client):
    _, runs, jobs = history
    never = max(jobs.values()) + 1  # an id that names no job
    for user, readable, refused in (("alice", [("ctr_a", DAG_A), ("shared", DAG_A), ("cli", "")],
                                     [("ctr_b", DAG_B), ("shared", DAG_B)]),
                                    ("bob", [("ctr_b", DAG_B), ("shared", DAG_B), ("cli", "")],
                                     [("ctr_a", DAG_A), ("shared", DAG_A)]),
                                    ("carol", [], list(RUNS)), (USER, list(RUNS), [])):
        allowed = "the id of a recorded job: " + (", ".join(
            f"{jobs[job, dag_id]} ({dag_id}//{job})" for job, dag_id in sorted(readable)) or "none recorded yet")
        for key in readable:  # its own runs only: "shared" in DAG_A is not "shared" in DAG_B
            assert [r["id"] for r in as_user(user, f"/dlrover/api/jobs/{jobs[key]}/runs").json()] == [runs[key]]
            assert as_user(user, f"/dlrover/jobs/{jobs[key]}").status_code == 200, (user, key)
        for path in ("/dlrover/api/jobs/{}/runs", "/dlrover/jobs/{}"):  # the API and the job's page
            nowhere = unknown(as_user(user, path.format(never)), never)
            assert nowhere["field"] == "job" and nowhere["allowed"] == allowed  # lists only what the user may read
            for key in refused:  # the same answer as an id that names no job
                assert unknown(as_user(user, path.format(jobs[key])), jobs[key]) == nowhere, (user, path, key)


def test_the_what_if_planner_plans_only_jobs_the_user_may_read(as_user, history):
    from airflow_dlrover.history.identity import JobIdentity
    from airflow_dlrover.optimizer.planner import plan
    from airflow_dlrover.optimizer.types import Quota

    store, _, jobs = history
    quota = {"cpu": "16", "memory": "64Gi"}

    def what_if(user, key):
        return as_user(user, f"/dlrover/api/jobs/{key if isinstance(key, int) else jobs[key]}/what-if", **quota)

    assert what_if("alice", ("ctr_a", DAG_A)).status_code == 200
    nowhere = unknown(what_if("alice", 999), 999)
    for key in (("ctr_b", DAG_B), ("shared", DAG_B)):
        assert unknown(what_if("alice", key), jobs[key]) == nowhere
    assert nowhere["field"] == "job" and "shared" in nowhere["allowed"] and DAG_B not in nowhere["allowed"]
    # alice's "shared" plans with DAG_A's model, never with bob's run's of the same name
    answer = what_if("alice", ("shared", DAG_A)).json()
    assert answer["identity"] == f"{DAG_A}//shared"
    for dag_id in (DAG_A, DAG_B):
        model = store.latest_model(JobIdentity(dag_id, "", "shared"))
        expected = plan(model.throughput, model.memory, Quota(cpu=16, memory_mb=64 * 1024),
                        batch_size=model.throughput.batch_size).predicted_throughput
        assert (answer["plan"]["predicted_throughput"] == pytest.approx(expected)) == (dag_id == DAG_A)
    assert what_if(USER, ("shared", DAG_B)).json()["identity"] == f"{DAG_B}//shared"
    assert unknown(what_if("carol", ("cli", "")), jobs["cli", ""])["allowed"].endswith("none recorded yet")
    # the what-if page offers only the jobs the user may read (value: the job's id), and preselects one
    options = re.compile(r'<option value="(\d+)"( selected)?>([^<]+)</option>')
    select = re.compile(r'<select name="job" required>(.*?)</select>')

    def offered(user, **params):
        page = as_user(user, "/dlrover/what-if", **params)
        assert page.status_code == 200
        return [(int(i), bool(chosen), text) for i, chosen, text in options.findall(select.search(page.text)[1])]

    mine = [("cli", ""), ("ctr_a", DAG_A), ("shared", DAG_A)]
    assert offered("alice") == [(jobs[k], False, i) for k, i in zip(sorted(mine), identities(*mine))]
    assert offered(USER) == [(jobs[k], False, i) for k, i in zip(sorted(RUNS), identities(*RUNS))]
    assert offered("carol") == []
    assert [i for i, chosen, _ in offered("alice", job=jobs["shared", DAG_A]) if chosen] == [jobs["shared", DAG_A]]
    assert not any(chosen for _, chosen, _ in offered("alice", job=jobs["shared", DAG_B]))  # bob's: not offered


def test_a_dag_run_shows_only_runs_of_dags_the_user_may_read(as_user, history):
    _, ids, _ = history
    # the same run id in both DAGs: each DAG run shows its own DAG's run only
    for user in ("alice", USER):
        [found] = as_user(user, f"/dlrover/api/dag-runs/{DAG_A}/scheduled__1").json()
        assert found["id"] == ids["ctr_a", DAG_A]  # not DAG_B's run of the same run id
    [found] = as_user(USER, f"/dlrover/api/dag-runs/{DAG_B}/scheduled__1").json()
    assert found["id"] == ids["ctr_b", DAG_B]
    for path in (f"/dlrover/api/dag-runs/{DAG_B}/scheduled__1", f"/dlrover/dag-runs/{DAG_B}/scheduled__1",
                 f"/dlrover/dag-runs/{DAG_B}/scheduled__1/tasks/fine_tune"):
        refused = unknown(as_user("alice", path), DAG_B)
        assert refused["field"] == "dag_id"
        assert refused == unknown(as_user("alice", path.replace(DAG_B, "no_such_dag")), "no_such_dag")
    page = as_user("alice", f"/dlrover/dag-runs/{DAG_A}/scheduled__1")
    assert page.status_code == 200 and f'data-run="{ids["ctr_a", DAG_A]}"' in page.text
    assert as_user("bob", f"/dlrover/dag-runs/{DAG_B}/scheduled__1/tasks/fine_tune").status_code == 200
