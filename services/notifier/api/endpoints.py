"""/v1/webhook-endpoints: register, list, change, delete, rotate, test, recover."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView

from services.notifier import deliveries, disabled_endpoints, sla, webhook_endpoints
from services.notifier.api.access import READ, WRITE, tenant_id
from services.notifier.api.schemas import (
    BAD_KEY,
    IDEMPOTENCY_KEY_PARAM,
    KEY_REUSED,
    TOO_LARGE,
    DeliveryBatchSchema,
    DeliveryEnvelopeSchema,
    EndpointCreateSchema,
    EndpointEnvelopeSchema,
    EndpointListSchema,
    EndpointPatchSchema,
    EndpointStatsEnvelopeSchema,
    EndpointWithSecretSchema,
    RecoverSchema,
    RenewSchema,
    RotateSecretSchema,
    SendTestSchema,
    StatsArgs,
    endpoint_out,
)
from services.notifier.context import notifier
from services.notifier.models import NotifierIdempotencyRecord
from shared.api import Blueprint, ErrorSchema, ListArgs, field_error
from shared.audit.log import Change, record_request
from shared.idempotency import idempotent
from shared.identity import auth
from shared.timefmt import iso_ms, utcnow

blp = Blueprint(
    "webhook_endpoints",
    __name__,
    url_prefix="/v1",
    description="Webhook endpoints: register, change, rotate secrets, send tests, recover.",
)


@blp.route("/webhook-endpoints")
class WebhookEndpoints(MethodView):
    @auth.requires(blp, READ)
    @blp.arguments(ListArgs, location="query")
    @blp.response(200, EndpointListSchema)
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List the tenant's webhook endpoints, newest first."""
        ctx = notifier()
        now = utcnow()
        # Rows are read inside the session: closing a reader expires them.
        with ctx.db.reader() as session:
            page = webhook_endpoints.list_endpoints(
                session, tenant_id(), limit=args["limit"], cursor=args["cursor"]
            )
            items = [endpoint_out(e, now) for e in page.items]
        return {"webhook_endpoints": items, "next_cursor": page.next_cursor}

    @auth.requires(blp, WRITE)
    @idempotent(NotifierIdempotencyRecord)
    @blp.arguments(EndpointCreateSchema)
    @blp.response(200, EndpointWithSecretSchema)
    @blp.alt_response(
        409,
        schema=ErrorSchema,
        description="conflict (the tenant has the most endpoints) or idempotency_key_reused",
    )
    @blp.alt_response(413, schema=ErrorSchema, description=TOO_LARGE)
    @blp.doc(parameters=[IDEMPOTENCY_KEY_PARAM])
    def post(self, args: dict[str, Any]) -> dict[str, Any]:
        """Register an HTTPS endpoint. The signing secret is in this response only."""
        ctx = notifier()
        now = utcnow()
        with ctx.db.transaction() as session:
            endpoint, secret = webhook_endpoints.create_endpoint(
                session,
                ctx.secret_box,
                tenant_id(),
                name=args["name"],
                url=args["url"],
                event_types=args["event_types"],
                allow_private=ctx.config.allow_private,
                max_endpoints=ctx.max_endpoints_per_tenant,
                rate_limit_per_second=args["rate_limit_per_second"],
                signature_scheme=args["signature_scheme"],
                ordering=args["ordering"],
                ephemeral_ttl_s=args["ephemeral_ttl_seconds"],
                now=now,
            )
            after = webhook_endpoints.audited(endpoint)
            record_request(
                session,
                Change("webhook_endpoint.created", "webhook_endpoint", endpoint.id, None, after),
            )
            return {"webhook_endpoint": endpoint_out(endpoint, now), "secret": secret}


@blp.route("/webhook-endpoints/<endpointId>")
class WebhookEndpoint(MethodView):
    @auth.requires(blp, READ)
    @blp.response(200, EndpointEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint")
    def get(self, endpointId: str) -> dict[str, Any]:
        """One webhook endpoint (never its secret)."""
        with notifier().db.reader() as session:
            endpoint = webhook_endpoints.get_endpoint(session, tenant_id(), endpointId)
            return {"webhook_endpoint": endpoint_out(endpoint)}

    @auth.requires(blp, WRITE)
    @blp.arguments(EndpointPatchSchema)
    @blp.response(200, EndpointEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint")
    @blp.alt_response(
        409,
        schema=ErrorSchema,
        description="conflict: signatureScheme standard with a secret made before it "
        "existed (rotate the secret first)",
    )
    @blp.alt_response(413, schema=ErrorSchema, description=TOO_LARGE)
    def patch(self, args: dict[str, Any], endpointId: str) -> dict[str, Any]:
        """Change any of name, url, eventTypes, status (enabled or disabled),
        rateLimitPerSecond, signatureScheme, ordering."""
        ctx = notifier()
        now = utcnow()
        with ctx.db.transaction() as session:
            endpoint = webhook_endpoints.get_endpoint(
                session, tenant_id(), endpointId, for_update=True
            )
            was, before = endpoint.status, webhook_endpoints.audited(endpoint)
            webhook_endpoints.update_endpoint(
                endpoint,
                name=args.get("name"),
                url=args.get("url"),
                event_types=args.get("event_types"),
                status=args.get("status"),
                rate_limit_per_second=args.get(
                    "rate_limit_per_second", webhook_endpoints.UNCHANGED
                ),
                signature_scheme=args.get("signature_scheme"),
                box=ctx.secret_box,
                ordering=args.get("ordering", webhook_endpoints.UNCHANGED),
                allow_private=ctx.config.allow_private,
                now=now,
            )
            to_send = disabled_endpoints.status_changed(
                session, endpoint, was, now, identity=ctx.identity_db
            )
            after = webhook_endpoints.audited(endpoint)
            record_request(
                session,
                Change("webhook_endpoint.updated", "webhook_endpoint", endpoint.id, before, after),
            )
            out = endpoint_out(endpoint, now)
        ctx.hand_off(to_send)
        return {"webhook_endpoint": out}

    @auth.requires(blp, WRITE)
    @blp.response(204)
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint")
    def delete(self, endpointId: str) -> None:
        """Delete an endpoint: no new deliveries; unfinished ones stop (`endpoint_deleted`)."""
        with notifier().db.transaction() as session:
            endpoint = webhook_endpoints.get_endpoint(
                session, tenant_id(), endpointId, for_update=True
            )
            before = webhook_endpoints.audited(endpoint)
            webhook_endpoints.delete_endpoint(session, endpoint)
            record_request(
                session, Change("webhook_endpoint.deleted", "webhook_endpoint", endpoint.id, before)
            )


@blp.route("/webhook-endpoints/<endpointId>/stats")
class EndpointStats(MethodView):
    @auth.requires(blp, READ)
    @blp.arguments(StatsArgs, location="query")
    @blp.response(200, EndpointStatsEnvelopeSchema)
    @blp.alt_response(
        400,
        schema=ErrorSchema,
        description="invalid_request (`since` is not a duration or a past time)",
    )
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint")
    def get(self, args: dict[str, Any], endpointId: str) -> dict[str, Any]:
        """The endpoint's delivery SLA since a time: counts by outcome, success rate,
        p50/p99 of first-attempt latency and of commit-to-success time, oldest pending."""
        now = utcnow()
        try:
            since = sla.parse_since(args["since"], now)
        except ValueError as exc:
            raise field_error("since", str(exc)) from None
        with notifier().db.reader() as session:
            endpoint = webhook_endpoints.get_endpoint(session, tenant_id(), endpointId)
            return {"stats": sla.one_endpoint(session, endpoint, since=since, until=now)}


@blp.route("/webhook-endpoints/<endpointId>/rotate-secret")
class RotateSecret(MethodView):
    @auth.requires(blp, WRITE, step_up=True)
    @idempotent(NotifierIdempotencyRecord)
    @blp.arguments(RotateSecretSchema, required=False)
    @blp.response(200, EndpointWithSecretSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint")
    @blp.alt_response(409, schema=ErrorSchema, description=KEY_REUSED)
    @blp.alt_response(413, schema=ErrorSchema, description=TOO_LARGE)
    @blp.doc(parameters=[IDEMPOTENCY_KEY_PARAM])
    def post(self, args: dict[str, Any], endpointId: str) -> dict[str, Any]:
        """Rotate the signing secret; the old one may keep signing for up to 24 h."""
        ctx = notifier()
        now = utcnow()
        with ctx.db.transaction() as session:
            endpoint = webhook_endpoints.get_endpoint(
                session, tenant_id(), endpointId, for_update=True
            )
            secret = webhook_endpoints.rotate_secret(
                endpoint,
                ctx.secret_box,
                previous_expires_in_s=args["previous_secret_expires_in_seconds"],
                now=now,
            )
            expires = endpoint.previous_secret_expires_at
            # Never a secret: when the one rotated out stops signing.
            after = {"previousSecretExpiresAt": None if expires is None else iso_ms(expires)}
            record_request(
                session,
                Change(
                    "webhook_endpoint.secret_rotated", "webhook_endpoint", endpoint.id, None, after
                ),
            )
            return {"webhook_endpoint": endpoint_out(endpoint, now), "secret": secret}


@blp.route("/webhook-endpoints/<endpointId>/renew")
class Renew(MethodView):
    @auth.requires(blp, WRITE)
    @blp.arguments(RenewSchema, required=False)
    @blp.response(200, EndpointEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint (or it expired)")
    @blp.alt_response(409, schema=ErrorSchema, description="conflict: the endpoint is permanent")
    @blp.alt_response(413, schema=ErrorSchema, description=TOO_LARGE)
    def post(self, args: dict[str, Any], endpointId: str) -> dict[str, Any]:
        """Keep an ephemeral endpoint alive: it expires ttlSeconds from now
        (`settle listen` renews its own while it runs)."""
        ctx = notifier()
        now = utcnow()
        with ctx.db.transaction() as session:
            endpoint = webhook_endpoints.get_endpoint(
                session, tenant_id(), endpointId, for_update=True
            )
            webhook_endpoints.renew(endpoint, args["ttl_seconds"], now)
            return {"webhook_endpoint": endpoint_out(endpoint, now)}


@blp.route("/webhook-endpoints/<endpointId>/test")
class SendTest(MethodView):
    @auth.requires(blp, WRITE)
    @idempotent(NotifierIdempotencyRecord)
    @blp.arguments(SendTestSchema, required=False)
    @blp.response(200, DeliveryEnvelopeSchema)
    @blp.alt_response(
        400, schema=ErrorSchema, description=f"invalid_request (an unknown eventType); {BAD_KEY}"
    )
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint")
    @blp.alt_response(
        409,
        schema=ErrorSchema,
        description="conflict (the endpoint is disabled) or idempotency_key_reused",
    )
    @blp.alt_response(413, schema=ErrorSchema, description=TOO_LARGE)
    @blp.doc(parameters=[IDEMPOTENCY_KEY_PARAM])
    def post(self, args: dict[str, Any], endpointId: str) -> dict[str, Any]:
        """Send a `webhook.test` event (or the catalog's example of `eventType`) to this
        endpoint alone; returns the pending delivery."""
        ctx = notifier()
        with ctx.db.transaction() as session:
            delivery = deliveries.send_test(
                session, tenant_id(), endpointId, example_of=args["event_type"]
            )
            after = {"deliveryId": delivery.id, "eventType": delivery.event_type}
            record_request(
                session,
                Change(
                    "webhook_endpoint.test_sent",
                    "webhook_endpoint",
                    delivery.endpoint_id,
                    None,
                    after,
                ),
            )
        ctx.hand_off([delivery.id])
        return {"webhook_delivery": delivery}


@blp.route("/webhook-endpoints/<endpointId>/recover")
class Recover(MethodView):
    @auth.requires(blp, WRITE)
    @idempotent(NotifierIdempotencyRecord)
    @blp.arguments(RecoverSchema)
    @blp.response(200, DeliveryBatchSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="No such endpoint")
    @blp.alt_response(
        409,
        schema=ErrorSchema,
        description="conflict (the endpoint is disabled) or idempotency_key_reused",
    )
    @blp.alt_response(413, schema=ErrorSchema, description=TOO_LARGE)
    @blp.doc(parameters=[IDEMPOTENCY_KEY_PARAM])
    def post(self, args: dict[str, Any], endpointId: str) -> dict[str, Any]:
        """Send again every event whose delivery to this endpoint failed in the window.

        One new delivery per event, oldest first, at most 1000 per call; events already
        in flight or delivered are skipped, so calling again continues without duplicates.
        """
        ctx = notifier()
        with ctx.db.transaction() as session:
            made = deliveries.recover(
                session, tenant_id(), endpointId, since=args["since"], until=args["until"]
            )
            until = args["until"]
            after = {
                "since": iso_ms(args["since"]),
                "until": None if until is None else iso_ms(until),
                "deliveries": len(made),
            }
            record_request(
                session,
                Change("webhook_endpoint.recovered", "webhook_endpoint", endpointId, None, after),
            )
        ctx.hand_off([d.id for d in made])
        return {"webhook_deliveries": made}
