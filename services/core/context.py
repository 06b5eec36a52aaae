"""What core's request handlers and workers share within one process."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app

from services.core.addresses import AddressDeriver, load_or_create_dev_xpub
from services.core.chains import ChainRegistry, load_chains
from services.core.config import CoreConfig
from services.core.fees import FeeCache
from shared.db import Database
from shared.settings import SettingsError

#: Extension key of the CoreContext on the Flask app.
EXTENSION = "settle.core"


@dataclass
class CoreContext:
    config: CoreConfig
    db: Database
    identity_db: Database
    registry: ChainRegistry
    deriver: AddressDeriver
    fees: FeeCache

    @classmethod
    def build(
        cls,
        config: CoreConfig,
        *,
        db: Database | None = None,
        identity_db: Database | None = None,
    ) -> CoreContext:
        db = db or Database(config.database_url, pool_size=config.db_pool_size)
        if identity_db is None:
            identity_db = (
                db
                if config.identity_database_url == config.database_url
                else Database(config.identity_database_url)
            )
        registry = load_chains(config.chains_file)
        xpub = config.deposit_xpub
        if not xpub:
            if not config.is_dev:
                raise SettingsError("SETTLE_DEPOSIT_XPUB is required outside dev")
            xpub = load_or_create_dev_xpub(config.data_dir)
        return cls(
            config=config,
            db=db,
            identity_db=identity_db,
            registry=registry,
            deriver=AddressDeriver(xpub),
            fees=FeeCache(db, registry, ttl_s=config.chains_cache_s),
        )


def core() -> CoreContext:
    """The CoreContext of the current Flask app."""
    ctx: CoreContext = current_app.extensions[EXTENSION]
    return ctx
