"""A destination policy whose chain the chains file has since turned back to `declared`:
creating an account from it is refused, never written with a destination nobody pays."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask

from services.core.app import create_app
from services.core.context import CoreContext
from services.core.models import DepositAccount
from shared.db import Database
from tests.conftest import TenantKeys, core_config
from tests.integration.conftest import WALLET, create_account, put_policy
from tests.support.backfill import NEW_CHAIN_TOKEN, own_chains, write_chains
from tests.support.deposits import unique_chain_id

pytestmark = pytest.mark.integration


def _app(pg_url: str, pg_db: Database, folder: Path, name: str, text: str) -> Flask:
    chains_file, _ = write_chains(folder, name, text)
    config = core_config(pg_url, folder, chains_file=chains_file)
    app = create_app(context=CoreContext.build(config, db=pg_db, identity_db=pg_db))
    app.testing = True
    return app


def _accounts(db: Database, tenant_id: str) -> int:
    with db.reader() as session:
        return int(
            session.scalar(
                sa.select(sa.func.count())
                .select_from(DepositAccount)
                .where(DepositAccount.tenant_id == tenant_id)
            )
            or 0
        )


def test_an_account_made_after_the_policys_chain_is_declared_is_refused_unsupported_chain(
    pg_url: str, pg_db: Database, tenant: TenantKeys, tmp_path: Path
) -> None:
    venue, x = unique_chain_id(), unique_chain_id()
    # Given a deploy where chain X is active, and one (a later chains file) where it is
    # declared again; the second process has already copied the tenant's policy (on the
    # venue chain) into an account, so it holds that policy in its cache
    active = _app(pg_url, pg_db, tmp_path, "active.toml", own_chains(venue, x, "active"))
    declared = _app(pg_url, pg_db, tmp_path, "declared.toml", own_chains(venue, x, "declared"))
    put_policy(
        declared.test_client(),
        tenant,
        chain_id=venue,
        address=WALLET,
        token_address=NEW_CHAIN_TOKEN,
    )
    create_account(declared.test_client(), tenant)
    # When the policy moves to chain X (where X is active), and an account is then created
    # from it where X is declared
    put_policy(
        active.test_client(), tenant, chain_id=x, address=WALLET, token_address=NEW_CHAIN_TOKEN
    )
    before = _accounts(pg_db, tenant.tenant_id)
    response = declared.test_client().post(
        "/v1/deposit-accounts", json={"externalUserId": "after-declared"}, headers=tenant.headers
    )
    # Then it is refused as an unsupported chain, and nothing is written
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["code"] == "unsupported_chain"
    assert _accounts(pg_db, tenant.tenant_id) == before
    # And a process that never read the policy refuses it the same way
    fresh = _app(pg_url, pg_db, tmp_path, "declared2.toml", own_chains(venue, x, "declared"))
    response = fresh.test_client().post(
        "/v1/deposit-accounts", json={"externalUserId": "after-declared-2"}, headers=tenant.headers
    )
    assert (response.status_code, response.get_json()["code"]) == (400, "unsupported_chain")
    assert _accounts(pg_db, tenant.tenant_id) == before
