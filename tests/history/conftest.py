"""The history store's backends: every test that takes ``store_url`` (or ``store``) runs on SQLite and
on a real PostgreSQL server.

The server is the one ``DLROVER_TEST_POSTGRES_URL`` names (``.ci/run`` installs, starts and exports
it), e.g. ``postgresql+psycopg://dlrover:dlrover@127.0.0.1:5432/dlrover_test``; nothing here starts
one. Each test gets a schema of its own in that database (dropped after it), so the URL's role
needs only the right to create schemas there. Without the variable, or without a server answering
at it, the PostgreSQL variants skip and say why.
"""

from __future__ import annotations

import os
import uuid

import pytest

POSTGRES_ENV = "DLROVER_TEST_POSTGRES_URL"


def _postgres_server() -> tuple[str | None, str]:
    """(admin URL, '') of the test server, or (None, why the PostgreSQL tests skip)."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        return None, f"no PostgreSQL server: set {POSTGRES_ENV} to a SQLAlchemy URL (`.ci/run` starts one)"
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(url)
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as err:  # no driver, no server, a refused login: all say the same to the tests
        shown = sa.make_url(url).render_as_string(hide_password=True)
        return None, f"no PostgreSQL server answers at {POSTGRES_ENV}={shown}: {type(err).__name__}: {err}"
    return url, ""


_SERVER = None


def postgres_server() -> tuple[str | None, str]:
    global _SERVER
    if _SERVER is None:
        _SERVER = _postgres_server()
    return _SERVER


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    """A URL of an empty store on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'history.db'}"
        return
    import sqlalchemy as sa

    admin, why = postgres_server()
    if admin is None:
        pytest.skip(why)
    schema = f"dlrover_test_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(admin)
    with engine.begin() as connection:
        connection.execute(sa.text(f"CREATE SCHEMA {schema}"))
    url = sa.make_url(admin).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.begin() as connection:
            connection.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@pytest.fixture()
def open_store(store_url):
    """``open_store()``: a ``HistoryStore`` on the test's URL (its connections closed after the test)."""
    from airflow_dlrover.history.store import HistoryStore

    opened = []

    def open_() -> HistoryStore:
        opened.append(HistoryStore(store_url))
        return opened[-1]

    yield open_
    for store in opened:
        store.engine.dispose()


@pytest.fixture()
def store(open_store):
    return open_store()
