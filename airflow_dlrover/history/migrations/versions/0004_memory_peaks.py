"""Each profile and fine-tune window's largest node per role (``worker_memory_peak_mb``,
``ps_memory_peak_mb``): a request holds for every node of its role, so the memory model is fitted
on them. Older rows keep them empty and are read as the role's mean (``memory.node_peaks``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = ("worker_memory_peak_mb", "ps_memory_peak_mb")


def upgrade() -> None:
    with op.batch_alter_table("dlrover_samples") as batch:
        for column in COLUMNS:
            batch.add_column(sa.Column(column, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dlrover_samples") as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column)
