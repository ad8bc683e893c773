"""Schema migrations of the history store: Alembic revisions in ``migrations/versions`` (shipped in
the wheel), run in code — the way ``airflow db migrate`` runs Airflow's own.

``HistoryStore(url)`` upgrades to the head on open (``upgrade``); ``dlrover-rm db migrate`` and
``dlrover-rm db downgrade --to REV`` do it by hand. A store that the code before migrations
created (its tables, no version table) is stamped with revision ``BASELINE`` first, then upgraded.
Processes that open one store at once take turns: a ``flock`` on a file beside a SQLite database,
``pg_advisory_xact_lock`` on PostgreSQL; each checks the revision again once it holds the lock.

A schema change is a new ``versions/NNNN_what.py`` (``script.py.mako``'s shape: revision ``NNNN``,
``down_revision`` the previous head, an upgrade and a downgrade; batch mode for SQLite's
constraints) beside the change to the models; ``tests/history/test_migrations.py`` checks that the
models match the head and that old stores keep their rows, on both backends.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa

#: Alembic's version table for this store; not ``alembic_version``, which Airflow's metadata
#: database (a PostgreSQL store may live in it) already has.
VERSION_TABLE = "dlrover_alembic_version"
MIGRATIONS = Path(__file__).with_name("migrations")
#: The schema ``Base.metadata.create_all`` made before migrations existed.
BASELINE = "0001"
#: A table every revision has: present without a version table, the store predates migrations.
BASELINE_TABLE = "dlrover_jobs"
#: The key of the PostgreSQL advisory lock held while migrating ("dlrover" in ASCII, any fixed
#: 64-bit number would do: it only has to differ from the other users of advisory locks).
ADVISORY_LOCK_KEY = int.from_bytes(b"dlrover", "big")


class StoreTooNew(RuntimeError):
    """The store is at a revision this version of airflow-dlrover does not know."""


def _config(connection: sa.Connection | None = None):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def revisions() -> tuple[str, ...]:
    """Every revision, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_config())
    return tuple(reversed([r.revision for r in script.walk_revisions()]))


def head() -> str:
    return revisions()[-1]


def _revision(connection: sa.Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    found = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
    if found is not None and found not in revisions():
        raise StoreTooNew(f"the history store is at revision {found!r}, which this airflow-dlrover does not know "
                          f"(its newest is {head()!r}): upgrade airflow-dlrover")
    return found


def current(engine: sa.Engine) -> str | None:
    """The store's revision (None: an empty database)."""
    with engine.connect() as connection:
        return _revision(connection)


@contextmanager
def _locked(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction, held by one process at a time for this store."""
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    on_disk = bool(database) and database != ":memory:" and "mode=memory" not in str(engine.url)
    handle = os.open(f"{database}.migrate.lock", os.O_RDWR | os.O_CREAT, 0o600) if on_disk else None
    try:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the descriptor closes, or its process dies
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
            yield connection
    finally:
        if handle is not None:
            os.close(handle)


def upgrade(engine: sa.Engine, to: str = "head") -> tuple[str | None, str | None]:
    """Upgrade the store to revision ``to``; returns (revision before, revision after)."""
    from alembic import command

    if to == "head" and current(engine) == head():
        return head(), head()
    with _locked(engine) as connection:
        before = _revision(connection)
        if before is None and sa.inspect(connection).has_table(BASELINE_TABLE):
            command.stamp(_config(connection), BASELINE)
            before = BASELINE
        command.upgrade(_config(connection), to)
        return before, _revision(connection)


def downgrade(engine: sa.Engine, to: str) -> tuple[str | None, str | None]:
    """Downgrade the store to revision ``to`` (``base``: no tables at all); returns (before, after)."""
    from alembic import command

    with _locked(engine) as connection:
        before = _revision(connection)
        command.downgrade(_config(connection), to)
        return before, _revision(connection)


def check_revision(field: str, value: Any, *, downgrade: bool) -> str:
    """``value`` as a target: a revision id, or ``head`` (upgrade) / ``base`` (downgrade: no tables)."""
    from airflow_dlrover.optimizer.types import InvalidInputError

    allowed = (*revisions(), "base" if downgrade else "head")
    if value not in allowed:
        raise InvalidInputError(field, value, "one of the revisions " + ", ".join(allowed))
    return value
