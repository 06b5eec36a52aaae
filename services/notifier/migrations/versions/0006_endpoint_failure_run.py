"""an endpoint's run of failed attempts and whether the tenant was told it is failing

Revision ID: notifier_0006
Revises: notifier_0003
Create Date: 2026-11-28 18:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import shared.db

revision: str = "notifier_0006"
down_revision: str | None = "notifier_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column(
        "webhook_endpoints",
        sa.Column("failed_attempts", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column(
        "webhook_endpoints",
        sa.Column("failing_notified_at", shared.db.UTCDateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("webhook_endpoints", "failing_notified_at")
    op.drop_column("webhook_endpoints", "failed_attempts")
