"""A job is (dag_id, task_group, name); a run is (job, run_key).

Existing jobs get ``dag_id = task_group = ''`` (the identity of a job recorded outside a DAG);
the unique name becomes a unique triple, and a unique index keeps one run per (job, run_key).
SQLite changes a constraint by copying the table (batch mode); its unnamed ``UNIQUE (name)`` is
found through a naming convention.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: The names the old unnamed constraints get in SQLite's batch copies.
NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}
#: The name PostgreSQL gives ``UNIQUE (name)``; the downgrade restores it under this name.
NAME_UNIQUE = "dlrover_jobs_name_key"


def _name_unique(bind: sa.engine.Connection) -> str:
    for constraint in sa.inspect(bind).get_unique_constraints("dlrover_jobs"):
        if constraint["column_names"] == ["name"]:
            return constraint["name"] or NAMING["uq"] % {"table_name": "dlrover_jobs", "column_0_name": "name"}
    raise RuntimeError("dlrover_jobs has no unique constraint on name: not a store at revision 0001")


def _refuse(rows: list, what: str, fix: str) -> None:
    if rows:
        shown = "; ".join(", ".join(str(v) for v in row) for row in rows[:20])
        raise RuntimeError(f"{what}: {shown}. {fix}")


def upgrade() -> None:
    bind = op.get_bind()
    _refuse(bind.execute(sa.text("SELECT job_id, run_key, COUNT(*) FROM dlrover_runs GROUP BY job_id, run_key "
                                 "HAVING COUNT(*) > 1")).all(),
            "runs recorded twice for one job and run key (job id, run key, count)",
            "Delete the duplicates (and their samples, models and records) before migrating.")
    old = _name_unique(bind)
    with op.batch_alter_table("dlrover_jobs", naming_convention=NAMING) as batch:
        batch.add_column(sa.Column("dag_id", sa.String(250), nullable=False, server_default=""))
        batch.add_column(sa.Column("task_group", sa.String(250), nullable=False, server_default=""))
        batch.drop_constraint(old, type_="unique")
        batch.create_unique_constraint("uq_dlrover_jobs_identity", ["dag_id", "task_group", "name"])
    op.create_index("uq_dlrover_runs_job_run_key", "dlrover_runs", ["job_id", "run_key"], unique=True)


def downgrade() -> None:
    bind = op.get_bind()
    _refuse(bind.execute(sa.text("SELECT name, COUNT(*) FROM dlrover_jobs GROUP BY name HAVING COUNT(*) > 1")).all(),
            "job names that several DAGs or task groups share (name, jobs), which revision 0001 cannot hold",
            "Rename or delete those jobs before downgrading.")
    op.drop_index("uq_dlrover_runs_job_run_key", table_name="dlrover_runs")
    with op.batch_alter_table("dlrover_jobs", naming_convention=NAMING) as batch:
        batch.drop_constraint("uq_dlrover_jobs_identity", type_="unique")
        batch.drop_column("task_group")
        batch.drop_column("dag_id")
        batch.create_unique_constraint(NAME_UNIQUE, ["name"])
