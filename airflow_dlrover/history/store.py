"""History store: jobs, runs, profile samples, fitted models, plans, decisions, instability events.

SQLAlchemy 2 (any URL: the embedded default is a SQLite file under ``AIRFLOW_HOME``, production
may use PostgreSQL). Keyed so that the next day's run of a job finds its prior
(:meth:`HistoryStore.prior_model`), which warm-starts the fit and shortens the profiling.
Large things (time series, models) live here, not in XCom.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, create_engine, delete, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from airflow_dlrover.optimizer.job_model import JobModel
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, USAGE_COLUMNS

SAMPLE_COLUMNS = (*CONFIG_COLUMNS, "throughput", *USAGE_COLUMNS, "samples_seen", "timestamp")


def default_url() -> str:
    """``sqlite:///$AIRFLOW_HOME/dlrover_history.db`` (``~/airflow`` when unset, as Airflow does)."""
    home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow"))
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'dlrover_history.db'}"


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "dlrover_jobs"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(250), unique=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Run(Base):
    __tablename__ = "dlrover_runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("dlrover_jobs.id"), index=True)
    run_key: Mapped[str] = mapped_column(String(250))  # e.g. the Airflow dag_id/run_id
    started: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    status: Mapped[str] = mapped_column(String(32), default="running")
    summary: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class Sample(Base):
    __tablename__ = "dlrover_samples"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("dlrover_runs.id"), index=True)
    stage: Mapped[str] = mapped_column(String(32))  # profile | train
    workers: Mapped[int] = mapped_column(Integer)
    ps: Mapped[int] = mapped_column(Integer)
    worker_cpu: Mapped[float] = mapped_column(Float)
    ps_cpu: Mapped[float] = mapped_column(Float)
    worker_memory_mb: Mapped[float] = mapped_column(Float)
    ps_memory_mb: Mapped[float] = mapped_column(Float)
    worker_gpu: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    throughput: Mapped[float] = mapped_column(Float)
    worker_cpu_used: Mapped[float | None] = mapped_column(Float, nullable=True)
    ps_cpu_used: Mapped[float | None] = mapped_column(Float, nullable=True)
    worker_memory_used_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    ps_memory_used_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_seen: Mapped[float | None] = mapped_column(Float, nullable=True)
    timestamp: Mapped[float | None] = mapped_column(Float, nullable=True)


class Model(Base):
    __tablename__ = "dlrover_models"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("dlrover_runs.id"), index=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    document: Mapped[dict] = mapped_column(JSON)  # JobModel.to_dict()


class Record(Base):
    """Plans, fine-tune decisions and instability events: a kind, a time and a JSON document."""

    __tablename__ = "dlrover_records"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("dlrover_runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)  # plan | decision | event
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    document: Mapped[dict] = mapped_column(JSON)


RECORD_KINDS = ("plan", "decision", "event")


class HistoryStore:
    """The store behind one SQLAlchemy URL (tables are created on first use)."""

    def __init__(self, url: str | None = None):
        self.url = url or default_url()
        self.engine = create_engine(self.url, future=True)
        Base.metadata.create_all(self.engine)

    def start_run(self, job: str, run_key: str) -> int:
        """Open (or reopen, on a retry) the run ``run_key`` of ``job``; returns its id."""
        with Session(self.engine) as session, session.begin():
            record = session.scalar(select(Job).where(Job.name == job))
            if record is None:
                record = Job(name=job)
                session.add(record)
                session.flush()
            run = session.scalar(select(Run).where(Run.job_id == record.id, Run.run_key == run_key))
            if run is None:
                run = Run(job_id=record.id, run_key=run_key)
                session.add(run)
                session.flush()
            return run.id

    def finish_run(self, run_id: int, status: str, summary: dict[str, Any] | None = None) -> None:
        with Session(self.engine) as session, session.begin():
            run = session.get(Run, run_id)
            run.status, run.summary, run.finished = status, summary, _now()

    def add_samples(self, run_id: int, table: pd.DataFrame, stage: str = "profile") -> int:
        rows = table.reindex(columns=list(SAMPLE_COLUMNS)).astype(object).where(table.notna(), None)
        with Session(self.engine) as session, session.begin():
            session.add_all(Sample(run_id=run_id, stage=stage, **row) for row in rows.to_dict("records"))
        return len(rows)

    def clear_samples(self, run_id: int, stage: str) -> None:
        """Forget a run's samples of one stage (a retried profile measures them again)."""
        with Session(self.engine) as session, session.begin():
            session.execute(delete(Sample).where(Sample.run_id == run_id, Sample.stage == stage))

    def samples(self, job: str, *, run_id: int | None = None, stage: str | None = None) -> pd.DataFrame:
        """The job's samples, oldest first (a sample table in the vocabulary's columns)."""
        query = select(Sample).join(Run, Sample.run_id == Run.id).join(Job, Run.job_id == Job.id).where(Job.name == job)
        if run_id is not None:
            query = query.where(Sample.run_id == run_id)
        if stage is not None:
            query = query.where(Sample.stage == stage)
        with Session(self.engine) as session:
            rows = [{c: getattr(s, c) for c in SAMPLE_COLUMNS} for s in session.scalars(query.order_by(Sample.id))]
        return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))

    def samples_of_run(self, run_id: int) -> pd.DataFrame:
        """One run's samples, oldest first, with their ``stage`` (profile | finetune)."""
        columns = (*SAMPLE_COLUMNS, "stage")
        with Session(self.engine) as session:
            query = select(Sample).where(Sample.run_id == run_id).order_by(Sample.id)
            rows = [{c: getattr(s, c) for c in columns} for s in session.scalars(query)]
        return pd.DataFrame(rows, columns=list(columns))

    def save_model(self, run_id: int, model: JobModel) -> int:
        with Session(self.engine) as session, session.begin():
            record = Model(run_id=run_id, document=model.to_dict())
            session.add(record)
            session.flush()
            return record.id

    def latest_model(self, job: str, *, before_run: int | None = None) -> JobModel | None:
        """The newest model of ``job`` (from an earlier run when ``before_run`` is given)."""
        with Session(self.engine) as session:
            record = session.scalars(self._models(job, before_run).limit(1)).first()
            return JobModel.from_dict(record.document) if record else None

    def prior_model(self, job: str, *, before_run: int | None = None) -> JobModel | None:
        """The prior that warm-starts a run: the throughput model of the newest *cold* fit (one
        fitted without a prior, on a full profile) with the newest memory model.

        Warm-started fits never become priors: each is pulled toward its own prior, so a chain of
        them compounds the errors of a few probes run after run (in the cluster simulation the
        chain shrank one family's plan from 80 to 15 workers over three runs; anchoring on the
        cold fit cut the median JCT of ``ours`` by 14, 9 and 17 % on three seeds of 300 jobs, and
        by 5 % on the 1,000-job day: ``benchmarks/cluster_sim.py``, ``benchmarks/simulate.py``).
        """
        with Session(self.engine) as session:
            newest, cold = None, None
            for record in session.scalars(self._models(job, before_run)):
                model = JobModel.from_dict(record.document)
                newest = newest or model
                report = model.throughput.report
                if report is None or not report.warm_start:
                    cold = model
                    break
        if newest is None:
            return None
        return JobModel((cold or newest).throughput, newest.memory)

    @staticmethod
    def _models(job: str, before_run: int | None):
        """The job's models, newest first (none of ``before_run``)."""
        query = select(Model).join(Run, Model.run_id == Run.id).join(Job, Run.job_id == Job.id).where(Job.name == job)
        if before_run is not None:
            query = query.where(Model.run_id != before_run)
        return query.order_by(Model.created.desc(), Model.id.desc())

    def add(self, run_id: int, kind: str, document: dict[str, Any]) -> int:
        """Record a plan, a fine-tune decision or an instability event."""
        if kind not in RECORD_KINDS:
            raise ValueError(f"kind={kind!r} is invalid: allowed {', '.join(RECORD_KINDS)}")
        with Session(self.engine) as session, session.begin():
            record = Record(run_id=run_id, kind=kind, document=document)
            session.add(record)
            session.flush()
            return record.id

    def records(self, run_id: int, kind: str) -> list[dict[str, Any]]:
        with Session(self.engine) as session:
            query = select(Record).where(Record.run_id == run_id, Record.kind == kind).order_by(Record.id)
            return [r.document for r in session.scalars(query)]

    def run(self, run_id: int) -> dict[str, Any] | None:
        """One run (with its job's name and UTC times), None when there is no such run."""
        with Session(self.engine) as session:
            row = session.execute(select(Run, Job.name).join(Job, Run.job_id == Job.id).where(Run.id == run_id)).first()
            return _run_row(*row) if row else None

    def runs(self, job: str | None = None, *, run_key: str | None = None) -> list[dict[str, Any]]:
        """The runs of ``job`` (every job when None), optionally those of one ``run_key``, oldest first."""
        query = select(Run, Job.name).join(Job, Run.job_id == Job.id)
        if job is not None:
            query = query.where(Job.name == job)
        if run_key is not None:
            query = query.where(Run.run_key == run_key)
        with Session(self.engine) as session:
            return [_run_row(r, name) for r, name in session.execute(query.order_by(Run.id))]

    def jobs(self) -> list[str]:
        """The names of the jobs with a run, alphabetically."""
        with Session(self.engine) as session:
            return list(session.scalars(select(Job.name).order_by(Job.name)))

    def models_of_run(self, run_id: int) -> list[dict[str, Any]]:
        """The models fitted in one run (the fit task's first, then each fine-tune refit)."""
        with Session(self.engine) as session:
            query = select(Model).where(Model.run_id == run_id).order_by(Model.id)
            return [{"id": m.id, "created": _utc(m.created), "document": m.document} for m in session.scalars(query)]


def _utc(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; they were written in UTC."""
    return moment.replace(tzinfo=timezone.utc) if moment is not None and moment.tzinfo is None else moment


def _run_row(r: Run, job: str) -> dict[str, Any]:
    return {"id": r.id, "job": job, "run_key": r.run_key, "status": r.status, "started": _utc(r.started),
            "finished": _utc(r.finished), "summary": r.summary}
