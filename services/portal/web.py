"""Serving the portal: a small static app at `/portal/`, and `/` redirecting to it.

The pages hold no data and no secrets: they are HTML, CSS and a little JavaScript that
call the same JSON APIs tenants use (both services, under `/v1`), with the session
cookie. So core serves them without any template or state, and no Node.js is needed
to build or test them.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, redirect, send_from_directory

#: The app's files.
STATIC = Path(__file__).resolve().parent / "static"
#: The pages' security headers: only our own scripts, styles and API; no framing.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def portal_blueprint() -> Blueprint:
    """The routes of the portal's files (not part of either API's OpenAPI document)."""
    blp = Blueprint("portal", __name__)

    @blp.get("/")
    def root() -> Response:
        return redirect("/portal/", code=302)  # type: ignore[return-value]

    @blp.get("/portal")
    def portal_no_slash() -> Response:
        return redirect("/portal/", code=301)  # type: ignore[return-value]

    @blp.get("/portal/")
    @blp.get("/portal/link")
    def index() -> Response:
        """The one page; the app routes by the URL's fragment (`#/deliveries`, ...)."""
        return _file("index.html")

    @blp.get("/portal/static/<path:name>")
    def asset(name: str) -> Response:
        return _file(name)

    return blp


def _file(name: str) -> Response:
    # send_from_directory refuses paths outside STATIC (`..`, absolute) with 404.
    response = send_from_directory(STATIC, name, max_age=0)
    response.headers.update(HEADERS)
    return response
