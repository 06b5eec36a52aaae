"""index deposit_accounts (tenant_id, pk) for the newest-first account list

Revision ID: core_0003
Revises: core_0002
Create Date: 2026-11-21 06:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "core_0003"
down_revision: str | None = "core_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_deposit_accounts_tenant_pk"


def upgrade() -> None:
    # CONCURRENTLY: account creation keeps running while the index builds on a large
    # table. It cannot run inside the migration's transaction, and a build that failed
    # half-way leaves an invalid index behind: drop that one first.
    with op.get_context().autocommit_block():
        op.drop_index(INDEX, "deposit_accounts", postgresql_concurrently=True, if_exists=True)
        op.create_index(
            INDEX, "deposit_accounts", ["tenant_id", "pk"], postgresql_concurrently=True
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(INDEX, "deposit_accounts", postgresql_concurrently=True, if_exists=True)
