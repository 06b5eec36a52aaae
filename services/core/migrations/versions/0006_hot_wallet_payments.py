"""hot-wallet payments idempotent by nonce: the nonce allocator and the payments table

Revision ID: core_0006
Revises: core_0005
Create Date: 2026-11-24 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db

revision: str = "core_0006"
down_revision: str | None = "core_0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hot_wallet_nonces",
        sa.Column("chain_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("wallet", sa.String(length=42), nullable=False),
        sa.Column("next_nonce", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chain_id", "wallet"),
    )
    op.create_table(
        "hot_wallet_payments",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("deposit_id", sa.String(length=40), nullable=False),
        sa.Column("chain_id", sa.Integer(), nullable=False),
        sa.Column("wallet", sa.String(length=42), nullable=False),
        sa.Column("nonce", sa.BigInteger(), nullable=False),
        sa.Column("tx", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("raw_tx", sa.Text(), nullable=False),
        sa.Column("tx_hashes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("signed_block", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=True),
        sa.Column("alerted", sa.Boolean(), nullable=False),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("chain_id", "wallet", "nonce", name="uq_hot_wallet_payment_nonce"),
    )
    op.create_index(
        "ix_hot_wallet_payments_open",
        "hot_wallet_payments",
        ["deposit_id"],
        postgresql_where=sa.text("resolved_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_hot_wallet_payments_open", table_name="hot_wallet_payments")
    op.drop_table("hot_wallet_payments")
    op.drop_table("hot_wallet_nonces")
