"""``dlrover-rm``: the stages of DLRover-RM from a shell (profile table → fit → plan).

    dlrover-rm probes --cpu 64 --memory 256Gi [-o PROBES.csv]
    dlrover-rm fit SAMPLES.csv -o MODEL.json [--prior OLD.json]
    dlrover-rm predict MODEL.json CONFIGS.csv
    dlrover-rm plan MODEL.json --cpu 64 --memory 256Gi [--objective throughput|deadline|efficiency]
    dlrover-rm demo
    dlrover-rm report JOB [--dag-id DAG] [--task-group GROUP] [--run ID] [--history-url URL]
    dlrover-rm db migrate [--to REV] [--history-url URL] | db downgrade --to REV [--history-url URL]
    dlrover-rm render --launcher kubernetes PLAN.json [--job-id ID] [--namespace NS] [--image IMG] [--samples N]
                   [--volume-claim PVC] [--data-volume-claim PVC]

User mistakes print ``error: <field>=<value> is invalid: allowed ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib.resources import files
from pathlib import Path

import numpy as np
import pandas as pd

from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.job_model import JobModel, fit_job_model
from airflow_dlrover.optimizer.planner import plan
from airflow_dlrover.optimizer.probes import design_probes
from airflow_dlrover.optimizer.types import (
    CONFIG_COLUMNS,
    Configuration,
    OBJECTIVES,
    FaultKind,
    InvalidInputError,
    JobFailed,
    Quota,
    parse_duration_s,
    parse_faults,
    parse_memory_mb,
)

EXAMPLE_SAMPLES = files("airflow_dlrover") / "data" / "example_profile.csv"


def _read_table(path: str, field: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise InvalidInputError(field, path, "an existing CSV file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise InvalidInputError(field, path, f"a CSV table with a header line ({err})") from None


def _quota(args: argparse.Namespace) -> Quota:
    return Quota.parse(
        args.cpu, args.memory, args.gpu, args.max_nodes, args.price_per_core_hour, args.price_per_gb_hour
    )


def _print_fit(model: JobModel) -> None:
    report = model.throughput.report
    print("throughput model  1/X = Σ θ·f(x)   (see airflow_dlrover/optimizer/model.py)")
    for line in model.throughput.describe():
        print("  " + line)
    held_out = "n/a (too few configurations)" if report.out_of_sample_mape is None else f"{report.out_of_sample_mape:.1%}"
    print(f"samples {report.n_samples}, configurations {report.n_configurations}, warm start: {report.warm_start}")
    print(f"in-sample MAPE {report.in_sample_mape:.1%}   {report.out_of_sample_method} MAPE {held_out}")
    if report.sharpness_cv_mape:
        tried = ", ".join(f"q={q}: {m:.1%}" for q, m in report.sharpness_cv_mape.items())
        print(f"sharpness chosen by {C.SHARPNESS_CV_FOLDS}-fold CV over configurations: {tried}")
    print(f"relative noise {report.relative_noise:.1%} (90% band ±{C.BAND_Z * report.relative_noise:.0%} at least)")
    if model.memory:
        m = model.memory
        ps = "no PS" if m.ps_base_mb is None else f"PS {m.ps_base_mb:.0f} MB + {m.table_mb:.0f} MB / p"
        print(f"memory model: {ps};  worker {m.worker_base_mb:.0f} MB + {m.activation_mb_per_sample:.3f} MB × batch")
        if m.table_growth_mb_per_m_samples > 0:
            bound = "no bound (a line)" if m.asymptote_mb is None else f"towards {m.asymptote_mb:.0f} MB"
            print(f"  tables grow {m.table_growth_mb_per_m_samples:.1f} MB per 10⁶ samples at first, {bound}")
        for name, why in m.pinned.items():
            print(f"  pinned {name}: {why}")
    else:
        print("memory model: none (no *_memory_used_mb columns): `plan` sizes nodes from --worker-memory / "
              "--ps-memory, else gives each an equal share of the quota")


def _read_layout(path: str):
    from airflow_dlrover.runtime.layout import FeatureLayout

    try:
        return FeatureLayout.from_dict(json.loads(Path(path).read_text()))
    except (OSError, json.JSONDecodeError) as err:
        raise InvalidInputError("layout", path, "a JSON file of a feature layout (docs/data.md)", str(err)) from None


def cmd_fit(args: argparse.Namespace) -> None:
    prior = JobModel.load(args.prior) if args.prior else None
    layout = _read_layout(args.layout) if args.layout else None
    model = fit_job_model(_read_table(args.samples, "SAMPLES"), prior, leave_one_out=not args.no_loco or None,
                          table_capacity_mb=layout.table_mb() if layout else None,
                          largest_table_mb=layout.largest_table_mb() if layout else None)
    model.save(args.output)
    _print_fit(model)
    print(f"wrote {args.output}")


def cmd_predict(args: argparse.Namespace) -> None:
    model = JobModel.load(args.model)
    configs = _read_table(args.configs, "CONFIGS")
    missing = [c for c in ("workers", "ps", "worker_cpu", "ps_cpu") if c not in configs]
    if missing:
        raise InvalidInputError("CONFIGS columns", list(configs.columns), "workers, ps, worker_cpu, ps_cpu", f"Missing: {missing}.")
    values = configs[["workers", "ps", "worker_cpu", "ps_cpu"]].apply(pd.to_numeric, errors="coerce")
    bad = ~np.isfinite(values.to_numpy(float)) | (values.to_numpy(float) <= 0)
    if bad.any():
        row, col = map(int, np.argwhere(bad)[0])
        raise InvalidInputError(f"CONFIGS.{values.columns[col]}", configs.iloc[row, configs.columns.get_loc(values.columns[col])], "a positive number", f"Row {row}.")
    x, lower, upper = model.throughput.predict(configs)
    out = configs.copy()
    out["predicted_throughput"], out["lower_throughput"], out["upper_throughput"] = x.round(1), lower.round(1), upper.round(1)
    out.to_csv(sys.stdout, index=False)


def cmd_plan(args: argparse.Namespace) -> None:
    model = JobModel.load(args.model)
    deadline = parse_duration_s(args.deadline) if args.deadline is not None else None
    per_node = {f"{role}_memory_mb": parse_memory_mb(value, f"{role}_memory")
                for role, value in (("worker", args.worker_memory), ("ps", args.ps_memory)) if value is not None}
    result = plan(
        model.throughput, model.memory, _quota(args), args.objective,
        samples=args.samples, deadline_s=deadline, batch_size=args.batch_size, **per_node,
    )
    out = result.to_dict(details=args.details)
    print(json.dumps(out, indent=2, ensure_ascii=False))


def cmd_probes(args: argparse.Namespace) -> None:
    prior = JobModel.load(args.prior) if args.prior else None
    table = design_probes(
        _quota(args), batch_size=args.batch_size or 512, worker_gpu=args.worker_gpu,
        prior=prior.throughput if prior else None, memory=prior.memory if prior else None,
    )
    table.to_csv(args.output or sys.stdout, index=False)
    if table.empty:
        print("a warm start profiles nothing: the prior plans and the fine-tune re-scales it "
              "(optimizer.constants.MIN_PROBES_WARM)", file=sys.stderr)
    if args.output:
        print(f"wrote {len(table)} probe configurations to {args.output}")


def cmd_demo(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    samples = pd.read_csv(EXAMPLE_SAMPLES)
    print(f"== profile table: {EXAMPLE_SAMPLES.name} ({len(samples)} samples, measured on the queueing simulation)")
    print(samples.to_string(index=False, max_rows=12))
    print("\n== fit")
    model = fit_job_model(samples)
    model.save(out / "model.json")
    _print_fit(model)
    quota = Quota.parse(64, "256Gi")
    for objective, extra in (("throughput", {}), ("efficiency", {}), ("deadline", {"samples": 2e8, "deadline_s": 4 * 3600})):
        result = plan(model.throughput, model.memory, quota, objective, **extra)
        print(f"\n== plan ({objective}) under 64 cores / 256 GiB")
        print(json.dumps(result.to_dict(details=False), indent=2, ensure_ascii=False))
    (out / "plan.json").write_text(json.dumps(plan(model.throughput, model.memory, quota).to_dict(), indent=2))
    print(f"\nwrote {out / 'model.json'} and {out / 'plan.json'}")


def cmd_report(args: argparse.Namespace) -> None:
    from airflow_dlrover.history.report import format_report
    from airflow_dlrover.history.store import HistoryStore

    store = HistoryStore(args.history_url)
    identity = store.identity(args.job, dag_id=args.dag_id, task_group=args.task_group)
    runs = [r for r in store.runs(identity) if r["summary"] and (args.run is None or r["id"] == args.run)] \
        if identity else []
    if not runs:
        raise InvalidInputError("job", args.job, f"a job with a reported run in {store.url}")
    run = runs[-1]
    print(f"{identity} (dag_id/task_group/name), run {run['id']} ({run['run_key']}): {run['status']}")
    print("\n".join(format_report(run["summary"])))
    job_id = (run["summary"].get("job") or {}).get("job_id")
    print(f"\nhistory store: {store.url}")
    if job_id:
        from airflow_dlrover.launchers import default_jobs_dir

        print(f"job folder (logs, report.json, metrics.jsonl): {default_jobs_dir() / job_id}")


def cmd_db(args: argparse.Namespace) -> None:
    """``db migrate [--to REV]`` / ``db downgrade --to REV``: move the history store's schema."""
    from airflow_dlrover.history import migrate
    from airflow_dlrover.history.store import open_engine

    downgrade = args.db_command == "downgrade"
    to = migrate.check_revision("to", args.to, downgrade=downgrade)
    engine = open_engine(args.history_url)
    before, after = (migrate.downgrade if downgrade else migrate.upgrade)(engine, to)
    url = engine.url.render_as_string(hide_password=True)
    print(f"history store {url}: revision {before or 'none'} → {after or 'none (no tables)'} "
          f"(newest: {migrate.head()})")


def cmd_train(args: argparse.Namespace) -> None:
    """Run one training job with the local launcher; write summary.json and samples.csv."""
    from airflow_dlrover.launchers.local import LocalLauncher
    from airflow_dlrover.lifecycle.run import HOT_PS_SKEW, run_job
    from airflow_dlrover.runtime.spec import JobSpec

    config = Configuration(
        workers=args.workers, ps=args.ps, worker_cpu=args.worker_cpu, ps_cpu=args.ps_cpu,
        worker_memory_mb=parse_memory_mb(args.worker_memory, "worker_memory"),
        ps_memory_mb=parse_memory_mb(args.ps_memory, "ps_memory"), worker_gpu=args.worker_gpu,
        batch_size=args.batch_size,
    )
    faults = parse_faults(args.inject)
    skew = HOT_PS_SKEW if any(f.kind == FaultKind.HOT_PS for f in faults) else args.zipf_skew
    out = Path(args.out)
    job_id = args.job_id or f"train-{int(time.time())}"
    samples = args.samples if args.samples is not None or args.data != "synthetic" else 2_000_000
    layout, dim = None, args.embedding_dim
    if args.layout:
        layout = _read_layout(args.layout)
        dim = layout.dims[0]
    spec = JobSpec(job_id=job_id, samples=samples, data=args.data, batch_size=args.batch_size, zipf_skew=skew,
                   shard_size=args.shard_size, checkpoint_interval_s=args.checkpoint_interval, seed=args.seed,
                   table_sizes=(args.table_size,) * 26, embedding_dim=dim, bottom_mlp=(64, dim), layout=layout,
                   model=args.model or "", export=args.export or "", eval_fraction=args.eval_fraction,
                   eval_files=args.eval_files, max_bad_rows=args.max_bad_rows, **_training_args(args))
    summary = run_job(LocalLauncher(out / "jobs"), spec, config, out, faults)
    keys = ("samples_expected", "samples_trained", "samples_lost", "samples_duplicated", "duplicated_by",
            "duplicates_refused", "restarts", "resizes", "bad_rows",
            "eval_auc", "eval_loss", "previous_model", "export", "median_throughput", "wall_s")
    print(json.dumps({k: summary[k] for k in keys}, indent=2))
    print(f"wrote {out / 'summary.json'} and {out / 'samples.csv'}")


#: ``train`` flags of the schedule and the optimisers, each the ``JobSpec`` field of its name (unset: its default)
TRAINING_FIELDS = ("epochs", "learning_rate", "dense_learning_rate", "adagrad_initial_accumulator", "adam_betas",
                   "dense_weight_decay", "init_from", "shuffle_window_rows")


def _add_training(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training (default: the job spec's; runtime.spec.JobSpec)")
    g.add_argument("--epochs", type=int, help="passes over the training rows, each in its own shuffled order")
    g.add_argument("--shuffle-window-rows", type=int, metavar="ROWS", help="the rows an epoch shuffles together (a "
                   "worker holds a window decoded); 0: the data's order")
    g.add_argument("--learning-rate", type=float, help="sparse Adagrad's, on the embedding tables")
    g.add_argument("--dense-learning-rate", type=float, help="Adam's, on the dense model")
    g.add_argument("--adagrad-initial-accumulator", type=float, help="Adagrad's initial accumulator")
    g.add_argument("--adam-betas", type=lambda text: tuple(float(b) for b in text.split(",")), metavar="B1,B2")
    g.add_argument("--dense-weight-decay", type=float, help="decoupled weight decay on the dense model (AdamW)")
    g.add_argument("--init-from", metavar="EXPORT", help="start from this export's model (a previous --export)")


def _training_args(args: argparse.Namespace) -> dict:
    return {field: getattr(args, field) for field in TRAINING_FIELDS if getattr(args, field) is not None}


def _trainer_spec(args: argparse.Namespace, job_id: str, samples: int | None, batch_size: int):
    """The ``JobSpec`` of a trainer of the user's from ``run-trainer`` / ``profile`` arguments."""
    from airflow_dlrover.launchers.contract import TrainerSpec
    from airflow_dlrover.runtime.spec import JobSpec

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise InvalidInputError("COMMAND", "", "the trainer's argv after `--`, e.g. -- python train.py")
    trainer = TrainerSpec(command=tuple(command), kind=args.kind or ("ps" if args.ps else "allreduce"),
                          log_regex=args.log_regex or "", metrics_port=args.metrics_port, metrics_path=args.metrics_path,
                          metrics_names=_pairs("metrics-name", args.metrics_name), grace_s=args.grace,
                          report_timeout_s=args.report_timeout, workdir=os.getcwd(), max_restarts=args.max_restarts,
                          restart_window_s=args.restart_window, reports_from=args.reports_from)
    return JobSpec(job_id=job_id, samples=samples, batch_size=batch_size, trainer=trainer.to_dict())


def _pairs(option: str, items: list[str]) -> dict[str, str]:
    """``key=value`` arguments as a mapping."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key or not sep or not value:
            raise InvalidInputError(option, item, "key=value")
        pairs[key] = value
    return pairs


def cmd_run_trainer(args: argparse.Namespace) -> None:
    """Run a trainer of your own under the contract with the local launcher, recovering injected
    faults as the guard would; write summary.json."""
    from airflow_dlrover.launchers.local import LocalLauncher
    from airflow_dlrover.lifecycle.run import run_job

    config = Configuration(
        workers=args.workers, ps=args.ps, worker_cpu=args.worker_cpu, ps_cpu=args.ps_cpu if args.ps else 0.0,
        worker_memory_mb=parse_memory_mb(args.worker_memory, "worker_memory"),
        ps_memory_mb=parse_memory_mb(args.ps_memory, "ps_memory") if args.ps else 0.0,
        worker_gpu=args.worker_gpu, batch_size=args.batch_size,
    )
    out = Path(args.out)
    spec = _trainer_spec(args, args.job_id or f"trainer-{int(time.time())}", args.samples, args.batch_size)
    resizes = [(at, Configuration(**{**config.to_row(), **changes})) for at, changes in map(_parse_resize, args.resize)]
    summary = run_job(LocalLauncher(out / "jobs"), spec, config, out, parse_faults(args.inject), resizes,
                      timeout_s=args.timeout)
    keys = ("samples_total", "samples_done", "restarts", "resizes", "restart_s", "median_throughput", "loss", "auc",
            "wall_s")
    print(json.dumps({k: summary.get(k) for k in keys}, indent=2))
    print(f"wrote {out / 'summary.json'} and {out / 'samples.csv'}")


def _parse_resize(text: str) -> tuple[float, dict[str, float]]:
    """``30s:workers=1,worker_cpu=1`` → (30.0, {"workers": 1, "worker_cpu": 1.0})."""
    at, _, changes = text.partition(":")
    values = {}
    for item in filter(None, changes.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in CONFIG_COLUMNS:
            raise InvalidInputError("resize", text, f"T:column=value[,…] with columns among {', '.join(CONFIG_COLUMNS)}")
        values[key] = float(value)
    if not values:
        raise InvalidInputError("resize", text, "T:column=value[,…], e.g. 30s:workers=1")
    return parse_duration_s(at, "resize"), values


def cmd_profile(args: argparse.Namespace) -> None:
    """Profile a trainer of your own on the designed probes, each a bounded window through the
    local launcher (per-node CPU and memory from each node's cgroup); write the sample table."""
    from airflow_dlrover.launchers.local import LocalLauncher
    from airflow_dlrover.lifecycle.profiling import profile_job

    batch_size = args.batch_size or 512
    quota = _quota(args)
    out = Path(args.out)
    jobs = Path(args.jobs_dir) if args.jobs_dir else out.parent / f"{out.stem}-jobs"
    spec = _trainer_spec(args, args.job_id or f"profile-{int(time.time())}", args.samples, batch_size)
    launcher = LocalLauncher(jobs)
    try:
        table = profile_job(launcher, spec, quota, window_s=args.window, worker_gpu=args.worker_gpu,
                            allreduce=args.ps == 0)
    finally:
        if launcher.exists(spec.job_id):
            launcher.stop(spec.job_id)
    table.to_csv(out, index=False)
    print(table.to_string(index=False, max_rows=20))
    print(f"wrote {len(table)} samples to {out}; job folder (logs): {jobs / spec.job_id}")


def _add_configuration(parser: argparse.ArgumentParser, ps: int) -> None:
    """The configuration a job runs on (``train``, ``run-trainer``)."""
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=ps, help="parameter servers (0: an all-reduce job)")
    parser.add_argument("--worker-cpu", type=float, default=1.0)
    parser.add_argument("--ps-cpu", type=float, default=0.5)
    parser.add_argument("--worker-memory", default="2Gi")
    parser.add_argument("--ps-memory", default="1Gi")
    parser.add_argument("--worker-gpu", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=512)


def _add_trainer(parser: argparse.ArgumentParser) -> None:
    from airflow_dlrover.launchers.contract import REPORTS_FROM

    parser.add_argument("--kind", choices=("allreduce", "ps"), default=None,
                        help="allreduce (torch.distributed, no PS: the group restarts as one) or ps (default: by --ps)")
    parser.add_argument("--log-regex", default=None,
                        help="read reports from the log: a regex with (?P<throughput>…) [samples_done, samples_total, loss, auc]")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="read reports from the Prometheus text each node serves on DLROVER_METRICS_PORT "
                             "(locally a free port per node; this port on Kubernetes)")
    parser.add_argument("--metrics-path", default="/metrics", help="the endpoint's path (with --metrics-port)")
    parser.add_argument("--metrics-name", action="append", default=[], metavar="FIELD=SAMPLE",
                        help="the sample a field is read from (default dlrover_<field>), e.g. throughput=train_samples_per_second")
    parser.add_argument("--grace", type=float, default=T.TRAINER_GRACE_S, help="seconds from SIGTERM to SIGKILL")
    parser.add_argument("--report-timeout", type=float, default=T.TRAINER_REPORT_TIMEOUT_S,
                        help="a node that reports nothing this long after its start is a contract error")
    parser.add_argument("--max-restarts", type=int, default=C.TRAINER_MAX_RESTARTS,
                        help="failures the trainer may have within --restart-window before it stops (as torchrun's)")
    parser.add_argument("--restart-window", type=float, default=C.TRAINER_RESTART_WINDOW_S,
                        help="seconds over which --max-restarts counts")
    parser.add_argument("--reports-from", choices=REPORTS_FROM, default="every_node",
                        help="every_node: each worker reports its own rate; rank0: worker 0 reports the job's")
    parser.add_argument("--samples", type=int, default=None, help="samples to train (DLROVER_SAMPLES)")
    parser.add_argument("--job-id", default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the trainer's argv")


RENDER_LAUNCHERS = ("kubernetes",)  # the local launcher starts processes: it has nothing to render


def cmd_render(args: argparse.Namespace) -> None:
    """Print the manifests of a plan (a configuration row, as ``plan`` writes it) as YAML."""
    from airflow_dlrover.launchers.kubernetes_manifests import config_from_plan, render_job, to_yaml
    from airflow_dlrover.runtime.spec import JobSpec

    if args.launcher not in RENDER_LAUNCHERS:
        raise InvalidInputError("launcher", args.launcher, " | ".join(RENDER_LAUNCHERS))
    try:
        row = json.loads(Path(args.plan).read_text())
    except FileNotFoundError:
        raise InvalidInputError("PLAN", args.plan, "an existing JSON file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidInputError("PLAN", args.plan, f"a JSON object as `dlrover-rm plan` prints it ({err})") from None
    config = config_from_plan(row)
    if args.samples is not None and args.samples < 1:
        raise InvalidInputError("samples", args.samples, "an integer ≥ 1")
    extra = {} if args.samples is None else {"samples": args.samples}
    spec = JobSpec(job_id=args.job_id, batch_size=config.batch_size, **extra)
    labels = None
    if args.launcher_pod_labels:
        pairs = [item.partition("=") for item in args.launcher_pod_labels.split(",")]
        if any(not k or not sep for k, sep, _ in pairs):
            raise InvalidInputError("launcher-pod-labels", args.launcher_pod_labels, "key=value[,key=value...]")
        labels = {k: v for k, _, v in pairs}
    objects = render_job(spec, config, namespace=args.namespace, image=args.image, volume_claim=args.volume_claim,
                         data_volume_claim=args.data_volume_claim, launcher_namespace=args.launcher_namespace,
                         launcher_pod_labels=labels)
    print(to_yaml(objects), end="")


def _add_quota(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", required=True, help="cores in the quota, e.g. 64")
    parser.add_argument("--memory", required=True, help="memory in the quota, e.g. 256Gi")
    parser.add_argument("--gpu", default=0, help="GPUs in the quota (default 0)")
    parser.add_argument("--max-nodes", default=None, help="most pods/processes (default: no limit)")
    parser.add_argument("--price-per-core-hour", default=None)
    parser.add_argument("--price-per-gb-hour", default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="batch per worker step (default: the model's)")


HISTORY_URL_HELP = "SQLAlchemy URL of the history store (default: SQLite under AIRFLOW_HOME)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlrover-rm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="fit throughput and memory models to a sample table")
    p.add_argument("samples", metavar="SAMPLES.csv")
    p.add_argument("-o", "--output", required=True, metavar="MODEL.json")
    p.add_argument("--prior", metavar="MODEL.json", help="warm start from an earlier model of the job")
    p.add_argument("--layout", metavar="LAYOUT.json", help="the job's feature layout: PS memory saturates at its tables")
    p.add_argument("--no-loco", action="store_true", help="measure the out-of-sample error by k-fold CV instead of leave-one-configuration-out when there are many configurations")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("predict", help="predict throughput for configurations")
    p.add_argument("model", metavar="MODEL.json")
    p.add_argument("configs", metavar="CONFIGS.csv")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("plan", help="plan an allocation under a quota")
    p.add_argument("model", metavar="MODEL.json")
    _add_quota(p)
    p.add_argument("--objective", choices=OBJECTIVES, default="throughput")
    p.add_argument("--samples", type=float, default=None, help="samples to train (deadline objective; PS growth)")
    p.add_argument("--deadline", default=None, help="e.g. 2h (deadline objective)")
    p.add_argument("--details", action="store_true", help="include alternatives and the Pareto front")
    p.add_argument("--worker-memory", default=None, help="memory per worker, e.g. 4Gi (default: the model's, "
                   "else an equal share of the quota)")
    p.add_argument("--ps-memory", default=None, help="memory per PS, e.g. 8Gi (default: the model's, else an equal share)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("probes", help="design the configurations to profile")
    _add_quota(p)
    p.add_argument("--worker-gpu", type=int, default=0)
    p.add_argument("--prior", metavar="MODEL.json")
    p.add_argument("-o", "--output", metavar="PROBES.csv")
    p.set_defaults(func=cmd_probes)

    p = sub.add_parser("train", help="run a training job with the local launcher")
    _add_configuration(p, ps=1)
    p.add_argument("--samples", type=int, default=None,
                   help="samples to train (default: 2,000,000 synthetic; every training row of a dataset)")
    p.add_argument("--shard-size", type=int, default=8192)
    p.add_argument("--data", default="synthetic", metavar="PATH_OR_URL",
                   help="synthetic, or a Parquet/CSV/TSV file, folder or glob, local or an fsspec URL")
    p.add_argument("--layout", metavar="LAYOUT.json", help="the feature layout (default: the Criteo columns)")
    p.add_argument("--model", metavar="pkg.module:build", help="your dense model (default: DenseDLRM)")
    p.add_argument("--export", metavar="DIR_OR_URL", help="export the trained model here, atomically")
    p.add_argument("--eval-fraction", type=float, default=0.2, help="rows held out at the dataset's end")
    p.add_argument("--eval-files", type=int, default=0, help="hold out the dataset's last N files instead")
    p.add_argument("--max-bad-rows", type=int, default=1000, help="unreadable rows before the job fails")
    p.add_argument("--table-size", type=int, default=20_000, help="rows of each of the 26 Criteo tables")
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--zipf-skew", type=float, default=1.05)
    p.add_argument("--checkpoint-interval", type=float, default=30.0, help="seconds between checkpoints")
    p.add_argument("--seed", type=int, default=0)
    _add_training(p)
    p.add_argument("--inject", action="append", default=[], help="fault, e.g. kill-worker@20s (repeatable)")
    p.add_argument("--job-id", default=None)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("run-trainer", help="run a trainer of your own under the contract (docs/trainers.md)")
    _add_configuration(p, ps=0)
    p.add_argument("--inject", action="append", default=[], help="fault, e.g. kill-worker@20s (repeatable)")
    p.add_argument("--resize", action="append", default=[], metavar="T:COLUMN=VALUE,…",
                   help="resize (a group restart) at T, e.g. 30s:workers=1,worker_cpu=1 (repeatable)")
    p.add_argument("--timeout", type=float, default=3600.0, help="give up after this many seconds")
    p.add_argument("--out", required=True)
    _add_trainer(p)
    p.set_defaults(func=cmd_run_trainer)

    p = sub.add_parser("profile", help="profile a trainer of your own on the designed probes")
    _add_quota(p)
    p.add_argument("--ps", type=int, default=None, help="0: an all-reduce trainer (probes without PS)")
    p.add_argument("--worker-gpu", type=int, default=0)
    p.add_argument("--window", type=float, default=C.TRAINER_PROBE_WINDOW_S, help="seconds each probe is measured")
    p.add_argument("--jobs-dir", default=None, help="where the probe job's folder goes (default: beside --out)")
    p.add_argument("--out", required=True, metavar="SAMPLES.csv")
    _add_trainer(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("report", help="print the report of a job's last run from the history store")
    p.add_argument("job", help="the job's name (add --dag-id / --task-group when several DAGs or groups use it)")
    p.add_argument("--dag-id", help="the DAG of the job ('' for jobs recorded outside Airflow)")
    p.add_argument("--task-group", help="the job's task group in its DAG ('' for the DAG's root)")
    p.add_argument("--run", type=int, help="a run id (default: the last reported run)")
    p.add_argument("--history-url", help=HISTORY_URL_HELP)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("db", help="the history store's schema (Alembic migrations)")
    db = p.add_subparsers(dest="db_command", required=True)
    q = db.add_parser("migrate", help="upgrade the schema (opening the store does it too)")
    q.add_argument("--to", default="head", help="a revision (default: head, the newest)")
    q.add_argument("--history-url", help=HISTORY_URL_HELP)
    q.set_defaults(func=cmd_db)
    q = db.add_parser("downgrade", help="downgrade the schema for an older airflow-dlrover "
                      "(this one upgrades it again when it opens the store)")
    q.add_argument("--to", required=True, help="a revision, or base (drops every table)")
    q.add_argument("--history-url", help=HISTORY_URL_HELP)
    q.set_defaults(func=cmd_db)

    p = sub.add_parser("render", help="print the Kubernetes manifests of a plan (multi-document YAML)")
    p.add_argument("plan", metavar="PLAN.json", help="a configuration row, e.g. the output of `dlrover-rm plan`")
    p.add_argument("--launcher", required=True, help="kubernetes (the only one with manifests)")
    p.add_argument("--job-id", default="dlrm", help="DNS-1123 label naming every object (default dlrm)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--image", default="airflow-dlrover:latest", help="the runtime image (see the Dockerfile)")
    p.add_argument("--samples", type=int, default=None, help="samples to train (default: JobSpec's)")
    p.add_argument("--volume-claim", default="dlrover-jobs", help="ReadWriteMany claim holding the job dirs")
    p.add_argument("--data-volume-claim", default=None, help="claim of the training data, mounted read-only")
    p.add_argument("--launcher-namespace", default=None,
                   help="namespace of the Airflow pods the NetworkPolicies admit (default: the job's)")
    p.add_argument("--launcher-pod-labels", default=None,
                   help="labels of those pods, key=value[,key=value] (default: any pod of that namespace)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("demo", help="profile table → fit → plan on the bundled example")
    p.add_argument("--out", default="dlrover-demo", help="folder for model.json and plan.json")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command's ``func``; a user mistake prints one line, exit status 2."""
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except InvalidInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except JobFailed as err:
        print(f"failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
