"""What the UI shows, as JSON-able data: thin reads of the history store and the pure optimizer.

No FastAPI here: each function takes a :class:`~airflow_dlrover.history.store.HistoryStore` (and
plain arguments) and returns dicts and lists. Unknown jobs and runs raise :class:`NotFound`;
a user's bad input raises the optimizer's :class:`InvalidInputError` (both name the field, the
value and what is allowed). pandas / numpy / the optimizer are imported inside the functions, so
that loading the plugin stays cheap for every Airflow process.

Who may read what is decided by the app (``app.DagReader``) and handed in as ``may_read``: a
predicate over DAG ids ('' for a job run outside any DAG). A run of a DAG the user may not read
is answered exactly as a run that does not exist, and lists leave it out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, InvalidInputError

#: The four axes of the throughput curves: workers w, PS p, CPU per worker λw, CPU per PS λp.
AXES = ("workers", "ps", "worker_cpu", "ps_cpu")
#: Points per CPU curve (λ is continuous in the model; w and p are drawn at every integer).
CPU_CURVE_POINTS = 48
#: A curve spans at least this far along its axis, and at least twice the plan and every sample.
AXIS_MINIMUM_SPAN = {"workers": 8, "ps": 4, "worker_cpu": 4.0, "ps_cpu": 4.0}
#: The smallest CPU per node drawn (the planner's grid starts at 0.5).
CPU_CURVE_START = 0.25
#: Events the instability table shows (the others — profiled, launched, ... — mark the timeline).
INSTABILITY_EVENTS = ("instability", "node_failed", "recovered")
#: Jobs named in a "not found" message.
NAMES_IN_MESSAGE = 20
#: The largest run id a route accepts (its OpenAPI says so; beyond, 422): ids are SQLAlchemy
#: ``Integer`` columns, 32-bit on PostgreSQL, so a larger one names no run; past 2**63 - 1 it
#: overflowed SQLite's driver (a server error, found by tests/plugins/test_fuzz.py).
MAX_ID = 2**31 - 1

#: May the request's user read the runs of this DAG ('' = a job run outside any DAG)?
MayRead = Callable[[str], bool]


class NotFound(LookupError):
    """An unknown job or run: names the field, the value and what exists."""

    def __init__(self, field: str, value: Any, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r} is unknown: allowed {allowed}")


def clean(value: Any) -> Any:
    """JSON-safe: NaN/inf → None, numpy → Python, datetimes → ISO 8601 (recursively)."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):  # numpy array or scalar
        return clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _table(frame: Any) -> list[dict[str, Any]]:
    return clean(frame.to_dict("records"))


def dag_of(run: dict[str, Any]) -> str:
    """The DAG whose task recorded a run: its ``dag_id`` ('' when it ran outside any DAG, e.g. from
    ``dlrover-rm``)."""
    return run.get("dag_id") or ""


def get_job(store: Any, job: int, may_read: MayRead) -> Any:
    """The ``JobIdentity`` of the store's job id ``job`` (``jobs()``'s ``id``); a job of a DAG the
    user may not read is unknown to them, as one that does not exist."""
    identity = store.job(job)
    if identity is None or not may_read(identity.dag_id):
        known = [j for j in store.jobs() if may_read(j["dag_id"])]
        shown = ", ".join(f"{j['id']} ({_identity(j)})" for j in known[:NAMES_IN_MESSAGE]) or "none recorded yet"
        raise NotFound("job", job, f"the id of a recorded job: {shown}")
    return identity


def _unknown_run(run_id: int) -> NotFound:
    return NotFound("run", run_id, "the id of a recorded run (GET /dlrover/api/jobs lists them)")


def get_run(store: Any, run_id: int) -> dict[str, Any]:
    """The run ``run_id`` (whoever may read it: the app checks with :func:`readable_run` first)."""
    run = store.run(run_id)
    if run is None:
        raise _unknown_run(run_id)
    return run


def readable_run(store: Any, run_id: int, may_read: MayRead) -> dict[str, Any]:
    """The run ``run_id`` if the user may read its DAG; else the same answer as an unknown id."""
    run = store.run(run_id)
    if run is None or not may_read(dag_of(run)):
        raise _unknown_run(run_id)
    return run


def _identity(row: dict[str, Any]) -> str:
    """``dag_id/task_group/name`` of a job or run row (``JobIdentity``'s text)."""
    from airflow_dlrover.history.identity import JobIdentity

    return str(JobIdentity(row["dag_id"], row["task_group"], row["job"]))


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    """A run without its full report: the figures a list shows."""
    summary = run["summary"] or {}
    return clean({
        "id": run["id"], "job": run["job"], "dag_id": run["dag_id"], "task_group": run["task_group"],
        "job_ref": run["job_ref"], "identity": _identity(run), "run_key": run["run_key"], "status": run["status"],
        "started": run["started"], "finished": run["finished"],
        "measured_throughput": summary.get("measured_throughput"),
        "predicted_throughput": summary.get("predicted_throughput"),
        "utilisation": summary.get("utilisation"), "resizes": summary.get("resizes"),
        "recoveries": len(summary.get("recoveries") or []), "jct_s": summary.get("jct_s"),
    })


def jobs(store: Any, may_read: MayRead) -> list[dict[str, Any]]:
    """Every job the user may read (its DAG's runs) with its number of runs and its last run:
    plan, throughput, utilisation, status."""
    from airflow_dlrover.history.report import utilisation

    out = []
    for job in store.jobs():
        if not may_read(job["dag_id"]):
            continue
        identity = store.job(job["id"])
        runs = store.runs(identity)
        if not runs:
            continue
        last = runs[-1]
        brief = _brief(last)
        plans = store.records(last["id"], "plan")
        brief["plan"] = _config(plans[-1]) if plans else None
        if brief["measured_throughput"] is None or brief["utilisation"] is None:  # still running
            finetune = store.samples(identity, run_id=last["id"], stage="finetune")
            if not finetune.empty:
                if brief["measured_throughput"] is None:
                    brief["measured_throughput"] = float(finetune["throughput"].median())
                brief["utilisation"] = brief["utilisation"] or clean(utilisation(finetune))
        out.append({**job, "identity": _identity(job), "runs": len(runs), "last_run": brief})
    return out


def runs(store: Any, job: int, may_read: MayRead) -> list[dict[str, Any]]:
    return [_brief(r) for r in store.runs(get_job(store, job, may_read))]


def run(store: Any, run_id: int) -> dict[str, Any]:
    """The run, its stored report (when finished) and how many of each record it holds."""
    row = get_run(store, run_id)
    return clean({**row, "identity": _identity(row), "counts": {
        "samples": len(store.samples_of_run(run_id)), "models": len(store.models_of_run(run_id)),
        **{f"{kind}s": len(store.records(run_id, kind)) for kind in ("plan", "decision", "event")},
    }})


def runs_of_dag_run(store: Any, dag_id: str, run_key: str, may_read: MayRead,
                    task_group: str | None = None) -> list[dict[str, Any]]:
    """The history runs the Airflow DAG run (``dag_id``, ``run_key``) recorded, by task group
    and job name; those of one task group when ``task_group`` is given ('' for the DAG's root). A
    DAG the user may not read is unknown to them."""
    if not may_read(dag_id):
        raise NotFound("dag_id", dag_id, "the id of a DAG you may read")
    found = [r for r in store.runs(run_key=run_key, dag_id=dag_id) if task_group in (None, r["task_group"])]
    return [_brief(r) for r in sorted(found, key=lambda r: (r["task_group"], r["job"]))]


def samples(store: Any, run_id: int, stage: str | None = None) -> list[dict[str, Any]]:
    table = store.samples_of_run(get_run(store, run_id)["id"])
    if stage is not None:
        table = table[table["stage"] == stage]
    return _table(table)


def _models(store: Any, run_id: int) -> list[dict[str, Any]]:
    return store.models_of_run(get_run(store, run_id)["id"])


def models(store: Any, run_id: int) -> list[dict[str, Any]]:
    """Every model fitted in the run: the fit task's, then each fine-tune refit (full documents)."""
    return clean([{"index": i, **m} for i, m in enumerate(_models(store, run_id))])


def _pick_model(store: Any, run_id: int, index: int) -> tuple[int, dict[str, Any]]:
    fitted = _models(store, run_id)
    if not fitted:
        raise NotFound("model", run_id, "a run whose fit task has stored a model")
    if not -len(fitted) <= index < len(fitted):
        raise InvalidInputError("model", index, f"an index into the run's {len(fitted)} models "
                                f"(0 = the fit task's, -1 = the latest refit)")
    return index % len(fitted), fitted[index]


def _config(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in (*CONFIG_COLUMNS, "predicted_throughput", "reason")}


def curves(store: Any, run_id: int, model_index: int = 0) -> dict[str, Any]:
    """The fitted throughput along w, p, λw and λp through the chosen plan, with the 90 % band,
    and the measured samples on each axis.

    A sample is ``on_slice`` when its other three coordinates are the slice's (the plan's), so
    that the curve and the point are comparable; every point also carries the model's prediction
    at its own configuration.
    """
    import numpy as np
    import pandas as pd

    from airflow_dlrover.optimizer.job_model import JobModel

    index, record = _pick_model(store, run_id, model_index)
    model = JobModel.from_dict(record["document"]).throughput
    table = store.samples_of_run(run_id)
    plans = store.records(run_id, "plan")
    if plans:
        base, base_from = _config(plans[-1]), "plan"
    else:  # the run failed before its launch: slice through the fastest measured configuration
        base, base_from = _config(table.loc[table["throughput"].idxmax()].to_dict()), "fastest sample"
    base = {k: base[k] if base[k] is not None else (0 if k == "worker_gpu" else model.batch_size)
            for k in ("workers", "ps", "worker_cpu", "ps_cpu", "worker_gpu", "batch_size")}
    if not table.empty:
        table = table.assign(predicted=model.predict(table, band=False))
    out = {"model_index": index, "models": len(_models(store, run_id)), "created": record["created"],
           "base": base, "base_from": base_from, "axes": {}}
    axes = [a for a in AXES if not (model.allreduce and a.startswith("ps"))]  # an all-reduce job has no PS axis
    for axis in axes:
        top = max(AXIS_MINIMUM_SPAN[axis], 2 * base[axis], float(table[axis].max()) if not table.empty else 0)
        if axis in ("workers", "ps"):
            xs = np.arange(1, int(math.ceil(top)) + 1, dtype=float)
        else:
            xs = np.unique(np.r_[np.linspace(CPU_CURVE_START, top, CPU_CURVE_POINTS), base[axis]])
        grid = pd.DataFrame({**{k: base[k] for k in base}, axis: xs})
        mean, lower, upper = model.predict(grid)
        others = [a for a in axes if a != axis]
        points = []
        for row in table.to_dict("records"):
            on_slice = all(abs(float(row[a]) - float(base[a])) < 1e-9 for a in others)
            points.append({"x": row[axis], "y": row["throughput"], "predicted": row["predicted"],
                           "stage": row["stage"], "on_slice": on_slice,
                           "config": {k: row[k] for k in AXES}, "timestamp": row["timestamp"]})
        out["axes"][axis] = {"x": xs, "mean": mean, "lower": lower, "upper": upper, "points": points}
    report = model.report
    out["fit"] = report.to_dict() if report else None
    out["sharpness"] = model.sharpness
    return clean(out)


def plans(store: Any, run_id: int) -> dict[str, Any]:
    """The chosen plan (the last one recorded), its alternatives, the Pareto front and the baseline;
    ``history`` holds every plan of the run (a retried launch plans again)."""
    recorded = store.records(get_run(store, run_id)["id"], "plan")
    chosen = recorded[-1] if recorded else None
    return clean({
        "chosen": {k: v for k, v in chosen.items() if k not in ("alternatives", "pareto_front", "baseline")}
        if chosen else None,
        "alternatives": chosen.get("alternatives", []) if chosen else [],
        "pareto_front": chosen.get("pareto_front", []) if chosen else [],
        "baseline": chosen.get("baseline") if chosen else None,
        "history": [{k: p.get(k) for k in (*CONFIG_COLUMNS, "predicted_throughput", "objective", "reason", "time")}
                    for p in recorded],
    })


def decisions(store: Any, run_id: int) -> list[dict[str, Any]]:
    return clean(store.records(get_run(store, run_id)["id"], "decision"))


def events(store: Any, run_id: int, event: str | None = None) -> list[dict[str, Any]]:
    recorded = store.records(get_run(store, run_id)["id"], "event")
    return clean([e for e in recorded if event is None or e.get("event") == event])


def timeline(store: Any, run_id: int) -> dict[str, Any]:
    """Throughput and utilisation over the run (seconds since its start), with the fine-tune
    decisions and the events that mark it.

    Utilisation is per role and in totals over the role's nodes: used = per-node mean × nodes,
    allocated = per-node allocation × nodes (so a resize shows as a step of the allocation).
    """
    row = get_run(store, run_id)
    t0 = row["started"].timestamp()
    table = store.samples_of_run(run_id)
    table = table[table["timestamp"].notna()].sort_values("timestamp", kind="stable")
    series = []
    for r in table.to_dict("records"):
        w, p = r["workers"], r["ps"]

        def total(value: Any, nodes: int) -> float | None:
            return None if value is None or value != value else value * nodes

        series.append({
            "t": r["timestamp"] - t0, "stage": r["stage"], "throughput": r["throughput"], "workers": w, "ps": p,
            "worker_cpu_used": total(r["worker_cpu_used"], w), "worker_cpu_allocated": r["worker_cpu"] * w,
            "ps_cpu_used": total(r["ps_cpu_used"], p), "ps_cpu_allocated": r["ps_cpu"] * p,
            "worker_memory_used_mb": total(r["worker_memory_used_mb"], w),
            "worker_memory_allocated_mb": r["worker_memory_mb"] * w,
            "ps_memory_used_mb": total(r["ps_memory_used_mb"], p), "ps_memory_allocated_mb": r["ps_memory_mb"] * p,
        })
    marks = [{"t": d["time"] - t0, "action": d["action"], "reason": d.get("text") or d["reason"], "target": d.get("target"),
              "current": d.get("current"), "predicted_speedup": d.get("predicted_speedup")}
             for d in store.records(run_id, "decision")]
    noted = [{"t": e["time"] - t0, "event": e["event"], "label": _event_label(e)}
             for e in store.records(run_id, "event") if "time" in e]
    return clean({"run": run_id, "started": row["started"], "samples": series, "decisions": marks, "events": noted})


def _event_label(e: dict[str, Any]) -> str:
    kind = e["event"]
    if kind == "instability":
        return f"{e.get('instability')} on {e.get('node')}: {e.get('healed')}"
    if kind == "node_failed":
        return "; ".join(f"{n['name']} {n['state']} ({n.get('reason')})" for n in e.get("nodes", []))
    if kind == "recovered":
        return f"{e.get('node')} relaunched ({e.get('text') or e.get('reason')}) in {e.get('recovered_in_s', 0):.1f} s"
    if kind == "profiled":
        return f"{e.get('measured')} of {e.get('probes')} probes measured in {e.get('profile_s', 0):.0f} s"
    if kind == "launched":
        return "adopted and resized to the plan" if e.get("adopted") else "launched on the plan"
    return kind


def _action(e: dict[str, Any]) -> dict[str, Any]:
    """What the controller did (its action's kind and new resources)."""
    return {"kind": e.get("action"), **{k: e[k] for k in ("cpu", "memory_mb", "config", "remove") if e.get(k)}}


def instability(store: Any, run_id: int) -> list[dict[str, Any]]:
    """Instability, failure and recovery events: what was seen (evidence) and what was done."""
    t0 = get_run(store, run_id)["started"].timestamp()
    rows = []
    for e in store.records(run_id, "event"):
        kind = e.get("event")
        if kind not in INSTABILITY_EVENTS:
            continue
        if kind == "instability":
            row = {"kind": e.get("instability"), "node": e.get("node"), "reason": e.get("text") or e.get("reason"),
                   "evidence": e.get("numbers"), "action": _action(e), "outcome": e.get("healed")}
        elif kind == "node_failed":
            nodes = e.get("nodes", [])
            row = {"kind": "node_failed", "node": ", ".join(n["name"] for n in nodes),
                   "reason": "; ".join(f"{n['name']} {n['state']}: {n.get('reason')}" for n in nodes),
                   "evidence": {"nodes": nodes, "try_number": e.get("try_number")},
                   "action": {"kind": "retry", "detail": "the guard task fails; its Airflow retry recovers"},
                   "outcome": f"try {e.get('try_number')} failed"}
        else:
            row = {"kind": "recovered", "node": e.get("node"), "reason": e.get("text") or e.get("reason"),
                   "evidence": {k: e.get(k) for k in ("state", "try_number") if k in e},
                   "action": _action(e),
                   "outcome": f"relaunched in {e.get('recovered_in_s', 0):.1f} s by try {e.get('try_number')}"}
        rows.append({"t": e["time"] - t0 if "time" in e else None, "event": kind, **row})
    return clean(rows)


def what_if(store: Any, job: int, may_read: MayRead, *, cpu: Any, memory: Any, gpu: Any = 0,
            max_nodes: Any = None, objective: str = "throughput", samples: Any = None,
            deadline: Any = None) -> dict[str, Any]:
    """Plan ``job`` (the store's job id) under another quota and objective with its latest model
    (the real planner)."""
    from airflow_dlrover.optimizer.planner import plan
    from airflow_dlrover.optimizer.types import Quota, parse_duration_s

    identity = get_job(store, job, may_read)
    model = store.latest_model(identity)
    if model is None:
        raise NotFound("job", job, "a job with a fitted model (its fit task has run)")
    quota = Quota.parse(cpu, memory, gpu if gpu not in (None, "") else 0, max_nodes if max_nodes != "" else None)
    if samples in ("", None):
        samples = None
    else:
        try:
            samples = float(samples)
        except (TypeError, ValueError):
            raise InvalidInputError("samples", samples, "a positive number of samples to train") from None
    deadline_s = parse_duration_s(deadline, "deadline") if deadline not in (None, "") else None
    chosen = plan(model.throughput, model.memory, quota, objective, samples=samples, deadline_s=deadline_s,
                  batch_size=model.throughput.batch_size)
    return clean({"job": identity.name, "dag_id": identity.dag_id, "task_group": identity.task_group,
                  "identity": str(identity), "quota": quota.__dict__, "objective": objective, "samples": samples,
                  "deadline_s": deadline_s, "plan": chosen.to_dict(), "describe": chosen.config.describe()})
