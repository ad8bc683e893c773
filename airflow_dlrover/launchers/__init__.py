"""Where a job runs: the one launcher (``base.Launcher``) and its backends (``local``, ``kubernetes``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_dlrover.optimizer.types import InvalidInputError

if TYPE_CHECKING:
    from airflow_dlrover.launchers.base import Launcher


def default_jobs_dir() -> Path:
    """``$AIRFLOW_HOME/dlrover/jobs`` (``~/airflow`` when unset, as Airflow does)."""
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "dlrover" / "jobs"


#: The Kubernetes launcher's settings (connection extras, or the operators' ``kubernetes`` argument).
KUBERNETES_OPTIONS = ("kubernetes_conn_id", "namespace", "image", "volume_claim", "data_volume_claim",
                      "service_account", "node_selector", "tolerations", "master_url", "pending_timeout_s",
                      "in_place_resize", "launcher_namespace", "launcher_pod_labels")
_PLACEMENT = ("namespace", "image", "volume_claim", "data_volume_claim", "service_account", "node_selector",
              "tolerations", "launcher_namespace", "launcher_pod_labels")


def make_launcher(kind: str = "local", jobs_dir: str | None = None, options: dict[str, Any] | None = None) -> "Launcher":
    """The launcher of a connection's settings; plain arguments so that triggers can carry them.
    ``options`` are the Kubernetes launcher's settings (:data:`KUBERNETES_OPTIONS`)."""
    if kind == "local":
        from airflow_dlrover.launchers.local import LocalLauncher

        return LocalLauncher(jobs_dir or default_jobs_dir())
    if kind == "kubernetes":
        from airflow_dlrover.launchers.kubernetes import KubernetesLauncher
        from airflow_dlrover.launchers.kubernetes_manifests import Placement

        options = {k: v for k, v in (options or {}).items() if v is not None}
        unknown = sorted(set(options) - set(KUBERNETES_OPTIONS))
        if unknown:
            raise InvalidInputError("kubernetes", unknown[0], ", ".join(KUBERNETES_OPTIONS))
        placement = Placement(**{k: options.pop(k) for k in _PLACEMENT if k in options})
        return KubernetesLauncher(placement, jobs_dir=jobs_dir, **options)
    raise InvalidInputError("launcher", kind, "local | kubernetes")
