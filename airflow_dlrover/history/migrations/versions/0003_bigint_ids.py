"""64-bit ids on every backend: PostgreSQL's SERIAL ids (and the keys that point at them) become
BIGINT with BIGINT sequences, as SQLite's INTEGER ids already are, so that both take the same ids.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: Each table's id columns: its own id and the key of the row it belongs to.
ID_COLUMNS = {"dlrover_jobs": ("id",), "dlrover_runs": ("id", "job_id"), "dlrover_samples": ("id", "run_id"),
              "dlrover_models": ("id", "run_id"), "dlrover_records": ("id", "run_id")}
INT32_MAX = 2**31 - 1


def _retype(old: sa.types.TypeEngine, new: sa.types.TypeEngine, sequence_type: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":  # an INTEGER PRIMARY KEY is the 64-bit rowid already
        return
    for table, columns in ID_COLUMNS.items():
        for column in columns:
            op.alter_column(table, column, type_=new, existing_type=old, existing_nullable=False)
        if bind.dialect.name == "postgresql":
            sequence = bind.execute(sa.text(f"SELECT pg_get_serial_sequence('{table}', 'id')")).scalar()
            if sequence:
                op.execute(f"ALTER SEQUENCE {sequence} AS {sequence_type}")


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger(), "bigint")


def downgrade() -> None:
    bind = op.get_bind()
    for table in ID_COLUMNS if bind.dialect.name != "sqlite" else ():
        top = bind.execute(sa.text(f"SELECT MAX(id) FROM {table}")).scalar()
        if top is not None and top > INT32_MAX:
            raise RuntimeError(f"{table} holds id {top}, above revision 0002's 32-bit ids ({INT32_MAX}): "
                               "cannot downgrade below 0003")
    _retype(sa.BigInteger(), sa.Integer(), "integer")
