"""ordered delivery per deposit account

- webhook_endpoints.ordering: `per_account` or NULL (each delivery on its own).
- notifier_events.account_id, sequence: the account an event is about and its number
  (the envelope's `sequence`), indexed: an ordered delivery waits for the events
  before it to arrive. Events stored before carry none (they are not ordered).
- webhook_deliveries.order_key, order_seq: set on deliveries to an ordered endpoint;
  a partial index on the unfinished ones finds a delivery's open predecessors.

Revision ID: notifier_0009
Revises: notifier_0008
Create Date: 2026-11-28 18:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "notifier_0009"
down_revision: str | None = "notifier_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns without defaults: added without rewriting the tables.
    op.add_column("webhook_endpoints", sa.Column("ordering", sa.String(20), nullable=True))
    op.add_column("notifier_events", sa.Column("account_id", sa.String(40), nullable=True))
    op.add_column("notifier_events", sa.Column("sequence", sa.BigInteger(), nullable=True))
    op.add_column("webhook_deliveries", sa.Column("order_key", sa.String(40), nullable=True))
    op.add_column("webhook_deliveries", sa.Column("order_seq", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_notifier_events_account_sequence",
        "notifier_events",
        ["account_id", "sequence"],
        postgresql_where=sa.text("account_id IS NOT NULL"),
    )
    op.create_index(
        "ix_deliveries_order",
        "webhook_deliveries",
        ["endpoint_id", "order_key", "order_seq"],
        postgresql_where=sa.text("order_key IS NOT NULL AND status IN ('pending', 'retrying')"),
    )


def downgrade() -> None:
    op.drop_index("ix_deliveries_order", table_name="webhook_deliveries")
    op.drop_index("ix_notifier_events_account_sequence", table_name="notifier_events")
    op.drop_column("webhook_deliveries", "order_seq")
    op.drop_column("webhook_deliveries", "order_key")
    op.drop_column("notifier_events", "sequence")
    op.drop_column("notifier_events", "account_id")
    op.drop_column("webhook_endpoints", "ordering")
