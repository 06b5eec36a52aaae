"""Deposit accounts: create, list, read, and change the settlement destination."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import Response
from flask.views import MethodView

from services.core import accounts
from services.core.api.schemas import (
    ERROR_DESCRIPTIONS,
    DepositAccountEnvelopeSchema,
    DepositAccountSchema,
    DestinationSchema,
    ExternalUserId,
    Metadata,
    json_response,
)
from services.core.context import core
from services.core.models import IdempotencyRecord
from shared.api import Address, Blueprint, ErrorSchema, ListArgs, Schema
from shared.audit.log import record_request
from shared.idempotency import OPENAPI_PARAMETER, idempotent
from shared.identity import auth

blp = Blueprint(
    "deposit_accounts",
    __name__,
    url_prefix="/v1",
    description="Deposit accounts: one per end user, with deposit addresses per active chain.",
)


class CreateAccountSchema(Schema):
    external_user_id = ExternalUserId(required=True)
    destination = ma.fields.Nested(
        DestinationSchema,
        metadata={
            "description": "Omit to copy the tenant's destination policy as it is now; "
            "when given, chainId, address and tokenAddress are all required."
        },
    )
    metadata = Metadata()


class DestinationChangeSchema(Schema):
    destination = ma.fields.Nested(DestinationSchema, required=True)


class AccountListSchema(Schema):
    deposit_accounts = ma.fields.List(ma.fields.Nested(DepositAccountSchema), required=True)
    next_cursor = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "Pass as `cursor` for the next page; null on the last page."},
    )


def _error(status: int) -> Any:
    return blp.alt_response(status, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[status])


class AccountListArgs(ListArgs):
    deposit_address = Address(
        metadata={
            "description": "Only the account owning this deposit address (any case): a list "
            "of at most one."
        }
    )


@blp.route("/deposit-accounts")
class DepositAccounts(MethodView):
    @auth.requires(blp, "deposit_accounts:read")
    @blp.arguments(AccountListArgs, location="query")
    @blp.response(200, AccountListSchema)
    @_error(400)
    def get(self, args: dict[str, Any]) -> Response:
        """List the tenant's deposit accounts, newest first (or find one by an address)."""
        ctx = core()
        with ctx.db.reader() as session:
            page = accounts.list_accounts(
                session,
                ctx.registry,
                auth.current_principal().tenant_id,
                limit=args["limit"],
                cursor=args["cursor"],
                deposit_address=args.get("deposit_address"),
            )
        return json_response({"depositAccounts": page.items, "nextCursor": page.next_cursor})

    @auth.requires(blp, "deposit_accounts:write")
    @idempotent(IdempotencyRecord)
    @blp.arguments(CreateAccountSchema)
    @blp.response(200, DepositAccountEnvelopeSchema)
    @_error(400)
    @_error(409)
    @_error(413)
    @_error(422)
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self, args: dict[str, Any]) -> Response:
        """Create a deposit account.

        Without `destination` the account copies the destination policy (422
        destination_policy_missing when there is none). Emits deposit.account.created.
        Send an Idempotency-Key to retry safely.
        """
        ctx = core()
        principal = auth.current_principal()
        new = accounts.NewAccount(
            external_user_id=args["external_user_id"],
            destination=args.get("destination"),
            metadata=args.get("metadata") or {},
        )
        document = accounts.create_account(
            ctx.db,
            ctx.registry,
            ctx.deriver,
            principal.tenant_id,
            new,
            api_key_id=principal.api_key_id,
        )
        return json_response({"depositAccount": document})


@blp.route("/deposit-accounts/<path:externalUserId>")
class DepositAccount(MethodView):
    @auth.requires(blp, "deposit_accounts:read")
    @blp.response(200, DepositAccountEnvelopeSchema)
    @_error(404)
    def get(self, externalUserId: str) -> Response:
        """Read one account by the tenant's externalUserId (URL-encode it)."""
        ctx = core()
        with ctx.db.reader() as session:
            document = accounts.get_account(
                session, ctx.registry, auth.current_principal().tenant_id, externalUserId
            )
        return json_response({"depositAccount": document})


@blp.route("/deposit-accounts/<path:externalUserId>/destination")
class DepositAccountDestination(MethodView):
    @auth.requires(blp, "deposit_accounts:write", step_up=True)
    @blp.arguments(DestinationChangeSchema)
    @blp.response(200, DepositAccountEnvelopeSchema)
    @_error(400)
    @_error(404)
    @_error(413)
    def patch(self, args: dict[str, Any], externalUserId: str) -> Response:
        """Change an account's settlement destination.

        Emits deposit.account.destination_updated with the prior destination and the
        id of the API key that made the change (null, with `memberId`, for a portal
        member).
        """
        ctx = core()
        principal = auth.current_principal()
        with ctx.db.transaction() as session:
            document = accounts.update_destination(
                session,
                ctx.registry,
                principal.tenant_id,
                externalUserId,
                args["destination"],
                api_key_id=principal.api_key_id,
                member_id=principal.member_id,
                audit=record_request,
            )
        return json_response({"depositAccount": document})
