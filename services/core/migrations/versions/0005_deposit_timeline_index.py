"""index deposit status events by their deposit id (the deposit's timeline)

Revision ID: core_0005
Revises: core_0004
Create Date: 2026-11-24 01:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "core_0005"
down_revision: str | None = "core_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_outbox_deposit_id"
# Spelled as services/core/models.py spells them (a migration never imports models: it
# must build the index a later model change would no longer describe).
DEPOSIT_ID_OF_EVENT = "(body::jsonb #>> '{data,deposit,id}'::text[])"
IS_DEPOSIT_STATUS_EVENT = (
    "event_type IN ('deposit.source_seen', 'deposit.source_confirmed', "
    "'deposit.credit_submitted', 'deposit.credited', 'deposit.failed', "
    "'deposit.manual_review_required')"
)


def upgrade() -> None:
    # CONCURRENTLY: the outbox takes every event while the index builds on a large
    # table. It cannot run inside the migration's transaction, and a build that failed
    # half-way leaves an invalid index behind: drop that one first.
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        op.execute(
            f"CREATE INDEX CONCURRENTLY {INDEX} ON outbox ({DEPOSIT_ID_OF_EVENT}) "
            f"WHERE {IS_DEPOSIT_STATUS_EVENT}"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
