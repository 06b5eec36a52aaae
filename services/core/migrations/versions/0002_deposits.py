"""deposits, watcher cursors and checkpoints, inventory, route providers

Revision ID: core_0002
Revises: core_0001
Create Date: 2026-11-21 05:10:13.436580
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db

revision: str = "core_0002"
down_revision: str | None = "core_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE_SOURCE = "failure_reason IS NULL OR failure_reason <> 'reorged'"
OPEN_DEPOSITS = "status NOT IN ('credited', 'failed')"


def upgrade() -> None:
    op.create_table(
        "chain_checkpoints",
        sa.Column("chain_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("number", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.String(length=66), nullable=False),
        sa.PrimaryKeyConstraint("chain_id", "number"),
    )
    op.create_table(
        "chain_cursors",
        sa.Column("chain_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("next_block", sa.BigInteger(), nullable=False),
        sa.Column("head", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chain_id"),
    )
    op.create_table(
        "route_providers",
        sa.Column("name", sa.String(length=60), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=True),
        sa.Column("checked_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("changed_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "settlement_inventory",
        sa.Column("chain_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("token_address", sa.String(length=42), nullable=False),
        sa.Column("asset", sa.String(length=20), nullable=False),
        sa.Column("balance", sa.String(length=80), nullable=False),
        sa.Column("low_threshold", sa.String(length=80), nullable=False),
        sa.Column("low_alerted", sa.Boolean(), nullable=False),
        sa.Column("updated_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chain_id", "token_address"),
    )
    op.create_table(
        "deposits",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("account_pk", sa.BigInteger(), nullable=False),
        sa.Column("account_id", sa.String(length=40), nullable=False),
        sa.Column("external_user_id", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=30), nullable=False),
        sa.Column("chain_id", sa.Integer(), nullable=False),
        sa.Column("deposit_address", sa.String(length=42), nullable=False),
        sa.Column("asset", sa.String(length=20), nullable=True),
        sa.Column("token_address", sa.String(length=42), nullable=False),
        sa.Column("decimals", sa.Integer(), nullable=True),
        sa.Column("amount_raw", sa.String(length=80), nullable=False),
        sa.Column("amount_usd", sa.Numeric(precision=30, scale=6), nullable=True),
        sa.Column("fee_usd", sa.Numeric(precision=20, scale=6), nullable=True),
        sa.Column("net_usd", sa.Numeric(precision=30, scale=6), nullable=True),
        sa.Column("source_tx_hash", sa.String(length=66), nullable=False),
        sa.Column("log_index", sa.Integer(), nullable=False),
        sa.Column("from_address", sa.String(length=42), nullable=True),
        sa.Column("block_number", sa.BigInteger(), nullable=True),
        sa.Column("block_hash", sa.String(length=66), nullable=True),
        sa.Column("confirmations", sa.Integer(), nullable=False),
        sa.Column("required_confirmations", sa.Integer(), nullable=False),
        sa.Column("dest_chain_id", sa.Integer(), nullable=False),
        sa.Column("dest_address", sa.String(length=42), nullable=False),
        sa.Column("dest_token_address", sa.String(length=42), nullable=False),
        sa.Column("route", sa.String(length=20), nullable=True),
        sa.Column("provider", sa.String(length=60), nullable=True),
        sa.Column("provider_ref", sa.String(length=200), nullable=True),
        sa.Column("settle_phase", sa.String(length=20), nullable=True),
        sa.Column("settle_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column(
            "failed_providers",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column("credit_amount", sa.String(length=80), nullable=True),
        sa.Column("inventory_reserved", sa.String(length=80), nullable=True),
        sa.Column("credit_tx_hash", sa.String(length=100), nullable=True),
        sa.Column("failure_reason", sa.String(length=500), nullable=True),
        sa.Column("review_reason", sa.String(length=500), nullable=True),
        sa.Column("sandbox", sa.Boolean(), nullable=False),
        sa.Column("sandbox_outcome", sa.String(length=20), nullable=True),
        sa.Column("ops_by", sa.String(length=120), nullable=True),
        sa.Column("ops_reason", sa.Text(), nullable=True),
        sa.Column("ops_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("confirmed_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("credited_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["account_pk"], ["deposit_accounts.pk"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_deposits_open",
        "deposits",
        ["status", "chain_id"],
        unique=False,
        postgresql_where=sa.text(OPEN_DEPOSITS),
    )
    op.create_index("ix_deposits_tenant_id", "deposits", ["tenant_id", "id"], unique=False)
    op.create_index(
        "ix_deposits_tenant_user", "deposits", ["tenant_id", "external_user_id", "id"], unique=False
    )
    op.create_index(
        "uq_deposit_source",
        "deposits",
        ["chain_id", "source_tx_hash", "log_index"],
        unique=True,
        postgresql_where=sa.text(LIVE_SOURCE),
    )


def downgrade() -> None:
    op.drop_index("uq_deposit_source", table_name="deposits")
    op.drop_index("ix_deposits_tenant_user", table_name="deposits")
    op.drop_index("ix_deposits_tenant_id", table_name="deposits")
    op.drop_index("ix_deposits_open", table_name="deposits")
    op.drop_table("deposits")
    op.drop_table("settlement_inventory")
    op.drop_table("route_providers")
    op.drop_table("chain_cursors")
    op.drop_table("chain_checkpoints")
