"""sweeps: plans, the transfers out of deposit addresses, and the gas sent to them

Revision ID: core_0011
Revises: core_0010
Create Date: 2026-11-25 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db

revision: str = "core_0011"
down_revision: str | None = "core_0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _times() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.UTCDateTime(timezone=True), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "sweep_plans",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("chain_id", sa.Integer(), nullable=False),
        sa.Column("destination", sa.String(length=42), nullable=False),
        sa.Column("gas_wallet", sa.String(length=42), nullable=False),
        sa.Column("block_number", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("document", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_by", sa.String(length=120), nullable=False),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "sweeps",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.String(length=40), nullable=False),
        sa.Column("chain_id", sa.Integer(), nullable=False),
        sa.Column("deposit_address", sa.String(length=42), nullable=False),
        sa.Column("token_address", sa.String(length=42), nullable=False),
        sa.Column("asset", sa.String(length=20), nullable=False),
        sa.Column("amount_raw", sa.String(length=80), nullable=False),
        sa.Column("destination", sa.String(length=42), nullable=False),
        sa.Column("nonce", sa.BigInteger(), nullable=False),
        sa.Column("tx", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("raw_tx", sa.Text(), nullable=True),
        sa.Column("tx_hash", sa.String(length=66), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("block_number", sa.BigInteger(), nullable=True),
        sa.Column("block_hash", sa.String(length=66), nullable=True),
        *_times(),
        sa.Column("sent_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("confirmed_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["plan_id"], ["sweep_plans.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("plan_id", "deposit_address", "token_address", name="uq_sweep"),
    )
    op.create_index("ix_sweeps_address", "sweeps", ["chain_id", "deposit_address", "token_address"])
    op.create_index(
        "ix_sweeps_open",
        "sweeps",
        ["chain_id"],
        postgresql_where=sa.text("status IN ('signed', 'sent')"),
    )
    op.create_table(
        "sweep_fundings",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.String(length=40), nullable=False),
        sa.Column("chain_id", sa.Integer(), nullable=False),
        sa.Column("deposit_address", sa.String(length=42), nullable=False),
        sa.Column("wallet", sa.String(length=42), nullable=False),
        sa.Column("amount_wei", sa.String(length=80), nullable=False),
        sa.Column("nonce", sa.BigInteger(), nullable=True),
        sa.Column("tx", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("raw_tx", sa.Text(), nullable=True),
        sa.Column("tx_hash", sa.String(length=66), nullable=True),
        sa.Column("tx_hashes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("signed_block", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("block_number", sa.BigInteger(), nullable=True),
        sa.Column("block_hash", sa.String(length=66), nullable=True),
        *_times(),
        sa.ForeignKeyConstraint(["plan_id"], ["sweep_plans.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("plan_id", "deposit_address", name="uq_sweep_funding"),
    )


def downgrade() -> None:
    op.drop_table("sweep_fundings")
    op.drop_index("ix_sweeps_open", table_name="sweeps")
    op.drop_index("ix_sweeps_address", table_name="sweeps")
    op.drop_table("sweeps")
    op.drop_table("sweep_plans")
