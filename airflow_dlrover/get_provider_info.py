"""Provider metadata read by Airflow's ``ProvidersManager`` (entry point ``apache_airflow_provider``).

Keep this module import-free: a broken provider info breaks every ``airflow`` command.
"""

from __future__ import annotations

CONNECTION_FIELDS = {
    "launcher": {"label": "Launcher (local | kubernetes)", "schema": {"type": ["string", "null"], "enum": ["local", "kubernetes", None]}},
    "kubernetes_conn_id": {"label": "Kubernetes connection id", "schema": {"type": ["string", "null"]}},
    "namespace": {"label": "Kubernetes namespace", "schema": {"type": ["string", "null"]}},
    "image": {"label": "Runtime image", "schema": {"type": ["string", "null"]}},
    "jobs_dir": {"label": "Local launcher: jobs folder (default $AIRFLOW_HOME/dlrover/jobs)", "schema": {"type": ["string", "null"]}},
    "history_url": {"label": "History store SQLAlchemy URL", "schema": {"type": ["string", "null"]}},
    "quota_cpu": {"label": "Default quota: CPU cores", "schema": {"type": ["number", "null"], "minimum": 0}},
    "quota_memory": {"label": "Default quota: memory (e.g. 256Gi)", "schema": {"type": ["string", "null"]}},
    "quota_gpu": {"label": "Default quota: GPUs", "schema": {"type": ["integer", "null"], "minimum": 0}},
    "quota_max_nodes": {"label": "Default quota: max nodes", "schema": {"type": ["integer", "null"], "minimum": 2}},
}


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-dlrover",
        "name": "DLRover resource optimisation",
        "description": "Automatic resource optimisation and recovery for DLRM retraining "
        "(after DLRover-RM, VLDB'24).",
        "integrations": [
            {
                "integration-name": "DLRover",
                "external-doc-url": "https://github.com/intelligent-machine-learning/dlrover",
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": "DLRover", "python-modules": ["airflow_dlrover.operators.dlrover"]}],
        "sensors": [{"integration-name": "DLRover", "python-modules": ["airflow_dlrover.sensors.dlrover"]}],
        "triggers": [{"integration-name": "DLRover", "python-modules": ["airflow_dlrover.triggers.dlrover"]}],
        "hooks": [{"integration-name": "DLRover", "python-modules": ["airflow_dlrover.hooks.dlrover"]}],
        "connection-types": [
            {
                "hook-class-name": "airflow_dlrover.hooks.dlrover.DLRoverHook",
                "hook-name": "DLRover",
                "connection-type": "dlrover",
                "conn-fields": CONNECTION_FIELDS,
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "login", "password", "port", "extra"],
                    "relabeling": {},
                },
            }
        ],
    }
