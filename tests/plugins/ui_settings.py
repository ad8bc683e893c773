"""What the UI tests share: the example DAG's small run and the login."""

import secrets

JOB = "dlrm_daily_retrain"
USER, PASSWORD = "admin", secrets.token_urlsafe(12)
#: Environment of the SimpleAuthManager (a configured user, not "all admins"), shared with subprocesses.
AUTH_ENV = {
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
    "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(64),
}
