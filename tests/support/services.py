"""Reaching the real PostgreSQL and RabbitMQ of the machine from tests.

On a laptop without them the tests that need them skip; in CI (`CI` set) a
missing service fails the run loudly instead.
"""

from __future__ import annotations

import os
import socket

import pytest

PG_ADMIN_URL = os.environ.get(
    "SETTLE_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
AMQP_URL = os.environ.get("SETTLE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (or, in CI, fail) when a service does not answer."""
    if port_open(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run it (see .ci/run)", pytrace=False)
    pytest.skip(message)
