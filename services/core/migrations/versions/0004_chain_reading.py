"""transfer identity that survives reorgs, the watcher's second cursor, chain incidents,
transfers of unknown tokens

Revision ID: core_0004
Revises: core_0003
Create Date: 2026-11-23 23:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import shared.db

revision: str = "core_0004"
down_revision: str | None = "core_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IDENTITY = ["chain_id", "source_tx_hash", "token_address", "deposit_address", "transfer_seq"]


def upgrade() -> None:
    op.add_column(
        "deposits",
        sa.Column("transfer_seq", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "deposits",
        sa.Column("source_vanished_at", shared.db.UTCDateTime(timezone=True), nullable=True),
    )
    # Transfers of the same token to the same address in one transaction, numbered in
    # log order (almost always one, numbered 0).
    op.execute(
        """
        UPDATE deposits d SET transfer_seq = n.seq
        FROM (
            SELECT id, ROW_NUMBER() OVER (
                PARTITION BY chain_id, source_tx_hash, token_address, deposit_address,
                             COALESCE(failure_reason = 'reorged' AND ops_by IS NULL, false)
                ORDER BY log_index, id
            ) - 1 AS seq
            FROM deposits
        ) n
        WHERE d.id = n.id AND n.seq <> 0
        """
    )
    # The watcher's own `reorged` failures vanished from the chain; ops' do not count.
    op.execute(
        "UPDATE deposits SET source_vanished_at = updated_at "
        "WHERE failure_reason = 'reorged' AND ops_by IS NULL"
    )
    op.drop_index("uq_deposit_source", table_name="deposits")
    op.create_index(
        "uq_deposit_transfer",
        "deposits",
        IDENTITY,
        unique=True,
        postgresql_where=sa.text("source_vanished_at IS NULL"),
    )
    op.add_column("chain_cursors", sa.Column("confirmed_block", sa.BigInteger(), nullable=True))
    op.create_table(
        "chain_incidents",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("chain_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("deposit_id", sa.String(length=40), nullable=True),
        sa.Column("block_number", sa.BigInteger(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_chain_incidents_open",
        "chain_incidents",
        ["chain_id"],
        postgresql_where=sa.text("resolved_at IS NULL"),
    )
    op.create_table(
        "stray_transfers",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("chain_id", sa.Integer(), nullable=False),
        sa.Column("tx_hash", sa.String(length=66), nullable=False),
        sa.Column("transfer_seq", sa.Integer(), nullable=False),
        sa.Column("block_number", sa.BigInteger(), nullable=False),
        sa.Column("block_hash", sa.String(length=66), nullable=False),
        sa.Column("token_address", sa.String(length=42), nullable=False),
        sa.Column("from_address", sa.String(length=42), nullable=False),
        sa.Column("to_address", sa.String(length=42), nullable=False),
        sa.Column("amount_raw", sa.String(length=80), nullable=False),
        sa.Column("seen_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "chain_id",
            "tx_hash",
            "token_address",
            "to_address",
            "transfer_seq",
            name="uq_stray_transfer",
        ),
    )


def downgrade() -> None:
    op.drop_table("stray_transfers")
    op.drop_index("ix_chain_incidents_open", table_name="chain_incidents")
    op.drop_table("chain_incidents")
    op.drop_column("chain_cursors", "confirmed_block")
    op.drop_index("uq_deposit_transfer", table_name="deposits")
    op.create_index(
        "uq_deposit_source",
        "deposits",
        ["chain_id", "source_tx_hash", "log_index"],
        unique=True,
        postgresql_where=sa.text("failure_reason IS NULL OR failure_reason <> 'reorged'"),
    )
    op.drop_column("deposits", "source_vanished_at")
    op.drop_column("deposits", "transfer_seq")
