"""the id of the request that caused each stored event (for the delivery attempts' logs)

Revision ID: notifier_0002
Revises: notifier_0001
Create Date: 2026-11-24 01:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "notifier_0002"
down_revision: str | None = "notifier_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("notifier_events", sa.Column("request_id", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_column("notifier_events", "request_id")
