"""Tables of sweeps: the plans, each transfer out of a deposit address, and the gas
sent to an address so that it can pay for its own transfers.

Amounts are decimal text (a uint256 fits); every transaction is stored before it is
broadcast, so a run that dies anywhere is resumed from the rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from services.core.models import CoreBase
from shared.db import JSONType, UTCDateTime

# -- sweep statuses (docs/DEPOSITS.md, "Sweeps") -------------------------------------------

#: In a plan; nothing signed has been seen yet.
PLANNED = "planned"
#: A newer plan of the chain took its place before it was signed and sent.
REPLACED = "replaced"
#: Its signed bytes are stored; not broadcast yet.
SIGNED = "signed"
#: Broadcast at least once; not yet at the chain's depth.
SENT = "sent"
#: Mined with status 1, at the chain's depth, its block canonical: it moved.
CONFIRMED = "confirmed"
#: Mined with status 0 at depth: nothing moved (the nonce is spent).
REVERTED = "reverted"
#: Another transaction used its nonce (at depth): it can never be mined.
SUPERSEDED = "superseded"
#: Not broadcast: the chain no longer holds what the plan saw (plan again).
STALE = "stale"

#: Statuses a send still works on.
OPEN = (SIGNED, SENT)
#: Statuses nothing more happens to.
FINAL = (CONFIRMED, REVERTED, SUPERSEDED, STALE, REPLACED)

# -- funding statuses ----------------------------------------------------------------------

#: The address holds enough native token for its transfers' gas.
NOT_NEEDED = "not_needed"
#: Funding statuses as sweeps': SIGNED (stored, maybe broadcast), SENT, CONFIRMED, and
#: FAILED (mined with status 0, or its nonce used by another transaction).
FAILED = "failed"


class SweepPlan(CoreBase):
    """A plan as `settle sweep plan` wrote it: the document the offline signer reads."""

    __tablename__ = "sweep_plans"

    #: `swp_<ulid>`.
    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    destination: Mapped[str] = mapped_column(sa.String(42))
    gas_wallet: Mapped[str] = mapped_column(sa.String(42))
    #: The block its balances and nonces were read at.
    block_number: Mapped[int] = mapped_column(sa.BigInteger)
    #: sha256 of the document's canonical JSON, as written in the plan file.
    digest: Mapped[str] = mapped_column(sa.String(64))
    document: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_by: Mapped[str] = mapped_column(sa.String(120))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Sweep(CoreBase):
    """One token transfer out of a deposit address, to the plan's destination."""

    __tablename__ = "sweeps"
    __table_args__ = (
        sa.UniqueConstraint("plan_id", "deposit_address", "token_address", name="uq_sweep"),
        sa.Index("ix_sweeps_address", "chain_id", "deposit_address", "token_address"),
        sa.Index(
            "ix_sweeps_open", "chain_id", postgresql_where=sa.text("status IN ('signed', 'sent')")
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(sa.String(40), sa.ForeignKey("sweep_plans.id"))
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    deposit_address: Mapped[str] = mapped_column(sa.String(42))
    token_address: Mapped[str] = mapped_column(sa.String(42))
    asset: Mapped[str] = mapped_column(sa.String(20))
    amount_raw: Mapped[str] = mapped_column(sa.String(80))
    destination: Mapped[str] = mapped_column(sa.String(42))
    nonce: Mapped[int] = mapped_column(sa.BigInteger)
    #: The unsigned transaction the plan asked for: a signed one must be exactly this.
    tx: Mapped[dict[str, Any]] = mapped_column(JSONType)
    raw_tx: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    tx_hash: Mapped[str | None] = mapped_column(sa.String(66), nullable=True)
    status: Mapped[str] = mapped_column(sa.String(20))
    #: Why it is stale, reverted, superseded; what the last round saw.
    detail: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    block_number: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    block_hash: Mapped[str | None] = mapped_column(sa.String(66), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    confirmed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class SweepFunding(CoreBase):
    """The native token the gas wallet sends a deposit address for a plan's transfers."""

    __tablename__ = "sweep_fundings"
    __table_args__ = (sa.UniqueConstraint("plan_id", "deposit_address", name="uq_sweep_funding"),)

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(sa.String(40), sa.ForeignKey("sweep_plans.id"))
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    deposit_address: Mapped[str] = mapped_column(sa.String(42))
    wallet: Mapped[str] = mapped_column(sa.String(42))
    amount_wei: Mapped[str] = mapped_column(sa.String(80))
    #: The gas wallet's nonce, from the hot wallet's allocator (payments.allocate_nonce).
    nonce: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    #: The unsigned transfer (without nonce): what a replacement re-signs with higher fees.
    tx: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    #: The latest signed bytes, broadcast again while the node does not know them.
    raw_tx: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    #: The mined transaction's hash once mined, else the latest one.
    tx_hash: Mapped[str | None] = mapped_column(sa.String(66), nullable=True)
    #: Every hash signed for it (replacements keep the nonce): whichever is mined counts.
    tx_hashes: Mapped[list[str]] = mapped_column(JSONType, default=list)
    #: The head when `raw_tx` was signed: a replacement is due some blocks later.
    signed_block: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    status: Mapped[str] = mapped_column(sa.String(20))
    detail: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    block_number: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    block_hash: Mapped[str | None] = mapped_column(sa.String(66), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
