"""The deposit address backfill, each test on a database of its own (a pass scans every
account): the pass, the worker loop (transient failures, incremental passes) and the CLI."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from services import cli
from services.core import backfill
from services.core.backfill import backfill_addresses, run_address_backfill
from services.core.chains import ChainRegistry
from services.core.context import CoreContext
from services.core.models import DepositAddress
from shared import components, migrate
from shared.db import Database
from tests.conftest import core_config
from tests.support import keys
from tests.support.backfill import own_chains, write_chains
from tests.support.deposits import make_account
from tests.support.services import create_database, drop_database

VENUE, NEW = 777_001, 777_002
TENANT = "ten_backfill_runs"
#: Bound on every wait.
WAIT_S = 20.0


@pytest.fixture
def empty_url() -> Iterator[str]:
    """A database of this test's own, with no tables yet."""
    name = f"settle_test_backfill_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    yield create_database(name)
    drop_database(name)


def _migrated(url: str) -> Database:
    migrate.upgrade(components.CORE, url)
    return Database(url, pool_size=2)


def _registries(folder: Path) -> tuple[Path, ChainRegistry, ChainRegistry]:
    _, old = write_chains(folder, "old.toml", own_chains(VENUE, NEW, "declared"))
    new_file, new = write_chains(folder, "new.toml", own_chains(VENUE, NEW, "active"))
    return new_file, old, new


def _new_chain_addresses(db: Database) -> dict[int, tuple[str, int]]:
    with db.reader() as session:
        rows = session.execute(
            sa.select(
                DepositAddress.account_pk, DepositAddress.address, DepositAddress.position
            ).where(DepositAddress.chain_id == NEW)
        )
        return {pk: (address, position) for pk, address, position in rows}


def _wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_pass_in_small_chunks(
    empty_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given accounts created while the new chain was declared (and tiny INSERT chunks)
    monkeypatch.setattr(backfill, "INSERT_CHUNK", 2)
    db = _migrated(empty_url)
    new_file, old, new = _registries(tmp_path)
    ctx = CoreContext.build(core_config(db.url, tmp_path, chains_file=new_file), db=db)
    made = [make_account(db, TENANT, old, dest_chain_id=VENUE) for _ in range(5)]
    pks = [account.pk for account in made]

    # When the backfill runs, Then each gets the derived address at the chain's position
    result = backfill_addresses(db, new, ctx.deriver, batch=3)
    assert (result.accounts_scanned, result.addresses_added, result.accounts_changed) == (5, 5, 5)
    assert result.watermark == max(pks) and result.complete
    assert _new_chain_addresses(db) == {
        a.pk: (ctx.deriver.derive(NEW, a.address_index), 1) for a in made
    }

    # And a second run adds nothing
    again = backfill_addresses(db, new, ctx.deriver)
    assert (again.accounts_scanned, again.addresses_added) == (5, 0)
    db.dispose()


def test_the_worker_loop_survives_a_failing_database_and_catches_up(
    empty_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the loop started on a database that is not usable yet (no tables)
    caplog.set_level(logging.INFO, logger="services.core.backfill")
    new_file, old, _ = _registries(tmp_path)
    db = Database(empty_url, pool_size=2)
    config = core_config(db.url, tmp_path, chains_file=new_file, address_backfill_interval_s=0.1)
    ctx = CoreContext.build(config, db=db)
    stop = threading.Event()
    thread = threading.Thread(target=run_address_backfill, args=(ctx, stop))
    thread.start()
    try:
        _wait_for(
            lambda: any("address backfill failed" in r.message for r in caplog.records),
            "a logged failure",
        )
        assert thread.is_alive()

        # When the database comes up with accounts lacking the new chain
        migrate.upgrade(components.CORE, db.url)
        first = [make_account(db, TENANT, old, dest_chain_id=VENUE).pk for _ in range(3)]

        # Then the next round's full pass gives them their addresses
        _wait_for(lambda: set(_new_chain_addresses(db)) == set(first), "the full pass")

        # And accounts an old deploy creates later are picked up by incremental passes
        later = [make_account(db, TENANT, old, dest_chain_id=VENUE) for _ in range(2)]
        later_pks = {a.pk for a in later}
        _wait_for(
            lambda: set(_new_chain_addresses(db)) == {*first, *later_pks}, "an incremental pass"
        )
        assert any("incremental pass" in r.message for r in caplog.records)
        assert _new_chain_addresses(db)[later[0].pk][0] == ctx.deriver.derive(
            NEW, later[0].address_index
        )
    finally:
        stop.set()
        thread.join(WAIT_S)
    assert not thread.is_alive()
    db.dispose()


def test_the_cli_runs_one_pass_and_prints_the_counts(
    empty_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a dev database with accounts lacking the new chain
    db = _migrated(empty_url)
    new_file, old, _ = _registries(tmp_path)
    pks = [make_account(db, TENANT, old, dest_chain_id=VENUE).pk for _ in range(3)]
    monkeypatch.setenv("SETTLE_ENV", "dev")
    monkeypatch.setenv("SETTLE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SETTLE_DATABASE_URL", db.url)
    monkeypatch.setenv("SETTLE_CHAINS_FILE", str(new_file))
    monkeypatch.setenv("SETTLE_DEPOSIT_XPUB", keys.test_xpub())

    # When `settle core backfill-addresses` runs twice
    assert cli.main(["core", "backfill-addresses", "--batch", "2"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert cli.main(["core", "backfill-addresses"]) == 0
    second = json.loads(capsys.readouterr().out)

    # Then it reports what it added, then nothing more
    assert first == {
        "accountsScanned": 3,
        "addressesAdded": 3,
        "accountsChanged": 3,
        "watermark": max(pks),
        "complete": True,
    }
    assert (second["accountsScanned"], second["addressesAdded"]) == (3, 0)
    assert set(_new_chain_addresses(db)) == set(pks)
    db.dispose()
