"""What the notifier's request handlers, commands and workers share within one process."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flask import current_app

from services.notifier.config import NotifierConfig
from services.notifier.secrets import SecretBox
from shared.db import Database

log = logging.getLogger(__name__)

#: Extension key of the NotifierContext on the Flask app.
EXTENSION = "settle.notifier"
#: Endpoints a tenant may have at once (deleted ones do not count).
DEFAULT_MAX_ENDPOINTS = 20

#: Hands committed delivery ids to the delivery engine (Dramatiq messages); `routes` (id
#: -> (endpoint id, tenant id)), when given, ride along so a worker can hold a delivery
#: of a busy tenant without a claim; `groups` (each event's deliveries) may travel as one
#: job each (broker.DeliveryQueues.enqueue).
Enqueue = Callable[..., None]
Routes = Mapping[str, tuple[str, str]]


def _engine_not_wired(delivery_ids: list[str], routes: Routes | None = None, **_: Any) -> None:
    # Nothing is lost: the sweeper sends every due delivery, just later.
    log.warning(
        "no delivery engine wired into this process; %d deliveries wait for the sweeper",
        len(delivery_ids),
    )


@dataclass
class NotifierContext:
    config: NotifierConfig
    db: Database
    identity_db: Database
    secret_box: SecretBox
    #: Hands new deliveries to the delivery engine (delivery_engine.py builds the
    #: context with its queues); the default only logs.
    enqueue: Enqueue = field(default=_engine_not_wired)
    max_endpoints_per_tenant: int = DEFAULT_MAX_ENDPOINTS

    @classmethod
    def build(
        cls,
        config: NotifierConfig,
        *,
        db: Database | None = None,
        identity_db: Database | None = None,
        enqueue: Enqueue | None = None,
    ) -> NotifierContext:
        db = db or Database(config.database_url, pool_size=config.db_pool_size)
        if identity_db is None:
            identity_db = (
                db
                if config.identity_database_url == config.database_url
                else Database(config.identity_database_url, pool_size=config.db_pool_size)
            )
        return cls(
            config=config,
            db=db,
            identity_db=identity_db,
            secret_box=SecretBox(config.secret_key),
            enqueue=enqueue or _engine_not_wired,
            max_endpoints_per_tenant=config.max_endpoints_per_tenant,
        )

    def hand_off(
        self,
        delivery_ids: Sequence[str],
        routes: Routes | None = None,
        groups: Sequence[Sequence[str]] = (),
    ) -> None:
        """Give committed deliveries to the engine; a failure only delays them (sweeper).

        `groups`: the deliveries of each event, which may travel as one job."""
        if not delivery_ids:
            return
        try:
            self.enqueue(list(delivery_ids), routes, groups=groups)
        except Exception:
            log.exception(
                "enqueue of %d deliveries failed; the sweeper will send them", len(delivery_ids)
            )


def notifier() -> NotifierContext:
    """The NotifierContext of the current Flask app."""
    ctx: NotifierContext = current_app.extensions[EXTENSION]
    return ctx
