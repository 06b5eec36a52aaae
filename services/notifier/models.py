"""Notifier's tables: events as received, endpoints, deliveries and their attempts.

Names carry a `notifier_`/`webhook_` prefix so the notifier can share a database
with core (the embedded mode does).
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.notifier.statuses import DELIVERY_STATUSES as DELIVERY_STATUSES
from services.notifier.statuses import FAILED as FAILED
from services.notifier.statuses import PENDING as PENDING
from services.notifier.statuses import RETRYING as RETRYING
from services.notifier.statuses import SKIPPED as SKIPPED
from services.notifier.statuses import SUCCEEDED as SUCCEEDED
from shared.db import BigIntPK, JSONType, UTCDateTime
from shared.idempotency import IdempotencyRecordMixin

#: Endpoint statuses.
ENABLED, DISABLED = "enabled", "disabled"
#: An endpoint's `ordering`: events about one deposit account in commit order.
PER_ACCOUNT = "per_account"


class NotifierBase(DeclarativeBase):
    pass


class StoredEventId(NotifierBase):
    """The id of every stored event, unique across the events' partitions (a unique
    index on the partitioned table must include its key); see retention.py."""

    __tablename__ = "notifier_event_ids"
    __table_args__ = (sa.Index("ix_notifier_event_ids_received_at", "received_at"),)

    id: Mapped[str] = mapped_column(sa.String(120), primary_key=True)
    #: The stored event's received_at: its partition.
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)


class StoredEvent(NotifierBase):
    """A domain event, stored once (its id in StoredEventId).

    Partitioned by received_at (notifier_0008): the table's primary key is (id,
    received_at); the id alone is unique by StoredEventId.
    """

    __tablename__ = "notifier_events"
    __table_args__ = (
        sa.Index("ix_notifier_events_tenant_created", "tenant_id", "created_at"),
        sa.Index(
            "ix_notifier_events_account_sequence",
            "account_id",
            "sequence",
            postgresql_where=sa.text("account_id IS NOT NULL"),
        ),
        {"postgresql_partition_by": "RANGE (received_at)"},
    )

    id: Mapped[str] = mapped_column(sa.String(120), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36))
    event_type: Mapped[str] = mapped_column(sa.String(60))
    #: The exact body bytes (UTF-8 JSON) every delivery of the event sends.
    body: Mapped[str] = mapped_column(sa.Text)
    #: The envelope's createdAt (when core committed it).
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: The id of the core API request that caused the event (AMQP correlation_id), if
    #: any: every delivery attempt's log line carries it.
    request_id: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    #: The deposit account the event is about and its number there (the envelope's
    #: `sequence`), when it has one: ordered deliveries wait for the events before it.
    account_id: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    sequence: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)


class Endpoint(NotifierBase):
    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36), index=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    url: Mapped[str] = mapped_column(sa.String(2048))
    event_types: Mapped[list[str]] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(sa.String(20), default=ENABLED)
    #: Why it is disabled (`failing` when the notifier disabled it, `manual` by PATCH).
    disabled_reason: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    #: Fernet token of the current secret (encrypted with SETTLE_SECRET_KEY).
    secret_encrypted: Mapped[str] = mapped_column(sa.Text)
    previous_secret_encrypted: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: Start of the current run of failed attempts (None after a success).
    failing_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: Attempts that failed in a row (0 after a success).
    failed_attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    #: When `webhook.endpoint_failing` was sent about the current run (None: not sent;
    #: cleared, with `webhook.endpoint_recovered`, by the next success).
    failing_notified_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: `per_account`: deliveries of events about one deposit account go one at a time,
    #: in the events' order; None: every delivery on its own (the default).
    ordering: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    #: The endpoint's own cap on attempts per second (per worker process); None: none.
    rate_limit_per_second: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    #: `settle` (our headers) or `standard` (Standard Webhooks' headers too).
    signature_scheme: Mapped[str] = mapped_column(
        sa.String(20), default="settle", server_default="settle"
    )
    #: Set on an ephemeral endpoint (`settle listen`'s): it is deleted once this passes
    #: without a renewal, and does not count against the tenant's endpoint limit.
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Delivery(NotifierBase):
    """One event to one endpoint; retried until it succeeds or the schedule runs out.

    Partitioned by id (notifier_0008): ids sort by creation, a day of them is a range.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.Index("ix_deliveries_tenant_created", "tenant_id", "created_at"),
        sa.Index("ix_deliveries_due", "status", "next_attempt_at"),
        sa.Index("ix_deliveries_endpoint", "endpoint_id", "created_at"),
        sa.Index("ix_deliveries_event", "event_id"),
        # An ordered delivery's unfinished predecessors (the claim and the sweeper ask).
        sa.Index(
            "ix_deliveries_order",
            "endpoint_id",
            "order_key",
            "order_seq",
            postgresql_where=sa.text("order_key IS NOT NULL AND status IN ('pending', 'retrying')"),
        ),
        {"postgresql_partition_by": "RANGE (id)"},
    )

    #: Collation "C": partition bounds compare byte by byte.
    id: Mapped[str] = mapped_column(sa.String(40, collation="C"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.String(36))
    endpoint_id: Mapped[str] = mapped_column(sa.ForeignKey("webhook_endpoints.id"))
    #: The event (no foreign key: events are partitioned, and pruned on their own clock).
    event_id: Mapped[str] = mapped_column(sa.String(120))
    event_type: Mapped[str] = mapped_column(sa.String(60))
    status: Mapped[str] = mapped_column(sa.String(20), default=PENDING)
    attempt_count: Mapped[int] = mapped_column(sa.Integer, default=0)
    #: When the next attempt is due (None once final).
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: A worker holds the delivery until then; the sweeper re-enqueues after it.
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: The delivery this one replays (POST .../replay), if any.
    replay_of: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    #: Set when its endpoint orders per account (and the event has a `sequence`): the
    #: account and the event's number. It starts only when no delivery of the same
    #: endpoint and account with a lower number is unfinished (delivery_store's claim).
    order_key: Mapped[str | None] = mapped_column(sa.String(40), nullable=True)
    order_seq: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_response_status: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(sa.String(500), nullable=True)
    succeeded_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Attempt(NotifierBase):
    """One HTTP attempt of a delivery, as it happened.

    Partitioned by delivery id, with the deliveries' ranges (notifier_0008): a
    delivery's attempts live in the partition of the day it was made.
    """

    __tablename__ = "webhook_attempts"
    __table_args__ = (
        sa.Index("ix_attempts_delivery", "delivery_id", "number"),
        {"postgresql_partition_by": "RANGE (delivery_id)"},
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(sa.String(40, collation="C"))
    number: Mapped[int] = mapped_column(sa.Integer)
    attempted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    response_status: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    #: `timeout`, `connection_refused`, `blocked_address`, `http_500`, ... or None on success.
    error: Mapped[str | None] = mapped_column(sa.String(500), nullable=True)
    #: The first 4 KiB of the response body.
    response_body: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    #: The signature header sent, so support can see which secret signed it.
    signature_header: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    #: The `webhook-signature` header sent (Standard Webhooks), when the endpoint asked.
    webhook_signature: Mapped[str | None] = mapped_column(sa.Text, nullable=True)


class NotifierIdempotencyRecord(NotifierBase, IdempotencyRecordMixin):
    __tablename__ = "notifier_idempotency_keys"
