"""The schema as ``Base.metadata.create_all`` made it before migrations existed.

A store created then has these tables and no version table: ``migrate.upgrade`` stamps it with
this revision before upgrading.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def _run_child(name: str, *columns: sa.Column) -> None:
    """A table that belongs to a run (``run_id`` indexed, a foreign key to ``dlrover_runs``)."""
    op.create_table(name, sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("run_id", sa.Integer(), nullable=False), *columns,
                    sa.ForeignKeyConstraint(["run_id"], ["dlrover_runs.id"]), sa.PrimaryKeyConstraint("id"))
    op.create_index(f"ix_{name}_run_id", name, ["run_id"])


def upgrade() -> None:
    op.create_table("dlrover_jobs",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("name", sa.String(250), nullable=False),
                    sa.Column("created", _TIME, nullable=False),
                    sa.PrimaryKeyConstraint("id"), sa.UniqueConstraint("name"))
    op.create_table("dlrover_runs",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("job_id", sa.Integer(), nullable=False),
                    sa.Column("run_key", sa.String(250), nullable=False),
                    sa.Column("started", _TIME, nullable=False),
                    sa.Column("finished", _TIME, nullable=True),
                    sa.Column("status", sa.String(32), nullable=False),
                    sa.Column("summary", sa.JSON(), nullable=True),
                    sa.ForeignKeyConstraint(["job_id"], ["dlrover_jobs.id"]), sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_dlrover_runs_job_id", "dlrover_runs", ["job_id"])
    _run_child("dlrover_models", sa.Column("created", _TIME, nullable=False),
               sa.Column("document", sa.JSON(), nullable=False))
    _run_child("dlrover_records", sa.Column("kind", sa.String(32), nullable=False),
               sa.Column("created", _TIME, nullable=False), sa.Column("document", sa.JSON(), nullable=False))
    op.create_index("ix_dlrover_records_kind", "dlrover_records", ["kind"])
    _run_child("dlrover_samples", sa.Column("stage", sa.String(32), nullable=False),
               *(sa.Column(c, sa.Integer(), nullable=False) for c in ("workers", "ps")),
               *(sa.Column(c, sa.Float(), nullable=False)
                 for c in ("worker_cpu", "ps_cpu", "worker_memory_mb", "ps_memory_mb")),
               *(sa.Column(c, sa.Integer(), nullable=False) for c in ("worker_gpu", "batch_size")),
               sa.Column("throughput", sa.Float(), nullable=False),
               *(sa.Column(c, sa.Float(), nullable=True) for c in ("worker_cpu_used", "ps_cpu_used",
                                                                  "worker_memory_used_mb", "ps_memory_used_mb",
                                                                  "samples_seen", "timestamp")))


def downgrade() -> None:
    for table in ("dlrover_samples", "dlrover_records", "dlrover_models", "dlrover_runs", "dlrover_jobs"):
        op.drop_table(table)
