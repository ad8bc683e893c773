"""What the UI tests share: the example DAG's small run, the login, two DAGs of two teams."""

import secrets

JOB = "dlrm_daily_retrain"
USER, PASSWORD = "admin", secrets.token_urlsafe(12)
#: Environment of the SimpleAuthManager (a configured user, not "all admins"), shared with subprocesses.
AUTH_ENV = {
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
    "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(64),
}
#: Two DAGs in the metadata DB (``conftest.ui_dags``), each in a bundle of its own team, for the
#: SimpleAuthManager's per-team DAG access (multi-team mode).
DAG_A, DAG_B = "dlrover_ui_dag_a", "dlrover_ui_dag_b"
TEAM_A, TEAM_B = "dlrover_team_a", "dlrover_team_b"
