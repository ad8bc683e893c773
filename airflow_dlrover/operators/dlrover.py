"""DLRover-RM operators: profile → fit → launch (pre-tune) → fine-tune (deferrable) → report.

Thin: each parses and validates its arguments (a user's mistake fails at once, without retry,
naming the field), calls the launcher / the optimizer, records what it did in the history store
and pushes a small JSON summary to XCom. Time series and models live in the history store.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowRescheduleException

from airflow_dlrover.operators.job import (
    DLRoverTaskMixin, build_spec, duration_s, parse_faults, parse_quota, positive_int, user_errors,
)

OBJECTIVES = ("throughput", "deadline", "efficiency")


class DLRoverProfileOperator(DLRoverTaskMixin, BaseOperator):
    """Profile the job on the probe configurations the optimizer designs under the quota and store
    the sample table. A warm start (the job has a prior, ``HistoryStore.prior_model``) profiles
    nothing: the prior plans, and the fine-tune re-scales it from the job's own windows.

    Our DLRM runtime is profiled on the job itself (it starts on the first probe; see
    ``launchers.profiling``). With ``command`` a user's own trainer is profiled instead: the
    command runs once per probe for ``probe_window`` with the configuration in its placeholders
    and ``DLROVER_CONFIG``, its throughput read from ``metrics_file`` or ``log_regex``.

    :param job: the job's name, stable across runs (templated)
    :param job_args: the job: samples, data (``synthetic`` or a Criteo-format path), table_size,
        tables, embedding_dim, batch_size, ... (templated)
    :param quota: ``{"cpu", "memory", "gpu", "max_nodes"}``; the connection's default when None (templated)
    :param probe_window: measurement time per probe, for ``command`` (templated)
    :param command: bring-your-own trainer command (local launcher) (templated)
    :param metrics_file: file (in the probe's working folder) where the trainer writes its throughput (templated)
    :param log_regex: regex on the trainer's output whose first group is its throughput (templated)
    :param kubernetes: Kubernetes launcher settings over the connection's (namespace, image,
        service_account, node_selector, tolerations, ...: ``launchers.KUBERNETES_OPTIONS``) (templated)
    :param dlrover_conn_id: the ``dlrover`` connection
    """

    template_fields: Sequence[str] = ("job", "job_args", "quota", "probe_window", "command", "metrics_file", "log_regex", "kubernetes")
    ui_color = "#e8f4fd"

    def __init__(self, *, job: str, job_args: dict[str, Any] | None = None, quota: dict[str, Any] | None = None,
                 probe_window: str | float = "20s", command: str | None = None, metrics_file: str | None = None,
                 log_regex: str | None = None, kubernetes: dict[str, Any] | None = None,
                 dlrover_conn_id: str = "dlrover_default", **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.job_args, self.quota, self.probe_window = job, job_args, quota, probe_window
        self.command, self.metrics_file, self.log_regex = command, metrics_file, log_regex
        self.dlrover_conn_id = dlrover_conn_id
        self.kubernetes = kubernetes

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.launchers.profiling import profile_command, profile_job
        from airflow_dlrover.optimizer.probes import design_probes

        run, job_id = self.run_ids(context)
        with user_errors():
            quota = parse_quota(self.quota, self.hook.settings.quota)
            spec = build_spec(job_id, self.job_args)
            window_s = duration_s("probe_window", self.probe_window)
            prior = self.history.prior_model(self.job, before_run=run)
            probes = design_probes(quota, batch_size=spec.batch_size, prior=prior.throughput if prior else None,
                                   memory=prior.memory if prior else None)
        self.log.info("%s start: %d probes under %s", "warm" if prior else "cold", len(probes), quota)
        if probes.empty:  # a warm start: the prior plans, the fine-tune re-scales it (probes.py)
            self.history.clear_samples(run, "profile")
            summary = {"run": run, "job_id": job_id, "probes": 0, "measured": 0, "warm_start": True, "profile_s": 0.0}
            self.history.add(run, "event", {"event": "profiled", **summary, "bring_your_own": bool(self.command),
                                            "time": time.time()})
            return {**summary, "throughput_min": None, "throughput_max": None}
        started = time.monotonic()
        if self.command:
            with user_errors():
                table = profile_command(self.command, probes, self.launcher.job_dir(job_id) / "byo-profile",
                                        window_s=window_s, metrics_file=self.metrics_file, log_regex=self.log_regex)
        else:
            table = profile_job(self.launcher, spec, probes)
        profile_s = time.monotonic() - started
        self.history.clear_samples(run, "profile")  # a retry profiles again: keep one table
        self.history.add_samples(run, table, stage="profile")
        self.history.add(run, "event", {"event": "profiled", "probes": len(probes), "measured": len(table),
                                        "warm_start": prior is not None, "profile_s": profile_s,
                                        "bring_your_own": bool(self.command), "time": time.time()})
        if table.empty:
            raise RuntimeError(f"no probe of job {job_id} was measured cleanly; see the task log")
        for row in table.to_dict("records"):
            self.log.info("probe %dw×%g + %dps×%g: %.0f samples/s", row["workers"], row["worker_cpu"], row["ps"],
                          row["ps_cpu"], row["throughput"])
        return {"run": run, "job_id": job_id, "probes": len(probes), "measured": len(table),
                "warm_start": prior is not None, "profile_s": round(profile_s, 2),
                "throughput_min": float(table["throughput"].min()), "throughput_max": float(table["throughput"].max())}


class DLRoverFitOperator(DLRoverTaskMixin, BaseOperator):
    """Fit the throughput and memory models on this run's profile samples, warm-started from the
    job's prior (``HistoryStore.prior_model``); a warm start profiles nothing, and then the prior is
    this run's model until the fine-tune refits it. The model goes to the history store, a summary
    to XCom.

    :param job: the job's name (templated)
    :param kubernetes: Kubernetes launcher settings over the connection's (namespace, image,
        service_account, node_selector, tolerations, ...: ``launchers.KUBERNETES_OPTIONS``) (templated)
    :param dlrover_conn_id: the ``dlrover`` connection
    """

    template_fields: Sequence[str] = ("job", "kubernetes")
    ui_color = "#e8f4fd"

    def __init__(self, *, job: str, kubernetes: dict[str, Any] | None = None,
                 dlrover_conn_id: str = "dlrover_default", **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.dlrover_conn_id = job, dlrover_conn_id
        self.kubernetes = kubernetes

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.optimizer.job_model import fit_job_model
        from airflow_dlrover.optimizer.types import InvalidInputError

        run, _ = self.run_ids(context)
        samples = self.history.samples(self.job, run_id=run, stage="profile")
        prior = self.history.prior_model(self.job, before_run=run)
        if samples.empty and prior is None:
            with user_errors():
                raise InvalidInputError("samples", f"run {run} of {self.job}", "profile samples: run the profile task first")
        if samples.empty:  # a warm start profiles nothing: the prior is this run's model until the fine-tune refits
            model = prior
        else:
            with user_errors():
                model = fit_job_model(samples, prior)
        model_id = self.history.save_model(run, model)
        report = model.throughput.report
        summary = {
            "model_id": model_id, "samples": len(samples), "warm_start": prior is not None,
            "sharpness": model.throughput.sharpness,
            "parameters": {k: float(f"{v:.4g}") for k, v in model.throughput.params.items()},
            "in_sample_mape": round(report.in_sample_mape, 4),
            "out_of_sample_mape": None if report.out_of_sample_mape is None else round(report.out_of_sample_mape, 4),
            "out_of_sample_method": report.out_of_sample_method,
            "pinned": sorted(report.pinned), "memory_model": model.memory is not None,
        }
        self.log.info("fitted on %d samples: in-sample MAPE %.1f %%, %s", len(samples), 100 * report.in_sample_mape,
                      report.out_of_sample_method)
        return summary


class DLRoverLaunchOperator(DLRoverTaskMixin, BaseOperator):
    """Pre-tune and launch: plan under the quota with the fitted model, then launch the job on
    the plan — or adopt it when it already runs (after profiling, or on a retry) and resize it to
    the plan. Faults to inject (demos) are scheduled once per run.

    :param job: the job's name (templated)
    :param job_args: as for the profile task (templated)
    :param quota: as for the profile task (templated)
    :param objective: ``throughput``, ``deadline`` (with ``deadline``) or ``efficiency`` (templated)
    :param deadline: for the ``deadline`` objective, e.g. ``2h`` (templated)
    :param baseline: the configuration the job would run without us (a configuration row), for
        the report's comparison (templated)
    :param inject: demo faults, e.g. ``kill-worker@30s`` (from the launch) (templated)
    :param plan_only: record and return the plan without launching (for a trainer of your own,
        profiled with ``command``: its task reads the plan from this task's XCom)
    :param kubernetes: Kubernetes launcher settings over the connection's (namespace, image,
        service_account, node_selector, tolerations, ...: ``launchers.KUBERNETES_OPTIONS``) (templated)
    :param dlrover_conn_id: the ``dlrover`` connection
    """

    template_fields: Sequence[str] = ("job", "job_args", "quota", "objective", "deadline", "baseline", "inject", "kubernetes")
    ui_color = "#d9f2e6"

    def __init__(self, *, job: str, job_args: dict[str, Any] | None = None, quota: dict[str, Any] | None = None,
                 objective: str = "throughput", deadline: str | None = None, baseline: dict[str, Any] | None = None,
                 inject: str | list[str] | None = None, plan_only: bool = False,
                 kubernetes: dict[str, Any] | None = None,
                 dlrover_conn_id: str = "dlrover_default", **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.job_args, self.quota, self.objective, self.deadline = job, job_args, quota, objective, deadline
        self.baseline, self.inject, self.plan_only, self.dlrover_conn_id = baseline, inject, plan_only, dlrover_conn_id
        self.kubernetes = kubernetes

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.optimizer.planner import plan
        from airflow_dlrover.optimizer.types import Configuration, InvalidInputError

        run, job_id = self.run_ids(context)
        with user_errors():
            quota = parse_quota(self.quota, self.hook.settings.quota)
            spec = build_spec(job_id, self.job_args)
            faults = parse_faults(self.inject)
            if self.objective not in OBJECTIVES:
                raise InvalidInputError("objective", self.objective, " | ".join(OBJECTIVES))
            deadline_s = duration_s("deadline", self.deadline) if self.deadline else None
            baseline = Configuration(**self.baseline) if self.baseline else None
        model = self.history.latest_model(self.job)
        if model is None:
            with user_errors():
                raise InvalidInputError("model", self.job, "a fitted model: run the fit task first")
        with user_errors():
            chosen = plan(model.throughput, model.memory, quota, self.objective, samples=spec.samples,
                          deadline_s=deadline_s, batch_size=spec.batch_size)
        record = {**chosen.to_dict(), "deadline_s": deadline_s, "time": time.time()}
        if baseline is not None:
            record["baseline"] = {**baseline.to_row(),
                                  "predicted_throughput": predict(model, baseline)}
        self.history.add(run, "plan", record)
        self.log.info("plan: %s — %s", chosen.config.describe(), chosen.reason)
        summary = {"run": run, "job_id": job_id, "config": chosen.config.to_row(),
                   "predicted_throughput": round(chosen.predicted_throughput, 1), "reason": chosen.reason}
        if self.plan_only:
            return summary
        adopted = self.launcher.exists(job_id)
        self.launcher.launch(spec, chosen.config)  # adopts a running job
        current = Configuration(**self.launcher.read_job(job_id)["config"])
        resize = None
        if current != chosen.config:
            resize = self.launcher.resize(job_id, chosen.config)
        self.launcher.master_call(job_id, "/plan", chosen.to_dict(details=False))
        already = any(e.get("event") == "faults_scheduled" for e in self.history.records(run, "event"))
        if faults and not already:
            self.launcher.master_call(job_id, "/faults", {"faults": faults})
            self.history.add(run, "event", {"event": "faults_scheduled", "faults": faults, "time": time.time()})
        self.history.add(run, "event", {"event": "launched", "time": time.time(), "adopted": adopted,
                                        "resize": resize, "config": chosen.config.to_row()})
        return {**summary, "adopted": adopted}


class DLRoverFineTuneOperator(DLRoverTaskMixin, BaseOperator):
    """Fine-tune while the job trains (deferrable): a trigger measures the job in windows; on each
    batch of windows the operator refits the model, asks the fine-tune policy (``optimizer.finetune``,
    for the plan's objective and what is left of its deadline:
    resize only when the pessimistic saving beats the resize cost, never within the minimum
    interval, revert what did not deliver), resizes, records every decision with its reason, and
    defers again until the job completes.

    :param job: the job's name (templated)
    :param quota: as for the profile task (templated)
    :param window: measurement window (templated)
    :param windows: windows per decision (templated)
    :param turn: hand the worker slot back (reschedule) after this long; set it where tasks run
        one at a time (``airflow dags test``) so that the instability guard gets its turns (templated)
    :param kubernetes: Kubernetes launcher settings over the connection's (namespace, image,
        service_account, node_selector, tolerations, ...: ``launchers.KUBERNETES_OPTIONS``) (templated)
    :param dlrover_conn_id: the ``dlrover`` connection
    """

    template_fields: Sequence[str] = ("job", "quota", "window", "windows", "turn", "kubernetes")
    ui_color = "#fff4d6"

    def __init__(self, *, job: str, quota: dict[str, Any] | None = None, window: str | float = "3s",
                 windows: int | str = 3, turn: str | float | None = None, kubernetes: dict[str, Any] | None = None,
                 dlrover_conn_id: str = "dlrover_default",
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.quota, self.window, self.windows, self.turn = job, quota, window, windows, turn
        self.dlrover_conn_id = dlrover_conn_id
        self.kubernetes = kubernetes

    def execute(self, context: Any) -> None:
        from airflow_dlrover.optimizer.types import InvalidInputError

        _, job_id = self.run_ids(context)
        with user_errors():
            parse_quota(self.quota, self.hook.settings.quota)
            if positive_int("windows", self.windows) < 1:
                raise InvalidInputError("windows", self.windows, "≥ 1")
        self._defer(job_id, self.turn_ends_at())

    def _defer(self, job_id: str, turn_ends_at: float | None) -> None:
        from airflow_dlrover.triggers.dlrover import DLRoverJobTrigger

        trigger = DLRoverJobTrigger(job_id, "finetune", window_s=duration_s("window", self.window),
                                    windows=positive_int("windows", self.windows), turn_ends_at=turn_ends_at, **self.trigger_kwargs())
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any] | None:
        import pandas as pd

        run, job_id = self.run_ids(context)
        rows = event.get("rows") or []
        if rows:
            self.history.add_samples(run, pd.DataFrame(rows), stage="finetune")
        if event["kind"] == "windows":
            self._decide(run, job_id)
        elif event["kind"] == "turn":
            raise AirflowRescheduleException(datetime.now(timezone.utc) + timedelta(seconds=1))
        elif event["kind"] == "done":
            decisions = self.history.records(run, "decision")
            return {"job_id": job_id, "decisions": len(decisions),
                    "resizes": sum(d["action"] != "keep" for d in decisions)}
        elif event["kind"] == "timeout":
            raise TimeoutError(f"job {job_id} did not finish while fine-tuning")
        self._defer(job_id, event.get("turn_ends_at"))

    def _decide(self, run: int, job_id: str) -> None:
        import numpy as np

        from airflow_dlrover.optimizer.finetune import ResizeRecord, decide
        from airflow_dlrover.optimizer.job_model import fit_job_model
        from airflow_dlrover.optimizer.types import Configuration

        quota = parse_quota(self.quota, self.hook.settings.quota)
        samples = self.history.samples(self.job, run_id=run)
        # Warm-started from the job's prior, as the fit task: this run's own earlier refits
        # already saw these samples and would count them twice.
        model = fit_job_model(samples, self.history.prior_model(self.job, before_run=run))
        self.history.save_model(run, model)
        decisions = self.history.records(run, "decision")
        resizes = [d for d in decisions if d["action"] != "keep"]
        last = resizes[-1] if resizes else None
        last_resize = None
        if last is not None:
            last_resize = ResizeRecord(last["time"], Configuration(**last["current"]), Configuration(**last["target"]),
                                       last["throughput_before"], last["predicted_speedup"], last["action"] == "revert")
        since = last["time"] if last else self.history.records(run, "plan")[-1]["time"]
        current = Configuration(**self.launcher.read_job(job_id)["config"])
        finetune = samples[samples["timestamp"] >= since]
        measured = finetune["throughput"].tolist()
        status = self.launcher.master_call(job_id, "/status")
        planned = self.history.records(run, "plan")[-1]  # the fine-tune keeps to the plan's objective
        deadline_s = planned.get("deadline_s")
        decision = decide(model.throughput, model.memory, quota, current, measured,
                          status["samples_total"] - status["samples_done"], time.time(), last_resize,
                          rejected=[Configuration(**d["reject"]) for d in decisions if d.get("reject")],
                          objective=planned.get("objective", "throughput"),
                          deadline_s=None if deadline_s is None else deadline_s - (time.time() - planned["time"]))
        record = {**decision.to_dict(), "time": time.time(), "current": current.to_row(),
                  "throughput_before": float(np.median(measured)) if measured else 0.0, "samples_done": status["samples_done"]}
        if decision.action != "keep":
            record["resize"] = self.launcher.resize(job_id, decision.target)
        self.history.add(run, "decision", record)
        self.log.info("fine-tune: %s — %s", decision.action, decision.reason)


def predict(model: Any, config: Any) -> float:
    """The model's throughput for one configuration."""
    import pandas as pd

    return float(model.throughput.predict(pd.DataFrame([config.to_row()]), band=False)[0])


class DLRoverReportOperator(DLRoverTaskMixin, BaseOperator):
    """Finish the run: account for every sample, evaluate the model, stop the job, and print and
    store what the optimizer did — the chosen plan against the baseline, predicted and measured
    throughput, utilisation, decisions and recoveries. Run it with ``trigger_rule="all_done"``: it
    also stops the job of a failed run, and then fails.

    :param job: the job's name (templated)
    :param kubernetes: Kubernetes launcher settings over the connection's (namespace, image,
        service_account, node_selector, tolerations, ...: ``launchers.KUBERNETES_OPTIONS``) (templated)
    :param dlrover_conn_id: the ``dlrover`` connection
    """

    template_fields: Sequence[str] = ("job", "kubernetes")
    ui_color = "#eeeeee"

    def __init__(self, *, job: str, kubernetes: dict[str, Any] | None = None,
                 dlrover_conn_id: str = "dlrover_default", **kwargs: Any):
        super().__init__(**kwargs)
        self.job, self.dlrover_conn_id = job, dlrover_conn_id
        self.kubernetes = kubernetes

    def execute(self, context: Any) -> dict[str, Any]:
        import json

        from airflow.sdk.exceptions import AirflowFailException

        from airflow_dlrover.history.report import build_report, format_report
        from airflow_dlrover.launchers.run import job_summary

        run, job_id = self.run_ids(context)
        if not self.launcher.exists(job_id):
            self.history.finish_run(run, "failed", {"error": "the job was never launched"})
            raise AirflowFailException(f"job {job_id} was never launched: see the upstream tasks")
        try:
            status = self.launcher.master_call(job_id, "/status", timeout=10.0)
        except ConnectionError:
            status = {"state": "unreachable"}
        try:
            job = job_summary(self.launcher, job_id, self.launcher.spec(job_id)) if status["state"] == "done" else None
        finally:
            self.launcher.stop(job_id)
        report = build_report(self.history, run, job, status)
        self.history.finish_run(run, report["status"], report)
        path = self.launcher.job_dir(job_id) / "report.json"
        path.write_text(json.dumps(report, indent=2, default=str))
        for line in format_report(report):
            self.log.info("%s", line)
        self.log.info("Full report: %s; history store: %s (job %r, run %d)", path, self.history.url, self.job, run)
        if report["status"] != "succeeded":
            raise AirflowFailException(f"job {job_id} did not complete: {report.get('error', status['state'])}")
        return {key: report[key] for key in ("status", "jct_s", "profile_share", "measured_throughput",
                                              "predicted_throughput", "samples_lost", "recoveries", "resizes")}
