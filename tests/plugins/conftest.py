"""Fixtures of the UI tests: one real DAG run recorded per session, a login, the /dlrover app."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

JOB = "dlrm_daily_retrain"
#: One small run of the example DAG, with a killed worker so that the run has a failure and a
#: recovery to show (the parameters of tests/dags' warm run, known to finish in about a minute).
RUN_CONF = {"samples": 2_400_000, "table_size": 5000, "quota_cpu": 1.5, "quota_memory": "4Gi", "turn": "10s",
            "inject": "kill-worker@4s"}
USER, PASSWORD = "admin", secrets.token_urlsafe(12)
#: Environment of the SimpleAuthManager (a configured user, not "all admins"), shared with subprocesses.
AUTH_ENV = {
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
    "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(64),
}


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


@pytest.fixture(scope="session")
def recorded_run(airflow_db):
    """The example DAG run once with ``dag.test()`` (real tasks, triggers inline, local launcher):
    its Airflow ids and the history run it recorded."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_dlrover.history.store import HistoryStore

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    dagrun = bag.get_dag(JOB).test(run_conf=RUN_CONF)
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
