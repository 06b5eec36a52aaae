"""`/v1/openapi.json` documents every route of the core API this suite covers."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis

from shared.identity.models import SCOPE_ROLES

pytestmark = pytest.mark.integration

#: (method, path, scope or "session" or None, has a request body)
ROUTES = [
    ("get", "/v1/destination-policy", "destination_policy:read", False),
    ("put", "/v1/destination-policy", "destination_policy:write", True),
    ("get", "/v1/tenants/{tenantId}/destination-policy", "session", False),
    ("put", "/v1/tenants/{tenantId}/destination-policy", "session", True),
    ("get", "/v1/deposit-accounts", "deposit_accounts:read", False),
    ("post", "/v1/deposit-accounts", "deposit_accounts:write", True),
    ("get", "/v1/deposit-accounts/{externalUserId}", "deposit_accounts:read", False),
    ("patch", "/v1/deposit-accounts/{externalUserId}/destination", "deposit_accounts:write", True),
    ("post", "/v1/fee-preview", "fees:read", True),
    ("post", "/v1/sessions", None, True),
    ("get", "/v1/sessions/current", "session", False),
    ("delete", "/v1/sessions/current", "session", False),
    ("post", "/v1/sessions/portal-link", None, True),
    ("get", "/v1/api-keys", "api_keys:write", False),
    ("post", "/v1/api-keys", "api_keys:write", True),
    ("delete", "/v1/api-keys/{apiKeyId}", "api_keys:write", False),
    ("get", "/v1/members", "members:write", False),
    ("post", "/v1/members", "members:write", True),
    ("patch", "/v1/members/{memberId}", "members:write", True),
    ("delete", "/v1/members/{memberId}", "members:write", False),
    ("post", "/v1/portal-links", "portal:write", True),
]


@pytest.fixture(scope="module")
def spec(core_app: Any) -> dict[str, Any]:
    response = core_app.test_client().get("/v1/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.get_json()
    return document


def test_the_document_loads_as_openapi(spec: dict[str, Any]) -> None:
    loaded = schemathesis.openapi.from_dict(spec)
    operations = {(r.ok().method.lower(), r.ok().path) for r in loaded.get_all_operations()}
    assert {(method, path) for method, path, _, _ in ROUTES} <= operations


@pytest.mark.parametrize(("method", "path", "auth", "has_body"), ROUTES)
def test_each_route_documents_auth_body_and_errors(
    spec: dict[str, Any], method: str, path: str, auth: str | None, has_body: bool
) -> None:
    operation = spec["paths"][path][method]
    assert operation.get("summary"), "the view's docstring is the summary"
    responses = operation["responses"]
    success = "204" if method == "delete" else "200"
    assert success in responses
    if success == "200":
        assert "$ref" in responses["200"]["content"]["application/json"]["schema"]
    if has_body:
        assert "$ref" in operation["requestBody"]["content"]["application/json"]["schema"]
        assert "400" in responses
    if auth is None:
        assert "security" not in operation
    elif auth == "session":
        assert operation["security"] == [{"session": []}]
        assert "401" in responses
        # 403 is a low role or a missing CSRF token: a viewer's GET meets neither.
        assert ("403" in responses) == (method != "get")
    else:
        # An API key with the scope, or a session of the role the scope maps to
        assert operation["security"] == [{"apiKey": []}, {"session": []}]
        assert {"401", "403"} <= set(responses)
        assert f"Scope: `{auth}`." in operation["description"]
        assert f"session of role `{SCOPE_ROLES[auth]}` or higher" in operation["description"]


def test_documented_error_codes(spec: dict[str, Any]) -> None:
    create = spec["paths"]["/v1/deposit-accounts"]["post"]["responses"]
    assert {"400", "409", "413", "422"} <= set(create)
    assert "unsupported_chain" in create["400"]["description"]
    assert "destination_policy_missing" in create["422"]["description"]
    error = spec["components"]["schemas"]["Error"]
    assert {"error", "code"} <= set(error["required"])
