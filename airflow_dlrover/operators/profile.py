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

    The job is profiled on itself, through the launcher: it starts on the first probe and is
    resized through the others, each measured for a bounded window (``lifecycle.profiling``), and
    the samples it trains meanwhile count. It measures the probes that identify the model, and the
    rest as far as ``PROFILE_BUDGET_FRACTION`` of the job's run time allows. That holds for our
    runtime and for a trainer of the user's (``job_args.trainer``, ``docs/trainers.md``), whose
    probes are all-reduce ones (``ps = 0``) when it is an ``allreduce`` trainer.

    :param job_args: the job: samples, data (``synthetic``, or a Parquet/CSV/TSV dataset: a file, folder,
        glob or fsspec URL), layout, model, export, eval_fraction, eval_files, max_bad_rows, table_size,
        tables, embedding_dim, batch_size, ...; or ``trainer`` (a ``TrainerSpec`` mapping) with
        samples and batch_size (templated)
    :param probe_window: measurement time per probe (default: ``PROBE_WINDOW_S`` for our runtime,
        ``TRAINER_PROBE_WINDOW_S`` for a trainer of the user's) (templated)
    Shared arguments (``job``, ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``.
    """

    template_fields: Sequence[str] = (*DLRoverBaseOperator.template_fields, "job_args", "probe_window")
    ui_color = "#e8f4fd"

    def __init__(self, *, job_args: dict[str, Any] | None = None, probe_window: str | float | None = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.job_args, self.probe_window = job_args, probe_window

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_dlrover.lifecycle.profiling import profile_job
        from airflow_dlrover.optimizer import constants as C
        from airflow_dlrover.optimizer.probes import design_probes
        from airflow_dlrover.optimizer.types import EventKind

        run, job_id = self.run_ids(context)
        with user_errors():
            quota = self.parsed_quota()
            spec = build_spec(job_id, self.job_args)
            trainer = spec.trainer
            default_window = C.TRAINER_PROBE_WINDOW_S if trainer else C.PROBE_WINDOW_S
            window_s = duration_s("probe_window", self.probe_window) if self.probe_window else default_window
            prior = self.history.prior_model(self.job, before_run=run)
            probes = design_probes(quota, batch_size=spec.batch_size, prior=prior.throughput if prior else None,
                                   memory=prior.memory if prior else None,
                                   table_mb=None if trainer else spec.layout.table_mb(),
                                   largest_table_mb=None if trainer else spec.layout.largest_table_mb(),
                                   allreduce=bool(trainer) and trainer["kind"] == "allreduce")
        self.log.info("%s start: %d probes under %s", "warm" if prior else "cold", len(probes), quota)
        if probes.empty:  # a warm start: the prior plans, the fine-tune re-scales it (probes.py)
            self.history.clear_samples(run, "profile")
            summary = {"run": run, "job_id": job_id, "probes": 0, "measured": 0, "warm_start": True, "profile_s": 0.0}
            self.history.add(run, "event", {"event": EventKind.PROFILED.value, **summary, "trainer": bool(trainer),
                                            "time": time.time()})
            return {**summary, "throughput_min": None, "throughput_max": None}
        started = time.monotonic()
        with user_errors():  # a trainer that breaks its contract
            table = profile_job(self.launcher, spec, probes, quota, window_s=window_s)
        profile_s = time.monotonic() - started
        self.history.clear_samples(run, "profile")  # a retry profiles again: keep one table
        self.history.add_samples(run, table, stage="profile")
        self.history.add(run, "event", {"event": EventKind.PROFILED.value, "probes": len(probes), "measured": len(table),
                                        "table_capacity_mb": None if trainer else spec.layout.table_mb(),
                                        "largest_table_mb": None if trainer else spec.layout.largest_table_mb(),
                                        "warm_start": prior is not None, "profile_s": profile_s,
                                        "samples_trained": float(table["samples_seen"].max()) if len(table) else 0.0,
                                        "trainer": bool(trainer), "window_s": window_s, "time": time.time()})
        if table.empty:
            raise RuntimeError(f"no probe of job {job_id} was measured cleanly; see the task log")
        for row in table.to_dict("records"):
            self.log.info("probe %dw×%g + %dps×%g: %.0f samples/s", row["workers"], row["worker_cpu"], row["ps"],
                          row["ps_cpu"], row["throughput"])
        return {"run": run, "job_id": job_id, "probes": len(probes), "measured": len(table),
                "warm_start": prior is not None, "profile_s": round(profile_s, 2),
                "throughput_min": float(table["throughput"].min()), "throughput_max": float(table["throughput"].max())}
