"""The baseline: a bare Flask route returning a constant JSON, served like core."""

from flask import Flask, Response

app = Flask("bare")
_BODY = b'{"ok":true,"service":"bare"}'


@app.get("/v1/bare")
def bare() -> Response:
    return Response(_BODY, mimetype="application/json")
