"""Tables of the deposit pipeline: deposits, watcher cursors, inventory, route providers,
and what the watcher keeps for ops (chain incidents, transfers of unknown tokens).

Token amounts are stored as decimal text (exact, and a uint256 fits); USD figures as
NUMERIC to the micro-dollar.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from services.core.destinations import Destination
from services.core.models import CoreBase
from shared.db import JSONType, UTCDateTime

#: A transfer is one deposit for good, unless the watcher saw it vanish from the chain
#: (`source_vanished_at`): then, mined again later, it is a new deposit (the vanished one
#: is final and stays failed). Failing a deposit by hand, whatever the reason given,
#: never frees its transfer.
LIVE_SOURCE = "source_vanished_at IS NULL"
#: A transfer's identity: its transaction and its place among that transaction's
#: transfers of the same token to the same address. It survives a reorg that re-mines
#: the transaction in another block or behind other transactions (the log index does not).
TRANSFER_IDENTITY = (
    "chain_id",
    "source_tx_hash",
    "token_address",
    "deposit_address",
    "transfer_seq",
)
#: Non-final deposits: the worker's scans read only these.
OPEN_DEPOSITS = "status NOT IN ('credited', 'failed')"
#: What a statement's totals group and sum (carried by `ix_deposits_tenant_credited`).
STATEMENT_TOTALS_COLUMNS = [
    "chain_id",
    "token_address",
    "asset",
    "decimals",
    "amount_raw",
    "amount_usd",
    "fee_usd",
    "net_usd",
]


class Deposit(CoreBase):
    """One incoming transfer to a deposit address and its way to a credit."""

    __tablename__ = "deposits"
    __table_args__ = (
        sa.Index(
            "uq_deposit_transfer",
            *TRANSFER_IDENTITY,
            unique=True,
            postgresql_where=sa.text(LIVE_SOURCE),
        ),
        sa.Index("ix_deposits_tenant_id", "tenant_id", "id"),
        sa.Index("ix_deposits_tenant_user", "tenant_id", "external_user_id", "id"),
        sa.Index(
            "ix_deposits_open",
            "status",
            "chain_id",
            postgresql_where=sa.text(OPEN_DEPOSITS),
        ),
        # Statements (services/core/statements/): a period's credits in order, and every
        # column their totals sum, so the opening totals are an index-only scan.
        sa.Index(
            "ix_deposits_tenant_credited",
            "tenant_id",
            "sandbox",
            "credited_at",
            "id",
            postgresql_include=STATEMENT_TOTALS_COLUMNS,
            postgresql_where=sa.text("credited_at IS NOT NULL"),
        ),
    )

    #: `dep_<ulid>`: sorts by creation time, so lists page on it.
    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36))
    account_pk: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("deposit_accounts.pk"))
    account_id: Mapped[str] = mapped_column(sa.String(40))
    external_user_id: Mapped[str] = mapped_column(sa.String(255))
    status: Mapped[str] = mapped_column(sa.String(30))
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    deposit_address: Mapped[str] = mapped_column(sa.String(42))
    #: Symbol of a supported asset; None for a token the chain does not support.
    asset: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    token_address: Mapped[str] = mapped_column(sa.String(42))
    #: None when the token is not supported (its decimals are not known).
    decimals: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    #: The transfer's value in the token's base units, as decimal text.
    amount_raw: Mapped[str] = mapped_column(sa.String(80))
    amount_usd: Mapped[Decimal | None] = mapped_column(sa.Numeric(30, 6), nullable=True)
    #: The chain's live fee, recorded at settlement (an estimate before).
    fee_usd: Mapped[Decimal | None] = mapped_column(sa.Numeric(20, 6), nullable=True)
    net_usd: Mapped[Decimal | None] = mapped_column(sa.Numeric(30, 6), nullable=True)
    source_tx_hash: Mapped[str] = mapped_column(sa.String(66))
    #: Position in the block where the transfer is now (a reorg may change it).
    log_index: Mapped[int] = mapped_column(sa.Integer)
    #: The transfer's place among its transaction's transfers of the same token to the
    #: same address (0 for the first): part of its identity (TRANSFER_IDENTITY).
    transfer_seq: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    from_address: Mapped[str | None] = mapped_column(sa.String(42), nullable=True)
    block_number: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    block_hash: Mapped[str | None] = mapped_column(sa.String(66), nullable=True)
    confirmations: Mapped[int] = mapped_column(sa.Integer, default=0)
    required_confirmations: Mapped[int] = mapped_column(sa.Integer)
    #: The account's destination when the deposit was detected (a snapshot).
    dest_chain_id: Mapped[int] = mapped_column(sa.Integer)
    dest_address: Mapped[str] = mapped_column(sa.String(42))
    dest_token_address: Mapped[str] = mapped_column(sa.String(42))
    #: `direct`, `inventory`, `routed` or `manual`, once chosen.
    route: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    #: The payer or route provider that carries the credit.
    provider: Mapped[str | None] = mapped_column(sa.String(60), nullable=True)
    provider_ref: Mapped[str | None] = mapped_column(sa.String(200), nullable=True)
    #: Set while a call to a payer or provider is in flight (`paying`, `submitting`), so a
    #: crash in the middle is noticed instead of paying twice.
    settle_phase: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    settle_attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: Providers that failed this deposit: alternates are tried first.
    failed_providers: Mapped[list[str]] = mapped_column(JSONType, default=list)
    #: What the credit pays, in destination token units (decimal text).
    credit_amount: Mapped[str | None] = mapped_column(sa.String(80), nullable=True)
    #: Destination token units taken from tracked inventory for this credit (decimal text).
    inventory_reserved: Mapped[str | None] = mapped_column(sa.String(80), nullable=True)
    credit_tx_hash: Mapped[str | None] = mapped_column(sa.String(100), nullable=True)
    failure_reason: Mapped[str | None] = mapped_column(sa.String(500), nullable=True)
    review_reason: Mapped[str | None] = mapped_column(sa.String(500), nullable=True)
    sandbox: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    sandbox_outcome: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    #: Who resolved the deposit by hand, and why (ops commands).
    ops_by: Mapped[str | None] = mapped_column(sa.String(120), nullable=True)
    ops_reason: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    ops_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    confirmed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    credited_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: When the watcher failed it because its transfer left the chain (see LIVE_SOURCE).
    source_vanished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: Why settlement waits and retries by itself (`rules.WAIT_REASONS`); None when not
    #: waiting. Shown as `waitReason`.
    wait_reason: Mapped[str | None] = mapped_column(sa.String(60), nullable=True)
    #: When the current wait began (a short hot wallet's wait is bounded).
    waiting_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    @property
    def destination(self) -> Destination:
        """Where the deposit settles (the account's destination when it was detected)."""
        return Destination(self.dest_chain_id, self.dest_address, self.dest_token_address)


class ChainCursor(CoreBase):
    """Where a chain's watcher continues: every block below `next_block` is scanned."""

    __tablename__ = "chain_cursors"

    chain_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    next_block: Mapped[int] = mapped_column(sa.BigInteger)
    #: Where the second reading, at finality, continues: every block below it was read
    #: again once final and its transfers confirmed (None: not started yet).
    confirmed_block: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    #: The node's head when last read (for status and lag figures).
    head: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ChainCheckpoint(CoreBase):
    """The hash of the last block of each scanned range: how a reorg is noticed."""

    __tablename__ = "chain_checkpoints"

    chain_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    number: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[str] = mapped_column(sa.String(66))


class InventoryBalance(CoreBase):
    """Settle's own balance of a token on a chain, that pays credits at once."""

    __tablename__ = "settlement_inventory"

    chain_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    token_address: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    asset: Mapped[str] = mapped_column(sa.String(20))
    #: Token units as decimal text (exact on every backend).
    balance: Mapped[str] = mapped_column(sa.String(80))
    low_threshold: Mapped[str] = mapped_column(sa.String(80))
    #: True once `inventory.low_balance` went out for the current dip (no repeats).
    low_alerted: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class RouteProviderHealth(CoreBase):
    """A route provider's health as the pipeline last saw it."""

    __tablename__ = "route_providers"

    name: Mapped[str] = mapped_column(sa.String(60), primary_key=True)
    #: `healthy` or `degraded` (degraded providers get no new traffic).
    status: Mapped[str] = mapped_column(sa.String(20), default="healthy")
    consecutive_failures: Mapped[int] = mapped_column(sa.Integer, default=0)
    reason: Mapped[str | None] = mapped_column(sa.String(500), nullable=True)
    checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ChainIncident(CoreBase):
    """Something on a chain a person must look at (kinds: `incidents.KINDS`). Open until
    `resolved_at`; a `nonce_gap` pauses the chain's payments until then."""

    __tablename__ = "chain_incidents"
    __table_args__ = (
        sa.Index(
            "ix_chain_incidents_open", "chain_id", postgresql_where=sa.text("resolved_at IS NULL")
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=True)
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    kind: Mapped[str] = mapped_column(sa.String(40))
    deposit_id: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    block_number: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    detail: Mapped[str] = mapped_column(sa.Text)
    #: What it is about, as data read by the code that resolves it (a nonce gap's
    #: wallet and nonces, a token's decimals); None for kinds that need none.
    facts: Mapped[dict[str, object] | None] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class StrayTransfer(CoreBase):
    """A transfer of a token the chain does not support, to a deposit address: kept quietly
    for ops (no deposit, no event, no review item), at most a few per scanned range."""

    __tablename__ = "stray_transfers"
    __table_args__ = (
        sa.UniqueConstraint(
            "chain_id",
            "tx_hash",
            "token_address",
            "to_address",
            "transfer_seq",
            name="uq_stray_transfer",
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=True)
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    tx_hash: Mapped[str] = mapped_column(sa.String(66))
    transfer_seq: Mapped[int] = mapped_column(sa.Integer)
    block_number: Mapped[int] = mapped_column(sa.BigInteger)
    block_hash: Mapped[str] = mapped_column(sa.String(66))
    token_address: Mapped[str] = mapped_column(sa.String(42))
    from_address: Mapped[str] = mapped_column(sa.String(42))
    to_address: Mapped[str] = mapped_column(sa.String(42))
    amount_raw: Mapped[str] = mapped_column(sa.String(80))
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime)


class HotWalletNonce(CoreBase):
    """The next nonce Settle gives a payment from one wallet on one chain.

    Allocated under this row's lock (`payments.allocate_nonce`), so two workers never
    sign two payments with one nonce, whatever their nodes say is pending.
    """

    __tablename__ = "hot_wallet_nonces"

    chain_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    wallet: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    next_nonce: Mapped[int] = mapped_column(sa.BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


#: `Deposit.provider_ref` of a hot-wallet payment in flight: `payment:<id>`.
PAYMENT_REF = "payment:"


class HotWalletPayment(CoreBase):
    """One credit paid from a hot wallet: its nonce and every transaction signed for it.

    Written in the transaction that marks the payment started, before anything is
    broadcast. Replacements keep the nonce and calldata (so at most one of `tx_hashes`
    can ever be mined); `raw_tx` is the latest, the one broadcast again while unknown.
    Open until `resolved_at` (`outcome`: `mined`, `failed`, `cancelled`, `ops`).
    """

    __tablename__ = "hot_wallet_payments"
    __table_args__ = (
        sa.UniqueConstraint("chain_id", "wallet", "nonce", name="uq_hot_wallet_payment_nonce"),
        sa.Index(
            "ix_hot_wallet_payments_open",
            "deposit_id",
            postgresql_where=sa.text("resolved_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=True)
    deposit_id: Mapped[str] = mapped_column(sa.String(40))
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    wallet: Mapped[str] = mapped_column(sa.String(42))
    nonce: Mapped[int] = mapped_column(sa.BigInteger)
    #: The unsigned transaction (without nonce): what a replacement re-signs.
    tx: Mapped[dict[str, object]] = mapped_column(JSONType)
    raw_tx: Mapped[str] = mapped_column(sa.Text)
    #: Every hash signed for this payment, oldest first; whichever is mined wins.
    tx_hashes: Mapped[list[str]] = mapped_column(JSONType)
    #: The chain's head when `raw_tx` was signed: a replacement is due N blocks later.
    signed_block: Mapped[int] = mapped_column(sa.BigInteger)
    #: The chain's head when the first transaction was signed (its nonce unused there):
    #: where the search for what used the nonce starts, whatever the replacements.
    first_signed_block: Mapped[int] = mapped_column(sa.BigInteger)
    #: Why a due replacement is held back (`fee_cap`, `max_replacements`), and since
    #: when; None while it may be replaced.
    stalled: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    stalled_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: Set when the payout must not happen (its deposit's transfer left the chain): the
    #: poll then signs `cancel_raw_tx`, a zero-value transfer to the wallet itself with
    #: the payment's nonce, stored before it is broadcast.
    cancel_reason: Mapped[str | None] = mapped_column(sa.String(300), nullable=True)
    cancel_raw_tx: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    cancel_tx_hash: Mapped[str | None] = mapped_column(sa.String(66), nullable=True)
    outcome: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    #: True once the "old in-flight payment" log line was written.
    alerted: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    @property
    def ref(self) -> str:
        """The deposit's `provider_ref` while this payment is in flight."""
        return f"{PAYMENT_REF}{self.id}"


class HotWalletShortfall(CoreBase):
    """The hot wallet short of a token (or of gas: the zero address) on a chain.

    One row per dip: written (and `inventory.low_balance` emitted) when a payout first
    finds the balance short, deleted when a payout finds it sufficient again.
    """

    __tablename__ = "hot_wallet_shortfalls"

    chain_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    token_address: Mapped[str] = mapped_column(sa.String(42), primary_key=True)
    asset: Mapped[str] = mapped_column(sa.String(20))
    wallet: Mapped[str] = mapped_column(sa.String(42))
    #: Token units as decimal text: what the wallet held, what the payout needed.
    balance: Mapped[str] = mapped_column(sa.String(80))
    needed: Mapped[str] = mapped_column(sa.String(80))
    since: Mapped[datetime] = mapped_column(UTCDateTime)
