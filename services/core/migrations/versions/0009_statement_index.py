"""index credited deposits by tenant and credit time, covering what statements sum

A statement lists a tenant's deposits credited in a period, in credit order, and sums
every deposit credited before its end (opening and closing totals). The index holds
the order and, as included columns, everything the totals group and sum, so even a
tenant's whole history is summed from the index alone. Partial: only credited rows.

Revision ID: core_0009
Revises: core_0008
Create Date: 2026-11-25 10:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "core_0009"
down_revision: str | None = "core_0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_deposits_tenant_credited"
# Spelled here, not imported from the models (a migration builds what it built then).
INCLUDED = "chain_id, token_address, asset, decimals, amount_raw, amount_usd, fee_usd, net_usd"


def upgrade() -> None:
    # CONCURRENTLY: the pipeline keeps writing deposits while the index builds. It
    # cannot run inside the migration's transaction, and a build that failed half-way
    # leaves an invalid index behind: drop that one first.
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        op.execute(
            f"CREATE INDEX CONCURRENTLY {INDEX} ON deposits "
            f"(tenant_id, sandbox, credited_at, id) INCLUDE ({INCLUDED}) "
            "WHERE credited_at IS NOT NULL"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
