"""each account's BIP32 index as a column of its own (no longer its pk)

Account creation takes its addresses' index from a block of account numbers its
process drew ahead, so the index is known before the one statement that writes the
account; the pk stays the sequence's value at insert, in insertion order. Both come
from the pk's sequence, which gives each number once, so an index never repeats one
given before. NULL means the pk: existing accounts, and those the previous release
writes during a rolling deploy, were derived at their pk. No index: nothing looks an
account up by it, and the addresses' unique key already refuses a repeated one.

Revision ID: core_0008
Revises: core_0007
Create Date: 2026-11-24 14:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "core_0008"
down_revision: str | None = "core_0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default, no backfill: adding it rewrites nothing and locks the table
    # only for the catalog change. NULL means "the pk", which is what every account
    # written so far was derived at, and what core of the previous release (still
    # running while a deploy rolls) keeps deriving at when it inserts without it.
    op.add_column("deposit_accounts", sa.Column("address_index", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # Accounts whose index is not their pk cannot go back: their addresses would change.
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT 1 FROM deposit_accounts "
        "WHERE address_index IS NOT NULL AND address_index <> pk) THEN "
        "RAISE EXCEPTION 'accounts with an address index other than their pk exist'; "
        "END IF; END $$"
    )
    op.drop_column("deposit_accounts", "address_index")
