"""The launcher interface that the local and the Kubernetes launchers share, and node recovery.

A launcher places a job's nodes (master, PS, workers) somewhere with the resources of a plan:
``launch(spec, config)`` (idempotent on the job id: a second call adopts the running job),
``resize(job_id, config)``, ``status(job_id)``, ``metrics(job_id)``,
``relaunch(job_id, node, cpu=, memory_mb=)`` and ``stop(job_id)``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_dlrover.optimizer.types import Configuration
from airflow_dlrover.runtime.spec import JobSpec

#: Node states. ``oom_killed``, ``failed``, ``lost`` and ``unschedulable`` (a pod the cluster could
#: not place for longer than a threshold) are recovered by relaunching the node; ``pending`` is a
#: node that is starting.
RUNNING, SUCCEEDED, FAILED, OOM_KILLED, LOST, STOPPED, PENDING, UNSCHEDULABLE = (
    "running", "succeeded", "failed", "oom_killed", "lost", "stopped", "pending", "unschedulable"
)
FAILED_STATES = (FAILED, OOM_KILLED, LOST, UNSCHEDULABLE)

#: After a real OOM kill the node comes back with this factor more memory (once per OOM).
OOM_MEMORY_GROWTH = 1.5


@dataclass(frozen=True)
class NodeStatus:
    name: str
    role: str  # master | ps | worker
    index: int
    state: str
    cpu: float | None
    memory_mb: float | None
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    oom_kills: int = 0


class Launcher(Protocol):
    def launch(self, spec: JobSpec, config: Configuration) -> str: ...
    def resize(self, job_id: str, config: Configuration) -> dict[str, Any]: ...
    def status(self, job_id: str) -> list[NodeStatus]: ...
    def metrics(self, job_id: str) -> dict[str, Any]: ...
    def relaunch(self, job_id: str, node: str, cpu: float | None = None, memory_mb: float | None = None) -> NodeStatus: ...
    def stop(self, job_id: str) -> None: ...


def call_master(base_url: str, path: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
    """One request to a job master's HTTP API (GET without ``body``, POST with it), retried until
    ``timeout`` while the master is unreachable; raises ``ConnectionError`` after that."""
    url = f"{base_url.rstrip('/')}{path}"
    data = None if body is None else json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    while True:
        try:
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                text = reply.read()
            return text.decode() if path.endswith("prometheus") else json.loads(text)
        except OSError as err:
            if time.monotonic() > deadline:
                raise ConnectionError(f"master unreachable at {url}: {err}") from None
            time.sleep(0.2)
