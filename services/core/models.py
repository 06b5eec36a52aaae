"""Core's tables: live fees, destination policies, deposit accounts and addresses,
the outbox and idempotency keys. (Deposits: services/core/deposits/models.py.)"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from shared import events
from shared.db import BigIntPK, JSONType, UTCDateTime
from shared.idempotency import IdempotencyRecordMixin
from shared.timefmt import utcnow


class CoreBase(DeclarativeBase):
    pass


class ChainFee(CoreBase):
    """The live flat settlement fee of a chain, as the fee oracle last computed it."""

    __tablename__ = "chain_fees"

    chain_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    settlement_fee_usd: Mapped[Decimal] = mapped_column(sa.Numeric(20, 6))
    gas_price_wei: Mapped[Decimal] = mapped_column(sa.Numeric(40, 0))
    native_usd: Mapped[Decimal] = mapped_column(sa.Numeric(20, 6))
    gas_units: Mapped[int] = mapped_column(sa.Integer)
    #: `rpc` (read from the chain's node) or `configured`.
    source: Mapped[str] = mapped_column(sa.String(20))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DestinationPolicy(CoreBase):
    __tablename__ = "destination_policies"

    tenant_id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    chain_id: Mapped[int] = mapped_column(sa.Integer)
    address: Mapped[str] = mapped_column(sa.String(42))
    token_address: Mapped[str] = mapped_column(sa.String(42))
    venue: Mapped[str | None] = mapped_column(sa.String(120), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


#: The sequence of deposit_accounts.pk (PostgreSQL's name for a serial column's).
ACCOUNT_SEQUENCE = "deposit_accounts_pk_seq"


class DepositAccount(CoreBase):
    __tablename__ = "deposit_accounts"
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "external_user_id", name="uq_account_tenant_user"),
        # GET /v1/deposit-accounts: a tenant's accounts newest first, keyset on pk.
        sa.Index("ix_deposit_accounts_tenant_pk", "tenant_id", "pk"),
    )

    #: In insertion order (lists and the address backfill walk it); never reused.
    pk: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    #: The BIP32 index of the account's deposit addresses, when it is not the pk (NULL):
    #: a number of the pk's sequence, which hands each number out once (as a pk or as
    #: an index), so indices never repeat. Creation takes it from its process's block
    #: (accounts._IndexBlock). NULL for accounts created before core_0008 and by code of
    #: that age still running during a deploy: both derived their addresses at the pk.
    #: Not indexed: nothing looks an account up by it, and a repeated index would meet
    #: the addresses' unique key (same index and chain, same address) and write nothing.
    address_index: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    id: Mapped[str] = mapped_column(sa.String(40), unique=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36))
    external_user_id: Mapped[str] = mapped_column(sa.String(255))
    status: Mapped[str] = mapped_column(sa.String(20), default="active")
    dest_chain_id: Mapped[int] = mapped_column(sa.Integer)
    dest_address: Mapped[str] = mapped_column(sa.String(42))
    dest_token_address: Mapped[str] = mapped_column(sa.String(42))
    #: The API key that last set the destination (reported in events).
    dest_set_by_key_id: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    addresses: Mapped[list[DepositAddress]] = relationship(
        back_populates="account", order_by="DepositAddress.position", lazy="selectin"
    )

    @property
    def derivation_index(self) -> int:
        """The BIP32 index its deposit addresses are derived at (`address_index`)."""
        return self.pk if self.address_index is None else self.address_index


class DepositKey(CoreBase):
    """An extended public key deposit addresses were derived from, and its scheme
    (services/core/addresses.py). Recorded the first time a process derives with it,
    so every address names the key (and so the path) that moves its funds, across
    rotations (docs/KEYS.md)."""

    __tablename__ = "deposit_keys"

    id: Mapped[int] = mapped_column(sa.SmallInteger, sa.Identity(), primary_key=True)
    xpub: Mapped[str] = mapped_column(sa.String(200), unique=True)
    #: `bip44` or `chain/index`.
    scheme: Mapped[str] = mapped_column(sa.String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DepositAddress(CoreBase):
    __tablename__ = "deposit_addresses"
    __table_args__ = (
        # A `bip44` key gives an account one address on every chain, so the address is
        # unique per chain. Leading with the address, the index also finds an address's
        # account (GET /v1/deposit-accounts?depositAddress=) without a second index.
        sa.UniqueConstraint("address", "chain_id", name="uq_deposit_address_chain"),
    )

    account_pk: Mapped[int] = mapped_column(sa.ForeignKey("deposit_accounts.pk"), primary_key=True)
    chain_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    #: Checksummed; never another account's (indices never repeat).
    address: Mapped[str] = mapped_column(sa.String(42))
    #: Order of the chain in the chains file, so lists read the same every time.
    position: Mapped[int] = mapped_column(sa.Integer, default=0)
    #: The key it was derived from; NULL: before core_0010, by the deployment's first key
    #: (scheme `chain/index`, the only one then).
    key_id: Mapped[int | None] = mapped_column(
        sa.SmallInteger, sa.ForeignKey("deposit_keys.id"), nullable=True
    )
    #: When it was given out (the database's clock); NULL: before core_0016 (the
    #: account's `created_at` stands in). Where a chain's first watching starts.
    created_at: Mapped[datetime | None] = mapped_column(
        UTCDateTime, nullable=True, server_default=sa.func.now()
    )

    account: Mapped[DepositAccount] = relationship(back_populates="addresses")


#: The events of a deposit's status changes; each carries the deposit as `data.deposit`.
DEPOSIT_STATUS_EVENT_TYPES: tuple[str, ...] = (
    events.DEPOSIT_SOURCE_SEEN,
    events.DEPOSIT_SOURCE_CONFIRMED,
    events.DEPOSIT_CREDIT_SUBMITTED,
    events.DEPOSIT_CREDITED,
    events.DEPOSIT_FAILED,
    events.DEPOSIT_MANUAL_REVIEW_REQUIRED,
)
#: SQL of the deposit a status event is about, and of "is a deposit status event". The
#: index below and the timeline's query (deposits/queries.py) use these same texts:
#: PostgreSQL uses a partial expression index only for a query spelling the same
#: expression and predicate with literals (a bind parameter would not match).
DEPOSIT_ID_OF_EVENT = "(body::jsonb #>> '{data,deposit,id}'::text[])"
IS_DEPOSIT_STATUS_EVENT = "event_type IN ({})".format(
    ", ".join(f"'{t}'" for t in DEPOSIT_STATUS_EVENT_TYPES)
)


class OutboxEvent(CoreBase):
    """A domain event written in the same transaction as the change that caused it.

    Rows are kept after publishing: a deposit's status events are its recorded
    timeline (`GET /v1/deposits/{id}/timeline` reads them by `ix_outbox_deposit_id`),
    kept a year; the others 30 days. Partitioned by (timeline, created_at) (core_0015,
    services/core/retention.py): the table's primary key is (id, timeline,
    created_at); a durable event id is kept unique by OutboxDurableId.
    """

    __tablename__ = "outbox"
    __table_args__ = (
        sa.Index(
            "ix_outbox_unpublished",
            "id",
            postgresql_where=sa.text("published_at IS NULL"),
        ),
        sa.Index(
            "ix_outbox_deposit_id",
            sa.text(DEPOSIT_ID_OF_EVENT),
            postgresql_where=sa.text(IS_DEPOSIT_STATUS_EVENT),
        ),
        {"postgresql_partition_by": "RANGE (timeline, created_at)"},
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    #: `evt_...`; a durable one is written once (OutboxDurableId).
    event_id: Mapped[str] = mapped_column(sa.String(120), index=True)
    event_type: Mapped[str] = mapped_column(sa.String(60))
    tenant_id: Mapped[str] = mapped_column(sa.String(36), index=True)
    #: The id of the API request whose transaction wrote it (X-Request-Id); None when no
    #: request did (the worker's pipeline). The relay carries it to the notifier.
    request_id: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    #: The exact envelope bytes (UTF-8 JSON) that receivers will get.
    body: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: A deposit's status event (DEPOSIT_STATUS_EVENT_TYPES): its timeline, kept longer.
    #: (false by default: for rows written by hand; outbox.row_of always sets it.)
    timeline: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())


class OutboxDurableId(CoreBase):
    """Each durable deposit event id written (`evt_dep_<deposit>_<status>`), unique
    across the outbox's partitions (a unique index there must include its key)."""

    __tablename__ = "outbox_durable_ids"
    __table_args__ = (sa.Index("ix_outbox_durable_ids_created_at", "created_at"),)

    event_id: Mapped[str] = mapped_column(sa.String(120), primary_key=True)
    #: The event's created_at (the outbox row's partition).
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AccountEventSequence(CoreBase):
    """The last `sequence` an event about this deposit account carried.

    Written in the transaction that writes the event (services/core/event_sequences.py):
    the row's lock, held to the commit, makes an account's numbers increase in commit
    order. Its own narrow table, so numbering never rewrites (or locks) the account row
    that the API reads and PATCH updates. An account without a row has had no numbered
    event (accounts created before core_0014): its next is 1.
    """

    __tablename__ = "account_event_sequences"

    account_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    last_sequence: Mapped[int] = mapped_column(sa.BigInteger)


class IdempotencyRecord(CoreBase, IdempotencyRecordMixin):
    __tablename__ = "idempotency_keys"
