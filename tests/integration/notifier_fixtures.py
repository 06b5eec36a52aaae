"""Fixtures and helpers for the notifier's API tests (real PostgreSQL, shared with core).

A test module imports the `*_fixture` functions it needs;
pytest knows them by their short names (`notifier_client`, `enqueued`, ...), so the
imports do not shadow test arguments. The helpers set up deliveries as the engine
would leave them (the engine itself is tested elsewhere).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from services.notifier.app import create_app
from services.notifier.config import NotifierConfig
from services.notifier.consumer import store_events
from services.notifier.context import NotifierContext
from services.notifier.models import Attempt, Delivery, Endpoint, StoredEvent
from shared import components, events, migrate
from shared.db import Database
from tests.conftest import TenantKeys
from tests.support.services import create_database, drop_database

#: Secret key the test notifier encrypts endpoint secrets with.
TEST_SECRET_KEY = "notifier-test-secret-key"
#: A URL the default (production-like) policy admits; nothing is ever sent to it.
PUBLIC_URL = "https://hooks.example.com/settle"


class EnqueueRecorder:
    """Stands in for the delivery engine: remembers what the API handed over."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, delivery_ids: list[str], routes: Any = None, **_: Any) -> None:
        self.calls.append(list(delivery_ids))

    @property
    def ids(self) -> list[str]:
        return [i for call in self.calls for i in call]


def notifier_config(db_url: str, **overrides: Any) -> NotifierConfig:
    values: dict[str, Any] = {
        "database_url": db_url,
        "identity_database_url": db_url,
        "secret_key": TEST_SECRET_KEY,
        "env": "dev",
        "allow_private": False,
    }
    values.update(overrides)
    return NotifierConfig(**values)


@pytest.fixture(scope="session", name="notifier_context")
def notifier_context_fixture(pg_url: str, pg_db: Database) -> NotifierContext:
    """Production-like URL policy (https, public hosts), sharing the test database."""
    return NotifierContext.build(notifier_config(pg_url), db=pg_db, identity_db=pg_db)


@pytest.fixture(scope="session", name="notifier_app")
def notifier_app_fixture(notifier_context: NotifierContext) -> Flask:
    app = create_app(context=notifier_context)
    app.testing = True
    return app


@pytest.fixture(name="notifier_client")
def notifier_client_fixture(notifier_app: Flask) -> FlaskClient:
    return notifier_app.test_client()


@pytest.fixture(scope="session", name="dev_notifier_client")
def dev_notifier_client_fixture(notifier_context: NotifierContext) -> FlaskClient:
    """A notifier with SETTLE_WEBHOOK_ALLOW_PRIVATE on (http and loopback admitted)."""
    config = dataclasses.replace(notifier_context.config, allow_private=True)
    context = dataclasses.replace(notifier_context, config=config)
    app = create_app(context=context)
    app.testing = True
    return app.test_client()


@contextmanager
def own_database_notifier(identity_url: str, identity: Database) -> Iterator[NotifierContext]:
    """A notifier whose database is its own, not identity's (production's layout:
    DESIGN.md); its database is dropped afterwards."""
    name = f"settle_test_notifier_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    own = Database(url, pool_size=2)
    try:
        migrate.upgrade(components.NOTIFIER, url)
        yield NotifierContext.build(
            notifier_config(url, identity_database_url=identity_url), db=own, identity_db=identity
        )
    finally:
        own.dispose()
        drop_database(name)


@pytest.fixture(name="enqueued")
def enqueued_fixture(notifier_context: NotifierContext) -> Iterator[EnqueueRecorder]:
    """Records what the API hands to the engine during one test."""
    recorder = EnqueueRecorder()
    previous = notifier_context.enqueue
    notifier_context.enqueue = recorder
    yield recorder
    notifier_context.enqueue = previous


# -- helpers ------------------------------------------------------------------------


def make_endpoint(
    client: FlaskClient, tenant: TenantKeys, **fields: Any
) -> tuple[dict[str, Any], str]:
    """POST an endpoint (defaults: a public https URL, deposit.credited); -> (endpoint, secret)."""
    body = {"name": "Ledger", "url": PUBLIC_URL, "eventTypes": [events.DEPOSIT_CREDITED]}
    body.update(fields)
    response = client.post("/v1/webhook-endpoints", json=body, headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    data = response.get_json()
    return data["webhookEndpoint"], data["secret"]


def deliver_event(
    db: Database,
    tenant_id: str,
    event_type: str = events.DEPOSIT_CREDITED,
    *,
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> tuple[StoredEvent, list[Delivery]]:
    """What the consumer does with an event from core: store it, fan out to subscribers."""
    envelope = events.envelope(event_type, tenant_id, data or {"n": 1}, created_at=at)
    (handled,) = store_events(db, [events.encode(envelope)], now=at)
    assert handled.malformed is None
    with db.reader() as session:
        event = session.get_one(StoredEvent, envelope["id"])
        made = [session.get_one(Delivery, delivery_id) for delivery_id in handled.delivery_ids]
    return event, made


def update_delivery(db: Database, delivery_id: str, **values: Any) -> None:
    """Put a delivery in the state the engine would have left it in."""
    with db.transaction() as session:
        session.execute(sa.update(Delivery).where(Delivery.id == delivery_id).values(**values))


def add_attempt(db: Database, delivery_id: str, number: int, **values: Any) -> None:
    with db.transaction() as session:
        session.add(Attempt(delivery_id=delivery_id, number=number, **values))


def load(db: Database, model: type[Any], key: str) -> Any:
    """A row, detached with its values loaded (closing a reader would expire it)."""
    with db.reader() as session:
        row = session.get(model, key)
        if row is not None:
            session.expunge(row)
        return row


def endpoint_row(db: Database, endpoint_id: str) -> Endpoint:
    row: Endpoint = load(db, Endpoint, endpoint_id)
    return row
