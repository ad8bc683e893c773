"""``DLRoverProfileOperator``: profile the job on the probe configurations (DLRover-RM §4)."""

from __future__ import annotations

import time
from typing import Any, Sequence

from airflow_dlrover.operators.base import DLRoverBaseOperator
from airflow_dlrover.operators.job import build_spec, duration_s, user_errors


class DLRoverProfileOperator(DLRoverBaseOperator):
    """Profile the job on the probe configurations the optimizer designs under the quota and store
    the sample table. A warm start (the job has a prior, ``HistoryStore.prior_model``) profiles
    nothing: the prior plans, and the fine-tune re-scales it from the job's own windows. A job with
    no history of its own starts from the models of jobs like it where the store has some
    (``HistoryStore.similar_prior``: by layout, dense network, batch and trainer), and profiles
    the fewer probes the more alike they are (``optimizer.similarity``).

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
    :param similar_jobs: a job with no history of its own starts from the models of jobs like it;
        False: it profiles cold (an A/B of the prior, or a job that must not learn from others')
    Shared arguments (``job``, ``quota``, ``kubernetes``, ``dlrover_conn_id``): ``DLRoverBaseOperator``.
    """

    template_fields: Sequence[str] = (*DLRoverBaseOperator.template_fields, "job_args", "probe_window")
    ui_color = "#e8f4fd"

    def __init__(self, *, job_args: dict[str, Any] | None = None, probe_window: str | float | None = None,
                 similar_jobs: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.job_args, self.probe_window, self.similar_jobs = job_args, probe_window, similar_jobs

    def execute(self, context: Any) -> dict[str, Any]:
        import pandas as pd

        from airflow_dlrover.lifecycle.profiling import advance
        from airflow_dlrover.optimizer import constants as C
        from airflow_dlrover.optimizer.controller import begin
        from airflow_dlrover.optimizer.types import EventKind
        from airflow_dlrover.runtime.export import starting_tables_mb

        run, job_id = self.run_ids(context)
        with user_errors():
            quota = self.parsed_quota()
            spec = build_spec(job_id, self.job_args)
            trainer = spec.trainer
            default_window = C.TRAINER_PROBE_WINDOW_S if trainer else C.PROBE_WINDOW_S
            window_s = duration_s("probe_window", self.probe_window) if self.probe_window else default_window
            prior = self.history.prior_model(self.job, before_run=run)
            signature = spec.signature()
            similar = self.history.similar_prior(self.job, signature) if prior is None and self.similar_jobs else None
            layout = {"table_mb": None, "largest_table_mb": None} if trainer else {
                "table_mb": spec.layout.table_mb(), "largest_table_mb": spec.layout.largest_table_mb(),
                "table_start_mb": starting_tables_mb(spec)}
            state = begin(quota, prior=prior, batch_size=spec.batch_size, window_s=window_s,
                          allreduce=bool(trainer) and trainer["kind"] == "allreduce", similar=similar, **layout)
        designed = len(state.probes)
        start = "warm" if prior else f"similar ({similar.describe()})" if similar else "cold"
        self.log.info("%s start: %d probes under %s", start, designed, quota)
        started = time.monotonic()
        with user_errors():  # a trainer that breaks its contract
            state, _ = advance(self.launcher, job_id, state, spec=spec)
        profile_s = time.monotonic() - started if designed else 0.0
        table = pd.DataFrame(list(state.profile))
        self.history.clear_samples(run, "profile")  # a retry profiles again: keep one table
        if len(table):
            self.history.add_samples(run, table, stage="profile")
        self.history.add(run, "event", {"event": EventKind.PROFILED.value, "probes": designed, "measured": len(table),
                                        "table_capacity_mb": layout["table_mb"],
                                        "largest_table_mb": layout["largest_table_mb"],
                                        "table_start_mb": layout.get("table_start_mb"), "apart": state.apart,
                                        "warm_start": prior is not None, "profile_s": profile_s,
                                        "signature": signature, "similar": similar.to_dict() if similar else None,
                                        # a stand-in's samples are not the job's
                                        "samples_trained": float(table["samples_seen"].max())
                                        if len(table) and not state.apart else 0.0,
                                        "trainer": bool(trainer), "window_s": window_s, "time": time.time()})
        for row in table.to_dict("records"):
            self.log.info("probe %dw×%g + %dps×%g: %.0f samples/s", row["workers"], row["worker_cpu"], row["ps"],
                          row["ps_cpu"], row["throughput"])
        measured = {"throughput_min": float(table["throughput"].min()) if len(table) else None,
                    "throughput_max": float(table["throughput"].max()) if len(table) else None}
        return {"run": run, "job_id": job_id, "probes": designed, "measured": len(table),
                "warm_start": prior is not None, "similar_to": [name for name, _ in similar.sources] if similar else [],
                "profile_s": round(profile_s, 2), **measured}
