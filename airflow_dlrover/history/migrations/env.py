"""Alembic's environment for the history store (``airflow_dlrover.history.migrate`` runs it).

Online only, on the connection the caller holds (``config.attributes["connection"]``), which
already holds the migration lock; the version table is ``dlrover_alembic_version`` so that a store
that shares a database with Airflow's metadata (its own ``alembic_version``) never mixes the two.
"""

from __future__ import annotations

from alembic import context

from airflow_dlrover.history.migrate import VERSION_TABLE
from airflow_dlrover.history.store import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the history store's migrations run through airflow_dlrover.history.migrate "
                       "(`dlrover-rm db migrate`), which passes them a connection")
context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE,
                  render_as_batch=True, transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
