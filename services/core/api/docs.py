"""GET /v1/docs: the API reference (Swagger UI) for both services, served offline.

Swagger UI's files come from the `swagger-ui-bundle` pip package, so the page works
with no internet access (a laptop on a plane, a locked-down network). It shows core's
and the notifier's OpenAPI documents, chosen in its top bar; both are on the same
origin behind the ingress and in `settle dev`.
"""

from __future__ import annotations

import functools
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


@functools.cache
def _assets_folder() -> Path:
    import swagger_ui_bundle

    return Path(swagger_ui_bundle.swagger_ui_path)


@blp.get("/v1/docs")
def page() -> Response:
    return Response(PAGE, mimetype="text/html")


@blp.get("/v1/docs/assets/<name>")
def asset(name: str) -> Response:
    if name not in ASSETS:
        abort(404)
    response = send_from_directory(_assets_folder(), name, max_age=86400)
    return response
