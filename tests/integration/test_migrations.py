"""Migrations: they match the models, and running them twice changes nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import services.core.deposits.models  # noqa: F401  (registers the deposit tables)
from services.core.models import CoreBase
from services.notifier.models import NotifierBase
from shared import components, migrate
from shared.identity.models import IdentityBase
from shared.migrate import _only_own_tables

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
