"""events, deliveries and attempts become range-partitioned tables (bounded data)

Each old table is renamed aside, its partitioned successor made with a DEFAULT
partition and a partition per period from its oldest row's (at most
MAX_BACKFILL_DAYS back: older rows go to the DEFAULT partition, which the first prune
empties) to the periods made ahead; then every row is copied and the old table
dropped. Event ids are recorded in `notifier_event_ids`, which keeps them unique
across partitions. The foreign keys between these three tables go: a unique index on
a partitioned table must include its key, and each table is pruned on its own clock.

Revision ID: notifier_0008
Revises: notifier_0007
Create Date: 2026-11-28 18:40:00
"""

import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

import shared.db
from shared import partitions

revision: str = "notifier_0008"
down_revision: str | None = "notifier_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Oldest period a partition is made for when migrating; older rows go to DEFAULT.
MAX_BACKFILL_DAYS = 400

_T = shared.db.UTCDateTime(timezone=True)

# The partitioned tables as services/notifier/retention.py names them, spelled here (a
# migration must keep building what it built; retentions do not matter to it).
SPECS = [
    partitions.PartitionedTable("notifier_events", "received_at", timedelta(days=90)),
    partitions.PartitionedTable("webhook_deliveries", "id", timedelta(days=30), id_prefix="whd_"),
    partitions.PartitionedTable(
        "webhook_attempts", "delivery_id", timedelta(days=30), id_prefix="whd_"
    ),
]

#: The columns copied from each old table.
_EVENTS = ("id", "tenant_id", "event_type", "body", "created_at", "received_at", "request_id")
_DELIVERIES = (
    "id",
    "tenant_id",
    "endpoint_id",
    "event_id",
    "event_type",
    "status",
    "attempt_count",
    "next_attempt_at",
    "lease_until",
    "replay_of",
    "last_attempt_at",
    "last_response_status",
    "last_error",
    "succeeded_at",
    "created_at",
    "updated_at",
)
_ATTEMPTS = (
    "id",
    "delivery_id",
    "number",
    "attempted_at",
    "response_status",
    "latency_ms",
    "error",
    "response_body",
    "signature_header",
    "webhook_signature",
)


def upgrade() -> None:
    conn = op.get_bind()
    for table in ("notifier_events", "webhook_deliveries", "webhook_attempts"):
        op.rename_table(table, f"{table}_old")
    op.execute("ALTER TABLE webhook_attempts_old DROP CONSTRAINT webhook_attempts_pkey CASCADE")
    op.execute("ALTER TABLE webhook_deliveries_old DROP CONSTRAINT webhook_deliveries_pkey CASCADE")
    op.execute("ALTER TABLE notifier_events_old DROP CONSTRAINT notifier_events_pkey CASCADE")
    for index in (
        "ix_notifier_events_tenant_created",
        "ix_deliveries_due",
        "ix_deliveries_endpoint",
        "ix_deliveries_event",
        "ix_deliveries_tenant_created",
        "ix_attempts_delivery",
    ):
        op.execute(f"DROP INDEX {index}")

    op.create_table(
        "notifier_event_ids",
        sa.Column("id", sa.String(length=120), nullable=False),
        sa.Column("received_at", _T, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_notifier_event_ids_received_at", "notifier_event_ids", ["received_at"])
    op.create_table(
        "notifier_events",
        sa.Column("id", sa.String(length=120), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("event_type", sa.String(length=60), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", _T, nullable=False),
        sa.Column("received_at", _T, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.PrimaryKeyConstraint("id", "received_at"),
        postgresql_partition_by="RANGE (received_at)",
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=40, collation="C"), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=120), nullable=False),
        sa.Column("event_type", sa.String(length=60), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", _T, nullable=True),
        sa.Column("lease_until", _T, nullable=True),
        sa.Column("replay_of", sa.String(length=40), nullable=True),
        sa.Column("last_attempt_at", _T, nullable=True),
        sa.Column("last_response_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("succeeded_at", _T, nullable=True),
        sa.Column("created_at", _T, nullable=False),
        sa.Column("updated_at", _T, nullable=False),
        sa.ForeignKeyConstraint(["endpoint_id"], ["webhook_endpoints.id"]),
        sa.PrimaryKeyConstraint("id"),
        postgresql_partition_by="RANGE (id)",
    )
    op.create_table(
        "webhook_attempts",
        sa.Column(
            "id",
            sa.BigInteger(),
            server_default=sa.text("nextval('webhook_attempts_id_seq'::regclass)"),
            nullable=False,
        ),
        sa.Column("delivery_id", sa.String(length=40, collation="C"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("attempted_at", _T, nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.String(length=500), nullable=True),
        sa.Column("response_body", sa.Text(), nullable=True),
        sa.Column("signature_header", sa.Text(), nullable=True),
        sa.Column("webhook_signature", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", "delivery_id"),
        postgresql_partition_by="RANGE (delivery_id)",
    )
    # The attempts' id sequence moves to the new table (dropping the old would drop it).
    op.execute("ALTER SEQUENCE webhook_attempts_id_seq OWNED BY webhook_attempts.id")

    now = datetime.now(UTC)
    settings = partitions.PartitionSettings.from_env(os.environ)
    oldest = {
        "notifier_events": "SELECT min(received_at) FROM notifier_events_old",
        "webhook_deliveries": "SELECT min(created_at) FROM webhook_deliveries_old",
        "webhook_attempts": "SELECT min(created_at) FROM webhook_deliveries_old",
    }
    for spec in SPECS:
        partitions.create_default(conn, spec)
        first = conn.execute(sa.text(oldest[spec.parent])).scalar() or now
        first = max(first, now - timedelta(days=MAX_BACKFILL_DAYS))
        for partition in partitions.span(spec, first, now, settings):
            partitions.create(conn, spec, partition)

    op.execute(
        "INSERT INTO notifier_event_ids (id, received_at) SELECT id, received_at "
        "FROM notifier_events_old"
    )
    for table, columns in (
        ("notifier_events", _EVENTS),
        ("webhook_deliveries", _DELIVERIES),
        ("webhook_attempts", _ATTEMPTS),
    ):
        listed = ", ".join(columns)
        op.execute(f"INSERT INTO {table} ({listed}) SELECT {listed} FROM {table}_old")  # noqa: S608
    for table in ("webhook_attempts_old", "webhook_deliveries_old", "notifier_events_old"):
        op.drop_table(table)

    op.create_index(
        "ix_notifier_events_tenant_created", "notifier_events", ["tenant_id", "created_at"]
    )
    op.create_index("ix_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_deliveries_endpoint", "webhook_deliveries", ["endpoint_id", "created_at"])
    op.create_index("ix_deliveries_event", "webhook_deliveries", ["event_id"])
    op.create_index(
        "ix_deliveries_tenant_created", "webhook_deliveries", ["tenant_id", "created_at"]
    )
    op.create_index("ix_attempts_delivery", "webhook_attempts", ["delivery_id", "number"])


def downgrade() -> None:
    raise NotImplementedError(
        "notifier_0008 (partitioned tables) has no downgrade: restore the backup taken "
        "before upgrading (docs/RUNBOOK.md)"
    )
