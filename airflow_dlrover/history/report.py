"""A run's report: what the optimizer did and what it bought, from the history store.

Built by the report task at the end of a run (and stored as the run's summary); printed by the
report task's log and by ``dlrover-rm report JOB``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from airflow_dlrover.optimizer.types import RESIZE_ACTIONS


def build_report(history: Any, run: int, job: dict[str, Any] | None, status: dict[str, Any]) -> dict[str, Any]:
    """The run's story from the history store and the finished job's summary."""
    from airflow_dlrover.optimizer.finetune import shape

    plans = history.records(run, "plan")
    events = history.records(run, "event")
    decisions = history.records(run, "decision")
    samples = history.samples_of_run(run)
    profiled = [e for e in events if e.get("event") == "profiled"]
    launched = [e for e in events if e.get("event") == "launched"]
    finetune = samples[samples["stage"] == "finetune"] if not samples.empty else samples
    run_row = history.run(run)
    now = time.time()
    started = run_row["started"].timestamp()
    checks = [e for e in events if e.get("event") == "plan_checked"]
    # (seconds, samples trained meanwhile) of the profile and of each plan check
    profile_stages = ([(p["profile_s"], p.get("samples_trained")) for p in profiled[-1:]]
                      + [(c["probe_s"], c.get("samples_trained")) for c in checks])
    profile_s = float(sum(seconds for seconds, _ in profile_stages))
    plan = plans[-1] if plans else {}
    on_plan = finetune
    if not finetune.empty and plan:
        on_plan = finetune[[shape(row) == shape(plan) for row in finetune.to_dict("records")]]

    measured = float(on_plan["throughput"].median()) if not on_plan.empty else None
    profile_cost_s = profiling_cost_s(profile_stages, measured)
    report = {
        "status": "succeeded" if job and job["samples_lost"] == 0 and job["samples_trained"] >= (job["samples_expected"] or 0)
        else "failed",
        "run_seconds": now - started,
        "jct_s": now - (profiled[-1]["time"] - profiled[-1]["profile_s"]) if profiled else None,
        "profile_s": profile_s,
        "profile_share": profile_s / (now - started),
        "profile_cost_s": profile_cost_s,
        "profile_cost_share": profile_cost_s / (now - started) if profile_cost_s is not None else None,
        "probes": profiled[-1]["measured"] if profiled else 0,
        "plan_checks": len(checks),
        "warm_start": bool(profiled and profiled[-1]["warm_start"]),
        "similar_start": (profiled[-1].get("similar") or {}).get("sources", []) if profiled else [],
        "plan": {k: plan.get(k) for k in ("workers", "ps", "worker_cpu", "ps_cpu", "worker_memory_mb", "ps_memory_mb",
                                          "worker_gpu", "batch_size", "reason")},
        "predicted_throughput": plan.get("predicted_throughput"),
        "baseline": plan.get("baseline"),
        "measured_throughput": measured,
        "utilisation": utilisation(finetune),
        "decisions": [{"action": d["action"], "reason": d["reason"], "text": d.get("text", d["reason"])}
                      for d in decisions],
        "resizes": sum(d["action"] in RESIZE_ACTIONS for d in decisions),
        "recoveries": [e for e in events if e.get("event") == "recovered"],
        "instability": [e for e in events if e.get("event") == "instability"],
        "failures": [e for e in events if e.get("event") == "node_failed"],
        "adopted_on_launch": bool(launched and launched[-1]["adopted"]),
        "job": job,
        "samples_lost": job["samples_lost"] if job else None,
        "model_comparison": model_comparison(job),
    }
    if job is None:
        report["error"] = f"the job ended in state {status['state']!r}"
    return report


def profiling_cost_s(stages: list[tuple[float, float | None]], plan_throughput: float | None) -> float | None:
    """What profiling added to the run, s. The probes and plan checks train the job itself
    (``lifecycle.profiling``), so each stage (seconds, samples trained meanwhile as read off the
    job's master) costs its time less the time the plan would have taken to train those samples:
    Σ max(t − n / X_plan, 0), X_plan the plan's measured throughput. None without X_plan or a
    stage's samples (a run recorded before they were)."""
    stages = [(seconds, trained) for seconds, trained in stages if seconds]
    if not plan_throughput or any(trained is None for _, trained in stages):
        return None
    return sum(max(seconds - trained / plan_throughput, 0.0) for seconds, trained in stages)


def model_comparison(job: dict[str, Any] | None) -> dict[str, Any] | None:
    """Today's model against the one the job continued from (``job_args.init_from``), both
    evaluated by the job on today's held-out rows: each model's AUC and log loss and today's
    change (today − previous; None where either is missing or NaN). None without a previous model."""
    previous = (job or {}).get("previous_model")
    if not previous:
        return None
    today = {"auc": job.get("eval_auc"), "log_loss": job.get("eval_loss")}
    before = {"auc": previous.get("auc"), "log_loss": previous.get("loss")}
    known = {k: all(isinstance(v, (int, float)) and not math.isnan(v) for v in (today[k], before[k])) for k in today}
    return {"previous_uri": previous.get("uri"), "samples": previous.get("samples"),
            **today, **{f"previous_{k}": v for k, v in before.items()},
            **{f"{k}_change": today[k] - before[k] if known[k] else None for k in today}}


#: used column, allocated column of each utilisation figure (per node: means over a role's nodes)
UTILISATION = {
    "worker_cpu": ("worker_cpu_used", "worker_cpu"),
    "ps_cpu": ("ps_cpu_used", "ps_cpu"),
    "worker_memory": ("worker_memory_used_mb", "worker_memory_mb"),
    "ps_memory": ("ps_memory_used_mb", "ps_memory_mb"),
}


def utilisation(samples: Any) -> dict[str, float | None]:
    """Median used / allocated of a sample table, per resource (None where never measured)."""
    import numpy as np

    out: dict[str, float | None] = {}
    for name, (used, allocated) in UTILISATION.items():
        measured = not samples.empty and samples[used].notna().any()
        out[name] = float(np.nanmedian(samples[used].astype(float) / samples[allocated])) if measured else None
    return out


def _start(report: dict[str, Any]) -> str:
    """warm (the job's own prior), similar (other jobs' models, named with their similarity) or cold."""
    if report["warm_start"]:
        return "warm"
    similar = report.get("similar_start") or []
    return "similar (" + ", ".join(f"{name} {s:.2f}" for name, s in similar) + ")" if similar else "cold"


def format_report(report: dict[str, Any]) -> list[str]:
    """The report as the lines the task log shows."""
    def fmt(value: Any, unit: str = "", spec: str = ",.0f") -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        return f"{value:{spec}}{unit}" if isinstance(value, float) else f"{value}{unit}"

    plan, baseline, job = report["plan"], report["baseline"], report["job"] or {}
    lines = ["DLRover-RM run report", "=" * 72]
    lines.append(f"status {report['status']}; JCT {fmt(report['jct_s'], ' s')}; profiling {fmt(report['profile_s'], ' s')} "
                 f"({100 * report['profile_share']:.1f} % of the run, {report['probes']} probes"
                 f"{f' + {n} plan check' + ('s' if n > 1 else '') if (n := report.get('plan_checks')) else ''}, "
                 f"{_start(report)} start)")
    if report.get("profile_cost_s") is not None and report["profile_s"]:
        lines.append(f"profiling cost the run {fmt(report['profile_cost_s'], ' s')} "
                     f"({100 * report['profile_cost_share']:.1f} %): the job trained while it was profiled, "
                     f"{fmt(report['profile_s'] - report['profile_cost_s'], ' s')}' worth at the plan's measured speed")
    lines.append(f"{'':12}{'workers':>8}{'w_cpu':>7}{'ps':>4}{'ps_cpu':>7}{'w_mem':>8}{'ps_mem':>8}{'pred/s':>10}")
    for name, row in (("chosen", {**plan, "predicted_throughput": report["predicted_throughput"]}), ("baseline", baseline)):
        if row:
            lines.append(f"{name:12}{row['workers']:>8}{row['worker_cpu']:>7g}{row['ps']:>4}{row['ps_cpu']:>7g}"
                         f"{row['worker_memory_mb']:>8g}{row['ps_memory_mb']:>8g}{fmt(row['predicted_throughput']):>10}")
    lines.append(f"reason: {plan.get('reason')}")
    predicted, measured = report["predicted_throughput"], report["measured_throughput"]
    error = f" ({100 * (predicted / measured - 1):+.0f} %)" if predicted and measured else ""
    lines.append(f"throughput of the plan: predicted {fmt(predicted)}/s, measured {fmt(measured)}/s{error}")
    util = {k: (f"{100 * v:.0f} %" if v is not None else "—") for k, v in report["utilisation"].items()}
    lines.append("utilisation (used / allocated): " + ", ".join(f"{k} {v}" for k, v in util.items()))
    lines.append(f"fine-tune: {len(report['decisions'])} decisions, {report['resizes']} resizes")
    for d in report["decisions"][-5:]:
        lines.append(f"  {d['action']}: {d['text']}")
    lines.append(f"failures {len(report['failures'])}, recoveries {len(report['recoveries'])}, healed in place "
                 f"{len(report['instability'])}")
    for e in report["recoveries"]:
        lines.append(f"  try {e['try_number']}: {e['node']} {e['state']} ({e.get('text', e['reason'])}) → relaunched with "
                     f"{fmt(e['memory_mb'], ' MB')} in {e['recovered_in_s']:.1f} s")
    for e in report["instability"]:
        lines.append(f"  {e['instability']} {e['node']}: {e['healed']}")
    if job and job.get("trainer"):
        costs = ", ".join(f"{s:.1f} s" if s is not None else "—" for s in job["restart_s"])
        lines.append(f"samples (the trainer's own counter): {job['samples_done']:,} of {fmt(job['samples_total'])}; "
                     f"restarts {job['restarts']}, resizes {job['resizes']} (each group restart took {costs or '—'}); "
                     f"loss {fmt(job['loss'], '', '.4f')}, AUC {fmt(job['auc'], '', '.3f')}")
    elif job:
        lines.append(f"samples: {job['samples_trained']:,} trained of {job['samples_expected']:,}, lost "
                     f"{job['samples_lost']}, duplicated {job['samples_duplicated']}"
                     + "".join(f" ({n} by {cause})" for cause, n in (job.get("duplicated_by") or {}).items())
                     + f", redone and refused {job.get('duplicates_refused', 0)}; restarts {job['restarts']}; "
                     f"held-out loss {fmt(job['eval_loss'], '', '.4f')}, AUC {fmt(job['eval_auc'], '', '.3f')} "
                     f"on {job.get('eval_samples', 0):,} rows")
        if (compared := report.get("model_comparison")) is not None:
            lines.append(comparison_line(compared))
        if job.get("bad_rows"):
            lines.append(f"rows that could not be read (trained as nothing): {job['bad_rows']:,}")
        if job.get("export"):
            lines.append(f"model exported to {job['export']}")
    return lines


def comparison_line(compared: dict[str, Any]) -> str:
    """The report's line comparing today's model with the previous one (:func:`model_comparison`)."""
    def metric(name: str) -> str:
        today, before, change = (compared[name], compared[f"previous_{name}"], compared[f"{name}_change"])
        text = " vs ".join("—" if v is None or v != v else f"{v:.4f}" for v in (today, before))
        return text + (f" ({change:+.4f})" if change is not None else "")

    rows = f" {compared['samples']:,}" if compared.get("samples") else ""
    return (f"today vs the previous model ({compared['previous_uri']}) on today's{rows} held-out rows: "
            f"AUC {metric('auc')}, log loss {metric('log_loss')}")
