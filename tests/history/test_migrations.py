"""The history store's Alembic migrations, on SQLite and PostgreSQL (``conftest.py``): a store that the
code before migrations created keeps every row, downgrades round-trip, the models match the
revisions, and processes that open one store at once all succeed."""

from __future__ import annotations

import json
import multiprocessing
import re

import pytest
import sqlalchemy as sa

from airflow_dlrover import cli
from airflow_dlrover.history import migrate
from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.history.store import Base, HistoryStore, open_engine
from airflow_dlrover.optimizer.job_model import fit_job_model
from sim.synthetic import model_samples

pytestmark = pytest.mark.unit

#: The DDL ``Base.metadata.create_all`` ran before migrations existed (commit f704f4f), per dialect.
OLD_DDL = {
    "sqlite": """
CREATE TABLE dlrover_jobs (
	id INTEGER NOT NULL, name VARCHAR(250) NOT NULL, created DATETIME NOT NULL,
	PRIMARY KEY (id), UNIQUE (name));
CREATE TABLE dlrover_runs (
	id INTEGER NOT NULL, job_id INTEGER NOT NULL, run_key VARCHAR(250) NOT NULL, started DATETIME NOT NULL,
	finished DATETIME, status VARCHAR(32) NOT NULL, summary JSON,
	PRIMARY KEY (id), FOREIGN KEY(job_id) REFERENCES dlrover_jobs (id));
CREATE INDEX ix_dlrover_runs_job_id ON dlrover_runs (job_id);
CREATE TABLE dlrover_models (
	id INTEGER NOT NULL, run_id INTEGER NOT NULL, created DATETIME NOT NULL, document JSON NOT NULL,
	PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES dlrover_runs (id));
CREATE INDEX ix_dlrover_models_run_id ON dlrover_models (run_id);
CREATE TABLE dlrover_records (
	id INTEGER NOT NULL, run_id INTEGER NOT NULL, kind VARCHAR(32) NOT NULL, created DATETIME NOT NULL,
	document JSON NOT NULL, PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES dlrover_runs (id));
CREATE INDEX ix_dlrover_records_run_id ON dlrover_records (run_id);
CREATE INDEX ix_dlrover_records_kind ON dlrover_records (kind);
CREATE TABLE dlrover_samples (
	id INTEGER NOT NULL, run_id INTEGER NOT NULL, stage VARCHAR(32) NOT NULL, workers INTEGER NOT NULL,
	ps INTEGER NOT NULL, worker_cpu FLOAT NOT NULL, ps_cpu FLOAT NOT NULL, worker_memory_mb FLOAT NOT NULL,
	ps_memory_mb FLOAT NOT NULL, worker_gpu INTEGER NOT NULL, batch_size INTEGER NOT NULL,
	throughput FLOAT NOT NULL, worker_cpu_used FLOAT, ps_cpu_used FLOAT, worker_memory_used_mb FLOAT,
	ps_memory_used_mb FLOAT, samples_seen FLOAT, timestamp FLOAT,
	PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES dlrover_runs (id));
CREATE INDEX ix_dlrover_samples_run_id ON dlrover_samples (run_id);
""",
    "postgresql": """
CREATE TABLE dlrover_jobs (
	id SERIAL NOT NULL, name VARCHAR(250) NOT NULL, created TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (id), UNIQUE (name));
CREATE TABLE dlrover_runs (
	id SERIAL NOT NULL, job_id INTEGER NOT NULL, run_key VARCHAR(250) NOT NULL,
	started TIMESTAMP WITH TIME ZONE NOT NULL, finished TIMESTAMP WITH TIME ZONE, status VARCHAR(32) NOT NULL,
	summary JSON, PRIMARY KEY (id), FOREIGN KEY(job_id) REFERENCES dlrover_jobs (id));
CREATE INDEX ix_dlrover_runs_job_id ON dlrover_runs (job_id);
CREATE TABLE dlrover_models (
	id SERIAL NOT NULL, run_id INTEGER NOT NULL, created TIMESTAMP WITH TIME ZONE NOT NULL, document JSON NOT NULL,
	PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES dlrover_runs (id));
CREATE INDEX ix_dlrover_models_run_id ON dlrover_models (run_id);
CREATE TABLE dlrover_records (
	id SERIAL NOT NULL, run_id INTEGER NOT NULL, kind VARCHAR(32) NOT NULL,
	created TIMESTAMP WITH TIME ZONE NOT NULL, document JSON NOT NULL,
	PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES dlrover_runs (id));
CREATE INDEX ix_dlrover_records_run_id ON dlrover_records (run_id);
CREATE INDEX ix_dlrover_records_kind ON dlrover_records (kind);
CREATE TABLE dlrover_samples (
	id SERIAL NOT NULL, run_id INTEGER NOT NULL, stage VARCHAR(32) NOT NULL, workers INTEGER NOT NULL,
	ps INTEGER NOT NULL, worker_cpu FLOAT NOT NULL, ps_cpu FLOAT NOT NULL, worker_memory_mb FLOAT NOT NULL,
	ps_memory_mb FLOAT NOT NULL, worker_gpu INTEGER NOT NULL, batch_size INTEGER NOT NULL,
	throughput FLOAT NOT NULL, worker_cpu_used FLOAT, ps_cpu_used FLOAT, worker_memory_used_mb FLOAT,
	ps_memory_used_mb FLOAT, samples_seen FLOAT, timestamp FLOAT,
	PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES dlrover_runs (id));
CREATE INDEX ix_dlrover_samples_run_id ON dlrover_samples (run_id);
""",
}
TABLES = ("dlrover_jobs", "dlrover_runs", "dlrover_samples", "dlrover_models", "dlrover_records")


def old_store(url: str) -> dict:
    """A store as the old code left it: two jobs, three runs, samples, a model, records; returns
    what was written."""
    engine = sa.create_engine(url)
    model = fit_job_model(model_samples(), leave_one_out=False)
    sample = {"workers": 2, "ps": 1, "worker_cpu": 1.0, "ps_cpu": 0.5, "worker_memory_mb": 2048.0,
              "ps_memory_mb": 1024.0, "worker_gpu": 0, "batch_size": 512, "throughput": 1234.5}
    tz = "+00" if engine.dialect.name == "postgresql" else ""  # UTC, as the old code wrote (SQLite: naive)
    with engine.begin() as c:
        for statement in OLD_DDL[engine.dialect.name].split(";"):
            if statement.strip():
                c.exec_driver_sql(statement)
        insert = lambda sql, **values: c.execute(sa.text(sql), values)  # noqa: E731
        insert(f"INSERT INTO dlrover_jobs (name, created) VALUES ('ctr', '2026-11-28 23:00:00{tz}'), "
               f"('video', '2026-11-28 23:00:00{tz}')")
        insert(f"INSERT INTO dlrover_runs (job_id, run_key, started, finished, status, summary) VALUES "
               f"(1, 'scheduled__2026-11-29', '2026-11-29 00:00:00{tz}', '2026-11-29 01:00:00{tz}', 'succeeded', :s), "
               f"(1, 'scheduled__2026-11-30', '2026-11-30 00:00:00{tz}', NULL, 'running', NULL), "
               f"(2, 'scheduled__2026-11-29', '2026-11-29 00:00:00{tz}', NULL, 'running', NULL)",
               s=json.dumps({"samples_lost": 0, "measured_throughput": 1200.0}))
        columns = ", ".join(sample)
        insert(f"INSERT INTO dlrover_samples (run_id, stage, {columns}, worker_cpu_used, timestamp) VALUES "
               f"(1, 'profile', {', '.join(':' + k for k in sample)}, 0.9, 1800000000.0), "
               f"(2, 'finetune', {', '.join(':' + k for k in sample)}, NULL, NULL)", **sample)
        insert(f"INSERT INTO dlrover_models (run_id, created, document) VALUES (1, '2026-11-29 00:30:00{tz}', :d)",
               d=json.dumps(model.to_dict()))
        insert(f"INSERT INTO dlrover_records (run_id, kind, created, document) VALUES "
               f"(1, 'plan', '2026-11-29 00:31:00{tz}', :p), (1, 'event', '2026-11-29 00:40:00{tz}', :e)",
               p=json.dumps({"workers": 2, "reason": "max throughput"}), e=json.dumps({"event": "launched"}))
    engine.dispose()
    return {"model": model, "sample": sample}


def counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as c:
        return {t: c.execute(sa.text(f"SELECT COUNT(*) FROM {t}")).scalar() for t in TABLES}


def columns(engine: sa.Engine, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns(table)}


def test_a_store_of_the_code_before_migrations_keeps_every_row(store_url, open_store):
    written = old_store(store_url)
    store = open_store()  # stamps 0001, upgrades to the head
    assert migrate.current(store.engine) == migrate.head()
    assert counts(store.engine) == {"dlrover_jobs": 2, "dlrover_runs": 3, "dlrover_samples": 2, "dlrover_models": 1,
                                    "dlrover_records": 2}
    assert [(j["dag_id"], j["task_group"], j["job"]) for j in store.jobs()] == [("", "", "ctr"), ("", "", "video")]
    first, second = store.runs("ctr")
    assert (first["run_key"], first["status"], first["summary"]) == (
        "scheduled__2026-11-29", "succeeded", {"samples_lost": 0, "measured_throughput": 1200.0})
    assert first["started"].isoformat() == "2026-11-29T00:00:00+00:00" and second["finished"] is None
    samples = store.samples("ctr")
    assert samples[list(written["sample"])].to_dict("records") == [written["sample"]] * 2
    assert samples["worker_cpu_used"].iloc[0] == 0.9 and samples["timestamp"].isna().iloc[1]
    assert store.latest_model("ctr").throughput.params == written["model"].throughput.params
    assert store.prior_model("ctr", before_run=second["id"]).throughput.params == written["model"].throughput.params
    assert store.records(first["id"], "plan") == [{"workers": 2, "reason": "max throughput"}]
    # the old jobs are jobs outside any DAG: their runs reopen, new runs follow the old ids
    assert store.start_run(JobIdentity("", "", "ctr"), "scheduled__2026-11-30") == second["id"]
    assert store.start_run("ctr", "scheduled__2026-12-01") == 4
    assert store.start_run(JobIdentity("dlrm", "", "ctr"), "scheduled__2026-12-01") == 5  # a DAG's job of that name
    open_store()  # opening it again changes nothing
    assert counts(store.engine)["dlrover_runs"] == 5


def test_downgrade_then_upgrade_round_trips(store_url, open_store):
    old_store(store_url)
    store = open_store()
    store.add(store.start_run(JobIdentity("dlrm", "group", "wide"), "manual__1"), "decision", {"action": "keep"})
    before = counts(store.engine)
    with store.engine.connect() as c:
        documents = sorted(json.dumps(d) for (d,) in c.execute(sa.text("SELECT document FROM dlrover_records")))

    assert migrate.downgrade(store.engine, "0001") == (migrate.head(), "0001")
    assert counts(store.engine) == before and "dag_id" not in columns(store.engine, "dlrover_jobs")
    assert migrate.upgrade(store.engine) == ("0001", migrate.head())
    assert counts(store.engine) == before
    with store.engine.connect() as c:
        assert sorted(json.dumps(d) for (d,) in c.execute(sa.text("SELECT document FROM dlrover_records"))) == documents
    # below 0002 a job has only its name: the DAG's job comes back as one outside any DAG
    assert store.identity("wide") == JobIdentity("", "", "wide")

    assert migrate.downgrade(store.engine, "base") == (migrate.head(), None)
    assert not set(TABLES) & set(sa.inspect(store.engine).get_table_names())
    assert migrate.upgrade(store.engine) == (None, migrate.head()) and counts(store.engine)["dlrover_runs"] == 0


def test_a_downgrade_that_would_lose_jobs_is_refused(store_url, open_store):
    store = open_store()
    store.start_run(JobIdentity("dag_a", "", "ctr"), "r1")
    store.start_run(JobIdentity("dag_b", "", "ctr"), "r1")
    with pytest.raises(RuntimeError, match=r"several DAGs or task groups share .*ctr, 2. Rename or delete"):
        migrate.downgrade(store.engine, "0001")
    assert migrate.current(store.engine) == migrate.head() and len(store.runs(run_key="r1")) == 2


def test_the_models_match_the_revisions(store_url, open_store):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    store = open_store()
    with store.engine.connect() as c:
        context = MigrationContext.configure(c, opts={"version_table": migrate.VERSION_TABLE, "compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    # and from the old store as well
    old_url = store_url
    store.engine.dispose()
    migrate.downgrade(store.engine, "base")
    old_store(old_url)
    migrate.upgrade(store.engine)
    with store.engine.connect() as c:
        context = MigrationContext.configure(c, opts={"version_table": migrate.VERSION_TABLE, "compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def _open_and_record(url: str, name: str, go, results) -> None:
    try:
        go.wait(60)
        store = HistoryStore(url)
        results.put((name, migrate.current(store.engine), store.start_run(name, "r1")))
    except BaseException as err:  # reported to the test, whatever it is
        results.put((name, "error", f"{type(err).__name__}: {err}"))


@pytest.mark.jobs
def test_four_processes_open_a_new_store_at_once(store_url):
    spawn = multiprocessing.get_context("spawn")
    go, results = spawn.Event(), spawn.Queue()
    workers = [spawn.Process(target=_open_and_record, args=(store_url, f"job{i}", go, results)) for i in range(4)]
    for worker in workers:
        worker.start()
    go.set()
    answers = sorted(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(30)
    assert [a[1] for a in answers] == [migrate.head()] * 4, answers
    assert sorted(a[2] for a in answers) == [1, 2, 3, 4]
    engine = open_engine(store_url)
    with engine.connect() as c:
        assert c.execute(sa.text(f"SELECT COUNT(*) FROM {migrate.VERSION_TABLE}")).scalar() == 1
    engine.dispose()


def test_a_store_newer_than_the_code_is_refused(store_url, open_store):
    store = open_store()
    with store.engine.begin() as c:
        c.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999'"))
    with pytest.raises(migrate.StoreTooNew, match="revision '9999', which this airflow-dlrover does not know"):
        open_store()


def test_the_db_commands(store_url, capsys):
    old_store(store_url)
    assert cli.main(["db", "migrate", "--to", "0002", "--history-url", store_url]) == 0
    out = capsys.readouterr().out
    assert re.search(r"revision 0001 → 0002 \(newest: 0004\)", out) and "dlrover:dlrover@" not in out
    assert cli.main(["db", "migrate", "--history-url", store_url]) == 0
    assert "revision 0002 → 0004" in capsys.readouterr().out
    assert cli.main(["db", "downgrade", "--to", "0001", "--history-url", store_url]) == 0
    assert "revision 0004 → 0001" in capsys.readouterr().out
    assert cli.main(["db", "downgrade", "--to", "head", "--history-url", store_url]) == 2
    assert "to='head' is invalid: allowed one of the revisions 0001, 0002, 0003, 0004, base" in capsys.readouterr().err
    assert cli.main(["db", "migrate", "--to", "7", "--history-url", store_url]) == 2
    assert "to='7' is invalid" in capsys.readouterr().err
    engine = open_engine(store_url)
    assert migrate.current(engine) == "0001"
    engine.dispose()
