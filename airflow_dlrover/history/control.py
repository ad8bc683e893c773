"""The controller's state of a run, rebuilt from the run's records, and the records its actions
leave behind.

The fine-tune and the guard are two tasks (and each defers and is retried), so the controller's
state is not kept in memory: it is a function of what the history store holds — the plan (the
objective, the deadline, the plan's time), the model, the profile and fine-tune samples, the
fine-tune's decisions (the last resize, the rejected configurations) and the guard's events (the
failures already reported). Each task records what ``step`` decided, and the next task to step
rebuilds the state from that.
"""

from __future__ import annotations

import math
import time

import numpy as np
from typing import Any, Iterable

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.controller import Action, ControllerState, Fail, Resize, prior_fields
from airflow_dlrover.optimizer.finetune import ResizeRecord
from airflow_dlrover.optimizer.similarity import SimilarPrior
from airflow_dlrover.optimizer.types import (
    EXPLORATIONS, RESIZE_ACTIONS, Configuration, EventKind, NodeState, NodeStatus, Phase, Quota, Reason, RecordKind,
)


def controller_state(history: Any, job: Any, run: int, quota: Quota | None,
                     node_history: Iterable[dict[str, Any]] = (), *, phase: Phase = Phase.TRAINING,
                     **fields: Any) -> ControllerState:
    """The state of run ``run`` of ``job`` (a ``JobIdentity``, or the name of the run's job; see
    the module docstring) in ``phase``; ``node_history``: the detectors' rows the guard carries
    between its deferrals; ``fields``: what the task knows better than the records (the launch
    task's objective and deadline, before any plan is recorded)."""
    job = history.identity(job, run=run) or job
    events = history.records(run, RecordKind.EVENT.value)
    profiled = [e for e in events if e.get("event") == EventKind.PROFILED]
    layout = profiled[-1] if profiled else {}
    plans = history.records(run, RecordKind.PLAN.value)
    planned = plans[-1] if plans else {}
    decisions = history.records(run, RecordKind.DECISION.value)
    resizes = [d for d in decisions if d["action"] in RESIZE_ACTIONS]
    last = resizes[-1] if resizes else None
    last_resize = None
    if last is not None:
        judged = any(d["reason"] == Reason.EXPLORED for d in decisions[decisions.index(last):])
        last_resize = ResizeRecord(last["time"], Configuration(**last["current"]), Configuration(**last["target"]),
                                   last["throughput_before"], last.get("predicted_speedup") or 1.0,
                                   is_revert=last["action"] == "revert",
                                   exploring=last["reason"] in EXPLORATIONS and not judged)
    reports = [e for e in events if e.get("event") == EventKind.NODE_FAILED]
    failures = {(n["name"], n.get("restarts", 0)) for e in reports for n in e.get("nodes", [])}
    failure_log = tuple({"time_s": e["time"], "samples_done": e.get("samples_done") or 0.0,
                         "exit_codes": {n["name"]: n.get("exit_code") for n in e.get("nodes", [])
                                        if n.get("state") == NodeState.FAILED}} for e in reports)
    deadline_s = planned.get("deadline_s")
    values = dict(
        quota=quota,
        objective=planned.get("objective", "throughput"),
        deadline_at_s=None if deadline_s is None else planned["time"] + deadline_s,
        model=history.latest_model(job),
        **prior_fields(history.prior_model(job, before_run=run),
                       SimilarPrior.from_dict(layout["similar"]) if layout.get("similar") else None),
        profile=_rows(history.samples(job, run_id=run, stage="profile")),
        windows=_rows(history.samples(job, run_id=run, stage="finetune")),
        since_s=last["time"] if last else planned.get("time", -math.inf),
        last_resize=last_resize,
        rejected=tuple(Configuration(**d["reject"]) for d in resizes if d.get("reject")),
        explorations=sum(d["reason"] in EXPLORATIONS for d in resizes),
        failures_reported=frozenset(failures),
        failure_log=failure_log,
        node_history=tuple(node_history),
        phase=phase,
        window_s=layout.get("window_s") or C.PROBE_WINDOW_S,
        table_mb=layout.get("table_capacity_mb"),
        largest_table_mb=layout.get("largest_table_mb"),
        table_start_mb=layout.get("table_start_mb"),
        apart=bool(layout.get("apart")),
        last_run_config=history.last_configuration(job, before_run=run),
    )
    return ControllerState(**{**values, **fields})


def _rows(table: Any) -> tuple[dict, ...]:
    return tuple(table.to_dict("records")) if not table.empty else ()


def decision_record(action: Action, current: Configuration, measured: list[float], samples_done: float,
                    resize: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fine-tune decision: ``action`` keep | resize | revert, the reason and its text, the
    configuration before (``current``) and after (``target``), and what the launcher did."""
    record = action.to_record()
    if isinstance(action, Resize):
        record.update(action="revert" if action.revert else "resize", target=action.config.to_row(),
                      predicted_speedup=action.expected_speedup)
    record.update(current=current.to_row(), throughput_before=float(np.median(measured)) if measured else 0.0, samples_done=samples_done, time=time.time(),
                  resize=resize)
    return record


def failure_record(action: Fail, nodes: Iterable[NodeStatus], try_number: int) -> dict[str, Any]:
    """The guard's ``node_failed`` event: the nodes (with their restarts: which incarnation failed)."""
    failed = [n.to_dict() for n in nodes if n.name in action.nodes]
    return {"event": EventKind.NODE_FAILED.value, "time": time.time(), "nodes": failed, "try_number": try_number,
            "samples_done": action.numbers.get("samples_done"),
            "retryable": action.retryable, "reason": action.reason.value, "text": action.describe()}


RECOVERY_REASONS = (Reason.NODE_FAILED, Reason.OOM_KILLED, Reason.UNSCHEDULABLE)


def action_event(record: dict[str, Any], nodes: Iterable[NodeStatus], try_number: int) -> dict[str, Any]:
    """The guard's event for an applied action (``Launcher.apply``'s record): ``recovered`` for
    a failed node's relaunch (or its removal), ``instability`` for healing."""
    node = record.get("node") or record["numbers"].get("node") or (record.get("remove") or [""])[0]
    before = next((n for n in nodes if n.name == node), None)
    if Reason(record["reason"]) in RECOVERY_REASONS:
        memory = record.get("memory_mb") or (before.memory_mb if before else None)  # None: unchanged
        return {**record, "event": EventKind.RECOVERED.value, "node": node,
                "state": before.state.value if before else None, "memory_mb": memory,
                "recovered_in_s": record.get("seconds", 0.0), "time": time.time(), "try_number": try_number}
    return {**record, "event": EventKind.INSTABILITY.value, "node": node,
            "instability": record["numbers"].get("event", record["reason"]),
            "healed": "; ".join(record.get("done") or [record["text"]]), "time": time.time(),
            "try_number": try_number}
