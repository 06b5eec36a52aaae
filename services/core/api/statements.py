"""Statements: a tenant's credited deposits over a period with opening and closing totals,
as JSON or CSV, signed (Ed25519 over the exact bytes); and the public key that verifies
them."""

from __future__ import annotations

import base64
import threading
from typing import Any

import marshmallow as ma
from flask import Response, request
from flask.views import MethodView
from werkzeug.wsgi import wrap_file

from services.core.context import core
from services.core.statements import render
from services.core.statements.service import Statements
from services.core.statements.signing import ALGORITHM, StatementSigner
from shared.api import Address, Blueprint, ErrorSchema, Schema, Timestamp
from shared.identity import auth

blp = Blueprint(
    "statements",
    __name__,
    url_prefix="/v1",
    description="Statements: credited deposits over a period, with totals, signed.",
)

#: The response headers that carry the signature and the id of the key that made it.
SIGNATURE_HEADER = "x-service-statement-signature"
KEY_ID_HEADER = "x-service-statement-key-id"

_DECIMAL = {"type": "string", "example": "125.50"}


class StatementArgs(Schema):
    """Query arguments (unknown ones are refused: a typo must not change the books)."""

    start = Timestamp(
        data_key="from",
        required=True,
        metadata={"description": "Inclusive: deposits credited at or after it."},
    )
    end = Timestamp(
        data_key="to",
        load_default=None,
        metadata={"description": "Exclusive, not in the future; default: now."},
    )
    format = ma.fields.String(
        load_default=None,
        validate=ma.validate.OneOf(render.FORMATS),
        metadata={"description": "`json` or `csv`; default: the `Accept` header's, else json."},
    )
    sandbox = ma.fields.Boolean(
        load_default=None,
        metadata={
            "description": "Sandbox deposits instead of live ones; default: whether the "
            "tenant is a sandbox tenant. A statement never mixes the two."
        },
    )


class FiguresSchema(Schema):
    deposits = ma.fields.Integer(required=True, metadata={"description": "How many."})
    amount = ma.fields.String(
        required=True, metadata={**_DECIMAL, "description": "Token units (exact)."}
    )
    amount_usd = ma.fields.String(required=True, metadata=_DECIMAL)
    settlement_gas_fee_usd = ma.fields.String(required=True, metadata=_DECIMAL)
    net_amount_usd = ma.fields.String(required=True, metadata=_DECIMAL)


class TokenTotalsSchema(Schema):
    chain_id = ma.fields.Integer(required=True)
    asset = ma.fields.String(required=True, allow_none=True)
    token_address = Address(required=True)
    decimals = ma.fields.Integer(required=True, allow_none=True)
    opening = ma.fields.Nested(
        FiguresSchema, required=True, metadata={"description": "Credited before `from`."}
    )
    period = ma.fields.Nested(
        FiguresSchema, required=True, metadata={"description": "Credited in the period."}
    )
    closing = ma.fields.Nested(
        FiguresSchema,
        required=True,
        metadata={"description": "Credited before `to`: opening + period."},
    )


class StatementDestinationSchema(Schema):
    chain_id = ma.fields.Integer(required=True)
    address = Address(required=True)
    token_address = Address(required=True)


class StatementDepositSchema(Schema):
    id = ma.fields.String(required=True)
    account_id = ma.fields.String(required=True)
    external_user_id = ma.fields.String(required=True)
    chain_id = ma.fields.Integer(required=True)
    deposit_address = Address(required=True)
    asset = ma.fields.String(required=True, allow_none=True)
    token_address = Address(required=True)
    amount = ma.fields.String(required=True, metadata=_DECIMAL)
    amount_usd = ma.fields.String(required=True, allow_none=True, metadata=_DECIMAL)
    settlement_gas_fee_usd = ma.fields.String(required=True, allow_none=True, metadata=_DECIMAL)
    net_amount_usd = ma.fields.String(required=True, allow_none=True, metadata=_DECIMAL)
    destination = ma.fields.Nested(StatementDestinationSchema, required=True)
    credit_amount = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={**_DECIMAL, "description": "Paid, in destination token units."},
    )
    route = ma.fields.String(required=True, allow_none=True)
    source_tx_hash = ma.fields.String(required=True)
    source_block_number = ma.fields.Integer(required=True, allow_none=True)
    source_block_hash = ma.fields.String(required=True, allow_none=True)
    log_index = ma.fields.Integer(required=True)
    credit_tx_hash = ma.fields.String(required=True, allow_none=True)
    created_at = Timestamp(required=True)
    credited_at = Timestamp(required=True)


class StatementSchema(Schema):
    tenant_id = ma.fields.String(required=True)
    sandbox = ma.fields.Boolean(required=True)
    start = Timestamp(data_key="from", required=True)
    end = Timestamp(data_key="to", required=True)
    generated_at = Timestamp(required=True)
    key_id = ma.fields.String(
        required=True, metadata={"description": "The key that signed it (GET /v1/statements/key)."}
    )
    totals = ma.fields.List(ma.fields.Nested(TokenTotalsSchema), required=True)
    deposits = ma.fields.List(
        ma.fields.Nested(StatementDepositSchema),
        required=True,
        metadata={"description": "Oldest credit first."},
    )


class StatementEnvelopeSchema(Schema):
    statement = ma.fields.Nested(StatementSchema, required=True)


class PublicKeySchema(Schema):
    key_id = ma.fields.String(required=True, metadata={"example": "stk_3f9a0c1d2e4b5a67"})
    algorithm = ma.fields.String(required=True, metadata={"enum": [ALGORITHM]})
    public_key = ma.fields.String(
        required=True, metadata={"description": "The raw 32-byte public key, base64."}
    )
    public_key_pem = ma.fields.String(
        required=True, metadata={"description": "The same key as PEM (SubjectPublicKeyInfo)."}
    )


class StatementKeysSchema(Schema):
    key = ma.fields.Nested(
        PublicKeySchema, required=True, metadata={"description": "The key signing statements now."}
    )
    retired_keys = ma.fields.List(
        ma.fields.Nested(PublicKeySchema),
        required=True,
        metadata={"description": "Keys that signed statements before a rotation."},
    )


_SIGNED_HEADERS = {
    SIGNATURE_HEADER: {
        "description": "Ed25519 signature of the exact body bytes, base64 (64 bytes).",
        "schema": {"type": "string"},
    },
    KEY_ID_HEADER: {
        "description": "The id of the key that made it (`keyId` of GET /v1/statements/key).",
        "schema": {"type": "string"},
    },
}


#: The process's statement slots (a Database attachment: one set per process and database).
SLOTS = "statements.slots"


def _statements() -> Statements:
    ctx = core()
    settings = ctx.config.statements
    slots = ctx.db.attachment(SLOTS, lambda _db: threading.BoundedSemaphore(settings.concurrency))
    return Statements(ctx.db, settings, _signer(), slots=slots)


def _signer() -> StatementSigner:
    config = core().config
    return StatementSigner.from_settings(config.statements, config.secret_key)


def _format(asked: str | None) -> str:
    """`format` when given; else what `Accept` prefers of JSON and CSV (JSON on a tie)."""
    if asked is not None:
        return asked
    best = request.accept_mimetypes.best_match(["application/json", "text/csv"])
    return render.CSV if best == "text/csv" else render.JSON


@blp.route("/statements")
class StatementView(MethodView):
    @auth.requires(blp, "deposits:read")
    @blp.arguments(StatementArgs, location="query", unknown=ma.RAISE)
    @blp.response(200, StatementEnvelopeSchema, headers=_SIGNED_HEADERS)
    @blp.doc(
        responses={
            200: {  # the int key flask-smorest files the response under (merged into it)
                "content": {
                    "text/csv": {
                        "schema": {"type": "string"},
                        "example": ",".join(render.CSV_COLUMNS) + "\r\n",
                    }
                }
            }
        }
    )
    @blp.alt_response(
        400, schema=ErrorSchema, description="invalid_request (names `from`, `to`, `format`)"
    )
    @blp.alt_response(
        503,
        schema=ErrorSchema,
        description="service_unavailable (Retry-After): the process is making as many "
        "statements as it may at once",
    )
    @blp.alt_response(
        422,
        schema=ErrorSchema,
        description="statement_too_large: the period holds more deposits than one statement "
        "lists (details: deposits, maxDeposits); ask for shorter periods",
    )
    def get(self, args: dict[str, Any]) -> Response:
        """The deposits credited in `[from, to)`, with opening and closing totals, signed.

        JSON (`application/json`) or CSV (`text/csv`), chosen by `format` or else by
        `Accept`. The body's exact bytes are signed with Ed25519: the signature is in
        the `x-service-statement-signature` header (base64), the key's id in
        `x-service-statement-key-id` and in the body; the public key is at
        `GET /v1/statements/key`. A deposit belongs to the period it was credited in;
        opening totals count deposits credited before `from`, closing totals those
        credited before `to` (docs/DEPOSITS.md, "Statements").
        """
        principal = auth.current_principal()
        fmt = _format(args["format"])
        signed = _statements().build(
            principal.tenant_id,
            start=args["start"],
            end=args["end"],
            sandbox=principal.sandbox if args["sandbox"] is None else args["sandbox"],
            fmt=fmt,
        )
        response = Response(
            wrap_file(request.environ, signed.file),
            mimetype=None,
            content_type=signed.media_type,
            direct_passthrough=True,
        )
        response.content_length = signed.size
        response.headers[SIGNATURE_HEADER] = base64.b64encode(signed.signature).decode("ascii")
        response.headers[KEY_ID_HEADER] = signed.key_id
        response.headers["Cache-Control"] = "no-store"
        response.headers["Vary"] = "Accept"
        if fmt == render.CSV:
            response.headers["Content-Disposition"] = f'attachment; filename="{signed.filename}"'
        return response


@blp.route("/statements/key")
class StatementKeyView(MethodView):
    @blp.response(200, StatementKeysSchema)
    def get(self) -> dict[str, Any]:
        """The public key that verifies statements (public: an auditor needs no API key).

        `key` signs statements now; `retiredKeys` signed earlier ones. A statement names
        its key by `keyId` (in its body and its `x-service-statement-key-id` header).
        """
        signer = _signer()
        return {"key": signer.public, "retired_keys": list(signer.retired)}
