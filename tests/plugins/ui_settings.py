"""What the UI tests share: the example DAG's small run and the login."""

import secrets

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
