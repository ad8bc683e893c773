"""Where a job runs: the launcher interface (``base``) and its implementations."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow_dlrover.optimizer.types import InvalidInputError


def default_jobs_dir() -> Path:
    """``$AIRFLOW_HOME/dlrover/jobs`` (``~/airflow`` when unset, as Airflow does)."""
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "dlrover" / "jobs"


def make_launcher(kind: str = "local", jobs_dir: str | None = None) -> Any:
    """The launcher of a connection's settings; plain arguments so that triggers can carry them."""
    if kind == "local":
        from airflow_dlrover.launchers.local import LocalLauncher

        return LocalLauncher(jobs_dir or default_jobs_dir())
    raise InvalidInputError("launcher", kind, "local (this release has no Kubernetes launcher yet)")
