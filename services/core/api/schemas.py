"""Schemas and fields core's blueprints share: chain ids, destinations, accounts.

Input schemas check shape; the domain modules check meaning. One exception on
purpose: a chain id that is not active fails as `unsupported_chain` while the body
is read (before other fields), so that error wins wherever a chain is supplied.
"""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import Response, jsonify

from services.core import amounts
from services.core.accounts import (
    EXTERNAL_USER_ID_MAX,
    METADATA_KEY_MAX,
    METADATA_MAX_KEYS,
    METADATA_STRING_MAX,
    external_user_id_problem,
    metadata_problems,
)
from services.core.context import core
from services.core.destinations import Destination
from shared.api import Address, Schema, StrictInteger, Timestamp

ERROR_DESCRIPTIONS = {
    400: "invalid_json, invalid_request (names the field) or unsupported_chain",
    404: "not_found (also for another tenant's object)",
    409: "account_exists or idempotency_key_reused",
    413: "payload_too_large (body over 256 KiB)",
    422: "destination_policy_missing",
}


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    """The body rendered once, as built (schemas only document it)."""
    response = jsonify(body)
    response.status_code = status
    return response


class ChainId(StrictInteger):
    """An EVM chain id that must be active: declared or unknown is `unsupported_chain`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("metadata", {})
        kwargs["metadata"].setdefault("example", 8453)
        kwargs["metadata"].setdefault(
            "description", "An active chain id (see GET /v1/chains); others: unsupported_chain."
        )
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        chain_id = super()._deserialize(value, attr, data, **kwargs)
        # Not a ValidationError: it escapes the parser and answers unsupported_chain.
        core().registry.require_active(chain_id)
        return chain_id


def printable(value: str) -> None:
    """Free text must be printable (no control characters, NUL or unpaired surrogates)."""
    if not value.isprintable():
        raise ma.ValidationError("must contain only printable characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ma.ValidationError("must contain only printable characters") from None


class Amount(ma.fields.String):
    """A token amount (`services.core.amounts`): a decimal string in, a Decimal out."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("metadata", {})
        kwargs["metadata"].setdefault(
            "description",
            f"Token units as {amounts.AMOUNT_SHAPE}, greater than 0, with at most the "
            "token's decimals.",
        )
        kwargs["metadata"].setdefault("example", "125.50")
        kwargs["metadata"].setdefault("pattern", f"^{amounts.AMOUNT_PATTERN}$")
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        try:
            return amounts.parse_amount(value)
        except amounts.AmountError as err:
            raise ma.ValidationError(str(err)) from None


class DestinationSchema(Schema):
    """A settlement destination; all three fields are required."""

    chain_id = ChainId(required=True)
    address = Address(
        required=True,
        metadata={
            "description": "Wallet that receives settlements.",
            "example": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
        },
    )
    # The example must be an asset of the example chain (USDC on Base), so that the
    # documented example request is one the API accepts.
    token_address = Address(
        required=True,
        metadata={
            "description": "Token contract; one of the chain's deposit assets.",
            "example": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
        },
    )

    @ma.post_load
    def _make(self, data: dict[str, Any], **kwargs: Any) -> Destination:
        return Destination(data["chain_id"], data["address"], data["token_address"])


class ExternalUserId(ma.fields.String):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault(
            "metadata",
            {
                "description": f"The tenant's own user id: 1..{EXTERNAL_USER_ID_MAX} "
                "printable characters, unique per tenant.",
                "example": "user_8412",
                "minLength": 1,
                "maxLength": EXTERNAL_USER_ID_MAX,
            },
        )
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text: str = super()._deserialize(value, attr, data, **kwargs)
        problem = external_user_id_problem(text)
        if problem:
            raise ma.ValidationError(problem)
        return text


class Metadata(ma.fields.Dict):
    """A flat key-value object (see `services.core.accounts.metadata_problems`)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault(
            "metadata",
            {
                "description": f"At most {METADATA_MAX_KEYS} keys of 1..{METADATA_KEY_MAX} "
                f"characters; values are strings (<= {METADATA_STRING_MAX} characters), "
                "numbers, booleans or null. Nested objects and arrays are refused.",
                "maxProperties": METADATA_MAX_KEYS,
                "additionalProperties": {
                    "nullable": True,
                    "oneOf": [
                        {"type": "string", "maxLength": METADATA_STRING_MAX},
                        {"type": "number"},
                        {"type": "boolean"},
                    ],
                },
                "example": {"tier": "gold"},
            },
        )
        super().__init__(keys=ma.fields.String(), **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if not isinstance(value, dict):
            raise ma.ValidationError("must be an object")
        problems = metadata_problems(value)
        if problems:
            raise ma.ValidationError(problems)  # type: ignore[arg-type]
        return dict(value)


class DepositAddressSchema(Schema):
    chain_id = ma.fields.Integer(required=True, metadata={"example": 8453})
    address = ma.fields.String(required=True, metadata={"description": "EIP-55 checksummed."})
    assets = ma.fields.List(
        ma.fields.String(), required=True, metadata={"example": ["USDC", "DAI"]}
    )


class DepositAccountSchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "acc_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    external_user_id = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={"enum": ["active"]})
    destination = ma.fields.Nested(DestinationSchema, required=True)
    deposit_addresses = ma.fields.List(
        ma.fields.Nested(DepositAddressSchema),
        required=True,
        metadata={"description": "One per active chain, in GET /v1/chains order."},
    )
    metadata = ma.fields.Dict(required=True, metadata={"description": "{} when none was given."})
    created_at = Timestamp(required=True)
    updated_at = Timestamp(required=True)


class DepositAccountEnvelopeSchema(Schema):
    deposit_account = ma.fields.Nested(DepositAccountSchema, required=True)
