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
    if op.get_bind().dialect.name == "postgresql":
        # CONCURRENTLY: account creation keeps running while the index builds on a
        # large table. It cannot run inside the migration's transaction, and a build
        # that failed half-way leaves an invalid index behind: drop that one first.
        with op.get_context().autocommit_block():
            op.drop_index(INDEX, "deposit_accounts", postgresql_concurrently=True, if_exists=True)
            op.create_index(
                INDEX, "deposit_accounts", ["tenant_id", "pk"], postgresql_concurrently=True
            )
    else:
        op.create_index(INDEX, "deposit_accounts", ["tenant_id", "pk"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        with op.get_context().autocommit_block():
            op.drop_index(INDEX, "deposit_accounts", postgresql_concurrently=True, if_exists=True)
    else:
        op.drop_index(INDEX, "deposit_accounts")
