"""Debian's Chromium for the tests that drive the portal (Playwright never downloads one).

On a laptop without /usr/bin/chromium those tests skip; in CI (`CI` set) they fail,
loudly: `.ci/run` installs it.
"""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
#: The flags every launch uses: headless, no sandbox (containers), nothing phoning home.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> str:
    """The browser's path; skips the test without it (fails it in CI)."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    reason = f"{CHROMIUM} is missing (apt-get install chromium): the browser tests need it"
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}; .ci/run must install it", pytrace=False)
    pytest.skip(reason)
