"""The sweep as an operator runs it, every command a subprocess: `settle keys new`,
`settle db upgrade`, `settle core worker` crediting 20 deposits on two anvil chains (mined
before its first look), then `settle sweep plan|sign|send|status` and `settle reconcile`.
One `send` is killed (SIGKILL) midway and run again; a second `send` moves nothing; the words from
`settle keys new` give a deposit address's key in eth-account's own BIP44 derivation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from eth_account import Account

from services.core import accounts
from services.core.accounts import NewAccount
from services.core.addresses import AddressDeriver
from services.core.chains import load_chains
from services.core.deposits import states
from services.core.destinations import Destination
from services.core.sweeps.models import CONFIRMED, SENT, Sweep, SweepFunding
from shared.bus import BusNames
from shared.db import Database
from tests.conftest import make_tenant
from tests.support.pipeline import delete_bus, unique_prefix, wait_until
from tests.support.processes import ROOT, SettleProcesses, settle_argv
from tests.support.services import AMQP_URL, create_database, drop_database, require_service
from tests.support.sweeps import DEPTH, USDC, SweepRig, deposits_on, sweep_chains

pytestmark = pytest.mark.e2e

Account.enable_unaudited_hdwallet_features()
RELAY_READY = "outbox relay started"


def _settle(
    env: dict[str, str], *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        settle_argv(*args, "--json"),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _ok(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture
def database() -> Iterator[str]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    name = f"settle_test_sweep_e2e_{os.getpid()}"
    url = create_database(name)
    try:
        yield url
    finally:
        drop_database(name)


def _env(rig: SweepRig, url: str, tmp_path: Path, xpub: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    env.update(
        PYTHONUNBUFFERED="1",
        SETTLE_ENV="dev",
        SETTLE_DATABASE_URL=url,
        SETTLE_DATA_DIR=str(tmp_path / "data"),
        SETTLE_DEPOSIT_XPUB=xpub,
        SETTLE_AMQP_URL=AMQP_URL,
        SETTLE_AMQP_PREFIX=prefix,
        SETTLE_CHAINS_FILE=str(rig.write_chains_file(tmp_path)),
        SETTLE_HOT_WALLET_KEY="0x" + bytes(rig.hot.key).hex(),
        SETTLE_SIMULATED_SETTLEMENT="false",
        SETTLE_TREASURY_ADDRESS=rig.treasury,
        SETTLE_WATCHER_LAG_BLOCKS="0",
        SETTLE_WATCHER_POLL_S="0.2",
        SETTLE_PIPELINE_POLL_S="0.1",
        SETTLE_SETTLE_RETRY_S="0.2",
    )
    for chain_id, node_url in rig.rpc_urls().items():
        env[f"SETTLE_RPC_URL_{chain_id}"] = node_url
    (tmp_path / "data").mkdir(exist_ok=True)
    return env


# About 15 `settle` processes, each importing the service (seconds apiece on a loaded
# machine), a worker crediting 20 deposits and four sends following blocks to depth:
# 1-3 minutes on a quiet machine, more with others' work running.
@pytest.mark.timeout(900)
def test_an_operator_sweeps_two_chains_with_the_commands_and_a_killed_send_resumes(
    database: str, tmp_path: Path
) -> None:
    with sweep_chains() as rig:
        # Given a deposit key made by `settle keys new` and a migrated database
        key_file = tmp_path / "deposit-key.json"
        made = _ok(_settle(dict(os.environ), "keys", "new", "--out", str(key_file)))
        prefix = unique_prefix()
        env = _env(rig, database, tmp_path, made["xpub"], prefix)
        _ok(_settle(env, "db", "upgrade"))
        db = Database(database, pool_size=2)
        try:
            _run(rig, env, db, key_file, tmp_path)
        finally:
            db.dispose()
            delete_bus(BusNames(prefix))


def _run(rig: SweepRig, env: dict[str, str], db: Database, key_file: Path, tmp: Path) -> None:
    registry = load_chains(Path(env["SETTLE_CHAINS_FILE"]))
    deriver = AddressDeriver(env["SETTLE_DEPOSIT_XPUB"])
    tenant_id = make_tenant(db).tenant_id
    # And five accounts per chain (as the API makes them), each sent two deposits
    addresses: dict[int, list[str]] = {}
    for chain_id in rig.chain_ids:
        for n in range(5):
            document = accounts.create_account(
                db,
                registry,
                deriver,
                tenant_id,
                NewAccount(
                    f"e2e-{chain_id}-{n}",
                    Destination(chain_id, rig.wallets[chain_id], rig.tokens[chain_id]),
                ),
                api_key_id=None,
            )
            addresses.setdefault(chain_id, []).append(document["depositAddresses"][0]["address"])
    # And the deposits are mined and buried before any worker looks (a first deployment):
    # the watchers' first look reads back to when the addresses were given out
    deposited: dict[int, dict[str, int]] = {}
    sent: dict[int, list[str]] = {}
    for chain_id, node in rig.nodes.items():
        for n, address in enumerate(addresses[chain_id]):
            for k in (1, 2):
                amount = (11 + 5 * n + k) * USDC + 70_001 * k
                sent.setdefault(chain_id, []).append(
                    node.transfer(rig.tokens[chain_id], rig.customer, address, amount, wait=False)
                )
                held = deposited.setdefault(chain_id, {})
                held[address] = held.get(address, 0) + amount
    for chain_id, node in rig.nodes.items():
        last = max(int(node.wait_mined(h)["blockNumber"], 16) for h in sent[chain_id])
        wait_until(lambda n=node, b=last: n.head() > b + 2 * DEPTH, 30, "blocks on the deposits")
    with SettleProcesses(env, tmp / "logs") as procs:
        (tmp / "logs").mkdir()
        procs.start("core-worker", "core", "worker", ready=RELAY_READY)
        # When `settle core worker` credits the 20 deposits
        try:
            wait_until(
                lambda: all(
                    len(ds) == 10 and {d.status for d in ds} == {states.CREDITED}
                    for ds in (deposits_on(db, c) for c in rig.chain_ids)
                ),
                150,
                "20 credited deposits",
                interval=0.5,
            )
        except AssertionError as timed_out:
            seen = {c: sorted(d.status for d in deposits_on(db, c)) for c in rig.chain_ids}
            raise AssertionError(f"{timed_out}; deposits seen {seen}\n{procs.logs()}") from None
        first, second = rig.chain_ids
        # And the operator plans, signs offline and sends chain one, and the send is
        # killed once it has broadcast
        signed = _plan_and_sign(env, first, key_file, tmp)
        killed = subprocess.Popen(
            settle_argv("sweep", "send", str(signed), "--poll", "0.2", "--json"),
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until(lambda: SENT in _statuses(db, first), 120, "a sweep broadcast", 0.05)
        finally:
            os.killpg(killed.pid, signal.SIGKILL)
            killed.wait(10)
        assert set(_statuses(db, first)) != {CONFIRMED}  # killed midway
        # Then the send run again ends with every deposit at the treasury, once
        resumed = _ok(_settle(env, "sweep", "send", str(signed), "--poll", "0.2"))
        assert resumed["done"] and resumed["counts"] == {CONFIRMED: 5}
        _assert_swept(rig, db, first, deposited[first])
        # And a second send moves nothing
        nonces = [rig.nodes[first].nonce(a) for a in (rig.hot.address, *deposited[first])]
        again = _ok(_settle(env, "sweep", "send", str(signed), "--poll", "0.2"))
        assert again["counts"] == {CONFIRMED: 5}
        assert nonces == [rig.nodes[first].nonce(a) for a in (rig.hot.address, *deposited[first])]
        _assert_swept(rig, db, first, deposited[first])

        # When chain two is swept in one go
        signed_two = _plan_and_sign(env, second, key_file, tmp)
        done = _ok(_settle(env, "sweep", "send", str(signed_two), "--poll", "0.2"))
        assert done["counts"] == {CONFIRMED: 5}
        _assert_swept(rig, db, second, deposited[second])

        # Then `settle sweep status` shows each plan done, and reconcile finds nothing
        # left to sweep and no balance unexplained
        shown = _ok(_settle(env, "sweep", "status"))
        assert [p["sweeps"] for p in shown["plans"]] == [{CONFIRMED: 5}, {CONFIRMED: 5}]
        report = json.loads(_settle(env, "reconcile", "--settle-seconds", "3600", "--json").stdout)
        assert report["unswept"] == []
        assert report["counts"]["balancesChecked"] == 10
        for kind in ("sweep_unconfirmed", "sweep_reorged", "unexplained_balance"):
            assert report["discrepancies"][kind] == []

    # And the words alone give each deposit address's key in eth-account's BIP44
    words = json.loads(key_file.read_text())["mnemonic"]
    with db.reader() as session:
        indices = [
            a.derivation_index
            for a in session.scalars(
                sa.select(accounts.DepositAccount).where(
                    accounts.DepositAccount.tenant_id == tenant_id
                )
            )
        ]
    recovered = {
        Account.from_mnemonic(words, account_path=f"m/44'/60'/0'/0/{i}").address for i in indices
    }
    assert recovered == {a for per_chain in addresses.values() for a in per_chain}


def _plan_and_sign(env: dict[str, str], chain_id: int, key_file: Path, tmp: Path) -> Path:
    plan_file, signed_file = tmp / f"plan-{chain_id}.json", tmp / f"signed-{chain_id}.json"
    planned = _ok(_settle(env, "sweep", "plan", "--chain", str(chain_id), "--out", str(plan_file)))
    assert (planned["addresses"], planned["transfers"]) == (5, 5)
    # Offline: the signer's environment has no database, node or Settle setting at all
    offline = {k: v for k, v in env.items() if not k.startswith("SETTLE_")}
    offline["SETTLE_DATA_DIR"] = str(tmp / "nowhere")
    signed = _ok(
        _settle(
            offline,
            "sweep",
            "sign",
            "--plan",
            str(plan_file),
            "--key-file",
            str(key_file),
            "--expect-destination",
            env["SETTLE_TREASURY_ADDRESS"],
            "--out",
            str(signed_file),
        )
    )
    assert (signed["planId"], signed["transactions"]) == (planned["planId"], 5)
    return signed_file


def _statuses(db: Database, chain_id: int) -> list[str]:
    with db.reader() as session:
        return list(session.scalars(sa.select(Sweep.status).where(Sweep.chain_id == chain_id)))


def _assert_swept(rig: SweepRig, db: Database, chain_id: int, deposited: dict[str, int]) -> None:
    node, token = rig.nodes[chain_id], rig.tokens[chain_id]
    assert node.balance_of(token, rig.treasury) == sum(deposited.values())
    assert all(node.balance_of(token, a) == 0 for a in deposited)
    with db.reader() as session:
        sweeps = list(session.scalars(sa.select(Sweep).where(Sweep.chain_id == chain_id)))
        fundings = list(
            session.scalars(sa.select(SweepFunding).where(SweepFunding.chain_id == chain_id))
        )
    assert {s.deposit_address: int(s.amount_raw) for s in sweeps} == deposited
    assert sorted(f.deposit_address for f in fundings) == sorted(deposited)  # one each
    credits = sum(Decimal(d.credit_amount or 0) for d in deposits_on(db, chain_id))
    assert node.balance_of(token, rig.wallets[chain_id]) == int(credits * USDC)
