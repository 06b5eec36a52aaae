"""The deposit address backfill on real PostgreSQL: a chain turned active gives existing
accounts an address, exactly once, alongside concurrent runners and account creation.

Passes here start above the highest pk that existed before the test (`after_pk`), so
they touch only this test's accounts in the shared database.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from services.core import deposit_keys
from services.core.app import create_app
from services.core.backfill import backfill_addresses, backfill_batch
from services.core.chains import ChainRegistry
from services.core.context import CoreContext
from services.core.models import DepositAccount, DepositAddress
from shared.db import Database
from tests.conftest import TenantKeys, core_config
from tests.integration.conftest import create_account, outbox_events, put_policy
from tests.support.backfill import own_chains, shipped_with, write_chains
from tests.support.deposits import make_account, unique_chain_id

pytestmark = pytest.mark.integration

#: Bound on every wait for a thread.
JOIN_S = 30.0


def _max_pk(db: Database) -> int:
    with db.reader() as session:
        return int(session.scalar(sa.select(sa.func.max(DepositAccount.pk))) or 0)


def _address_indices(db: Database) -> dict[int, int]:
    """Each account's BIP32 index, by pk."""
    with db.reader() as session:
        rows = session.scalars(sa.select(DepositAccount))
        return {row.pk: row.derivation_index for row in rows}


def _addresses(db: Database, after_pk: int) -> dict[int, dict[int, tuple[str, int]]]:
    """{account pk: {chain id: (address, position)}} for accounts above `after_pk`."""
    out: dict[int, dict[int, tuple[str, int]]] = {}
    with db.reader() as session:
        pks = session.scalars(sa.select(DepositAccount.pk).where(DepositAccount.pk > after_pk))
        for pk in pks:
            out[pk] = {}
        rows = session.execute(
            sa.select(
                DepositAddress.account_pk,
                DepositAddress.chain_id,
                DepositAddress.address,
                DepositAddress.position,
            ).where(DepositAddress.account_pk > after_pk)
        )
        for pk, chain_id, address, position in rows:
            out[pk][chain_id] = (address, position)
    return out


def _context(pg_url: str, pg_db: Database, folder: Path, chains_file: Path) -> CoreContext:
    config = core_config(pg_url, folder, chains_file=chains_file)
    return CoreContext.build(config, db=pg_db, identity_db=pg_db)


def _app(context: CoreContext) -> Flask:
    app = create_app(context=context)
    app.testing = True
    return app


def _get(app: Flask, tenant: TenantKeys, uid: str) -> dict[str, Any]:
    response = app.test_client().get(f"/v1/deposit-accounts/{uid}", headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    account: dict[str, Any] = response.get_json()["depositAccount"]
    return account


def test_an_activated_chain_reaches_existing_accounts(
    pg_url: str, pg_db: Database, tenant: TenantKeys, tmp_path: Path
) -> None:
    # Given accounts created while chain X is declared
    x = unique_chain_id()
    old_file, _ = write_chains(tmp_path, "old.toml", shipped_with(x, "declared"))
    new_file, _ = write_chains(tmp_path, "new.toml", shipped_with(x, "active"))
    old = _context(pg_url, pg_db, tmp_path, old_file)
    old_app = _app(old)
    floor = _max_pk(pg_db)
    client = old_app.test_client()
    put_policy(client, tenant)
    uids = [create_account(client, tenant)["externalUserId"] for _ in range(3)]
    events_before = outbox_events(pg_db, tenant.tenant_id)

    # And a deploy where X is active: the GET shows no address on X yet
    new = _context(pg_url, pg_db, tmp_path, new_file)
    new_app = _app(new)
    assert [a["chainId"] for a in _get(new_app, tenant, uids[0])["depositAddresses"]] == [
        1,
        137,
        8453,
    ]

    # When the backfill runs
    result = backfill_addresses(pg_db, new.registry, new.deriver, after_pk=floor, batch=2)

    # Then each account got exactly the address creation would have derived, at X's position
    stored = _addresses(pg_db, floor)
    indices = _address_indices(pg_db)
    assert len(stored) == 3
    assert result.accounts_scanned == 3
    assert result.addresses_added == 3
    assert result.accounts_changed == 3
    assert result.watermark == max(stored)
    assert result.complete
    for pk, chains in stored.items():
        assert set(chains) == {1, x, 137, 8453}
        assert chains[x] == (new.deriver.derive(x, indices[pk]), new.registry.position(x))
        assert chains[x][1] == 1

    # And the GET lists it in chains-file order, with X's assets
    for uid in uids:
        listed = _get(new_app, tenant, uid)["depositAddresses"]
        assert [a["chainId"] for a in listed] == [1, x, 137, 8453]
        assert listed[1]["assets"] == ["USDC"]
    # (the old deploy still hides the declared chain)
    assert [a["chainId"] for a in _get(old_app, tenant, uids[0])["depositAddresses"]] == [
        1,
        137,
        8453,
    ]

    # And no event was written for it
    assert outbox_events(pg_db, tenant.tenant_id) == events_before

    # When it runs again, Then it adds nothing
    again = backfill_addresses(pg_db, new.registry, new.deriver, after_pk=floor)
    assert (again.accounts_scanned, again.addresses_added, again.accounts_changed) == (3, 0, 0)
    assert again.watermark == result.watermark
    assert _addresses(pg_db, floor) == stored

    # And an account created on the new deploy already has X: nothing to add for it
    uid = create_account(new_app.test_client(), tenant)["externalUserId"]
    assert [a["chainId"] for a in _get(new_app, tenant, uid)["depositAddresses"]] == [
        1,
        x,
        137,
        8453,
    ]
    last = backfill_addresses(pg_db, new.registry, new.deriver, after_pk=floor)
    assert (last.accounts_scanned, last.addresses_added) == (4, 0)

    # And an incremental pass above the watermark scans nothing older
    tail = backfill_addresses(pg_db, new.registry, new.deriver, after_pk=last.watermark)
    assert (tail.accounts_scanned, tail.addresses_added, tail.watermark) == (0, 0, last.watermark)


def _own_registries(tmp_path: Path) -> tuple[int, int, ChainRegistry, ChainRegistry]:
    venue, x = unique_chain_id(), unique_chain_id()
    _, old = write_chains(tmp_path, "old.toml", own_chains(venue, x, "declared"))
    _, new = write_chains(tmp_path, "new.toml", own_chains(venue, x, "active"))
    return venue, x, old, new


def test_a_concurrent_runner_waits_and_adds_nothing_twice(
    pg_db: Database, core_context: CoreContext, tmp_path: Path
) -> None:
    # Given accounts lacking chain X
    venue, x, old, new = _own_registries(tmp_path)
    deriver = core_context.deriver
    key = deposit_keys.recorded(pg_db, deriver.xpub, deriver.scheme)
    floor = _max_pk(pg_db)
    tenant_id = "ten_backfill_race"
    for _ in range(5):
        make_account(pg_db, tenant_id, old, dest_chain_id=venue)

    # When one runner has inserted a batch but not committed, and a second runner starts
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            outcome["result"] = backfill_addresses(pg_db, new, deriver, after_pk=floor)
        except Exception as exc:  # reported below; a thread cannot fail the test itself
            outcome["error"] = exc

    with pg_db.transaction() as session:
        scanned, added, _, _ = backfill_batch(session, new, deriver, key_id=key.id, after_pk=floor)
        assert (scanned, added) == (5, 5)
        runner = threading.Thread(target=second)
        runner.start()
        # Then the second waits on the first's rows (same (account_pk, chain_id) keys)
        runner.join(0.5)
        assert runner.is_alive()
    # And once the first commits it finishes without an error and without adding any
    runner.join(JOIN_S)
    assert not runner.is_alive()
    assert "error" not in outcome, outcome
    assert outcome["result"].addresses_added == 0
    assert outcome["result"].accounts_scanned == 5
    stored = _addresses(pg_db, floor)
    indices = _address_indices(pg_db)
    assert all(chains[x][0] == deriver.derive(x, indices[pk]) for pk, chains in stored.items())


def test_runners_and_account_creation_at_once_add_each_address_once(
    pg_db: Database, core_context: CoreContext, tmp_path: Path
) -> None:
    # Given accounts lacking X, and more being created (by old and new deploys) meanwhile
    venue, x, old, new = _own_registries(tmp_path)
    deriver = core_context.deriver
    floor = _max_pk(pg_db)
    tenant_id = "ten_backfill_mix"
    for _ in range(40):
        make_account(pg_db, tenant_id, old, dest_chain_id=venue)

    results: list[Any] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def runner(batch: int) -> None:
        try:
            start.wait(JOIN_S)
            for _ in range(3):
                results.append(backfill_addresses(pg_db, new, deriver, after_pk=floor, batch=batch))
        except BaseException as exc:
            errors.append(exc)

    def creator(registry: ChainRegistry) -> None:
        try:
            start.wait(JOIN_S)
            for _ in range(15):
                make_account(pg_db, tenant_id, registry, dest_chain_id=venue)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=runner, args=(7,)),
        threading.Thread(target=runner, args=(11,)),
        threading.Thread(target=creator, args=(old,)),
        threading.Thread(target=creator, args=(new,)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    assert errors == []

    # When a last pass runs after the old deploy stopped creating accounts
    final = backfill_addresses(pg_db, new, deriver, after_pk=floor)

    # Then every account has X's derived address, and each was added exactly once in all
    stored = _addresses(pg_db, floor)
    indices = _address_indices(pg_db)
    assert len(stored) == 70
    for pk, chains in stored.items():
        assert set(chains) == {venue, x}
        assert chains[x] == (deriver.derive(x, indices[pk]), new.position(x))
    lacking = 40 + 15  # the accounts created without X
    assert sum(r.addresses_added for r in [*results, final]) == lacking
    assert final.accounts_scanned == 70


def test_the_worker_loop_stops_promptly(pg_url: str, pg_db: Database, tmp_path: Path) -> None:
    # Given the backfill task of a worker with a long interval, past its first pass
    from services.core.worker import core_tasks

    venue, x, old, _ = _own_registries(tmp_path)
    new_file, _ = write_chains(tmp_path, "new.toml", own_chains(venue, x, "active"))
    account = make_account(pg_db, "ten_backfill_loop", old, dest_chain_id=venue)
    config = core_config(
        pg_url,
        tmp_path,
        chains_file=new_file,
        address_backfill_interval_s=3600,
        amqp_url="amqp://guest:guest@127.0.0.1:5672/%2F",  # required by core_tasks, unused here
    )
    ctx = CoreContext.build(config, db=pg_db, identity_db=pg_db)
    (task,) = [t for t in core_tasks(ctx) if t.name == "address-backfill"]
    stop = threading.Event()
    thread = threading.Thread(target=task.run, args=(stop,))
    thread.start()
    deadline = time.monotonic() + JOIN_S
    while x not in _addresses(pg_db, account.pk - 1)[account.pk]:
        assert time.monotonic() < deadline, "the first pass never added the address"
        time.sleep(0.05)

    # When it is told to stop, Then it returns at once (not after the interval)
    began = time.monotonic()
    stop.set()
    thread.join(JOIN_S)
    assert not thread.is_alive()
    assert time.monotonic() - began < 2.0
