"""``DLRoverProfileOperator``: profile the job on the probe configurations (DLRover-RM §4)."""

from __future__ import annotations

import time
from typing import Any, Sequence

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.job import build_spec, duration_s, user_errors


class DLRoverProfileOperator(DLRoverBaseOperator):
    """Profile the job on the probe configurations the optimizer designs under the quota and store
    the sample table. A warm start (the job has a prior, ``HistoryStore.prior_model``) profiles
    nothing: the prior plans, and the fine-tune re-scales it from the job's own windows.

    Our DLRM runtime is profiled on the job itself (it starts on the first probe; see
    ``launchers.profiling``). With ``command`` a user's own trainer is profiled instead: the
    command runs once per probe for ``probe_window`` with the configuration in its placeholders
    and ``DLROVER_CONFIG``, its throughput read from ``metrics_file`` or ``log_regex``.

    :param job_args: the job: samples, data (``synthetic``, or a Parquet/CSV/TSV dataset: a file, folder,
        glob or fsspec URL), layout, model, export, eval_fraction, eval_files, max_bad_rows, table_size,
        tables, embedding_dim, batch_size, ... (templated)
    :param probe_window: measurement time per probe, for ``command`` (templated)
    :param command: bring-your-own trainer command, an argv list (or a string split like a shell
        does); it runs without a shell (local launcher) (templated)
    :param metrics_file: file (in the probe's working folder) where the trainer writes its throughput (templated)
    :param log_regex: regex on the trainer's output whose first group is its throughput (templated)
    Shared arguments (``job``, ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``.
    """

    template_fields: Sequence[str] = (*DLRoverBaseOperator.template_fields, "job_args", "probe_window", "command",
                                      "metrics_file", "log_regex")
    ui_color = "#e8f4fd"

    def __init__(self, *, job_args: dict[str, Any] | None = None, probe_window: str | float = "20s",
                 command: str | list[str] | None = None, metrics_file: str | None = None, log_regex: str | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.job_args, self.probe_window = job_args, probe_window
        self.command, self.metrics_file, self.log_regex = command, metrics_file, log_regex

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.launchers.profiling import profile_command, profile_job
        from airflow_dlrover.optimizer.probes import design_probes
        from airflow_dlrover.optimizer.types import EventKind

        run, job_id = self.run_ids(context)
        with user_errors():
            quota = self.parsed_quota()
            spec = build_spec(job_id, self.job_args)
            window_s = duration_s("probe_window", self.probe_window)
            prior = self.history.prior_model(self.job, before_run=run)
            probes = design_probes(quota, batch_size=spec.batch_size, prior=prior.throughput if prior else None,
                                   memory=prior.memory if prior else None, table_mb=spec.layout.table_mb())
        self.log.info("%s start: %d probes under %s", "warm" if prior else "cold", len(probes), quota)
        if probes.empty:  # a warm start: the prior plans, the fine-tune re-scales it (probes.py)
            self.history.clear_samples(run, "profile")
            summary = {"run": run, "job_id": job_id, "probes": 0, "measured": 0, "warm_start": True, "profile_s": 0.0}
            self.history.add(run, "event", {"event": EventKind.PROFILED.value, **summary, "bring_your_own": bool(self.command),
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
        self.history.add(run, "event", {"event": EventKind.PROFILED.value, "probes": len(probes), "measured": len(table),
                                        "table_capacity_mb": spec.layout.table_mb(),
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
