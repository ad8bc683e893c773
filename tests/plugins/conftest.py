"""Fixtures of the UI tests: one real DAG run recorded per session, a login, the /dlrover app."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ui_settings import AUTH_ENV, DAG_A, DAG_B, JOB, PASSWORD, TEAM_A, TEAM_B, USER


@pytest.fixture(scope="session")
def auth_env(airflow_db):
    """The login: user ``admin`` with a password in a passwords file, set in this process's environment."""
    passwords = Path(airflow_db) / "dlrover-ui-passwords.json"
    passwords.write_text(f'{{"{USER}": "{PASSWORD}"}}')
    env = {**AUTH_ENV, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def ui_dags(airflow_db):
    """``DAG_A`` and ``DAG_B`` in the metadata DB, in the bundles of the teams ``TEAM_A`` and
    ``TEAM_B`` (what the auth manager authorises on); removed after the module."""
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.team import Team
    from airflow.utils.session import create_session

    dags = {DAG_A: TEAM_A, DAG_B: TEAM_B}
    with create_session() as session:
        for dag_id, team_name in dags.items():
            bundle = DagBundleModel(name=f"{dag_id}_bundle")
            bundle.teams.append(Team(name=team_name))
            session.add(bundle)
            session.flush()
            session.add(DagModel(dag_id=dag_id, bundle_name=bundle.name, fileloc=f"/{dag_id}.py", is_stale=False))
    yield dags
    with create_session() as session:
        for dag_id, team_name in dags.items():
            session.query(DagModel).filter(DagModel.dag_id == dag_id).delete()
            session.query(DagBundleModel).filter(DagBundleModel.name == f"{dag_id}_bundle").delete()
            session.query(Team).filter(Team.name == team_name).delete()


@pytest.fixture(scope="session")
def recorded_run(killed_worker_run):
    """The session's run of the example DAG with a killed worker (``tests/conftest.py``: real
    tasks, triggers inline, local launcher): its Airflow ids and the history run it recorded."""
    from airflow_dlrover.history.store import HistoryStore

    dagrun = killed_worker_run
    [history_run] = HistoryStore().runs(JOB, run_key=dagrun.run_id)
    return {"dag_id": JOB, "run_id": dagrun.run_id, "state": str(dagrun.state), "id": history_run["id"],
            "tasks": sorted(ti.task_id for ti in dagrun.get_task_instances())}


@pytest.fixture(scope="session")
def dlrover_client(auth_env):
    """The /dlrover app mounted as the API server mounts it, behind the configured auth manager,
    and a token from ``POST /auth/token``."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import init_auth_manager

    from airflow_dlrover.plugins import URL_PREFIX
    from airflow_dlrover.plugins.app import create_app

    sub = create_app()
    root = FastAPI()
    root.mount(URL_PREFIX, sub)
    init_auth_manager(root)
    client = TestClient(root)
    response = client.post("/auth/token", json={"username": USER, "password": PASSWORD})
    assert response.status_code == 201, response.text
    client.app_state = sub
    client.token = response.json()["access_token"]
    return client
