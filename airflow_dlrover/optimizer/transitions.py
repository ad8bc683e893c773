"""What each transition of a running job costs: one table, measured, used by every caller.

A cost is an *equivalent pause* in seconds: over a window ``W`` from the call, the job trained
``S`` samples and then runs at ``r`` samples/s, so it lost ``W − S / r`` seconds against a job
that had been on the new configuration from the call on. Work lost back to the last checkpoint
is not in it (the caller charges what it rolled back). ``benchmarks/runtime.py transitions``
measures the runtime's on the local launcher and writes ``transition_costs.json`` beside this
module; the controller (``finetune.resize_cost_s``) and the cluster simulator read that file, so
the controller's costs come from the measurement, not the other way round.

On Kubernetes every transition that starts a pod also waits for it: ``pod_start_s`` is the
upstream pod-startup SLO (99th percentile ≤ 5 s for a schedulable stateless pod whose image is
on the node, kubernetes/community ``sig-scalability/slos/pod_startup_latency.md``), added to
the runtime's own cost. An in-place CPU or memory change (KEP-1287, beta since 1.33) writes the
container's cgroup as the local launcher does: the runtime's figure, not verified on a cluster.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from airflow_dlrover.optimizer.types import Configuration, InvalidInputError

MEASURED_PATH = Path(__file__).with_name("transition_costs.json")

#: Pod startup of a schedulable stateless pod with its image on the node: the upstream SLO's
#: 99th percentile (kubernetes/community, sig-scalability/slos/pod_startup_latency.md).
POD_START_S = 5.0


@dataclass(frozen=True)
class TransitionCosts:
    """Seconds of training each transition costs (an equivalent pause; see the module docstring).

    ``cold_launch_s``   nothing runs → the job trains (processes or pods, imports, the first batches)
    ``relaunch_s``      the whole job stopped and started again from its checkpoint
    ``worker_join_s``   workers added while the others train on
    ``worker_leave_s``  workers drained and removed while the others train on
    ``cpu_in_place_s``  a node's CPU limit changed without a restart
    ``memory_in_place_s`` a node's memory limit raised without a restart
    ``node_relaunch_s`` one node restarted (new resources, a straggler replaced), re-joined to the job
    ``ps_change_s``     PS count (or a PS's threads) changed: checkpoint, new PS, restore
    ``ps_recovery_s``   a failed PS restarted and every PS rolled back to the checkpoint
    ``checkpoint_mb_per_s`` / ``restore_mb_per_s``  how fast the job's PS state (rows and their
                        optimiser state, all PS together) is written / read back: a PS change
                        and a relaunch move the whole state, so their cost grows with it
    """

    cold_launch_s: float
    relaunch_s: float
    worker_join_s: float
    worker_leave_s: float
    cpu_in_place_s: float
    memory_in_place_s: float
    node_relaunch_s: float
    ps_change_s: float
    ps_recovery_s: float
    checkpoint_mb_per_s: float
    restore_mb_per_s: float
    source: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "source" and not (isinstance(value, (int, float)) and value >= 0):
                raise InvalidInputError(f.name, value, "a number ≥ 0")
        for name in ("checkpoint_mb_per_s", "restore_mb_per_s"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(name, getattr(self, name), "MB/s > 0")

    def checkpoint_s(self, state_mb: float) -> float:
        return state_mb / self.checkpoint_mb_per_s

    def restore_s(self, state_mb: float) -> float:
        return state_mb / self.restore_mb_per_s

    def relaunch_cost_s(self, state_mb: float = 0.0) -> float:
        """The whole job started again and its state read back from the checkpoint."""
        return self.relaunch_s + self.restore_s(state_mb)

    def ps_recovery_cost_s(self, state_mb: float = 0.0) -> float:
        """A failed PS replaced and every PS rolled back: the whole state read back."""
        return self.ps_recovery_s + self.restore_s(state_mb)

    def on_kubernetes(self, pod_start_s: float = POD_START_S) -> "TransitionCosts":
        """The same runtime on pods: ``pod_start_s`` more for each transition that starts a pod."""
        more = {name: getattr(self, name) + pod_start_s for name in (
            "cold_launch_s", "relaunch_s", "worker_join_s", "node_relaunch_s", "ps_change_s", "ps_recovery_s")}
        return replace(self, **more, source=f"{self.source}; + {pod_start_s:g} s pod start (upstream SLO)")

    def of(self, current: Configuration | None, target: Configuration, *, in_place: bool = True,
           state_mb: float = 0.0) -> float:
        """What changing ``current`` into ``target`` costs, as the launcher base carries it out
        (``JobKind.resize``): a PS count change re-partitions (checkpoint, new PS, restore); an
        all-reduce job's worker count restarts its group; a per-node change is in place where the
        backend can (``in_place``; a worker's torch threads must stay), else relaunches the workers
        or re-partitions the PS; workers join or leave live. Several at once: the largest (they overlap).
        ``state_mb``: the PS state a re-partition writes and reads back."""
        if current is None:
            return self.cold_launch_s
        repartition = self.ps_change_s + self.checkpoint_s(state_mb) + self.restore_s(state_mb)
        if target.ps != current.ps:
            return repartition
        costs = [0.0]
        if target.ps == 0 and target.workers != current.workers:
            costs.append(self.relaunch_s)
        elif target.workers > current.workers:
            costs.append(self.worker_join_s)
        elif target.workers < current.workers:
            costs.append(self.worker_leave_s)
        if (target.ps_cpu, target.ps_memory_mb) != (current.ps_cpu, current.ps_memory_mb):
            costs.append(self._in_place(current.ps_cpu, target.ps_cpu, current.ps_memory_mb, target.ps_memory_mb)
                         if in_place else repartition)
        worker = (target.worker_cpu, target.worker_memory_mb, target.worker_gpu)
        if worker != (current.worker_cpu, current.worker_memory_mb, current.worker_gpu):
            same_threads = torch_threads(target.worker_cpu) == torch_threads(current.worker_cpu)
            costs.append(self._in_place(current.worker_cpu, target.worker_cpu, current.worker_memory_mb,
                                        target.worker_memory_mb)
                         if in_place and same_threads and target.worker_gpu == current.worker_gpu
                         else self.node_relaunch_s)
        return max(costs)

    def _in_place(self, cpu_before: float, cpu: float, memory_before: float, memory: float) -> float:
        return max(self.cpu_in_place_s if cpu != cpu_before else 0.0,
                   self.memory_in_place_s if memory != memory_before else 0.0)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def torch_threads(cpu: float | None) -> int:
    """Torch threads of a node: its whole cores (more threads than the cores a node owns contend and run slower)."""
    return max(1, math.floor(cpu or 1))


@lru_cache(maxsize=1)
def measured() -> TransitionCosts:
    """The runtime's table as last measured (``benchmarks/runtime.py transitions``)."""
    try:
        return TransitionCosts(**json.loads(MEASURED_PATH.read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise InvalidInputError("transition_costs.json", str(MEASURED_PATH),
                                "the table benchmarks/runtime.py transitions writes", str(err)) from None


__all__ = ["MEASURED_PATH", "POD_START_S", "TransitionCosts", "measured", "torch_threads"]
