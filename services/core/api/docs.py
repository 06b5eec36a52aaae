"""GET /v1/docs: the API reference (Swagger UI) for both services, served offline.

Swagger UI's files come from the `swagger-ui-bundle` pip package, so the page works
with no internet access (a laptop on a plane, a locked-down network). It shows core's
and the notifier's OpenAPI documents, chosen in its top bar; both are on the same
origin behind the ingress and in `settle dev`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from pathlib import Path

from flask import Blueprint, Response, abort, send_from_directory

#: The files of the bundle the page loads (nothing else in its folder is served).
ASSETS = frozenset(
    {
        "swagger-ui.css",
        "swagger-ui-bundle.js",
        "swagger-ui-standalone-preset.js",
        "favicon-16x16.png",
        "favicon-32x32.png",
    }
)

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Settle API reference</title>
  <link rel="stylesheet" href="/v1/docs/assets/swagger-ui.css">
  <link rel="icon" type="image/png" href="/v1/docs/assets/favicon-32x32.png">
</head>
<body>
  <div id="reference"></div>
  <script src="/v1/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/v1/docs/assets/swagger-ui-standalone-preset.js"></script>
  <script>
    window.onload = function () {
      window.ui = SwaggerUIBundle({
        urls: [
          {url: "/v1/openapi.json", name: "Core: accounts, policy, chains, deposits"},
          {url: "/v1/notifier/openapi.json", name: "Notifier: webhook endpoints, deliveries"}
        ],
        dom_id: "#reference",
        deepLinking: true,
        presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
        layout: "StandaloneLayout"
      });
    };
  </script>
</body>
</html>
"""

blp = Blueprint("docs", __name__)


def _script_hash(page: str) -> str:
    """The CSP source of the page's one inline script (it runs by its hash only)."""
    match = re.search(r"<script>(.*?)</script>", page, re.DOTALL)
    assert match is not None
    digest = hashlib.sha256(match.group(1).encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


#: Swagger UI's own files and the page's inline script; the documents and "Try it out"
#: on this origin; inline styles (Swagger UI sets them); never framed (issue 23).
CSP = (
    f"default-src 'none'; script-src 'self' {_script_hash(PAGE)}; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


@functools.cache
def _assets_folder() -> Path:
    import swagger_ui_bundle

    return Path(swagger_ui_bundle.swagger_ui_path)


@blp.get("/v1/docs")
def page() -> Response:
    return Response(PAGE, mimetype="text/html", headers={"Content-Security-Policy": CSP})


@blp.get("/v1/docs/assets/<name>")
def asset(name: str) -> Response:
    if name not in ASSETS:
        abort(404)
    response = send_from_directory(_assets_folder(), name, max_age=86400)
    return response
