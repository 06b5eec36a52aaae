"""deposit keys: the xpub (and scheme) each deposit address was derived from

`deposit_keys` records every key a process has derived with; each address row names
its key (`key_id`; NULL for rows written before this revision, all derived by the
deployment's first key, scheme `chain/index`). A `bip44` key gives an account one
address on every chain, so an address is unique per chain: the unique key becomes
(address, chain_id), built without blocking writes, and the address-only one goes.

Revision ID: core_0010
Revises: core_0009
Create Date: 2026-11-25 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import shared.db

revision: str = "core_0010"
down_revision: str | None = "core_0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNIQUE = "uq_deposit_address_chain"
#: PostgreSQL's name for 0001's `UniqueConstraint("address")`.
OLD_UNIQUE = "deposit_addresses_address_key"


def upgrade() -> None:
    op.create_table(
        "deposit_keys",
        sa.Column("id", sa.SmallInteger(), sa.Identity(), nullable=False),
        sa.Column("xpub", sa.String(length=200), nullable=False),
        sa.Column("scheme", sa.String(length=20), nullable=False),
        sa.Column("created_at", shared.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("xpub"),
    )
    # Nullable, no default: a catalog change only, and NULL says "before keys were
    # recorded", which is true of every row written so far and of those the previous
    # release writes while a deploy rolls.
    op.add_column("deposit_addresses", sa.Column("key_id", sa.SmallInteger(), nullable=True))
    op.create_foreign_key(
        "deposit_addresses_key_id_fkey", "deposit_addresses", "deposit_keys", ["key_id"], ["id"]
    )
    # CONCURRENTLY (outside the migration's transaction): accounts are created while
    # the index builds on a large table.
    with op.get_context().autocommit_block():
        # A build that failed half-way leaves an invalid index behind: drop that first.
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {UNIQUE}")
        op.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {UNIQUE} ON deposit_addresses (address, chain_id)"
        )
    op.execute(f"ALTER TABLE deposit_addresses ADD CONSTRAINT {UNIQUE} UNIQUE USING INDEX {UNIQUE}")
    op.drop_constraint(OLD_UNIQUE, "deposit_addresses", type_="unique")


def downgrade() -> None:
    # One address on several chains (a bip44 key's) cannot go back under a unique address.
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT address FROM deposit_addresses GROUP BY address "
        "HAVING count(*) > 1) THEN RAISE EXCEPTION 'addresses shared across chains exist "
        "(a bip44 deposit key)'; END IF; END $$"
    )
    op.create_unique_constraint(OLD_UNIQUE, "deposit_addresses", ["address"])
    op.drop_constraint(UNIQUE, "deposit_addresses", type_="unique")
    op.drop_constraint("deposit_addresses_key_id_fkey", "deposit_addresses", type_="foreignkey")
    op.drop_column("deposit_addresses", "key_id")
    op.drop_table("deposit_keys")
