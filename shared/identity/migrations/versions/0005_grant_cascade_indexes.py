"""index portal links by who made them, and sessions by the link that opened them

Revoking an API key or removing a member ends what it handed out in the same
transaction (shared/identity/service.py, end_grants): its portal links, found by
`created_by`, and the sessions those links opened, found by `portal_link_id`. Without
these two indexes each revocation scanned both tables whole, under the revocation's
locks.

Revision ID: identity_0005
Revises: identity_0004
"""

from collections.abc import Sequence

from alembic import op

revision: str = "identity_0005"
down_revision: str | None = "identity_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "ix_portal_links_created_by": "portal_links (created_by)",
    "ix_sessions_portal_link_id": "sessions (portal_link_id)",
}


def upgrade() -> None:
    # CONCURRENTLY: sign-ins and links keep being written while the indexes build. It
    # cannot run inside the migration's transaction, and a build that failed half-way
    # leaves an invalid index behind: drop that one first.
    with op.get_context().autocommit_block():
        for name, target in INDEXES.items():
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            op.execute(f"CREATE INDEX CONCURRENTLY {name} ON {target}")


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in INDEXES:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
