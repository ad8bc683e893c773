"""History store: jobs, runs, profile samples, fitted models, plans, decisions, instability events.

SQLAlchemy 2 on SQLite (the embedded default: a file under ``AIRFLOW_HOME``) or PostgreSQL
(``postgresql+psycopg://...``, the ``postgres`` extra), the schema kept by Alembic migrations
(``migrate``). A job is its ``JobIdentity`` (dag id, task group, name), so that the next day's run
of the same task group of the same DAG finds its prior (:meth:`HistoryStore.prior_model`), which
warm-starts the fit and shortens the profiling, and the same name elsewhere never does. Large
things (time series, models) live here, not in XCom.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import (JSON, BigInteger, DateTime, Engine, Float, ForeignKey, Index, Integer, String,
                        UniqueConstraint, create_engine, delete, select)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from airflow_dlrover.history import migrate
from airflow_dlrover.history.identity import ID_LENGTH, JobIdentity
from airflow_dlrover.optimizer.constants import MEMORY_OOM_HISTORY_RUNS
from airflow_dlrover.optimizer.job_model import JobModel, choose_prior
from airflow_dlrover.optimizer.similarity import SimilarPrior, similar_prior
from airflow_dlrover.optimizer.types import (
    CONFIG_COLUMNS, RESIZE_ACTIONS, USAGE_COLUMNS, Configuration, EventKind, InvalidInputError,
)

SAMPLE_COLUMNS = (*CONFIG_COLUMNS, "throughput", *USAGE_COLUMNS, "samples_seen", "timestamp")


def default_url() -> str:
    """``sqlite:///$AIRFLOW_HOME/dlrover_history.db`` (``~/airflow`` when unset, as Airflow does)."""
    home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow"))
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'dlrover_history.db'}"


def open_engine(url: str | None = None) -> Engine:
    """The engine of a store's URL (``default_url()`` when None), writing JSON as ``_json``."""
    return create_engine(url or default_url(), json_serializer=_json)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


#: Ids are 64-bit on every backend (SQLite's INTEGER PRIMARY KEY is its 64-bit rowid).
ID = BigInteger().with_variant(Integer(), "sqlite")
#: The largest id a lookup can match; a larger one (a URL's) finds nothing instead of overflowing.
MAX_ID = 2**63 - 1


class Job(Base):
    """A job: (dag_id, task_group, name), unique (``identity.JobIdentity``)."""

    __tablename__ = "dlrover_jobs"
    __table_args__ = (UniqueConstraint("dag_id", "task_group", "name", name="uq_dlrover_jobs_identity"),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(ID_LENGTH))
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    dag_id: Mapped[str] = mapped_column(String(ID_LENGTH), server_default="")
    task_group: Mapped[str] = mapped_column(String(ID_LENGTH), server_default="")

    def identity(self) -> JobIdentity:
        return JobIdentity(self.dag_id, self.task_group, self.name)


class Run(Base):
    """A run of a job: one per (job, run_key), the Airflow run id."""

    __tablename__ = "dlrover_runs"
    __table_args__ = (Index("uq_dlrover_runs_job_run_key", "job_id", "run_key", unique=True),)
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    job_id: Mapped[int] = mapped_column(ID, ForeignKey("dlrover_jobs.id"), index=True)
    run_key: Mapped[str] = mapped_column(String(ID_LENGTH))
    started: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    status: Mapped[str] = mapped_column(String(32), default="running")
    summary: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class Sample(Base):
    __tablename__ = "dlrover_samples"
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    run_id: Mapped[int] = mapped_column(ID, ForeignKey("dlrover_runs.id"), index=True)
    stage: Mapped[str] = mapped_column(String(32))  # profile | finetune
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
    worker_memory_peak_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    ps_memory_peak_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_seen: Mapped[float | None] = mapped_column(Float, nullable=True)
    timestamp: Mapped[float | None] = mapped_column(Float, nullable=True)


class Model(Base):
    __tablename__ = "dlrover_models"
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    run_id: Mapped[int] = mapped_column(ID, ForeignKey("dlrover_runs.id"), index=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    document: Mapped[dict] = mapped_column(JSON)  # JobModel.to_dict()


class Record(Base):
    """Plans, fine-tune decisions and instability events: a kind, a time and a JSON document."""

    __tablename__ = "dlrover_records"
    id: Mapped[int] = mapped_column(ID, primary_key=True)
    run_id: Mapped[int] = mapped_column(ID, ForeignKey("dlrover_runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)  # plan | decision | event
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    document: Mapped[dict] = mapped_column(JSON)


RECORD_KINDS = ("plan", "decision", "event")


class HistoryStore:
    """The store behind one SQLAlchemy URL, upgraded to the newest schema on open (``migrate``).

    Jobs are ``JobIdentity`` triples. Where a method takes ``job``, a bare name works too when
    one job has it (a caller outside Airflow: the CLI, a benchmark) and is refused, listing the
    candidates, when several DAGs or task groups share it; with a run (``run_id``,
    ``before_run``) the name is that run's job. ``start_run`` records a bare name as a job
    outside any DAG (``dag_id == ''``).
    """

    def __init__(self, url: str | None = None):
        self.engine = open_engine(url)
        self.url = self.engine.url.render_as_string(hide_password=True)
        migrate.upgrade(self.engine)

    def start_run(self, job: JobIdentity | str, run_key: str) -> int:
        """Open (or reopen, on a retry) the run ``run_key`` of ``job``; returns its id. Tasks that
        open one run at once get the same id (the loser of the insert race reads the winner's row)."""
        identity = JobIdentity.of(job)
        if not isinstance(run_key, str) or not 0 < len(run_key) <= ID_LENGTH:
            raise InvalidInputError("run_key", run_key, f"a run id of 1 to {ID_LENGTH} characters")
        try:
            return self._open_run(identity, run_key)
        except IntegrityError:  # another task inserted the job or the run first: read its row
            return self._open_run(identity, run_key)

    def _open_run(self, identity: JobIdentity, run_key: str) -> int:
        with Session(self.engine) as session, session.begin():
            record = session.scalar(select(Job).where(*_is(identity)))
            if record is None:
                record = Job(dag_id=identity.dag_id, task_group=identity.task_group, name=identity.name)
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

    def identity(self, job: JobIdentity | str, *, dag_id: str | None = None, task_group: str | None = None,
                 run: int | None = None) -> JobIdentity | None:
        """The recorded job ``job`` names (None when none does): an identity as it is, a name
        narrowed by ``dag_id`` / ``task_group`` / the job of ``run`` where given. A name that
        several jobs share is a user error listing them."""
        with Session(self.engine) as session:
            found = _resolve(session, job, dag_id=dag_id, task_group=task_group, run=run)
            return found.identity() if found is not None else None

    def samples(self, job: JobIdentity | str, *, run_id: int | None = None, stage: str | None = None) -> pd.DataFrame:
        """The job's samples, oldest first (a sample table in the vocabulary's columns)."""
        with Session(self.engine) as session:
            found = _resolve(session, job, run=run_id)
            query = select(Sample).join(Run, Sample.run_id == Run.id).where(Run.job_id == (found.id if found else None))
            if run_id is not None:
                query = query.where(Sample.run_id == _id(run_id))
            if stage is not None:
                query = query.where(Sample.stage == stage)
            rows = [{c: getattr(s, c) for c in SAMPLE_COLUMNS} for s in session.scalars(query.order_by(Sample.id))]
        return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))

    def samples_of_run(self, run_id: int) -> pd.DataFrame:
        """One run's samples, oldest first, with their ``stage`` (profile | finetune)."""
        columns = (*SAMPLE_COLUMNS, "stage")
        with Session(self.engine) as session:
            query = select(Sample).where(Sample.run_id == _id(run_id)).order_by(Sample.id)
            rows = [{c: getattr(s, c) for c in columns} for s in session.scalars(query)]
        return pd.DataFrame(rows, columns=list(columns))

    def save_model(self, run_id: int, model: JobModel) -> int:
        with Session(self.engine) as session, session.begin():
            record = Model(run_id=run_id, document=model.to_dict())
            session.add(record)
            session.flush()
            return record.id

    def latest_model(self, job: JobIdentity | str, *, before_run: int | None = None) -> JobModel | None:
        """The newest model of ``job`` (from an earlier run when ``before_run`` is given)."""
        with Session(self.engine) as session:
            record = session.scalars(self._models(session, job, before_run).limit(1)).first()
            return JobModel.from_dict(record.document) if record else None

    def prior_model(self, job: JobIdentity | str, *, before_run: int | None = None) -> JobModel | None:
        """The prior that warm-starts a run (``job_model.choose_prior`` over the job's models,
        newest first; none of ``before_run``), its memory margins those the job's OOM history
        justifies (:meth:`oom_history`, ``MemoryModel.with_oom_history``)."""
        with Session(self.engine) as session:
            records = session.scalars(self._models(session, job, before_run))
            prior = choose_prior(JobModel.from_dict(record.document) for record in records)
        if prior is None or prior.memory is None:
            return prior
        return replace(prior, memory=prior.memory.with_oom_history(self.oom_history(job, before_run=before_run)))

    def oom_history(self, job: JobIdentity | str, *, before_run: int | None = None,
                    last: int = MEMORY_OOM_HISTORY_RUNS) -> list[set[str]]:
        """The roles (worker, ps) OOM-killed while the job trained in each of its ``last`` runs
        before ``before_run``, newest first (the guard's ``recovered`` events: a node sized by the
        plan, not a probe's guess)."""
        with Session(self.engine) as session:
            found = _resolve(session, job, run=before_run)
            query = select(Run.id).where(Run.job_id == (found.id if found else None))
            if before_run is not None:
                query = query.where(Run.id < _id(before_run)) if _id(before_run) else query.where(False)
            runs = list(session.scalars(query.order_by(Run.id.desc()).limit(last)))
            killed: dict[int, set[str]] = {run: set() for run in runs}
            for event in session.scalars(select(Record).where(Record.run_id.in_(runs), Record.kind == "event")):
                if event.document.get("event") == "recovered" and event.document.get("reason") == "oom_killed":
                    killed[event.run_id].add(str(event.document.get("node", "")).split("-")[0])
        return [killed[run] for run in runs]

    def last_configuration(self, job: JobIdentity | str, *, before_run: int | None = None) -> Configuration | None:
        """The configuration the job's newest run that launched (before ``before_run``) ended on:
        the target of its last fine-tune resize or revert, else its launch (``launched`` event);
        None for a job that never launched."""
        with Session(self.engine) as session:
            found = _resolve(session, job, run=before_run)
            query = select(Record).join(Run, Record.run_id == Run.id).where(
                Run.job_id == (found.id if found else None), Record.kind.in_(("event", "decision")))
            if before_run is not None:
                query = query.where(Run.id < _id(before_run)) if _id(before_run) else query.where(False)
            for record in session.scalars(query.order_by(Run.id.desc(), Record.id.desc())):
                document = record.document
                if record.kind == "decision" and document.get("action") in RESIZE_ACTIONS:
                    return Configuration(**document["target"])
                if record.kind == "event" and document.get("event") == EventKind.LAUNCHED:
                    return Configuration(**document["config"])
        return None

    def similar_prior(self, job: JobIdentity | str, signature: dict[str, Any]) -> SimilarPrior | None:
        """A prior for ``job`` from the other jobs (``similarity.similar_prior``): each one's prior
        (``choose_prior``) with the signature its newest profile recorded (``profiled`` events)."""
        identity = JobIdentity.of(job)
        candidates = []
        with Session(self.engine) as session:
            for other in session.scalars(select(Job).order_by(Job.id)):
                if other.identity() == identity:
                    continue
                events = session.scalars(select(Record).join(Run, Record.run_id == Run.id).where(
                    Run.job_id == other.id, Record.kind == "event").order_by(Record.id.desc()))
                recorded = next((e.document["signature"] for e in events if e.document.get("event") == "profiled"
                                 and e.document.get("signature")), None)
                if recorded is None:
                    continue
                models = session.scalars(self._models(session, other.identity(), None))
                prior = choose_prior(JobModel.from_dict(m.document) for m in models)
                if prior is not None:
                    candidates.append((str(other.identity()), recorded, prior.throughput))
        return similar_prior(signature, candidates)

    @staticmethod
    def _models(session: Session, job: JobIdentity | str, before_run: int | None):
        """The job's models, newest first (none of ``before_run``, which names the job's run)."""
        found = _resolve(session, job, run=before_run)
        query = select(Model).join(Run, Model.run_id == Run.id).where(Run.job_id == (found.id if found else None))
        if before_run is not None:
            query = query.where(Model.run_id != _id(before_run))
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
            query = select(Record).where(Record.run_id == _id(run_id), Record.kind == kind).order_by(Record.id)
            return [r.document for r in session.scalars(query)]

    def run(self, run_id: int) -> dict[str, Any] | None:
        """One run (with its job's identity and UTC times), None when there is no such run."""
        with Session(self.engine) as session:
            row = session.execute(select(Run, Job).join(Job, Run.job_id == Job.id).where(Run.id == _id(run_id))).first()
            return _run_row(*row) if row else None

    def runs(self, job: JobIdentity | str | None = None, *, run_key: str | None = None,
             dag_id: str | None = None) -> list[dict[str, Any]]:
        """The runs of ``job`` (every job when None), optionally those of one ``run_key`` and of
        one DAG (``dag_id``: an Airflow DAG run is ``dag_id`` + ``run_key``), oldest first."""
        query = select(Run, Job).join(Job, Run.job_id == Job.id)
        if run_key is not None:
            query = query.where(Run.run_key == run_key)
        if dag_id is not None:
            query = query.where(Job.dag_id == dag_id)
        with Session(self.engine) as session:
            if job is not None:
                found = _resolve(session, job, dag_id=dag_id)
                query = query.where(Job.id == (found.id if found else None))
            return [_run_row(r, j) for r, j in session.execute(query.order_by(Run.id))]

    def jobs(self) -> list[dict[str, Any]]:
        """The recorded jobs — ``id``, ``dag_id``, ``task_group``, ``job`` (the name) — by name,
        then DAG and group (sorted here: the backends' collations differ)."""
        with Session(self.engine) as session:
            rows = [_job_row(j) for j in session.scalars(select(Job))]
        return sorted(rows, key=lambda r: (r["job"], r["dag_id"], r["task_group"]))

    def job(self, job_id: int) -> JobIdentity | None:
        """The job with the store's id ``job_id`` (``jobs()``'s ``id``), None when there is none."""
        with Session(self.engine) as session:
            found = session.get(Job, _id(job_id)) if _id(job_id) is not None else None
            return found.identity() if found is not None else None

    def models_of_run(self, run_id: int) -> list[dict[str, Any]]:
        """The models fitted in one run (the fit task's first, then each fine-tune refit)."""
        with Session(self.engine) as session:
            query = select(Model).where(Model.run_id == _id(run_id)).order_by(Model.id)
            return [{"id": m.id, "created": _utc(m.created), "document": m.document} for m in session.scalars(query)]


def _id(value: int) -> int | None:
    """``value`` as an id a query can compare (None, matching nothing, when no id can be it)."""
    return value if isinstance(value, int) and 0 < value <= MAX_ID else None


def _is(identity: JobIdentity):
    return Job.dag_id == identity.dag_id, Job.task_group == identity.task_group, Job.name == identity.name


def _resolve(session: Session, job: JobIdentity | str, *, dag_id: str | None = None, task_group: str | None = None,
             run: int | None = None) -> Job | None:
    """The ``Job`` row of ``job`` (see ``HistoryStore.identity``)."""
    if isinstance(job, JobIdentity):
        query = select(Job).where(*_is(job))
    else:
        query = select(Job).where(Job.name == job)
        if dag_id is not None:
            query = query.where(Job.dag_id == dag_id)
        if task_group is not None:
            query = query.where(Job.task_group == task_group)
    if run is not None:
        query = query.join(Run, Run.job_id == Job.id).where(Run.id == _id(run))
    found = list(session.scalars(query))
    if len(found) > 1:
        candidates = ", ".join(sorted(str(j.identity()) for j in found))
        raise InvalidInputError("job", job, "the name of one job, or its DAG id and task group too: "
                                f"{len(found)} jobs have this name (dag_id/task_group/name): {candidates}")
    return found[0] if found else None


def _json(document: Any) -> str:
    """JSON without NaN or infinities (PostgreSQL's json refuses them): stored as null everywhere."""
    return json.dumps(_finite(document), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _utc(moment: datetime | None) -> datetime | None:
    """Aware, in UTC: SQLite hands back naive datetimes (written in UTC), PostgreSQL its session's zone."""
    if moment is None:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def _job_row(j: Job) -> dict[str, Any]:
    return {"id": j.id, "dag_id": j.dag_id, "task_group": j.task_group, "job": j.name}


def _run_row(r: Run, j: Job) -> dict[str, Any]:
    """A run: ``job`` is its job's name, ``job_ref`` the job's store id (``HistoryStore.job``)."""
    return {"id": r.id, "job": j.name, "dag_id": j.dag_id, "task_group": j.task_group, "job_ref": j.id,
            "run_key": r.run_key, "status": r.status, "started": _utc(r.started), "finished": _utc(r.finished),
            "summary": r.summary}
