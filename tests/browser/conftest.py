"""The portal in a real browser: Debian's Chromium driven by Playwright for Python.

One `settle dev` process (all of Settle on one port, on a fresh database of the
tests' PostgreSQL) serves the portal and both APIs; receivers on 127.0.0.1 take the
webhooks. Playwright never downloads a browser: it launches /usr/bin/chromium. On a
laptop without it the tests skip; in CI (`CI` set) they fail, loudly.

With SETTLE_PORTAL_SCREENSHOTS=1 (`make screenshots`) the tests also write a
screenshot of each page to docs/portal/.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from shared.db import Database
from shared.identity import service as identity
from tests.conftest import PASSWORD
from tests.support.chromium import require_chromium
from tests.support.processes import ROOT, SettleProcesses, settle_argv
from tests.support.receiver import Receiver
from tests.support.services import create_database, drop_database

SCREENSHOTS = ROOT / "docs" / "portal"
ROLES = ("viewer", "developer", "admin", "owner")
#: How long the UI may take to show something (a loaded 2-core machine).
UI_TIMEOUT_MS = 15_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Portal:
    """The running Settle: its base URL, the demo tenant and one member per role."""

    base: str
    tenant_id: str
    api_key: str
    db: Database
    emails: dict[str, str]
    #: The environment of the running `settle dev` (ops commands run with it).
    env: dict[str, str]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """The tenant's API with the full-scope demo key; a non-2xx fails the test."""
        response = requests.request(
            method, self.base + path, json=body, headers=self.headers, timeout=30, **kwargs
        )
        assert response.ok, (method, path, response.status_code, response.text)
        return response.json() if response.content else None

    def settle(self, *args: str) -> str:
        """A `settle` command (ops: `deposits credit ...`) on this Settle's database."""
        ran = subprocess.run(
            settle_argv(*args),
            env={**os.environ, **self.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, (args, ran.stdout[-2000:], ran.stderr[-2000:])
        return ran.stdout

    def wait_for(self, method: str, path: str, done: Any, timeout: float = 30.0) -> Any:
        """Poll until `done(body)`; the last body."""
        deadline = time.monotonic() + timeout
        while True:
            body = self.call(method, path)
            if done(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} never got there: {body}")
            time.sleep(0.3)


@pytest.fixture(scope="session")
def portal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Portal]:
    require_chromium()
    name = f"settle_browser_{os.getpid()}"
    url = create_database(name)
    data = tmp_path_factory.mktemp("portal-data")
    port = _free_port()
    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(data),
        "SETTLE_WEBHOOK_RETRY_SCHEDULE": "1s,1s",
        "SETTLE_WEBHOOK_TIMEOUT_S": "5",
        "SETTLE_WEBHOOK_ALLOW_PRIVATE": "1",
        "SETTLE_SANDBOX_BLOCK_S": "0.01",
        "SETTLE_RATE_LIMIT_PER_IP": "0",
    }
    group = SettleProcesses(env, log_dir=tmp_path_factory.mktemp("portal-logs"))
    dev = group.start(
        "dev", "dev", "--host", "127.0.0.1", "--port", str(port), ready="API key", wait=True
    )
    try:
        banner = dev.output()
        tenant = re.search(r"tenant\s+([0-9a-f-]{36})", banner)
        key = re.search(r"API key\s+(sk_\S+)", banner)
        assert tenant and key, banner
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(base + "/v1/status", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, dev.output()[-3000:]
            time.sleep(0.2)
        db = Database(url, pool_size=1)
        emails = {role: f"{role}-{uuid.uuid4().hex[:8]}@example.com" for role in ROLES}
        with db.transaction() as session:
            for role, email in emails.items():
                identity.add_member(session, tenant.group(1), email, role, PASSWORD)
        yield Portal(base, tenant.group(1), key.group(1), db, emails, env)
        db.dispose()
    finally:
        group.stop_all()
        drop_database(name)


@pytest.fixture
def context(browser: Any, portal: Portal) -> Iterator[Any]:
    """A fresh browser profile (no cookies), clipboard allowed, errors collected."""
    made = browser.new_context(
        base_url=portal.base,
        viewport={"width": 1280, "height": 900},
        permissions=["clipboard-read", "clipboard-write"],
    )
    made.set_default_timeout(UI_TIMEOUT_MS)
    made.page_errors = []  # type: ignore[attr-defined]
    yield made
    made.close()


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    made = context.new_page()
    made.on("pageerror", lambda error: context.page_errors.append(str(error)))
    yield made
    # No script error on any page a test visited
    assert context.page_errors == []


def sign_in(page: Any, portal: Portal, role: str) -> None:
    """Sign in through the form, as a person would."""
    page.goto("/")
    page.get_by_label("Email").fill(portal.emails[role])
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Overview").wait_for()
    loaded(page)


def loaded(page: Any) -> None:
    """Wait until the current page has loaded its data (the app clears aria-busy)."""
    page.locator('#main[aria-busy="false"]').wait_for()


def screenshot(page: Any, name: str) -> None:
    """docs/portal/<name>.png when SETTLE_PORTAL_SCREENSHOTS is set (`make screenshots`)."""
    if not os.environ.get("SETTLE_PORTAL_SCREENSHOTS"):
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as rx:
        yield rx
