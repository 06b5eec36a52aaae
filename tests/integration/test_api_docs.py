"""GET /v1/docs: the API reference page works offline and shows both services' documents."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient

from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration


def test_the_reference_page_loads_everything_from_this_origin(client: FlaskClient) -> None:
    page = client.get("/v1/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    # Nothing from a CDN: every script, stylesheet and icon is served here
    assert "//" not in re.sub(r"<!DOCTYPE html>", "", html).replace("/v1/", "")
    assets = re.findall(r'(?:src|href)="(/v1/docs/assets/[^"]+)"', html)
    assert {a.rsplit("/", 1)[1] for a in assets} >= {
        "swagger-ui.css",
        "swagger-ui-bundle.js",
        "swagger-ui-standalone-preset.js",
    }
    for asset in assets:
        answer = client.get(asset)
        assert answer.status_code == 200, asset
        assert len(answer.get_data()) > 500, asset
    # And it offers both OpenAPI documents
    assert '"/v1/openapi.json"' in html and '"/v1/notifier/openapi.json"' in html


@pytest.mark.parametrize(
    "path",
    [
        "/v1/docs/assets/index.html",
        "/v1/docs/assets/..%2F__init__.py",
        "/v1/docs/assets/%2e%2e",
        "/v1/docs/assets/swagger-ui.js.map",
    ],
)
def test_nothing_else_of_the_package_is_served(client: FlaskClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_both_documents_name_their_server(
    client: FlaskClient, notifier_client: FlaskClient
) -> None:
    for http, path in (
        (client, "/v1/openapi.json"),
        (notifier_client, "/v1/notifier/openapi.json"),
    ):
        spec = http.get(path).get_json()
        assert spec["servers"] == [
            {"url": "/", "description": "The deployment that serves this document"}
        ], path
