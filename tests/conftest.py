"""Fixtures shared by every suite: databases, apps, tenants.

Integration tests share one PostgreSQL database per run (created fresh and
migrated once); each test makes its own tenants, so tests never see each other's
objects and need no cleanup.
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from services.core.app import create_app
from services.core.config import CoreConfig
from services.core.context import CoreContext
from shared import components, migrate
from shared.db import Database
from shared.identity import service as identity
from shared.identity.auth import CSRF_HEADER, SESSION_COOKIE
from shared.identity.models import SCOPES, Member
from shared.identity.secrets import hash_password
from shared.ids import new_id
from shared.timefmt import utcnow
from tests.support.chromium import CHROMIUM_ARGS, require_chromium
from tests.support.keys import test_xpub
from tests.support.services import create_database, drop_database


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test run (see tests/support/services.py)."""
    name = os.environ.get("SETTLE_TEST_DB", f"settle_test_{os.getpid()}")
    url = create_database(name)
    for component in (components.IDENTITY, components.CORE, components.NOTIFIER):
        migrate.upgrade(component, url)
    yield url
    if not os.environ.get("SETTLE_TEST_KEEP_DB"):
        drop_database(name)


@pytest.fixture(scope="session")
def pg_db(pg_url: str) -> Iterator[Database]:
    db = Database(pg_url, pool_size=5)
    yield db
    db.dispose()


def core_config(db_url: str, data_dir: Path, **overrides: Any) -> CoreConfig:
    values: dict[str, Any] = {
        "database_url": db_url,
        "identity_database_url": db_url,
        "env": "dev",
        "data_dir": data_dir,
        "deposit_xpub": test_xpub(),
        "sandbox": True,
    }
    values.update(overrides)
    return CoreConfig(**values)


@pytest.fixture(scope="session")
def core_context(
    pg_url: str, pg_db: Database, tmp_path_factory: pytest.TempPathFactory
) -> CoreContext:
    config = core_config(pg_url, tmp_path_factory.mktemp("core-data"))
    return CoreContext.build(config, db=pg_db, identity_db=pg_db)


@pytest.fixture(scope="session")
def core_app(core_context: CoreContext) -> Flask:
    app = create_app(context=core_context)
    app.testing = True
    return app


@pytest.fixture
def client(core_app: Flask) -> FlaskClient:
    return core_app.test_client()


#: The password of every member tests make.
PASSWORD = "correct horse battery staple"


@functools.cache
def _password_hash() -> str:
    """PASSWORD hashed once per run: argon2 takes about half a second here."""
    return hash_password(PASSWORD)


@dataclass(frozen=True)
class SignedIn:
    """A member of a tenant with an open portal session (cookie token and CSRF token)."""

    tenant_id: str
    member_id: str
    email: str
    role: str
    token: str
    csrf: str

    @property
    def headers(self) -> dict[str, str]:
        """The CSRF header unsafe requests of this session carry."""
        return {CSRF_HEADER: self.csrf}

    def client(self, app: Flask) -> FlaskClient:
        """A test client of `app` carrying this session's cookie."""
        client = app.test_client()
        client.set_cookie(SESSION_COOKIE, self.token, path="/v1")
        return client


@dataclass
class TenantKeys:
    """A tenant made for one test, with a full-scope API key."""

    tenant_id: str
    api_key: str
    api_key_id: str
    db: Database

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def key_with(self, *scopes: str) -> dict[str, str]:
        """Headers of a new key of this tenant with only these scopes."""
        with self.db.transaction() as session:
            issued = identity.create_api_key(session, self.tenant_id, scopes)
        return {"Authorization": f"Bearer {issued.api_key}"}

    def signed_in(self, role: str) -> SignedIn:
        """A new member of this tenant with `role`, signed in (no password check: fast)."""
        email = f"{role}-{uuid.uuid4().hex[:12]}@example.com"
        with self.db.transaction() as session:
            member = Member(
                id=new_id("mem"),
                tenant_id=self.tenant_id,
                email=email,
                password_hash=_password_hash(),
                role=role,
                created_at=utcnow(),
            )
            session.add(member)
            session.flush()
            issued = identity.open_session(session, member)
            return SignedIn(self.tenant_id, member.id, email, role, issued.token, issued.csrf_token)


def make_tenant(db: Database, *, sandbox: bool = False) -> TenantKeys:
    with db.transaction() as session:
        tenant, issued = identity.create_tenant(
            session, f"Tenant {uuid.uuid4().hex[:8]}", sandbox=sandbox
        )
        return TenantKeys(tenant.id, issued.api_key, issued.record.id, db)


@pytest.fixture
def tenant(pg_db: Database) -> TenantKeys:
    return make_tenant(pg_db)


@pytest.fixture
def other_tenant(pg_db: Database) -> TenantKeys:
    return make_tenant(pg_db)


ALL_SCOPES = SCOPES


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's Chromium, once per run (Playwright's sync API allows one at a time)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=require_chromium(), args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()


#: Threads of core's deposit pipeline (services/core/deposits/worker.py names them).
PIPELINE_THREADS = ("deposit-settlement", "watcher-")


@pytest.fixture(autouse=True)
def no_pipeline_outlives_its_test() -> Iterator[None]:
    """Stop a deposit pipeline a test left running, and say which test left it.

    A test that fails before stopping its in-process pipeline (`worker.run`) leaves its
    settlement loop on the session's database: every later test's deposits were then
    settled by it, with the wrong chains and prices (a cascade of unrelated failures in
    a full run, none alone). Its threads hold the run's stop event among their args.
    """
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [
        t
        for t in threading.enumerate()
        if t.ident not in before and t.is_alive() and t.name.startswith(PIPELINE_THREADS)
    ]
    for thread in leaked:
        for arg in getattr(thread, "_args", ()):
            if isinstance(arg, threading.Event):
                arg.set()
    for thread in leaked:
        thread.join(15)
    if leaked:
        warnings.warn(
            f"a deposit pipeline outlived its test (stopped now): {[t.name for t in leaked]}",
            stacklevel=1,
        )
