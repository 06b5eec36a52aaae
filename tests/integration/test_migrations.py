"""Migrations: they match the models, and running them twice changes nothing."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.orm import Session

import services.core.deposits.models  # registers the deposit tables
import services.core.sweeps.models  # noqa: F401  (and the sweep tables)
from services.core.models import CoreBase, DepositAccount
from services.notifier.models import NotifierBase
from shared import components, migrate
from shared.identity.models import IdentityBase
from shared.migrate import _only_own_tables
from tests.support.services import create_database, drop_database

pytestmark = pytest.mark.integration

COMPONENTS = [
    (components.IDENTITY, IdentityBase.metadata),
    (components.CORE, CoreBase.metadata),
    (components.NOTIFIER, NotifierBase.metadata),
]


@pytest.mark.parametrize(
    ("component", "metadata"), COMPONENTS, ids=lambda c: getattr(c, "name", "")
)
def test_models_and_migrations_agree(
    pg_url: str, component: migrate.Component, metadata: sa.MetaData
) -> None:
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"include_name": _only_own_tables(metadata)}
            )
            assert compare_metadata(ctx, metadata) == []
        assert migrate.is_current(component, pg_url)
    finally:
        engine.dispose()


def test_upgrading_twice_on_postgresql_is_a_no_op(pg_url: str) -> None:
    for component, _ in COMPONENTS:
        migrate.upgrade(component, pg_url)
        assert migrate.is_current(component, pg_url)


def test_core_0008_keeps_every_account_at_the_index_its_addresses_were_derived_at() -> None:
    # Given accounts created before core_0008, where the pk was the BIP32 index
    name = f"settle_test_migrate_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    engine = sa.create_engine(url)
    try:
        migrate.upgrade(components.IDENTITY, url)
        migrate.upgrade(components.CORE, url, "core_0007")
        # (as the previous release inserts: its own pk, addresses derived at it)
        insert = sa.text(
            "INSERT INTO deposit_accounts (pk, id, tenant_id, external_user_id, status, "
            "dest_chain_id, dest_address, dest_token_address, metadata, created_at, "
            "updated_at) VALUES (nextval('deposit_accounts_pk_seq'), :id, 'ten_x', :id, "
            "'active', 1, '0x0', '0x0', '{}', now(), now()) RETURNING pk"
        )
        with engine.begin() as conn:
            old = [conn.execute(insert, {"id": f"acc_{n}"}).scalar_one() for n in range(3)]

        # When core is upgraded while the previous release still creates accounts
        migrate.upgrade(components.CORE, url)
        with engine.begin() as conn:
            during = conn.execute(insert, {"id": "acc_during"}).scalar_one()

        # Then every one of them is still derived at its pk (NULL means the pk)
        with Session(engine) as session:
            rows = session.scalars(sa.select(DepositAccount)).all()
            assert {r.pk: r.derivation_index for r in rows} == {pk: pk for pk in [*old, during]}
            assert all(r.address_index is None for r in rows)
    finally:
        engine.dispose()
        drop_database(name)
