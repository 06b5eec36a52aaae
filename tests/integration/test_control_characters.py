"""NUL and every other control character in a path segment or a query is a 400.

Issue 23: a NUL byte in a member or key id reached PostgreSQL (which refuses NUL in
text) and answered 500. Every route of both services (the portal's pages and the
API docs included), every method, with a control character in each path parameter
or in a query value, must answer 400 `invalid_request` in the error format, before
any handler, database or auth runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from tests.conftest import TenantKeys
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    notifier_app_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration

#: C0, DEL and C1 controls, percent-encoded as a client would send them (C1 in UTF-8).
CONTROLS = ["%00", "%01", "%09", "%0A", "%0D", "%1B", "%1F", "%7F", "%C2%80", "%C2%9F"]
_VARIABLE = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def _routes(app: Flask) -> Iterator[tuple[str, str]]:
    """(method, path with each variable as `{}`) of every rule of `app`."""
    for rule in app.url_map.iter_rules():
        path = _VARIABLE.sub("{}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            yield method, path


def _assert_400(response: Any, what: str) -> None:
    assert response.status_code == 400, (what, response.status_code, response.data[:300])
    body = response.get_json()
    assert body["code"] == "invalid_request", (what, body)
    assert body["error"].startswith("invalid_request: "), (what, body)


@pytest.mark.parametrize("service", ["core", "notifier"])
def test_a_control_character_anywhere_in_the_path_or_query_is_400(
    service: str, core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    app = core_app if service == "core" else notifier_app
    client = app.test_client()
    routes = list(_routes(app))
    assert len(routes) > 10
    for method, path in routes:
        for control in CONTROLS:
            target = path.replace("{}", f"a{control}b") if "{}" in path else None
            if target is not None:
                response = client.open(target, method=method, headers=tenant.headers, json={})
                _assert_400(response, f"{method} {target}")
            filled = path.replace("{}", "x")
            for query in (f"cursor={control}", f"limit=1&q{control}=1", f"x=a{control}"):
                response = client.open(
                    f"{filled}?{query}", method=method, headers=tenant.headers, json={}
                )
                _assert_400(response, f"{method} {filled}?{query}")


@pytest.mark.parametrize("path", ["/v1/members/%00", "/v1/api-keys/key%00", "/v1/deposits/%00x"])
def test_a_nul_in_an_id_is_400_not_500(core_app: Flask, tenant: TenantKeys, path: str) -> None:
    # The report's case: a NUL in a member or key id answered 500.
    client = core_app.test_client()
    for method in ("GET", "DELETE", "PATCH"):
        response = client.open(path, method=method, headers=tenant.headers, json={})
        assert response.status_code in (400, 405), (method, path, response.status_code)
        if response.status_code == 400:
            _assert_400(response, f"{method} {path}")


def test_printable_text_still_passes(core_app: Flask, tenant: TenantKeys) -> None:
    # Unicode letters and a plain query are not refused (only controls are)
    client = core_app.test_client()
    response = client.get(
        "/v1/deposit-accounts?externalUserId=J%C3%BCrgen%20M", headers=tenant.headers
    )
    assert response.status_code == 200, response.get_json()
