"""The launcher interface that the local and the Kubernetes launchers share, and node recovery.

A launcher places a job's nodes (master, PS, workers) somewhere with the resources of a plan:
``launch(spec, config)`` (idempotent on the job id: a second call adopts the running job),
``resize(job_id, config)``, ``status(job_id)``, ``metrics(job_id)``,
``relaunch(job_id, node, cpu=, memory_mb=)`` and ``stop(job_id)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from airflow_dlrover.optimizer.types import Configuration
from airflow_dlrover.runtime.spec import JobSpec

#: Node states. ``oom_killed`` and ``failed``/``lost`` are recovered by relaunching the node.
RUNNING, SUCCEEDED, FAILED, OOM_KILLED, LOST, STOPPED = (
    "running", "succeeded", "failed", "oom_killed", "lost", "stopped"
)
FAILED_STATES = (FAILED, OOM_KILLED, LOST)

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
