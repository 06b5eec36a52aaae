"""the id of the request that caused each outbox event (carried to the notifier)

Revision ID: core_0007
Revises: core_0006
Create Date: 2026-11-24 01:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "core_0007"
down_revision: str | None = "core_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing (events no request caused have none).
    op.add_column("outbox", sa.Column("request_id", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_column("outbox", "request_id")
