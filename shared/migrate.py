"""Alembic, driven from code: each component keeps its own scripts and version table.

Components: identity (shared), core, notifier. `settle db upgrade` runs them in
that order against their configured databases.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData

from shared.db import make_engine, normalize_url


@dataclass(frozen=True)
class Component:
    """A set of migrations with its own version table."""

    name: str
    script_location: Path

    @property
    def version_table(self) -> str:
        return f"alembic_version_{self.name}"


def alembic_config(component: Component, url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(component.script_location))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    cfg.attributes["version_table"] = component.version_table
    return cfg


def revision(component: Component, url: str, message: str) -> None:
    """Autogenerate a revision from the component's models (for developers)."""
    command.revision(alembic_config(component, url), message=message, autogenerate=True)


def upgrade(component: Component, url: str, revision: str = "head") -> None:
    """Bring the component's tables in the database at `url` up to `revision`."""
    command.upgrade(alembic_config(component, url), revision)


def is_current(component: Component, url: str) -> bool:
    """True when the database is at the component's head revision."""
    script = ScriptDirectory.from_config(alembic_config(component, url))
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": component.version_table})
            return set(ctx.get_current_heads()) == set(script.get_heads())
    finally:
        engine.dispose()


def _only_own_tables(metadata: MetaData | None) -> Any:
    """Autogenerate sees only this component's tables, never another's (or their versions)."""

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        if type_ != "table" or metadata is None:
            return True
        return name in metadata.tables

    return include_name


def run_env(target_metadata: MetaData | None = None) -> None:
    """Body of every component's alembic env.py (online mode only)."""
    from alembic import context

    cfg = context.config
    url = cfg.get_main_option("sqlalchemy.url")
    assert url is not None
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                version_table=cfg.attributes["version_table"],
                target_metadata=target_metadata,
                include_name=_only_own_tables(target_metadata),
            )
            with context.begin_transaction():
                context.run_migrations()
            if connection.in_transaction():
                connection.commit()
    finally:
        engine.dispose()
