"""Provider metadata read by Airflow's ``ProvidersManager`` (entry point ``apache_airflow_provider``).

Keep this module import-free: a broken provider info breaks every ``airflow`` command.
"""

from __future__ import annotations

CONNECTION_FIELDS = {
    "launcher": {"label": "Launcher (local | kubernetes)", "schema": {"type": ["string", "null"], "enum": ["local", "kubernetes", None]}},
    "kubernetes_conn_id": {"label": "Kubernetes connection id", "schema": {"type": ["string", "null"]}},
    "namespace": {"label": "Kubernetes namespace", "schema": {"type": ["string", "null"]}},
    "image": {"label": "Runtime image", "schema": {"type": ["string", "null"]}},
    "volume_claim": {"label": "Kubernetes: ReadWriteMany claim of the job dirs (default dlrover-jobs)", "schema": {"type": ["string", "null"]}},
    "data_volume_claim": {"label": "Kubernetes: claim of the training data (read-only)", "schema": {"type": ["string", "null"]}},
    "service_account": {"label": "Kubernetes: service account of the pods", "schema": {"type": ["string", "null"]}},
    "node_selector": {"label": "Kubernetes: node selector (JSON object)", "schema": {"type": ["object", "null"]}},
    "tolerations": {"label": "Kubernetes: tolerations (JSON list)", "schema": {"type": ["array", "null"]}},
    "launcher_namespace": {"label": "Kubernetes: namespace of the Airflow pods the job's NetworkPolicies admit (default: the job's)", "schema": {"type": ["string", "null"]}},
    "launcher_pod_labels": {"label": "Kubernetes: labels of those Airflow pods (JSON object; default: any pod)", "schema": {"type": ["object", "null"]}},
    "master_url": {"label": "Kubernetes: URL of a job's master API (default: its Service in the cluster)", "schema": {"type": ["string", "null"]}},
    "pending_timeout_s": {"label": "Kubernetes: seconds a pod may stay Unschedulable", "schema": {"type": ["number", "null"], "exclusiveMinimum": 0}},
    "in_place_resize": {"label": "Kubernetes: in-place pod resize (Kubernetes >= 1.33)", "schema": {"type": ["boolean", "null"]}},
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
        "operators": [{"integration-name": "DLRover", "python-modules": [
            "airflow_dlrover.operators.base", "airflow_dlrover.operators.profile", "airflow_dlrover.operators.fit",
            "airflow_dlrover.operators.launch", "airflow_dlrover.operators.finetune",
            "airflow_dlrover.operators.report"]}],
        "sensors": [{"integration-name": "DLRover", "python-modules": ["airflow_dlrover.sensors.guard"]}],
        "triggers": [{"integration-name": "DLRover", "python-modules": ["airflow_dlrover.triggers.job"]}],
        "hooks": [{"integration-name": "DLRover", "python-modules": ["airflow_dlrover.hooks.dlrover"]}],
        "extra-links": ["airflow_dlrover.links.DLRoverRunLink"],
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
