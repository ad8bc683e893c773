"""``DLRoverHook``: reads the ``dlrover`` connection — launcher, history store, default quota.

Extras are read from an allow-list (``CONNECTION_FIELDS``) and validated; unknown keys are
ignored with a warning, never spread into calls. The default connection ``dlrover_default``
need not exist: the embedded defaults (local launcher, SQLite history under ``AIRFLOW_HOME``)
apply.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from airflow_dlrover.get_provider_info import CONNECTION_FIELDS
from airflow_dlrover.launchers import KUBERNETES_OPTIONS
from airflow_dlrover.optimizer.types import InvalidInputError, Quota

log = logging.getLogger(__name__)

LAUNCHERS = ("local", "kubernetes")


@dataclass(frozen=True)
class DLRoverSettings:
    """What a ``dlrover`` connection configures."""

    launcher: str = "local"
    #: The Kubernetes launcher's settings (``launchers.KUBERNETES_OPTIONS``), validated when used.
    kubernetes: dict[str, Any] = field(default_factory=dict)
    jobs_dir: str | None = None
    history_url: str | None = None
    quota: Quota | None = None


def settings_from_extras(extras: dict[str, Any], conn_id: str = "dlrover_default") -> DLRoverSettings:
    """Validate the allow-listed extras of a connection; errors name ``conn_id`` and the field."""
    unknown = sorted(set(extras) - set(CONNECTION_FIELDS))
    if unknown:
        log.warning("Connection %s: ignoring unknown extra fields %s", conn_id, unknown)
    value = {k: v for k, v in extras.items() if k in CONNECTION_FIELDS and v not in (None, "")}
    launcher = value.get("launcher", "local")
    if launcher not in LAUNCHERS:
        raise InvalidInputError(f"connection {conn_id}: launcher", launcher, " | ".join(LAUNCHERS))
    quota = None
    if "quota_cpu" in value or "quota_memory" in value:
        if not ("quota_cpu" in value and "quota_memory" in value):
            raise InvalidInputError(
                f"connection {conn_id}: quota", {k: v for k, v in value.items() if k.startswith("quota")},
                "both quota_cpu and quota_memory (or neither)",
            )
        try:
            quota = Quota.parse(
                value["quota_cpu"], value["quota_memory"], value.get("quota_gpu", 0), value.get("quota_max_nodes")
            )
        except InvalidInputError as err:
            raise InvalidInputError(f"connection {conn_id}: quota_{err.field}", err.value, err.allowed) from None
    return DLRoverSettings(
        launcher=launcher,
        kubernetes={k: v for k, v in value.items() if k in KUBERNETES_OPTIONS},
        jobs_dir=value.get("jobs_dir"),
        history_url=value.get("history_url"),
        quota=quota,
    )


class DLRoverHook(BaseHook):
    """Interact with DLRover-RM: the launcher and history store a ``dlrover`` connection names.

    :param dlrover_conn_id: the ``dlrover`` connection; ``dlrover_default`` falls back to the
        embedded defaults when it does not exist.
    """

    conn_name_attr = "dlrover_conn_id"
    default_conn_name = "dlrover_default"
    conn_type = "dlrover"
    hook_name = "DLRover"

    def __init__(self, dlrover_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.dlrover_conn_id = dlrover_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {"hidden_fields": ["host", "schema", "login", "password", "port", "extra"], "relabeling": {}}

    @cached_property
    def settings(self) -> DLRoverSettings:
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            connection = self.get_connection(self.dlrover_conn_id)
        except AirflowNotFoundException as err:
            # Only a connection that does not exist falls back to the embedded defaults. Any other
            # error (the metadata API did not answer) propagates and the task is retried: falling
            # back then would turn a Kubernetes job into a local one, and a retry start a second copy.
            if self.dlrover_conn_id != self.default_conn_name:
                raise InvalidInputError(
                    "dlrover_conn_id", self.dlrover_conn_id, "an existing connection of type dlrover",
                    f"({type(err).__name__}: {err})",
                ) from None
            return DLRoverSettings()
        if connection.conn_type not in (None, "", self.conn_type):
            raise InvalidInputError(
                f"connection {self.dlrover_conn_id}: conn_type", connection.conn_type, self.conn_type
            )
        return settings_from_extras(connection.extra_dejson, self.dlrover_conn_id)

    def get_history(self):
        """The history store the connection names (default: SQLite under ``AIRFLOW_HOME``)."""
        from airflow_dlrover.history.store import HistoryStore

        return HistoryStore(self.settings.history_url)

    def launcher_options(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The connection's Kubernetes settings with a task's ``kubernetes`` argument over them."""
        if overrides is not None and not isinstance(overrides, dict):
            raise InvalidInputError("kubernetes", overrides, "a dict of " + ", ".join(KUBERNETES_OPTIONS))
        return {**self.settings.kubernetes, **(overrides or {})}

    def get_launcher(self, overrides: dict[str, Any] | None = None):
        """The launcher the connection names (default: local processes under ``jobs_dir``)."""
        from airflow_dlrover.launchers import make_launcher

        return make_launcher(self.settings.launcher, self.settings.jobs_dir, self.launcher_options(overrides))

    def test_connection(self) -> tuple[bool, str]:
        try:
            settings = self.settings
        except InvalidInputError as err:
            return False, str(err)
        return True, f"launcher={settings.launcher}, quota={settings.quota}"
