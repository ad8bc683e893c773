"""Runs *inside the dlrover==0.6.1 venv*: DLRover's own PS resource optimizer behind JSON lines.

Not imported by airflow_dlrover (it imports dlrover, which is not in the project's environment);
:mod:`sim.dlrover_bridge` starts it as ``<venv>/bin/python dlrover_worker.py``.

Protocol: one JSON array of requests per stdin line, one JSON array of replies per stdout line.
Each request has ``op`` and ``job`` (a string id):

``new``      ``cpu``, ``memory_bytes`` (the job's ResourceLimits), optionally ``worker`` / ``ps``:
             ``{"cpu", "memory_mb"}``, the per-node resources of the user's ElasticJob (its
             original resources; no replica counts, so that DLRover chooses them) → the
             job-creation resources (``PSJobResourceOptimizer.init_job_resource``; stage CREATE →
             WORKER_INITIAL).
``report``   ``now``, ``speed``, ``step``, ``ps``/``workers``: lists of [count, [config_cpu,
             config_memory_mb, used_cpu, used_memory_bytes]] (``count`` identical nodes, expanded
             into DLRover ``Node`` objects) → ``LocalStatsReporter`` (no reply content).
``plan``     ``now`` → ``PSJobResourceOptimizer.get_job_resource_plan()`` (its own stage machine:
             WORKER_INITIAL → PS_INITIAL → PS_RUNNING, PS changes at most hourly by its clock,
             which reads ``now``).
``oom``      ``now``, ``type`` ("ps" | "worker"), ``name``, ``cpu``, ``memory_mb`` →
             ``adjust_oom_resource(node)``: the node's new memory (MB) and the group's.
``close``    forget the job.

Three adaptations, forced by running many jobs in one process: DLRover's
``LocalStatsReporter`` is a process-wide singleton (its master runs one job per process), so each
job gets its own reporter instance; and ``job.py`` reads ``time.time()``, so its module sees the
simulated clock (as an epoch time); and the reporter's defensive ``copy.deepcopy`` of each
metric is skipped (each metric is built fresh and never mutated). Everything else is DLRover's
code, unchanged.
"""

import json
import logging
import sys
import types

from dlrover.python.common import global_context
from dlrover.python.common.constants import NodeType, OptimizeMode
from dlrover.python.common.node import Node, NodeGroupResource, NodeResource
from dlrover.python.master.resource import job as job_module
from dlrover.python.master.resource.job import JobResource, PSJobResourceOptimizer
from dlrover.python.master.stats import reporter as reporter_module
from dlrover.python.master.stats.reporter import JobMeta, LocalStatsReporter
from dlrover.python.master.stats.training_metrics import RuntimeMetric
from dlrover.python.scheduler.job import ResourceLimits

logging.disable(logging.CRITICAL)  # DLRover logs every plan as indented JSON: too slow here
#: The simulated clock as an epoch time (DLRover compares it with 0 = "never changed").
EPOCH = 1_700_000_000.0
_clock = {"now": EPOCH}
job_module.time = types.SimpleNamespace(time=lambda: _clock["now"])
# The reporter deep-copies every RuntimeMetric it keeps; ours are built fresh for each report and
# never touched again, so the copy is skipped (performance only: 100 workers × 3 windows a call).
reporter_module.copy = types.SimpleNamespace(deepcopy=lambda value: value)
context = global_context.Context.singleton_instance()
context.auto_ps_enabled = True
context.auto_worker_enabled = True

JOBS = {}
NODES = {}  # job → (the last report's node rows, their Node objects)


def _group(plan_group):
    return {"count": plan_group.count, "cpu": plan_group.node_resource.cpu, "memory_mb": plan_group.node_resource.memory}


def _plan_dict(plan):
    if plan is None:
        return {"groups": {}, "nodes": {}}
    return {
        "groups": {t: _group(g) for t, g in plan.node_group_resources.items()},
        "nodes": {name: {"cpu": r.cpu, "memory_mb": r.memory} for name, r in plan.node_resources.items()},
    }


def handle(request):
    op, key = request["op"], request.get("job")
    if "now" in request:
        _clock["now"] = EPOCH + float(request["now"])
    if op == "version":
        return {"version": _dist_version()}
    if op == "new":
        limits = ResourceLimits(float(request["cpu"]), int(request["memory_bytes"]))
        worker, ps = (NodeGroupResource(0, NodeResource(float(r.get("cpu", 0)), float(r.get("memory_mb", 0))))
                      for r in (request.get("worker") or {}, request.get("ps") or {}))
        optimizer = PSJobResourceOptimizer(worker, ps, OptimizeMode.SINGLE_JOB, key, limits)
        local = optimizer._resource_optimizer
        local._stats_collector = LocalStatsReporter(JobMeta(key))  # one per job, not per process
        JOBS[key] = optimizer
        resource = optimizer.init_job_resource(JobResource())
        return {
            "groups": {t: _group(g) for t, g in resource.node_group_resources.items()},
            "stage": optimizer.get_job_stage(),
        }
    optimizer = JOBS[key]
    if op == "report":
        nodes = _nodes(key, request["ps"], request["workers"])
        metric = RuntimeMetric(nodes, global_step=int(request["step"]), speed=float(request["speed"]),
                               timestamp=int(_clock["now"]))
        optimizer._resource_optimizer._stats_collector.report_runtime_stats(metric)
        return {}
    if op == "plan":
        plan = optimizer.get_job_resource_plan()
        out = _plan_dict(plan)
        out["stage"] = optimizer.get_job_stage()
        # After its worker sample phase, DLRover's PS_RUNNING stage can only plan when its PS
        # interval has passed (its WORKER_RUNNING plan is always empty in 0.6.1): tell the
        # simulator when, so that it need not ask every period in between.
        quiet = optimizer.get_job_stage() == "job_stage_ps_running" and optimizer.optimize_worker_sampled
        interval = context.seconds_interval_to_change_ps
        out["quiet_until"] = (optimizer._last_ps_change_time + interval - EPOCH) if quiet else None
        return out
    if op == "oom":
        kind = NodeType.PS if request["type"] == "ps" else NodeType.WORKER
        node = Node(kind, 0, config_resource=NodeResource(request["cpu"], request["memory_mb"]), name=request["name"])
        optimizer.adjust_oom_resource(node)
        group = optimizer._ps_resource if kind == NodeType.PS else optimizer._worker_resource
        return {"memory_mb": node.config_resource.memory, "group_memory_mb": group.node_resource.memory}
    if op == "close":
        JOBS.pop(key, None)
        NODES.pop(key, None)
        return {}
    raise ValueError(f"unknown op {op!r}")


def _nodes(key, ps_rows, worker_rows):
    """The report's running nodes. A period's windows report the same nodes (only speed and step
    differ), so the list built for one window is reused for the next: DLRover only reads it."""
    rows = (ps_rows, worker_rows)
    cached = NODES.get(key)
    if cached is not None and cached[0] == rows:
        return cached[1]
    nodes = []
    for kind, kind_rows in ((NodeType.PS, ps_rows), (NodeType.WORKER, worker_rows)):
        expanded = [values for count, values in kind_rows for _ in range(count)]
        for i, (cpu, memory_mb, used_cpu, used_bytes) in enumerate(expanded):
            node = Node(kind, i, config_resource=NodeResource(cpu, memory_mb), name=f"{kind}-{i}")
            node.used_resource = NodeResource(used_cpu, used_bytes)
            nodes.append(node)
    NODES[key] = (rows, nodes)
    return nodes


def _dist_version():
    from importlib.metadata import version

    return version("dlrover")


def main():
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        replies = []
        for request in json.loads(line):
            try:
                replies.append({"ok": True, **handle(request)})
            except Exception as err:  # reported to the simulator, which raises it
                replies.append({"ok": False, "error": f"{type(err).__name__}: {err}"})
        out.write(json.dumps(replies) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
