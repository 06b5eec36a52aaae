"""Server-side ops commands for webhooks: `settle deliveries ...`, `settle endpoints ...`
run without an API URL (registered by services/support.py, which also runs them over
the API with a key).

Operators act across tenants (`--tenant` narrows), so these read and write the
notifier's database directly, through the same domain functions as the API, and
print the API's JSON shapes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from services import output
from services.notifier import deliveries, disabled_endpoints, sla, webhook_endpoints
from services.notifier.api.schemas import (
    DeliveryDetailEnvelopeSchema,
    DeliveryEnvelopeSchema,
    DeliveryListSchema,
    EndpointEnvelopeSchema,
    EndpointListSchema,
    EndpointStatsSchema,
    delivery_detail,
    endpoint_out,
)
from services.notifier.config import NotifierConfig
from services.notifier.context import NotifierContext
from services.notifier.models import DISABLED, ENABLED, PENDING
from shared.audit.log import Actor, Change, record
from shared.errors import ApiError
from shared.timefmt import iso_ms, parse_iso, utcnow

#: Builds the context a command runs with (tests pass their own).
ContextFactory = Callable[[], NotifierContext]


def default_context() -> NotifierContext:
    return NotifierContext.build(NotifierConfig.from_env())


def _print(schema: Any, payload: dict[str, Any]) -> None:
    output.emit(schema.dump(payload))


def _time(text: str | None) -> Any:
    """An ISO 8601 option as a time (None when not given); a bad one is a 400."""
    if text is None:
        return None
    try:
        return parse_iso(text)
    except ValueError:
        raise ApiError(f"not an ISO 8601 time: {text!r}") from None


def deliveries_list(ctx: NotifierContext, args: argparse.Namespace) -> int:
    filters = deliveries.DeliveryFilters(
        endpoint_id=args.endpoint,
        event_id=args.event,
        event_type=args.type,
        status=args.status,
        created_after=_time(args.since),
        created_before=_time(args.until),
    )
    with ctx.db.reader() as session:  # printed inside: closing a reader expires rows
        page = deliveries.list_deliveries(
            session, args.tenant, filters, limit=args.limit, cursor=args.cursor
        )
        _print(
            DeliveryListSchema(),
            {"webhook_deliveries": page.items, "next_cursor": page.next_cursor},
        )
    return 0


def deliveries_show(ctx: NotifierContext, args: argparse.Namespace) -> int:
    with ctx.db.reader() as session:
        delivery = deliveries.get_delivery(session, args.tenant, args.delivery_id)
        attempts = deliveries.attempts_of(session, delivery.id)
        body = deliveries.event_of(session, delivery).body
        _print(
            DeliveryDetailEnvelopeSchema(),
            {"webhook_delivery": delivery_detail(delivery, attempts, body)},
        )
    return 0


def deliveries_replay(ctx: NotifierContext, args: argparse.Namespace) -> int:
    with ctx.db.transaction() as session:
        delivery = deliveries.replay(session, args.tenant, args.delivery_id)
        change = deliveries.replayed(delivery)
        record(session, delivery.tenant_id, change, Actor.ops(), log=ctx.identity_db)
    ctx.hand_off([delivery.id])
    config = ctx.config
    # The delivery is committed as due now; a worker (or, without a broker reachable from
    # here, the sweeper: every interval, past its grace) sends it. Say so, not nothing.
    sys.stderr.write(
        f"replay {delivery.id} queued: sent by the notifier's workers within about "
        f"{config.sweep_grace_s + config.sweep_interval_s:.0f} s"
        + ("" if args.wait else f"; follow it: settle deliveries show {delivery.id}")
        + "\n"
    )
    if args.wait:
        delivery = _wait_final(ctx, args.tenant, delivery.id, args.wait)
    _print(DeliveryEnvelopeSchema(), {"webhook_delivery": delivery})
    return 0


def _wait_final(ctx: NotifierContext, tenant: str | None, delivery_id: str, limit_s: float) -> Any:
    """Poll the delivery until its first attempt is recorded (or `limit_s`), with progress."""
    started = time.monotonic()
    last = ""
    while True:
        with ctx.db.reader() as session:
            delivery = deliveries.get_delivery(session, tenant, delivery_id)
            session.expunge(delivery)
        waited = time.monotonic() - started
        state = f"{delivery.status}, {delivery.attempt_count} attempt(s)"
        if state != last:
            sys.stderr.write(f"  {waited:4.0f} s  {state}\n")
            last = state
        # attempt_count is taken when a worker starts an attempt; last_attempt_at is
        # set when the attempt is recorded.
        recorded = delivery.last_attempt_at is not None or delivery.status != PENDING
        if recorded or waited >= limit_s:
            if not recorded:
                sys.stderr.write(f"  still not sent after {limit_s:.0f} s; it stays queued\n")
            return delivery
        time.sleep(min(1.0, max(0.05, limit_s - waited)))


def endpoints_list(ctx: NotifierContext, args: argparse.Namespace) -> int:
    now = utcnow()
    with ctx.db.reader() as session:
        page = webhook_endpoints.list_endpoints(
            session, args.tenant, limit=args.limit, cursor=args.cursor
        )
        items = [endpoint_out(e, now) for e in page.items]
    _print(EndpointListSchema(), {"webhook_endpoints": items, "next_cursor": page.next_cursor})
    return 0


def _set_status(status: str) -> Callable[[NotifierContext, argparse.Namespace], int]:
    def run(ctx: NotifierContext, args: argparse.Namespace) -> int:
        now = utcnow()
        with ctx.db.transaction() as session:
            endpoint = webhook_endpoints.get_endpoint(
                session, args.tenant, args.endpoint_id, for_update=True
            )
            was, before = endpoint.status, webhook_endpoints.audited(endpoint)
            webhook_endpoints.set_status(endpoint, status)
            endpoint.updated_at = now
            to_send = disabled_endpoints.status_changed(
                session, endpoint, was, now, identity=ctx.identity_db
            )
            after = webhook_endpoints.audited(endpoint)
            change = Change(
                "webhook_endpoint.updated", "webhook_endpoint", endpoint.id, before, after
            )
            record(session, endpoint.tenant_id, change, Actor.ops(), log=ctx.identity_db)
            out = endpoint_out(endpoint, now)
        ctx.hand_off(to_send)
        _print(EndpointEnvelopeSchema(), {"webhook_endpoint": out})
        return 0

    return run


def sla_since(text: str) -> Any:
    """`settle sla --since`: 7d, 24h, 30m ... or an ISO 8601 time."""
    try:
        return sla.parse_since(text, utcnow())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--since {text!r}: {exc}") from None


def _short(value: float | None, scale: float = 1.0, digits: int = 3) -> str | None:
    return None if value is None else f"{value * scale:.{digits}f}"


def _row(stats: sla.EndpointStats) -> dict[str, Any]:
    """One line of the table: the same figures, in short columns."""
    return {
        "tenant": stats.tenant_id,
        "endpoint": stats.endpoint_id,
        "name": stats.endpoint_name,
        "deliveries": stats.deliveries,
        "succeeded": stats.succeeded,
        "failed": stats.failed,
        "exhausted": stats.exhausted,
        "pending": stats.pending,
        "success_%": _short(stats.success_rate, 100, 2),
        "first_p50_s": _short(stats.first_attempt_latency_p50_seconds),
        "first_p99_s": _short(stats.first_attempt_latency_p99_seconds),
        "commit_p50_s": _short(stats.commit_to_success_p50_seconds),
        "commit_p99_s": _short(stats.commit_to_success_p99_seconds),
        "oldest_pending_s": _short(stats.oldest_pending_age_seconds, digits=0),
    }


def sla_report(ctx: NotifierContext, args: argparse.Namespace) -> int:
    """Every endpoint's delivery SLA (of one tenant with --tenant) since --since."""
    until = utcnow()
    since = args.since if args.since is not None else sla.parse_since(sla.DEFAULT_SINCE, until)
    with ctx.db.reader() as session:
        found = sla.endpoint_stats(session, since=since, until=until, tenant_id=args.tenant)
    window = {"since": iso_ms(since), "until": iso_ms(until)}
    if output.wants_json():
        schema = EndpointStatsSchema()
        rows = [{"tenantId": s.tenant_id, **schema.dump(s)} for s in found]
        output.emit({**window, "endpoints": rows})
    else:
        output.emit({**window, "endpoints": [_row(s) for s in found] or "(none)"})
    return 0


endpoints_disable = _set_status(DISABLED)
endpoints_enable = _set_status(ENABLED)


def command(
    fn: Callable[[NotifierContext, argparse.Namespace], int], make_context: ContextFactory
) -> Callable[[argparse.Namespace], int]:
    """An argparse handler: builds the context, runs `fn`, answers errors on stderr (exit 2)."""

    def run(args: argparse.Namespace) -> int:
        ctx = make_context()
        try:
            return fn(ctx, args)
        except ApiError as err:
            sys.stderr.write(f"error: {err.code}: {err.message}\n")
            return 2
        finally:
            if make_context is default_context:  # ours to close; a given one is the caller's
                ctx.db.dispose()
                ctx.identity_db.dispose()

    return run
