"""/v1/webhook-deliveries: the delivery log and replay."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView

from services.notifier import deliveries
from services.notifier.api.access import READ, WRITE, tenant_id
from services.notifier.api.schemas import (
    BAD_KEY,
    IDEMPOTENCY_KEY_PARAM,
    TOO_LARGE,
    DeliveryDetailEnvelopeSchema,
    DeliveryEnvelopeSchema,
    DeliveryListArgs,
    DeliveryListSchema,
    delivery_detail,
    delivery_out,
)
from services.notifier.context import notifier
from services.notifier.models import NotifierIdempotencyRecord
from shared.api import Blueprint, ErrorSchema
from shared.audit.log import record_request
from shared.idempotency import idempotent
from shared.identity import auth

blp = Blueprint(
    "webhook_deliveries",
    __name__,
    url_prefix="/v1",
    description="Webhook deliveries: what was sent, every attempt, replay.",
)


@blp.route("/webhook-deliveries")
class WebhookDeliveries(MethodView):
    @auth.requires(blp, READ)
    # Unknown parameters are refused: a misspelt filter would silently list everything.
    @blp.arguments(DeliveryListArgs, location="query", unknown=ma.RAISE)
    @blp.response(200, DeliveryListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List deliveries, newest first, filtered by endpoint, event, type, status and time."""
        filters = deliveries.DeliveryFilters(
            endpoint_id=args.get("endpoint_id"),
            event_id=args.get("event_id"),
            event_type=args.get("event_type"),
            status=args.get("status"),
            created_after=args.get("created_after"),
            created_before=args.get("created_before"),
        )
        # Dumped inside the session: closing a reader expires the rows.
        with notifier().db.reader() as session:
            page = deliveries.list_deliveries(
                session, tenant_id(), filters, limit=args["limit"], cursor=args["cursor"]
            )
            held = deliveries.holders(session, page.items)
            items = [delivery_out(d, held.get(d.id)) for d in page.items]
        return {"webhook_deliveries": items, "next_cursor": page.next_cursor}


@blp.route("/webhook-deliveries/<deliveryId>")
class WebhookDelivery(MethodView):
    @auth.requires(blp, READ)
    @blp.response(200, DeliveryDetailEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="No such delivery")
    def get(self, deliveryId: str) -> dict[str, Any]:
        """One delivery with every attempt and the event exactly as sent."""
        with notifier().db.reader() as session:
            delivery = deliveries.get_delivery(session, tenant_id(), deliveryId)
            attempts = deliveries.attempts_of(session, delivery.id)
            body = deliveries.event_of(session, delivery).body
            held_by = deliveries.holders(session, [delivery]).get(delivery.id)
            return {"webhook_delivery": delivery_detail(delivery, attempts, body, held_by)}


@blp.route("/webhook-deliveries/<deliveryId>/replay")
class Replay(MethodView):
    @auth.requires(blp, WRITE)
    @idempotent(NotifierIdempotencyRecord)
    @blp.response(200, DeliveryEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=BAD_KEY)
    @blp.alt_response(404, schema=ErrorSchema, description="No such delivery")
    @blp.alt_response(
        409,
        schema=ErrorSchema,
        description="conflict (the endpoint is disabled or was deleted) or idempotency_key_reused",
    )
    @blp.alt_response(413, schema=ErrorSchema, description=TOO_LARGE)
    @blp.doc(parameters=[IDEMPOTENCY_KEY_PARAM])
    def post(self, deliveryId: str) -> dict[str, Any]:
        """Send the same event (same id, same body) again now, as a new delivery.

        The new delivery names the one it replays in `replayOf` and is signed with the
        endpoint's current secret.
        """
        ctx = notifier()
        with ctx.db.transaction() as session:
            delivery = deliveries.replay(session, tenant_id(), deliveryId)
            record_request(session, deliveries.replayed(delivery))
        ctx.hand_off([delivery.id])
        return {"webhook_delivery": delivery}
