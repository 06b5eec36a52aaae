"""paying exactly once when the world is hostile: waits, replacements, cancels, incidents

- deposits.wait_reason, waiting_since: why settlement waits (it retries by itself:
  the hot wallet short of a token or gas, payments paused on the chain, fees over the
  cap), and since when (the wait is bounded for a short hot wallet).
- hot_wallet_payments.first_signed_block: the head when the payment's first
  transaction was signed (`signed_block` moves with each replacement); what happened
  to the nonce is searched from here, never from a replacement's block. Existing rows
  take `signed_block` (the best they know).
- hot_wallet_payments.stalled, stalled_since: a replacement held back (`fee_cap`: the
  market asks more than the chain's cap; `max_replacements`: no replacement left).
- hot_wallet_payments.cancel_reason, cancel_raw_tx, cancel_tx_hash: a payout whose
  deposit's transfer left the chain is cancelled (same nonce, zero-value transfer to
  the hot wallet itself), signed and stored before it is broadcast.
- chain_incidents.facts: what the incident is about, as data (a nonce gap's numbers,
  a token's decimals), read by the code that resolves it.
- hot_wallet_shortfalls: the hot wallet short of a token (or of gas) on a chain, one
  row per dip: `inventory.low_balance` goes out when it is written.

Revision ID: core_0012
Revises: core_0011
Create Date: 2026-11-25 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db

revision: str = "core_0012"
down_revision: str | None = "core_0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("deposits", sa.Column("wait_reason", sa.String(length=60), nullable=True))
    op.add_column(
        "deposits",
        sa.Column("waiting_since", shared.db.UTCDateTime(timezone=True), nullable=True),
    )
    op.add_column(
        "hot_wallet_payments", sa.Column("first_signed_block", sa.BigInteger(), nullable=True)
    )
    op.execute("UPDATE hot_wallet_payments SET first_signed_block = signed_block")
    op.alter_column("hot_wallet_payments", "first_signed_block", nullable=False)
    op.add_column("hot_wallet_payments", sa.Column("stalled", sa.String(20), nullable=True))
    op.add_column(
        "hot_wallet_payments",
        sa.Column("stalled_since", shared.db.UTCDateTime(timezone=True), nullable=True),
    )
    op.add_column("hot_wallet_payments", sa.Column("cancel_reason", sa.String(300), nullable=True))
    op.add_column("hot_wallet_payments", sa.Column("cancel_raw_tx", sa.Text(), nullable=True))
    op.add_column("hot_wallet_payments", sa.Column("cancel_tx_hash", sa.String(66), nullable=True))
    op.add_column(
        "chain_incidents",
        sa.Column("facts", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.create_table(
        "hot_wallet_shortfalls",
        sa.Column("chain_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("token_address", sa.String(length=42), nullable=False),
        sa.Column("asset", sa.String(length=20), nullable=False),
        sa.Column("wallet", sa.String(length=42), nullable=False),
        sa.Column("balance", sa.String(length=80), nullable=False),
        sa.Column("needed", sa.String(length=80), nullable=False),
        sa.Column("since", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("chain_id", "token_address"),
    )


def downgrade() -> None:
    op.drop_table("hot_wallet_shortfalls")
    op.drop_column("chain_incidents", "facts")
    for column in (
        "cancel_tx_hash",
        "cancel_raw_tx",
        "cancel_reason",
        "stalled_since",
        "stalled",
        "first_signed_block",
    ):
        op.drop_column("hot_wallet_payments", column)
    op.drop_column("deposits", "waiting_since")
    op.drop_column("deposits", "wait_reason")
