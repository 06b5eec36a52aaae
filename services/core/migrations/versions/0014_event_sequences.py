"""per-account event numbers: account_event_sequences

- account_event_sequences: the last `sequence` an event about the deposit account
  carried (services/core/event_sequences.py). No backfill: an account without a row has
  had no numbered event, and its next one is 1 (events written before carry none).

Revision ID: core_0014
Revises: core_0012
Create Date: 2026-11-28 18:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "core_0014"
down_revision: str | None = "core_0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "account_event_sequences",
        sa.Column("account_id", sa.String(length=40), primary_key=True),
        sa.Column("last_sequence", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("account_event_sequences")
