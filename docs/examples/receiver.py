"""A webhook receiver in ten lines: verify, then trust the body. (docs/WEBHOOKS.md)"""

import json
import os

from flask import Flask, abort, request

from shared.signing import SignatureError, verify

# No fallback: with an empty secret anyone could sign, so refuse to start without it.
SECRET = os.environ.get("SETTLE_WEBHOOK_SECRET") or ""
if not SECRET.startswith("whsec_"):
    raise SystemExit("set SETTLE_WEBHOOK_SECRET to the endpoint's secret (whsec_..., shown once)")
app = Flask(__name__)
received: list[dict] = []  # a real receiver would store the event id to drop repeats


@app.post("/hook")
def hook():
    try:
        verify(SECRET, request.headers, request.get_data())  # raw bytes, before any parsing
    except SignatureError as err:
        abort(400, str(err))
    event = json.loads(request.get_data())
    received.append(event)  # deliveries are at-least-once: deduplicate on event["id"]
    return "", 204
