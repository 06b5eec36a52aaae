"""portal: API key names, portal links, sessions opened by a link

Revision ID: identity_0002
Revises: identity_0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import shared.db

revision: str = "identity_0002"
down_revision: str | None = "identity_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("name", sa.String(length=100), nullable=True))
    op.create_table(
        "portal_links",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=36), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("created_by", sa.String(length=40), nullable=False),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("used_at", shared.db.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    # A session is a member's, or (member_id null) one a portal link opened with a role.
    op.alter_column("sessions", "member_id", existing_type=sa.String(length=40), nullable=True)
    op.add_column("sessions", sa.Column("role", sa.String(length=20), nullable=True))
    op.add_column("sessions", sa.Column("portal_link_id", sa.String(length=40), nullable=True))
    op.create_foreign_key(
        "fk_sessions_portal_link_id", "sessions", "portal_links", ["portal_link_id"], ["id"]
    )
    op.create_check_constraint(
        "ck_sessions_member_or_link",
        "sessions",
        "(member_id IS NOT NULL) <> (portal_link_id IS NOT NULL)",
    )


def downgrade() -> None:
    op.execute("DELETE FROM sessions WHERE member_id IS NULL")
    op.drop_constraint("ck_sessions_member_or_link", "sessions", type_="check")
    op.drop_constraint("fk_sessions_portal_link_id", "sessions", type_="foreignkey")
    op.drop_column("sessions", "portal_link_id")
    op.drop_column("sessions", "role")
    op.alter_column("sessions", "member_id", existing_type=sa.String(length=40), nullable=False)
    op.drop_table("portal_links")
    op.drop_column("api_keys", "name")
