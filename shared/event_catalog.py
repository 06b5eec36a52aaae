"""The event catalog: each event type, when it fires, the JSON Schema of its body, an example.

One source for three readers: `GET /v1/event-types` (core), docs/EVENTS.md (its
catalog section is rendered from here: `python -m shared.event_catalog`) and the
error that refuses an unknown type. A test validates real emitted events against
these schemas, so the catalog cannot drift from what receivers get.

Each schema describes the whole body a receiver gets (the envelope, with the
type's `data`). Schemas leave `additionalProperties` open on purpose: Settle may
add fields, and a receiver must accept them.
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared import events, subscriptions

#: JSON Schema dialect of every schema here.
DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: Extension type of DESIGN.md; the notifier emits it when it disables an endpoint.
WEBHOOK_ENDPOINT_DISABLED = events.WEBHOOK_ENDPOINT_DISABLED

# -- building blocks ----------------------------------------------------------------

_TIMESTAMP = {
    "type": "string",
    "format": "date-time",
    "description": "ISO 8601 UTC with milliseconds.",
    "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$",
}
_ADDRESS = {
    "type": "string",
    "pattern": "^0x[0-9a-fA-F]{40}$",
    "description": "EVM address, EIP-55 checksummed.",
}
_TX_HASH = {"type": "string", "pattern": "^0x[0-9a-fA-F]{64}$"}
_USD = {"type": ["number", "null"]}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    kind = out["type"]
    out["type"] = [*kind, "null"] if isinstance(kind, list) else [kind, "null"]
    return out


def _object(properties: dict[str, Any], *, description: str | None = None) -> dict[str, Any]:
    """An object whose properties are all present (null where the schema allows it)."""
    out: dict[str, Any] = {"type": "object"}
    if description:
        out["description"] = description
    out["required"] = list(properties)
    out["properties"] = properties
    return out


_DESTINATION = _object(
    {
        "chainId": {"type": "integer"},
        "address": _ADDRESS,
        "tokenAddress": _ADDRESS,
    },
    description="A settlement destination: chain, wallet and token contract.",
)

_DEPOSIT_ACCOUNT = _object(
    {
        "id": {"type": "string"},
        "externalUserId": {"type": "string", "minLength": 1, "maxLength": 255},
        "status": {"type": "string", "enum": ["active"]},
        "destination": _DESTINATION,
        "depositAddresses": {
            "type": "array",
            "items": _object(
                {
                    "chainId": {"type": "integer"},
                    "address": _ADDRESS,
                    "assets": {"type": "array", "items": {"type": "string"}},
                }
            ),
        },
        "metadata": {
            "type": "object",
            "description": "The tenant's key-value data ({} when none was given).",
        },
        "createdAt": _TIMESTAMP,
        "updatedAt": _TIMESTAMP,
    },
    description="The deposit account, as GET /v1/deposit-accounts/{externalUserId} serves it.",
)

_DEPOSIT_STATUSES = [
    "source_seen",
    "source_confirmed",
    "credit_submitted",
    "credited",
    "failed",
    "manual_review_required",
]

_DEPOSIT = _object(
    {
        "id": {"type": "string", "pattern": "^dep_", "description": "`dep_...`"},
        "accountId": {"type": "string", "description": "The deposit account's id."},
        "externalUserId": {"type": "string", "description": "Your id of the account's user."},
        "status": {"type": "string", "enum": _DEPOSIT_STATUSES},
        "chainId": {"type": "integer", "description": "Chain the deposit arrived on."},
        "depositAddress": _ADDRESS,
        "asset": {"type": ["string", "null"], "description": "Null for an unsupported token."},
        "tokenAddress": _ADDRESS,
        "decimals": {"type": ["integer", "null"], "description": "The token's decimals."},
        "amount": {
            "type": "string",
            "pattern": r"^\d+(\.\d+)?$",
            "description": "Token units as a decimal string (base units when the token is "
            "unsupported and its decimals unknown).",
        },
        "amountRaw": {"type": "string", "pattern": r"^\d+$", "description": "Base units."},
        "amountUsd": {**_USD, "description": "USD value when detected; null without a price."},
        "settlementGasFeeUsd": {
            **_USD,
            "description": "The chain's flat settlement fee, recorded at settlement.",
        },
        "netAmountUsd": {**_USD, "description": "amountUsd - settlementGasFeeUsd."},
        "sourceTxHash": {**_TX_HASH, "description": "The incoming transfer's transaction."},
        "logIndex": {"type": "integer", "description": "The transfer's log in that transaction."},
        "fromAddress": {**_nullable(_ADDRESS), "description": "The sender."},
        "blockNumber": {"type": ["integer", "null"], "description": "Block of the transfer."},
        "blockHash": _nullable(_TX_HASH),
        "sourceBlockNumber": {
            "type": ["integer", "null"],
            "description": "Block of the incoming transfer (the same as blockNumber); "
            "a reorg that re-mines it moves it. Sandbox: a block of the simulated chain.",
        },
        "sourceBlockHash": {
            **_nullable(_TX_HASH),
            "description": "Hash of that block (the same as blockHash). Sandbox: synthetic, "
            "keccak256 of `settle:sandbox:<chainId>:<number>`.",
        },
        "confirmations": {"type": "integer", "description": "Blocks seen on the transfer's."},
        "requiredConfirmations": {
            "type": "integer",
            "description": "Confirmations before it counts (the chain's depth).",
        },
        "destination": {
            **_DESTINATION,
            "description": "The account's destination when the deposit was detected.",
        },
        "route": {
            "type": ["string", "null"],
            "enum": ["direct", "inventory", "routed", "manual", None],
            "description": "How it settles; null until settlement starts.",
        },
        "creditTxHash": {
            "type": ["string", "null"],
            "description": "The payment to the destination; null until credited.",
        },
        "failureReason": {
            "type": ["string", "null"],
            "description": "reorged, below_minimum, below_fee, sandbox_outcome, or ops text.",
        },
        "reviewReason": {
            "type": ["string", "null"],
            "description": "Why a person must look (manual_review_required).",
        },
        "waitReason": {
            "type": ["string", "null"],
            "enum": [
                "hot_wallet_insufficient_balance",
                "payments_paused",
                "fee_cap",
                None,
            ],
            "description": "Why settlement waits; it tries again by itself (null: not waiting).",
        },
        "sandbox": {"type": "boolean", "description": "Made by POST /v1/sandbox/deposits."},
        "createdAt": _TIMESTAMP,
        "updatedAt": _TIMESTAMP,
        "confirmedAt": {**_nullable(_TIMESTAMP), "description": "When it was confirmed."},
        "creditedAt": {**_nullable(_TIMESTAMP), "description": "When it was credited."},
    },
    description="The deposit object, as GET /v1/deposits serves it.",
)

_WEBHOOK_ENDPOINT = _object(
    {
        "id": {"type": "string"},
        "name": {"type": "string"},
        "url": {"type": "string"},
        "eventTypes": {
            "type": "array",
            "items": {"type": "string"},
            "description": 'Types and patterns ("*", "deposit.*") it subscribes to.',
        },
        "receives": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The types it receives today (its patterns expanded).",
        },
        "status": {"type": "string", "enum": ["enabled", "disabled"]},
        "disabledReason": {"type": ["string", "null"]},
        "previousSecretExpiresAt": _nullable(_TIMESTAMP),
        "rateLimitPerSecond": {
            "type": ["number", "null"],
            "description": "The endpoint's own cap on deliveries a second; null: none.",
        },
        "signatureScheme": {
            "type": "string",
            "enum": ["settle", "standard"],
            "description": "`standard`: Standard Webhooks' headers are sent too.",
        },
        "ordering": {
            "type": ["string", "null"],
            "enum": ["per_account", None],
            "description": "`per_account`: an account's events one at a time, in order.",
        },
        "ephemeral": {
            "type": "boolean",
            "description": "`settle listen`'s: expires unless renewed; not counted in the limit.",
        },
        "expiresAt": {**_nullable(_TIMESTAMP), "description": "When an ephemeral one expires."},
        "createdAt": _TIMESTAMP,
        "updatedAt": _TIMESTAMP,
    },
    description="The endpoint, as GET /v1/webhook-endpoints serves it (never its secret).",
)

_DELIVERY_STATUSES = ["pending", "retrying", "succeeded", "failed", "skipped"]

_WEBHOOK_DELIVERY = _object(
    {
        "id": {"type": "string", "pattern": "^whd_"},
        "endpointId": {"type": "string"},
        "eventId": {"type": "string"},
        "eventType": {"type": "string"},
        "status": {"type": "string", "enum": _DELIVERY_STATUSES},
        "attemptCount": {"type": "integer"},
        "nextAttemptAt": {**_nullable(_TIMESTAMP), "description": "Null once final."},
        "lastAttemptAt": _nullable(_TIMESTAMP),
        "lastResponseStatus": {"type": ["integer", "null"]},
        "lastError": {"type": ["string", "null"]},
        "replayOf": {
            "type": ["string", "null"],
            "description": "The delivery this one replays or recovers, if any.",
        },
        "heldBy": {
            "type": ["string", "null"],
            "description": "Ordered endpoints: the unfinished delivery of an earlier event "
            "about the same account that this one waits for; null when it waits for none.",
        },
        "createdAt": _TIMESTAMP,
        "updatedAt": _TIMESTAMP,
        "succeededAt": _nullable(_TIMESTAMP),
    },
    description="A delivery, as GET /v1/webhook-deliveries serves it.",
)

#: How long a run of failures lasted, and how many attempts failed in it.
_FAILURE_RUN = {
    "failingSince": {**_TIMESTAMP, "description": "The first failed attempt of the run."},
    "failedAttempts": {
        "type": "integer",
        "minimum": 1,
        "description": "Attempts to the endpoint that failed in a row.",
    },
}


#: Objects several types share, by name: `$defs` of the schemas, sections of the docs.
#: A schema names one by holding that very dict (identity, not equality).
NAMED_OBJECTS: dict[str, dict[str, Any]] = {
    "Deposit": _DEPOSIT,
    "DepositAccount": _DEPOSIT_ACCOUNT,
    "Destination": _DESTINATION,
    "WebhookEndpoint": _WEBHOOK_ENDPOINT,
    "WebhookDelivery": _WEBHOOK_DELIVERY,
}


def _named(schema: Any) -> str | None:
    """The name of the shared object this schema is (its own description aside), or None."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    for name, named in NAMED_OBJECTS.items():
        if schema is named or (
            {k: v for k, v in schema.items() if k != "description"}
            == {k: v for k, v in named.items() if k != "description"}
        ):
            return name
    return None


def _with_refs(schema: Any, used: set[str]) -> Any:
    """A copy of the schema with each named object replaced by a `$ref` to its `$defs` entry."""
    name = _named(schema)
    if name is not None:
        used.add(name)
        ref = {"$ref": f"#/$defs/{name}"}
        if schema.get("description") != NAMED_OBJECTS[name].get("description"):
            ref["description"] = schema["description"]
        return ref
    if isinstance(schema, dict):
        return {key: _with_refs(value, used) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_with_refs(item, used) for item in schema]
    return schema


def _defs(used: set[str]) -> dict[str, Any]:
    """`$defs` for the named objects used, and for those they use in turn."""
    defs: dict[str, Any] = {}
    pending = sorted(used)
    while pending:
        name = pending.pop()
        if name in defs:
            continue
        inner: set[str] = set()
        # The object itself is not replaced by a ref to itself: walk its members.
        defs[name] = {k: _with_refs(v, inner) for k, v in NAMED_OBJECTS[name].items()}
        pending += sorted(inner - set(defs))
    return {name: defs[name] for name in NAMED_OBJECTS if name in defs}


_DESTINATION_UPDATED = _object(
    {
        "depositAccount": _DEPOSIT_ACCOUNT,
        "priorDestination": {
            **_DESTINATION,
            "type": ["object", "null"],
            "description": "The destination before the change; null when none was recorded.",
        },
        "apiKeyId": {
            "type": ["string", "null"],
            "description": "Id (`key_...`) of the API key that made the change; null when a "
            "portal member made it.",
        },
    }
)
# Not required: present only when a portal member (a session) made the change.
_DESTINATION_UPDATED["properties"]["memberId"] = {
    "type": "string",
    "description": "Only when a portal member made the change: the member's id.",
}


def _envelope(event_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a whole delivery body of this type."""
    used: set[str] = set()
    data_schema = _with_refs(data, used)
    schema: dict[str, Any] = {
        "$schema": DIALECT,
        "title": event_type,
        "type": "object",
        "required": ["id", "type", "createdAt", "tenantId", "livemode", "data"],
        "properties": {
            "id": {"type": "string", "pattern": "^evt_", "description": "Deduplicate on it."},
            "type": {"const": event_type},
            "createdAt": _TIMESTAMP,
            "tenantId": {"type": "string", "format": "uuid"},
            "livemode": {
                "type": "boolean",
                "description": (
                    "false on a test (webhook.test, the portal's Send example) and on every "
                    "event of a sandbox deposit or sandbox tenant: simulated, never money. "
                    "A production receiver ignores such events."
                ),
            },
            "sequence": {
                "type": "integer",
                "minimum": 1,
                "description": (
                    "Only on events about a deposit account (data.deposit.accountId or "
                    "data.depositAccount.id): 1, 2, 3... per account in commit order. A "
                    "jump shows an event still to come; a lower number than one already "
                    "seen, an event that overtook it."
                ),
            },
            "data": data_schema,
        },
    }
    if used:
        schema["$defs"] = _defs(used)
    return copy.deepcopy(schema)


# -- examples -----------------------------------------------------------------------

_TENANT_ID = "6f1c2a8e-4b3d-4e5f-9a7b-1c2d3e4f5a6b"
_EXAMPLE_TIME = datetime(2026, 11, 21, 4, 11, 28, 123000, tzinfo=UTC)
_EXAMPLE_SEQUENCE = 7
_WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
_USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
_USDC_POLYGON = "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359"
_ACCOUNT_EXAMPLE: dict[str, Any] = {
    "id": "acc_01JD3Y8Q2X4N6R5T7V9W0Z1A2B",
    "externalUserId": "user-42",
    "status": "active",
    "destination": {"chainId": 8453, "address": _WALLET, "tokenAddress": _USDC_BASE},
    "depositAddresses": [
        {
            "chainId": 1,
            "address": "0x9858EfFD232B4033E47d90003D41EC34EcaEda94",
            "assets": ["USDC", "USDT"],
        },
        {
            "chainId": 137,
            "address": "0x6Fac4D18c912343BF86fa7049364Dd4E424Ab9C0",
            "assets": ["USDC", "USDT"],
        },
        {
            "chainId": 8453,
            "address": "0xb6716976A3ebe8D39aCEB04372f22Ff8e6802D7A",
            "assets": ["USDC"],
        },
    ],
    "metadata": {"tier": "gold"},
    "createdAt": "2026-11-21T04:02:11.408Z",
    "updatedAt": "2026-11-21T04:02:11.408Z",
}


def _deposit_example(status: str) -> dict[str, Any]:
    """A 125.50 USDC deposit on Polygon settling to USDC on Base, at `status`."""
    confirmed = status != "source_seen"
    settling = status in {"credit_submitted", "credited"}
    credited = status == "credited"
    deposit: dict[str, Any] = {
        "id": "dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A",
        "accountId": _ACCOUNT_EXAMPLE["id"],
        "externalUserId": "user-42",
        "status": status,
        "chainId": 137,
        "depositAddress": "0x6Fac4D18c912343BF86fa7049364Dd4E424Ab9C0",
        "asset": "USDC",
        "tokenAddress": _USDC_POLYGON,
        "decimals": 6,
        "amount": "125.50",
        "amountRaw": "125500000",
        "amountUsd": 125.5,
        "settlementGasFeeUsd": 0.01 if settling else None,
        "netAmountUsd": 125.49 if settling else None,
        "sourceTxHash": "0x4e3a3754410177e6937ef1f84bba68ea139e8d1a2258c5f85db9f1cd715a1bdd",
        "logIndex": 3,
        "fromAddress": "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
        "blockNumber": 64213377,
        "blockHash": "0x8f5bab218b6bb34476f51ca588e9f4553a3a7ce5e13a66c660a5283e97e9a85a",
        "sourceBlockNumber": 64213377,
        "sourceBlockHash": "0x8f5bab218b6bb34476f51ca588e9f4553a3a7ce5e13a66c660a5283e97e9a85a",
        "confirmations": 128 if confirmed else 1,
        "requiredConfirmations": 128,
        "destination": {"chainId": 8453, "address": _WALLET, "tokenAddress": _USDC_BASE},
        "route": {"credit_submitted": "routed", "credited": "inventory"}.get(status),
        "creditTxHash": (
            "0xd1c6a4a5e2b8f4e4f3b7c0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9"
            if credited
            else None
        ),
        "failureReason": None,
        "reviewReason": "no_route" if status == "manual_review_required" else None,
        "waitReason": None,
        "sandbox": False,
        "createdAt": "2026-11-21T04:10:02.117Z",
        "updatedAt": "2026-11-21T04:11:28.123Z",
        "confirmedAt": "2026-11-21T04:11:27.950Z" if confirmed else None,
        "creditedAt": "2026-11-21T04:11:28.123Z" if credited else None,
    }
    if status == "failed":
        # Dust: under Polygon's floor, so it is never settled and has no net amount.
        deposit.update(amount="0.40", amountRaw="400000", amountUsd=0.4)
        deposit["failureReason"] = "below_minimum"
    return deposit


_ENDPOINT_EXAMPLE: dict[str, Any] = {
    "id": "we_01JD3Y8Q2X4N6R5T7V9W0Z1A2B",
    "name": "Production ledger",
    "url": "https://hooks.example.com/settle",
    "eventTypes": ["deposit.credited", "deposit.failed"],
    "receives": ["deposit.credited", "deposit.failed"],
    "status": "disabled",
    "disabledReason": "failing",
    "previousSecretExpiresAt": None,
    "rateLimitPerSecond": None,
    "signatureScheme": "settle",
    "ordering": None,
    "ephemeral": False,
    "expiresAt": None,
    "createdAt": "2026-11-18T09:30:00.000Z",
    "updatedAt": "2026-11-21T04:11:28.123Z",
}

_FAILING_ENDPOINT_EXAMPLE: dict[str, Any] = {
    **_ENDPOINT_EXAMPLE,
    "status": "enabled",
    "disabledReason": None,
    "updatedAt": "2026-11-18T09:30:00.000Z",
}

_DELIVERY_EXAMPLE: dict[str, Any] = {
    "id": "whd_01JD3YC4N6P8R0T2V4X6Z8B0D2",
    "endpointId": _ENDPOINT_EXAMPLE["id"],
    "eventId": "evt_dep_dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A_credited",
    "eventType": "deposit.credited",
    "status": "failed",
    "attemptCount": 10,
    "nextAttemptAt": None,
    "lastAttemptAt": "2026-11-23T05:02:41.310Z",
    "lastResponseStatus": 503,
    "lastError": "http_503",
    "replayOf": None,
    "heldBy": None,
    "createdAt": "2026-11-21T04:11:28.123Z",
    "updatedAt": "2026-11-23T05:02:41.322Z",
    "succeededAt": None,
}

_OPERATIONAL = (
    "Sent to the tenant's other enabled endpoints subscribed to it, never to the "
    "endpoint it is about: subscribe an operations endpoint to hear about the others."
)


# -- the catalog --------------------------------------------------------------------


@dataclass(frozen=True)
class EventType:
    """One entry of the catalog."""

    type: str
    #: When it fires, in one sentence (Markdown).
    summary: str
    #: What else a receiver should know (Markdown).
    details: str
    #: JSON Schema of `data`.
    data_schema: dict[str, Any]
    #: An example `data` (the catalog's own object: callers read `example`, a copy).
    data_example: dict[str, Any]
    #: Event id of the example (durable deposit events have a predictable one).
    example_id: str = "evt_01JD3YB6Q3W5E7R9T1Y3U5I7O9"

    @property
    def description(self) -> str:
        return f"{self.summary} {self.details}"

    @property
    def schema(self) -> dict[str, Any]:
        """JSON Schema of the whole body a receiver gets."""
        return _envelope(self.type, self.data_schema)

    @property
    def example(self) -> dict[str, Any]:
        """An example body, as a receiver gets it."""
        data = copy.deepcopy(self.data_example)
        sequence = None if events.account_of(data) is None else _EXAMPLE_SEQUENCE
        return events.envelope(
            self.type,
            _TENANT_ID,
            data,
            event_id=self.example_id,
            created_at=_EXAMPLE_TIME,
            sequence=sequence,
        )

    def document(self) -> dict[str, Any]:
        """The wire form of GET /v1/event-types."""
        return {
            "type": self.type,
            "description": self.description,
            "schema": self.schema,
            "example": self.example,
        }


def _deposit_event(status: str, summary: str, details: str) -> EventType:
    durable = status in events.DURABLE_DEPOSIT_STATUSES
    return EventType(
        type=f"deposit.{status}",
        summary=summary,
        details=details,
        data_schema=_object({"deposit": _DEPOSIT}),
        data_example={"deposit": _deposit_example(status)},
        example_id=(
            events.durable_event_id("dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A", status)
            if durable
            else "evt_01JD3YB6Q3W5E7R9T1Y3U5I7O9"
        ),
    )


_DURABLE = "Durable: emitted at most once per deposit, with id `evt_dep_<depositId>_{status}`."

#: Every entry written, including types not emitted yet (see `catalog`).
ENTRIES: tuple[EventType, ...] = (
    EventType(
        type=events.ACCOUNT_CREATED,
        summary="A deposit account was created (POST /v1/deposit-accounts).",
        details="An idempotent retry of the same request, or a 409 `account_exists`, "
        "emits nothing.",
        data_schema=_object({"depositAccount": _DEPOSIT_ACCOUNT}),
        data_example={"depositAccount": _ACCOUNT_EXAMPLE},
    ),
    EventType(
        type=events.ACCOUNT_DESTINATION_UPDATED,
        summary="An account's settlement destination was changed (PATCH "
        "/v1/deposit-accounts/{externalUserId}/destination).",
        details="Every successful PATCH "
        "emits one, even when the destination is the same as before. Deposits already "
        "detected keep the destination they were detected with.",
        data_schema=_DESTINATION_UPDATED,
        data_example={
            "depositAccount": {
                **_ACCOUNT_EXAMPLE,
                "destination": {"chainId": 137, "address": _WALLET, "tokenAddress": _USDC_POLYGON},
                "updatedAt": "2026-11-21T04:11:28.123Z",
            },
            "priorDestination": {"chainId": 8453, "address": _WALLET, "tokenAddress": _USDC_BASE},
            "apiKeyId": "key_01JD3Y7K5H3G1F9D7S5A3P1O9I",
        },
    ),
    _deposit_event(
        "source_seen",
        "A transfer to one of the account's deposit addresses was seen on chain, not yet "
        "confirmed.",
        "It may still vanish in a reorg (then `deposit.failed` with "
        "`failureReason: reorged`). " + _DURABLE.format(status="source_seen"),
    ),
    _deposit_event(
        "source_confirmed",
        "The transfer has the chain's required confirmations (`requiredConfirmations`); "
        "settlement starts.",
        _DURABLE.format(status="source_confirmed"),
    ),
    _deposit_event(
        "credit_submitted",
        "Best effort: a routed settlement was handed to a route provider and is in flight.",
        "Direct and inventory settlements skip it, and it may be skipped in any "
        "case: drive state from `deposit.credited` and `deposit.failed`.",
    ),
    _deposit_event(
        "credited",
        "The net amount was paid to the destination: `creditTxHash` is the payment.",
        "A settlement receipt: the deposit object says what arrived, the fee, what was paid "
        "and where. Also sent when ops credit a deposit manually, days later if need "
        "be. " + _DURABLE.format(status="credited"),
    ),
    _deposit_event(
        "failed",
        "The deposit will not be credited: `failureReason` says why.",
        "`below_minimum`: under the chain's `minDepositUsd`; `below_fee`: not worth the "
        "fee; `reorged`: the transfer vanished before confirmation; `sandbox_outcome`; or "
        "ops' text. " + _DURABLE.format(status="failed"),
    ),
    _deposit_event(
        "manual_review_required",
        "A person must look at the deposit; `reviewReason` says why.",
        "For example `unsupported_token`, `no_price`, `no_route`, `route_failed`. Ops "
        "end it in `deposit.credited` or `deposit.failed`. Not durable: a deposit may "
        "need review more than once.",
    ),
    EventType(
        type=events.WEBHOOK_TEST,
        summary="Sent by POST /v1/webhook-endpoints/{endpointId}/test to that endpoint "
        "alone, whether or not it subscribes to `webhook.test`.",
        details="Use it to check that your receiver answers 2xx and verifies signatures.",
        data_schema=_object(
            {
                "endpointId": {"type": "string", "description": "The endpoint tested."},
                "message": {"type": "string"},
            }
        ),
        data_example={
            "endpointId": "we_01JD3Y8Q2X4N6R5T7V9W0Z1A2B",
            "message": "Test delivery from Settle",
        },
    ),
    EventType(
        type=events.API_KEY_REVOKED,
        summary="An API key of the tenant was revoked (`settle api-keys revoke`, or the portal).",
        details="From `revokedAt` on, the key answers 401.",
        data_schema=_object(
            {
                "apiKeyId": {"type": "string", "description": "The revoked key's id, `key_...`."},
                "revokedAt": _TIMESTAMP,
            }
        ),
        data_example={
            "apiKeyId": "key_01JD3Y7K5H3G1F9D7S5A3P1O9I",
            "revokedAt": "2026-11-21T04:11:28.123Z",
        },
    ),
    EventType(
        type=events.INVENTORY_LOW_BALANCE,
        summary="Settle's own balance of a token on a chain, which pays inventory "
        "settlements at once, fell under its threshold; or its hot wallet holds too little "
        "of the token (or of the chain's gas) for a payout.",
        details="Sent once per crossing to each "
        "tenant whose accounts settle in that token (for gas: `tokenAddress` is the zero "
        "address, `asset` the chain's native token, and every tenant settling on that "
        "chain is told). Until it is refilled, settlements there may take a slower route, "
        "or wait (`waitReason: hot_wallet_insufficient_balance`) and are paid once it is.",
        data_schema=_object(
            {
                "inventory": _object(
                    {
                        "chainId": {"type": "integer"},
                        "asset": {"type": "string"},
                        "tokenAddress": _ADDRESS,
                        "balance": {"type": "string", "description": "Token units."},
                        "lowThreshold": {"type": "string", "description": "Token units."},
                        "updatedAt": _TIMESTAMP,
                    }
                )
            }
        ),
        data_example={
            "inventory": {
                "chainId": 8453,
                "asset": "USDC",
                "tokenAddress": _USDC_BASE,
                "balance": "980.25",
                "lowThreshold": "1000",
                "updatedAt": "2026-11-21T04:11:28.123Z",
            }
        },
    ),
    EventType(
        type=events.ROUTE_PROVIDER_DEGRADED,
        summary="A route provider (a bridge used by routed settlements) failed its "
        "health checks or too many routes in a row, and is avoided until it recovers.",
        details="A platform notice, sent to every tenant with deposit accounts.",
        data_schema=_object(
            {
                "provider": _object(
                    {
                        "name": {"type": "string"},
                        "status": {"type": "string", "enum": ["degraded"]},
                        "reason": {"type": ["string", "null"]},
                        "consecutiveFailures": {"type": "integer"},
                        "since": _TIMESTAMP,
                    }
                )
            }
        ),
        data_example={
            "provider": {
                "name": "bridge-a",
                "status": "degraded",
                "reason": "health check failed: HTTP 503",
                "consecutiveFailures": 3,
                "since": "2026-11-21T04:11:28.123Z",
            }
        },
    ),
    EventType(
        type=WEBHOOK_ENDPOINT_DISABLED,
        summary="One of the tenant's webhook endpoints was disabled.",
        details="`reason` is `failing` (every attempt failed for days) or `manual` "
        "(PATCH). Sent to the "
        "tenant's other endpoints subscribed to it, never to the disabled one.",
        data_schema=_object(
            {
                "webhookEndpoint": _WEBHOOK_ENDPOINT,
                "reason": {"type": "string", "enum": ["failing", "manual"]},
            }
        ),
        data_example={"webhookEndpoint": _ENDPOINT_EXAMPLE, "reason": "failing"},
    ),
    EventType(
        type=events.WEBHOOK_ENDPOINT_FAILING,
        summary="Attempts to one of the tenant's webhook endpoints have failed "
        "`SETTLE_WEBHOOK_FAILING_AFTER_ATTEMPTS` times in a row (5 by default).",
        details="Sent once per run of failures: the next is sent only after "
        "`webhook.endpoint_recovered`. Its deliveries keep being retried; if it fails for "
        "days it is disabled (`webhook.endpoint_disabled`). " + _OPERATIONAL,
        data_schema=_object(
            {
                "webhookEndpoint": _WEBHOOK_ENDPOINT,
                **_FAILURE_RUN,
                "lastAttempt": _object(
                    {
                        "deliveryId": {"type": "string"},
                        "number": {"type": "integer", "description": "Its delivery's attempt."},
                        "attemptedAt": _TIMESTAMP,
                        "responseStatus": {
                            "type": ["integer", "null"],
                            "description": "Null when there was no HTTP answer.",
                        },
                        "error": {
                            "type": "string",
                            "description": "`http_503`, `timeout`, `connection_refused`, ...",
                        },
                    },
                    description="The attempt that made the run long enough.",
                ),
            }
        ),
        data_example={
            "webhookEndpoint": _FAILING_ENDPOINT_EXAMPLE,
            "failingSince": "2026-11-21T04:06:58.005Z",
            "failedAttempts": 5,
            "lastAttempt": {
                "deliveryId": "whd_01JD3YC4N6P8R0T2V4X6Z8B0D2",
                "number": 2,
                "attemptedAt": "2026-11-21T04:11:28.101Z",
                "responseStatus": 503,
                "error": "http_503",
            },
        },
    ),
    EventType(
        type=events.WEBHOOK_ENDPOINT_RECOVERED,
        summary="A webhook endpoint that `webhook.endpoint_failing` was sent about answered "
        "2xx again.",
        details="Ends the run of failures (once per run). " + _OPERATIONAL,
        data_schema=_object(
            {
                "webhookEndpoint": _WEBHOOK_ENDPOINT,
                **_FAILURE_RUN,
                "recoveredAt": {**_TIMESTAMP, "description": "When it answered 2xx."},
            }
        ),
        data_example={
            "webhookEndpoint": _FAILING_ENDPOINT_EXAMPLE,
            "failingSince": "2026-11-21T04:06:58.005Z",
            "failedAttempts": 14,
            "recoveredAt": "2026-11-21T04:41:02.550Z",
        },
    ),
    EventType(
        type=events.WEBHOOK_DELIVERY_EXHAUSTED,
        summary="A delivery to one of the tenant's webhook endpoints gave up: every attempt "
        "of the retry schedule failed (`status: failed`).",
        details="One per delivery that gives up; `POST "
        "/v1/webhook-deliveries/{deliveryId}/replay` (or `.../recover` on the endpoint) "
        "sends it again. Not sent for deliveries of these operational events themselves "
        "(two failing endpoints would tell each other forever). " + _OPERATIONAL,
        data_schema=_object(
            {"webhookEndpoint": _WEBHOOK_ENDPOINT, "webhookDelivery": _WEBHOOK_DELIVERY}
        ),
        data_example={
            "webhookEndpoint": _FAILING_ENDPOINT_EXAMPLE,
            "webhookDelivery": _DELIVERY_EXAMPLE,
        },
    ),
)


def catalog() -> tuple[EventType, ...]:
    """Every event type Settle emits, in the order of `shared.events.EVENT_TYPES`."""
    by_type = {entry.type: entry for entry in ENTRIES}
    return tuple(by_type[t] for t in events.EVENT_TYPES)


def get(event_type: str) -> EventType:
    """The entry of one type (KeyError for a type Settle does not emit)."""
    if event_type not in events.EVENT_TYPES:
        raise KeyError(event_type)
    return next(entry for entry in ENTRIES if entry.type == event_type)


def documents() -> list[dict[str, Any]]:
    """`eventTypes` of GET /v1/event-types."""
    return [entry.document() for entry in catalog()]


#: The error for a type that is not in the catalog (it lists the valid ones).
unknown_type_message = events.unknown_type_message


# -- docs/EVENTS.md -----------------------------------------------------------------

BEGIN_MARK = "<!-- catalog: generated by `python -m shared.event_catalog`; do not edit -->"
END_MARK = "<!-- end of catalog -->"


def _anchor(title: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return "".join(ch for ch in title.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def _type_text(schema: dict[str, Any]) -> str:
    """A field's type for a person: `string or null`, a link to a shared object, an enum."""
    name = _named(schema)
    if name is not None:
        return f"[{name}](#{_anchor(name)})"
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kinds = schema.get("type", "any")
    text = " or ".join(kinds) if isinstance(kinds, list) else str(kinds)
    if "enum" in schema:
        values = ", ".join(f"`{v}`" for v in schema["enum"] if v is not None)
        text += f": {values}"
    return text


def _fields_table(schema: dict[str, Any]) -> list[str]:
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for name, field in schema["properties"].items():
        meaning = field.get("description", "").replace("|", "\\|")
        rows.append(f"| `{name}` | {_type_text(field)} | {meaning} |")
    return rows


def _json_block(value: Any) -> list[str]:
    return ["```json", json.dumps(value, indent=2), "```"]


def markdown() -> str:
    """The catalog section of docs/EVENTS.md: a summary table, each type, shared objects."""
    out = [BEGIN_MARK, "", "| type | fires when |", "|---|---|"]
    entries = catalog()
    for entry in entries:
        out.append(f"| [`{entry.type}`](#{_anchor(entry.type)}) | {entry.summary} |")
    out += ["", "An endpoint's `eventTypes` may also hold these patterns; each covers the types"]
    out += ["below today and any type added under it in a later release:", ""]
    out += ["| pattern | covers today |", "|---|---|"]
    for pattern in subscriptions.catalog_patterns():
        covered = ", ".join(f"`{t}`" for t in pattern["eventTypes"])  # type: ignore[union-attr]
        out.append(f"| `{pattern['pattern']}` | {covered} |")
    for entry in entries:
        out += ["", f"### {entry.type}", "", entry.summary, "", entry.details, ""]
        out += ["`data`:", "", *_fields_table(entry.data_schema), ""]
        out += ["Example body:", "", *_json_block(entry.example), ""]
        # The objects' definitions are shown once, under "Objects the events carry".
        schema = {k: v for k, v in entry.schema.items() if k != "$defs"}
        out += ["<details><summary>JSON Schema of the body</summary>", ""]
        out += [*_json_block(schema), "", "</details>"]
    out += ["", "## Objects the events carry", ""]
    out += ["The `$defs` of the schemas above; each schema of `GET /v1/event-types` carries"]
    out += ["the `$defs` it uses."]
    for name, schema in NAMED_OBJECTS.items():
        out += ["", f"### {name}", "", schema.get("description", ""), ""]
        out += [*_fields_table(schema), ""]
        out += [f"<details><summary>JSON Schema of {name}</summary>", ""]
        out += [*_json_block(_defs({name})[name]), "", "</details>"]
    out += ["", END_MARK]
    return "\n".join(out) + "\n"


def render_into(text: str) -> str:
    """`text` (a Markdown file with the two marks) with its catalog section rendered anew."""
    head, begin, rest = text.partition(BEGIN_MARK)
    _, end, tail = rest.partition(END_MARK + "\n")
    if not begin or not end:
        raise ValueError(f"the file lacks the marks {BEGIN_MARK!r} ... {END_MARK!r}")
    return head + markdown() + tail


def main(argv: list[str]) -> int:
    """Rewrite the catalog section of docs/EVENTS.md (or the file given)."""
    path = Path(argv[0] if argv else "docs/EVENTS.md")
    path.write_text(render_into(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the catalog section of {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
