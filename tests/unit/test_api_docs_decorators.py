"""Documenting decorators leave no wrapper in the request path (their cost per request
was a few percent of a POST); what they document still reaches the OpenAPI spec."""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask.views import MethodView
from flask_smorest import Api

from shared.api import Blueprint, ErrorSchema


def _app() -> tuple[Flask, Blueprint]:
    app = Flask(__name__)
    app.config.update(
        API_TITLE="t", API_VERSION="1", OPENAPI_VERSION="3.0.3", OPENAPI_URL_PREFIX="/"
    )
    return app, Blueprint("things", __name__, url_prefix="/v1")


def test_alt_response_and_doc_return_the_same_code_not_a_wrapper() -> None:
    _, blp = _app()
    seen: list[Any] = []

    def view(x: int, *, y: int = 2) -> int:
        """Summary.

        Body."""
        seen.append((x, y))
        return x + y

    documented = blp.doc(summary="s")(blp.alt_response(404, schema=ErrorSchema)(view))
    # Same code and closure: nothing runs per call that the view does not.
    assert documented.__code__ is view.__code__
    assert documented.__name__ == "view" and documented.__doc__ == view.__doc__
    assert documented(1) == 3 and documented(1, y=5) == 6
    assert seen == [(1, 2), (1, 5)]
    # The original function is left as it was.
    assert not hasattr(view, "_apidoc")
    assert documented._apidoc["manual_doc"] == {"summary": "s"}
    assert 404 in documented._apidoc["response"]["responses"]


def test_what_they_document_is_in_the_spec() -> None:
    app, blp = _app()

    @blp.route("/things")
    class Things(MethodView):
        @blp.alt_response(409, schema=ErrorSchema, description="taken")
        @blp.doc(summary="Make a thing")
        def post(self) -> dict[str, str]:
            return {"made": "yes"}

    api = Api(app)
    api.register_blueprint(blp)
    operation = api.spec.to_dict()["paths"]["/v1/things"]["post"]
    assert operation["summary"] == "Make a thing"
    assert operation["responses"]["409"]["description"] == "taken"
    assert app.test_client().post("/v1/things").get_json() == {"made": "yes"}
