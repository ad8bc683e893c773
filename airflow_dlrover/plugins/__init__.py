"""The Airflow UI plugin: what the optimizer did, and why.

``DLRoverPlugin`` mounts the ``/dlrover`` FastAPI app (``app.py``: a JSON API over the history
store and the HTML views that chart it) and links its views into the Airflow UI: in the
navigation, and on the DAG-run and task-instance pages with the run and task filled in.
It is registered through the ``airflow.plugins`` entry point; ``plugins/dlrover_plugin.py``
(for users who deploy by copying files into the plugins folder) stands down when that entry
point is installed, so that the plugin is never registered twice (see ``shim.py``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_dlrover.links import PLUGIN_PREFIX as URL_PREFIX

#: The entry point's target, as ``pyproject.toml`` declares it.
ENTRY_POINT = "airflow_dlrover.plugins:DLRoverPlugin"


@lru_cache(maxsize=1)
def _app():
    from airflow_dlrover.plugins.app import create_app

    return create_app()


class DLRoverPlugin(AirflowPlugin):
    name = "dlrover"
    external_views = [
        {"name": "DLRover-RM", "href": f"{URL_PREFIX}/", "destination": "nav", "url_route": "dlrover"},
        {"name": "DLRover-RM", "href": f"{URL_PREFIX}/dag-runs/{{DAG_ID}}/{{RUN_ID}}", "destination": "dag_run",
         "url_route": "dlrover-run"},
        {"name": "DLRover-RM", "href": f"{URL_PREFIX}/dag-runs/{{DAG_ID}}/{{RUN_ID}}/tasks/{{TASK_ID}}",
         "destination": "task_instance", "url_route": "dlrover-task"},
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Built on first use (by the API server only): other Airflow processes load plugins too."""
        return [{"app": _app(), "url_prefix": URL_PREFIX, "name": "DLRover-RM"}]
