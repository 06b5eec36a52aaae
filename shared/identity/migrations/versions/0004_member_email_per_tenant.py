"""a member's email is unique within its tenant, not across all tenants

Revision ID: identity_0004
Revises: identity_0003
"""

from collections.abc import Sequence

from alembic import op

revision: str = "identity_0004"
down_revision: str | None = "identity_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: identity_0001's unnamed UNIQUE (email), found by its column whatever it was named.
DROP_GLOBAL_UNIQUE = """
DO $$
DECLARE name text;
BEGIN
    SELECT c.conname INTO name
    FROM pg_constraint c
    WHERE c.conrelid = 'members'::regclass AND c.contype = 'u'
      AND c.conkey = ARRAY[(SELECT attnum FROM pg_attribute
                            WHERE attrelid = 'members'::regclass AND attname = 'email')];
    IF name IS NOT NULL THEN
        EXECUTE format('ALTER TABLE members DROP CONSTRAINT %I', name);
    END IF;
END
$$
"""


def upgrade() -> None:
    # The new constraint first: every pair is unique already (the old rule was stronger).
    op.create_unique_constraint("uq_members_tenant_email", "members", ["tenant_id", "email"])
    op.execute(DROP_GLOBAL_UNIQUE)
    # Sign-in looks a member up by email alone (then by tenant when several match).
    op.create_index("ix_members_email", "members", ["email"])


def downgrade() -> None:
    # Refused by PostgreSQL if two tenants now share an email: that is the point.
    op.drop_index("ix_members_email", table_name="members")
    op.create_unique_constraint("members_email_key", "members", ["email"])
    op.drop_constraint("uq_members_tenant_email", "members", type_="unique")
