"""the outbox becomes a table partitioned by (timeline, created_at) (bounded data)

The old table is renamed aside; the partitioned one gets a DEFAULT partition and
partitions from each class's oldest row's period (at most MAX_BACKFILL_DAYS back) to
the periods made ahead: a deposit's status events (`timeline`, kept a year) in 30-day
partitions, every other event in daily ones. Every row is copied (its class computed
from its type), the durable deposit event ids are recorded in `outbox_durable_ids`
(which keeps them written at most once across partitions), the id sequence moves to
the new table and the old one is dropped.

Revision ID: core_0015
Revises: core_0014
Create Date: 2026-11-28 19:00:00
"""

import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

import shared.db
from shared import partitions

revision: str = "core_0015"
down_revision: str | None = "core_0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Oldest period a partition is made for; older rows go to DEFAULT (the first prune's).
MAX_BACKFILL_DAYS = 400
# Spelled here, not imported (a migration must keep building what it built).
DEPOSIT_ID_OF_EVENT = "(body::jsonb #>> '{data,deposit,id}'::text[])"
IS_DEPOSIT_STATUS_EVENT = (
    "event_type IN ('deposit.source_seen', 'deposit.source_confirmed', "
    "'deposit.credit_submitted', 'deposit.credited', 'deposit.failed', "
    "'deposit.manual_review_required')"
)
COLUMNS = (
    "id",
    "event_id",
    "event_type",
    "tenant_id",
    "body",
    "created_at",
    "published_at",
    "request_id",
)
# The two classes of rows, as services/core/retention.py names their partitions.
SPECS = [
    partitions.PartitionedTable(
        "outbox",
        "created_at",
        timedelta(days=30),
        lead="false",
        stem="outbox_events",
        lead_condition="NOT timeline",
    ),
    partitions.PartitionedTable(
        "outbox",
        "created_at",
        timedelta(days=365),
        lead="true",
        stem="outbox_timeline",
        lead_condition="timeline",
        period_days=30,
    ),
]

_T = shared.db.UTCDateTime(timezone=True)


def upgrade() -> None:
    conn = op.get_bind()
    op.rename_table("outbox", "outbox_old")
    op.execute("ALTER TABLE outbox_old DROP CONSTRAINT outbox_pkey")
    op.execute("ALTER TABLE outbox_old DROP CONSTRAINT outbox_event_id_key")
    for index in (
        "ix_outbox_created_at",
        "ix_outbox_tenant_id",
        "ix_outbox_unpublished",
        "ix_outbox_deposit_id",
    ):
        op.execute(f"DROP INDEX IF EXISTS {index}")

    op.create_table(
        "outbox_durable_ids",
        sa.Column("event_id", sa.String(length=120), nullable=False),
        sa.Column("created_at", _T, nullable=False),
        sa.PrimaryKeyConstraint("event_id"),
    )
    op.create_index("ix_outbox_durable_ids_created_at", "outbox_durable_ids", ["created_at"])
    op.create_table(
        "outbox",
        sa.Column(
            "id",
            sa.BigInteger(),
            server_default=sa.text("nextval('outbox_id_seq'::regclass)"),
            nullable=False,
        ),
        sa.Column("event_id", sa.String(length=120), nullable=False),
        sa.Column("event_type", sa.String(length=60), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", _T, nullable=False),
        sa.Column("published_at", _T, nullable=True),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.Column("timeline", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("id", "timeline", "created_at"),
        postgresql_partition_by="RANGE (timeline, created_at)",
    )
    # The id sequence moves to the new table (dropping the old would drop it).
    op.execute("ALTER SEQUENCE outbox_id_seq OWNED BY outbox.id")

    now = datetime.now(UTC)
    settings = partitions.PartitionSettings.from_env(os.environ)
    partitions.create_default(conn, SPECS[0])
    for spec, of_class in zip(
        SPECS, (f"NOT ({IS_DEPOSIT_STATUS_EVENT})", IS_DEPOSIT_STATUS_EVENT), strict=True
    ):
        oldest = f"SELECT min(created_at) FROM outbox_old WHERE {of_class}"  # noqa: S608
        first = conn.execute(sa.text(oldest)).scalar()
        first = max(first or now, now - timedelta(days=MAX_BACKFILL_DAYS))
        for partition in partitions.span(spec, first, now, settings):
            partitions.create(conn, spec, partition)

    listed = ", ".join(COLUMNS)
    op.execute(
        f"INSERT INTO outbox ({listed}, timeline) "  # noqa: S608
        f"SELECT {listed}, {IS_DEPOSIT_STATUS_EVENT} FROM outbox_old"
    )
    op.execute(
        "INSERT INTO outbox_durable_ids (event_id, created_at) SELECT event_id, created_at "
        "FROM outbox_old WHERE starts_with(event_id, 'evt_dep_')"
    )
    op.drop_table("outbox_old")

    op.create_index("ix_outbox_created_at", "outbox", ["created_at"])
    op.create_index("ix_outbox_tenant_id", "outbox", ["tenant_id"])
    op.create_index("ix_outbox_event_id", "outbox", ["event_id"])
    op.create_index(
        "ix_outbox_unpublished", "outbox", ["id"], postgresql_where=sa.text("published_at IS NULL")
    )
    op.execute(
        f"CREATE INDEX ix_outbox_deposit_id ON outbox ({DEPOSIT_ID_OF_EVENT}) "
        f"WHERE {IS_DEPOSIT_STATUS_EVENT}"
    )


def downgrade() -> None:
    raise NotImplementedError(
        "core_0015 (partitioned outbox) has no downgrade: restore the backup taken before "
        "upgrading (docs/RUNBOOK.md)"
    )
