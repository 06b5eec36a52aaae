"""deposit_addresses.created_at: when an address was given out

A chain's watcher, on its first start, reads back to the earliest address on the chain
(services/core/deposits/watcher.py): a deposit sent before the worker first looked is
still found. Rows from before this revision keep NULL (their time is not known; the
account's `created_at` stands in). The column is added without a default and the
default set after, so no existing row is written (both steps change only the catalog).
The brief exclusive lock they take waits at most 5 s behind a long transaction on the
table (a backfill batch, say), rather than queueing every account creation behind
itself: `settle db upgrade` then fails and is run again.

Revision ID: core_0016
Revises: core_0015
Create Date: 2026-11-29 07:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "core_0016"
down_revision: str | None = "core_0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column(
        "deposit_addresses", sa.Column("created_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.alter_column("deposit_addresses", "created_at", server_default=sa.func.now())


def downgrade() -> None:
    op.drop_column("deposit_addresses", "created_at")
