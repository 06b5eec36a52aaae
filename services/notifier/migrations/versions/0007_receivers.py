"""receivers first (issue 26): an endpoint's signature scheme, ephemeral endpoints, the
Standard Webhooks signature an attempt sent

Revision ID: notifier_0007
Revises: notifier_0006
Create Date: 2026-11-28 18:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import shared.db

revision: str = "notifier_0007"
down_revision: str | None = "notifier_0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "webhook_endpoints",
        sa.Column("signature_scheme", sa.String(20), nullable=False, server_default="settle"),
    )
    op.add_column(
        "webhook_endpoints",
        sa.Column("expires_at", shared.db.UTCDateTime(timezone=True), nullable=True),
    )
    op.add_column("webhook_attempts", sa.Column("webhook_signature", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("webhook_attempts", "webhook_signature")
    op.drop_column("webhook_endpoints", "expires_at")
    op.drop_column("webhook_endpoints", "signature_scheme")
