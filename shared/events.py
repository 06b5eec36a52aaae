"""Domain events: the types, the envelope and the ids.

The envelope is what a webhook receiver gets as the body:
`{id, type, createdAt, tenantId, data}`, with `sequence` between `tenantId` and `data`
when the event is about a deposit account (`account_of`). Durable deposit events have ids that
name the deposit and the status, so a second emission is refused by a unique key.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from shared.ids import new_id, ulid
from shared.timefmt import iso_ms, utcnow

ACCOUNT_CREATED = "deposit.account.created"
ACCOUNT_DESTINATION_UPDATED = "deposit.account.destination_updated"
DEPOSIT_SOURCE_SEEN = "deposit.source_seen"
DEPOSIT_SOURCE_CONFIRMED = "deposit.source_confirmed"
DEPOSIT_CREDIT_SUBMITTED = "deposit.credit_submitted"
DEPOSIT_CREDITED = "deposit.credited"
DEPOSIT_FAILED = "deposit.failed"
DEPOSIT_MANUAL_REVIEW_REQUIRED = "deposit.manual_review_required"
WEBHOOK_TEST = "webhook.test"
API_KEY_REVOKED = "tenant.api_key_revoked"
INVENTORY_LOW_BALANCE = "inventory.low_balance"
ROUTE_PROVIDER_DEGRADED = "route.provider_degraded"
#: Extension types (DESIGN.md), operational events the notifier emits about a tenant's
#: own endpoints: disabled, failing (a run of failed attempts), recovered (it answered
#: again), and a delivery that gave up.
WEBHOOK_ENDPOINT_DISABLED = "webhook.endpoint_disabled"
WEBHOOK_ENDPOINT_FAILING = "webhook.endpoint_failing"
WEBHOOK_ENDPOINT_RECOVERED = "webhook.endpoint_recovered"
WEBHOOK_DELIVERY_EXHAUSTED = "webhook.delivery_exhausted"

#: Every event type of the interface, in its order.
EVENT_TYPES: tuple[str, ...] = (
    ACCOUNT_CREATED,
    ACCOUNT_DESTINATION_UPDATED,
    DEPOSIT_SOURCE_SEEN,
    DEPOSIT_SOURCE_CONFIRMED,
    DEPOSIT_CREDIT_SUBMITTED,
    DEPOSIT_CREDITED,
    DEPOSIT_FAILED,
    DEPOSIT_MANUAL_REVIEW_REQUIRED,
    WEBHOOK_TEST,
    API_KEY_REVOKED,
    INVENTORY_LOW_BALANCE,
    ROUTE_PROVIDER_DEGRADED,
    WEBHOOK_ENDPOINT_DISABLED,
    WEBHOOK_ENDPOINT_FAILING,
    WEBHOOK_ENDPOINT_RECOVERED,
    WEBHOOK_DELIVERY_EXHAUSTED,
)
#: The notifier's operational events: about one endpoint, never sent to it.
OPERATIONAL_EVENT_TYPES: tuple[str, ...] = (
    WEBHOOK_ENDPOINT_DISABLED,
    WEBHOOK_ENDPOINT_FAILING,
    WEBHOOK_ENDPOINT_RECOVERED,
    WEBHOOK_DELIVERY_EXHAUSTED,
)
#: Types the notifier makes itself (never in core's outbox).
NOTIFIER_EVENT_TYPES: tuple[str, ...] = (WEBHOOK_TEST, *OPERATIONAL_EVENT_TYPES)

#: Deposit statuses whose event is emitted at most once per deposit.
DURABLE_DEPOSIT_STATUSES: tuple[str, ...] = (
    "source_seen",
    "source_confirmed",
    "credited",
    "failed",
)


def unknown_type_message(event_type: object) -> str:
    """The error for a type that is not in the catalog; it lists the valid ones."""
    shown = repr(event_type)
    if len(shown) > 80:  # never echo a huge input back whole
        shown = shown[:77] + "..."
    return (
        f"unknown event type {shown}; the event types are: "
        + ", ".join(EVENT_TYPES)
        + " (GET /v1/event-types describes each)"
    )


#: Durable deposit event ids are `evt_dep_<depositId>_<status>`.
DURABLE_ID_PREFIX = "evt_dep_"


def durable_event_id(deposit_id: str, status: str) -> str:
    """`evt_dep_<depositId>_<status>` for the durable deposit statuses."""
    if status not in DURABLE_DEPOSIT_STATUSES:
        raise ValueError(f"{status} is not a durable deposit status")
    return f"{DURABLE_ID_PREFIX}{deposit_id}_{status}"


def deposit_of_durable_id(event_id: str, status: str) -> str | None:
    """The deposit a durable id `evt_dep_<depositId>_<status>` names, else None."""
    suffix = f"_{status}"
    if not (event_id.startswith(DURABLE_ID_PREFIX) and event_id.endswith(suffix)):
        return None
    deposit_id = event_id[len(DURABLE_ID_PREFIX) : -len(suffix)]
    return deposit_id or None


def deposit_of_body(body: str) -> str | None:
    """`data.deposit.id` of a serialized envelope, or None (not a deposit event, or unreadable)."""
    try:
        deposit = json.loads(body).get("data", {}).get("deposit", {})
    except (ValueError, AttributeError):
        return None
    deposit_id = deposit.get("id") if isinstance(deposit, dict) else None
    return deposit_id if isinstance(deposit_id, str) else None


def account_of(data: dict[str, Any]) -> str | None:
    """The deposit account an event's `data` is about: `data.deposit.accountId` (deposit
    events) or `data.depositAccount.id` (account events); None for any other event.

    Such events carry `sequence`, counted per account (services/core/event_sequences.py)."""
    deposit = data.get("deposit")
    if isinstance(deposit, dict):
        account = deposit.get("accountId")
        return account if isinstance(account, str) and account else None
    holder = data.get("depositAccount")
    if isinstance(holder, dict):
        account = holder.get("id")
        return account if isinstance(account, str) and account else None
    return None


def new_event_id() -> str:
    return new_id("evt")


#: Ids of events that are tests (`webhook.test`, "Send example"): delivered with the
#: TEST_HEADER, never about a real object.
TEST_EVENT_PREFIX = "evt_test_"  # shared/signing.py knows it too (no import between them)


def new_test_event_id() -> str:
    return f"{TEST_EVENT_PREFIX}{ulid()}"


def is_test_event(event_id: str) -> bool:
    return event_id.startswith(TEST_EVENT_PREFIX)


def is_sandbox_data(data: dict[str, Any]) -> bool:
    """Whether an event's data is about a sandbox deposit (simulated money)."""
    deposit = data.get("deposit")
    return isinstance(deposit, dict) and deposit.get("sandbox") is True


def envelope(
    event_type: str,
    tenant_id: str,
    data: dict[str, Any],
    *,
    event_id: str | None = None,
    created_at: datetime | None = None,
    sequence: int | None = None,
    livemode: bool = True,
) -> dict[str, Any]:
    """The event as a receiver sees it; `sequence` (an account's event number) only when
    given. `livemode` is false for tests, examples and sandbox money (a receiver in
    production ignores such events: docs/WEBHOOKS.md)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type}")
    envelope: dict[str, Any] = {
        "id": event_id or new_event_id(),
        "type": event_type,
        "createdAt": iso_ms(created_at or utcnow()),
        "tenantId": str(tenant_id),
        "livemode": bool(livemode) and not is_sandbox_data(data),
    }
    if sequence is not None:
        envelope["sequence"] = sequence
    envelope["data"] = data
    return envelope


def with_sequence(envelope: dict[str, Any], sequence: int) -> dict[str, Any]:
    """A copy of `envelope` carrying `sequence` (in its place, before `data`)."""
    copy = {key: value for key, value in envelope.items() if key not in ("sequence", "data")}
    copy["sequence"] = sequence
    copy["data"] = envelope["data"]
    return copy


#: `json.dumps(event, separators=(",", ":"), ensure_ascii=False)`, its encoder built once.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def encode(event: dict[str, Any]) -> bytes:
    """The exact body bytes: compact JSON, key order as built. Signed and stored as-is."""
    return _ENCODER.encode(event).encode("utf-8")


def encode_text(event: dict[str, Any]) -> str:
    """`encode(event)` as text (what the outbox stores)."""
    return _ENCODER.encode(event)
