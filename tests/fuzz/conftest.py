"""Fixtures of the fuzz suite: the notifier app on the shared test database, the summary."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from argon2 import PasswordHasher
from flask import Flask

from services.notifier.app import create_app
from services.notifier.context import NotifierContext
from shared.db import Database
from shared.identity import secrets
from tests.fuzz.harness import REPORTS, summary_lines
from tests.integration.notifier_fixtures import EnqueueRecorder, notifier_config


@pytest.fixture(scope="session")
def notifier_fuzz_app(pg_url: str, pg_db: Database) -> Flask:
    """The notifier with the production URL policy; deliveries are recorded, never sent."""
    context = NotifierContext.build(notifier_config(pg_url), db=pg_db, identity_db=pg_db)
    context.enqueue = EnqueueRecorder()
    app = create_app(context=context)
    app.testing = True
    return app


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reports = terminalreporter.config.stash.get(REPORTS, [])
    if reports:
        terminalreporter.section("API fuzzing")
        for line in summary_lines(reports):
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def cheap_password_hashing() -> Iterator[None]:
    """argon2 at its cheapest while fuzzing: POST /v1/members hashes every valid body.

    At the default cost (about half a second here) the fuzzer's hundreds of member
    creations outlast the test timeout; what is fuzzed is input handling, not the hash.
    """
    cheap = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
    previous = secrets._hasher
    secrets._hasher = cheap
    yield
    secrets._hasher = previous
