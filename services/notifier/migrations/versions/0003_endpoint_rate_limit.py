"""an endpoint's own cap on deliveries per second (rateLimitPerSecond)

Revision ID: notifier_0003
Revises: notifier_0002
Create Date: 2026-11-24 02:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "notifier_0003"
down_revision: str | None = "notifier_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "webhook_endpoints", sa.Column("rate_limit_per_second", sa.Float(), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("webhook_endpoints", "rate_limit_per_second")
