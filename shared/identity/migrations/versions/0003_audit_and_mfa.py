"""audit log (append-only, hash-chained), members' second factor, step-up

Revision ID: identity_0003
Revises: identity_0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db

revision: str = "identity_0003"
down_revision: str | None = "identity_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Refuses any change to a stored audit event: the log is append-only for every role,
#: the table's owner included (only a superuser can switch triggers off, and
#: `settle audit verify` then shows what was changed).
APPEND_ONLY = """
CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def upgrade() -> None:
    op.add_column(
        "tenants",
        sa.Column("require_mfa", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("members", sa.Column("totp_secret", sa.Text(), nullable=True))
    op.add_column(
        "members",
        sa.Column("totp_enabled_at", shared.db.UTCDateTime(timezone=True), nullable=True),
    )
    op.add_column("members", sa.Column("totp_last_step", sa.BigInteger(), nullable=True))
    op.add_column("members", sa.Column("totp_pending_secret", sa.Text(), nullable=True))
    op.add_column(
        "members",
        sa.Column("totp_pending_at", shared.db.UTCDateTime(timezone=True), nullable=True),
    )
    op.add_column(
        "sessions", sa.Column("factor_at", shared.db.UTCDateTime(timezone=True), nullable=True)
    )
    # Sessions open before this release signed in with a password when they were made.
    op.execute("UPDATE sessions SET factor_at = created_at WHERE member_id IS NOT NULL")
    op.create_table(
        "recovery_codes",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("member_id", sa.String(length=40), nullable=False),
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("used_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["member_id"], ["members.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_recovery_codes_member_id", "recovery_codes", ["member_id"])
    op.create_table(
        "audit_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("actor_type", sa.String(length=20), nullable=False),
        sa.Column("actor_id", sa.String(length=200), nullable=True),
        sa.Column("actor_name", sa.String(length=320), nullable=True),
        sa.Column("target_type", sa.String(length=40), nullable=False),
        sa.Column("target_id", sa.String(length=300), nullable=True),
        sa.Column("before", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("after", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("ip", sa.String(length=64), nullable=True),
        sa.Column("request_id", sa.String(length=128), nullable=True),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant_id", "sequence", name="uq_audit_events_tenant_sequence"),
    )
    op.create_index(
        "ix_audit_events_tenant_actor", "audit_events", ["tenant_id", "actor_id", "sequence"]
    )
    op.create_index(
        "ix_audit_events_tenant_action", "audit_events", ["tenant_id", "action", "sequence"]
    )
    op.execute(APPEND_ONLY)
    op.execute(
        "CREATE TRIGGER audit_events_no_update_or_delete BEFORE UPDATE OR DELETE "
        "ON audit_events FOR EACH ROW EXECUTE FUNCTION audit_events_append_only()"
    )
    op.execute(
        "CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only()"
    )
    # Grants as a second line: no role but the owner is given UPDATE, DELETE or TRUNCATE.
    op.execute("REVOKE UPDATE, DELETE, TRUNCATE ON audit_events FROM PUBLIC")


def downgrade() -> None:
    op.drop_table("audit_events")
    op.execute("DROP FUNCTION audit_events_append_only()")
    op.drop_index("ix_recovery_codes_member_id", table_name="recovery_codes")
    op.drop_table("recovery_codes")
    op.drop_column("sessions", "factor_at")
    for column in (
        "totp_pending_at",
        "totp_pending_secret",
        "totp_last_step",
        "totp_enabled_at",
        "totp_secret",
    ):
        op.drop_column("members", column)
    op.drop_column("tenants", "require_mfa")
