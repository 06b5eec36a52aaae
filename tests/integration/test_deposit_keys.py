"""Deposit keys on PostgreSQL: every address names the key that derived it, a `bip44` key
gives an account one address on every chain, and a rotation moves no address."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from eth_account import Account
from flask import Flask

from services.core.addresses import BIP44, CHAIN_INDEX
from services.core.app import create_app
from services.core.backfill import backfill_addresses
from services.core.context import CoreContext
from services.core.keyfiles import SigningKey, new_mnemonic
from services.core.models import DepositAccount, DepositAddress, DepositKey
from shared.db import Database
from tests.conftest import TenantKeys, core_config
from tests.integration.conftest import create_account, put_policy
from tests.support import keys
from tests.support.backfill import shipped_with, write_chains
from tests.support.deposits import unique_chain_id

pytestmark = pytest.mark.integration

Account.enable_unaudited_hdwallet_features()


def _app(pg_url: str, pg_db: Database, folder: Path, **overrides: Any) -> tuple[Flask, CoreContext]:
    context = CoreContext.build(
        core_config(pg_url, folder, **overrides), db=pg_db, identity_db=pg_db
    )
    app = create_app(context=context)
    app.testing = True
    return app, context


def _rows(db: Database, external_user_id: str) -> dict[int, tuple[str, str, str]]:
    """{chain id: (address, key scheme, key xpub)} of an account's addresses."""
    with db.reader() as session:
        rows = session.execute(
            sa.select(
                DepositAddress.chain_id, DepositAddress.address, DepositKey.scheme, DepositKey.xpub
            )
            .join(DepositAccount, DepositAccount.pk == DepositAddress.account_pk)
            .join(DepositKey, DepositKey.id == DepositAddress.key_id)
            .where(DepositAccount.external_user_id == external_user_id)
        )
        return {chain_id: (address, scheme, xpub) for chain_id, address, scheme, xpub in rows}


def test_a_bip44_key_gives_an_account_one_address_on_every_chain_recorded_with_its_key(
    pg_url: str, pg_db: Database, tenant: TenantKeys, tmp_path: Path
) -> None:
    # Given Settle configured with the xpub of `settle keys new`
    words = new_mnemonic()
    xpub = SigningKey.from_mnemonic(words).xpub
    app, _ = _app(pg_url, pg_db, tmp_path, deposit_xpub=xpub)
    client = app.test_client()
    put_policy(client, tenant)
    # When two accounts are created
    first, second = create_account(client, tenant), create_account(client, tenant)
    for account in (first, second):
        shown = {a["address"] for a in account["depositAddresses"]}
        # Then each has one address, shown on every chain, at its BIP44 index
        (address,) = shown
        rows = _rows(pg_db, account["externalUserId"])
        assert set(rows) == {1, 137, 8453}
        assert set(rows.values()) == {(address, BIP44, xpub)}
        with pg_db.reader() as session:
            index = (
                session.scalars(sa.select(DepositAccount).where(DepositAccount.id == account["id"]))
                .one()
                .derivation_index
            )
        path = f"m/44'/60'/0'/0/{index}"
        assert Account.from_mnemonic(words, account_path=path).address == address
        # And the account is found by that address
        found = client.get(
            "/v1/deposit-accounts", query_string={"depositAddress": address}, headers=tenant.headers
        ).get_json()["depositAccounts"]
        assert [a["id"] for a in found] == [account["id"]]
    assert first["depositAddresses"][0]["address"] != second["depositAddresses"][0]["address"]


def test_a_rotated_key_moves_no_address_and_new_addresses_name_the_new_key(
    pg_url: str, pg_db: Database, tenant: TenantKeys, tmp_path: Path
) -> None:
    # Given accounts made with the older root key while chain X is declared
    x = unique_chain_id()
    old_file, _ = write_chains(tmp_path, "old.toml", shipped_with(x, "declared"))
    new_file, _ = write_chains(tmp_path, "new.toml", shipped_with(x, "active"))
    old_app, _ = _app(pg_url, pg_db, tmp_path, chains_file=old_file)
    put_policy(old_app.test_client(), tenant)
    before = create_account(old_app.test_client(), tenant)
    old_rows = _rows(pg_db, before["externalUserId"])
    assert {row[1:] for row in old_rows.values()} == {(CHAIN_INDEX, keys.test_xpub())}

    # When the deposit key is rotated to a bip44 key and chain X becomes active
    new_xpub = SigningKey.from_mnemonic(new_mnemonic()).xpub
    new_app, new_context = _app(
        pg_url, pg_db, tmp_path, chains_file=new_file, deposit_xpub=new_xpub
    )
    backfill_addresses(pg_db, new_context.registry, new_context.deriver)
    after = create_account(new_app.test_client(), tenant)

    # Then the old account keeps every address with its old key, and its address on X
    # (derived after the rotation) names the new key
    rows = _rows(pg_db, before["externalUserId"])
    assert {c: rows[c] for c in old_rows} == old_rows
    assert rows[x][1:] == (BIP44, new_xpub)
    # And a new account's addresses all name the new key
    assert {row[1:] for row in _rows(pg_db, after["externalUserId"]).values()} == {
        (BIP44, new_xpub)
    }
