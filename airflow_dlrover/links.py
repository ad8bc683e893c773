"""``DLRoverRunLink``: the operator extra link from a DLRover task to its view in our UI plugin.

Registered in the provider info (``extra-links``) so that the API server can rebuild it from the
serialized DAG. The link is the plugin's task view of the task's DAG run (``/dlrover`` under the API
server's ``[api] base_url``), which finds the job by the task's identity.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

#: Where the plugin mounts its app (``plugins.URL_PREFIX``; kept here so that a worker need not
#: import the plugin and its FastAPI app).
PLUGIN_PREFIX = "/dlrover"


class DLRoverRunLink(BaseOperatorLink):
    name = "DLRover-RM"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.sdk import conf

        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
        parts = "/".join(quote(str(p), safe="") for p in (ti_key.dag_id, ti_key.run_id))
        return f"{base}{PLUGIN_PREFIX}/dag-runs/{parts}/tasks/{quote(ti_key.task_id, safe='')}"
