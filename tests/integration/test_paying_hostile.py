"""Paying exactly once when the world is hostile, part two: on a real node (anvil).

The real pipeline (watcher, settling, `EvmPayer` over the real `Erc20TransferExecutor`)
on PostgreSQL, paying from one of anvil's funded accounts with automine off, so a
payout sits in the node's pool until the test mines. Every test counts what reached
the chain: the destination's token balance, the hot wallet's nonce.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from services import cli
from services.core.context import CoreContext
from services.core.deposits import incidents as incident_kinds
from services.core.deposits import payout_tag, states
from services.core.deposits.metrics import ChainCollector
from services.core.deposits.models import HotWalletNonce
from services.core.deposits.payout_audit import PayoutScanner
from services.core.deposits.settlement import EvmPayer
from services.core.deposits.worker import build_pipeline
from services.core.evm import Web3ChainReader
from shared.audit import log as audit
from shared.db import Database
from shared.timefmt import iso_ms, utcnow
from tests.conftest import TenantKeys, core_config, make_tenant
from tests.support.anvil import AnvilNode
from tests.support.deposits import chains_toml, events_of
from tests.support.paying import (
    DEPTH,
    FEE_RAW,
    USDC,
    PayingRig,
    anvil_rig,
    new_watcher,
    with_settings,
)
from tests.support.pipeline import isolated_database
from tests.support.services import clone_database, drop_database

pytestmark = pytest.mark.integration

GWEI = 10**9


@pytest.fixture
def rig(pg_db: Database, tenant: TenantKeys) -> Iterator[PayingRig]:
    with anvil_rig(pg_db, tenant.tenant_id) as running:
        yield running


def gauge(db: Database, name: str, chain_id: int, **labels: str) -> float:
    """A chain gauge's value (0 when absent)."""
    for family in ChainCollector(db).collect():
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.labels.get("chain_id") == str(chain_id) and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return sample.value
    return 0


def cancel_with_nonce(rig: PayingRig, nonce: int, fee_wei: int) -> str:
    """Another transaction from the hot wallet with `nonce` (a 0-value transfer to itself):
    what ops do to make a pending payment unminable."""
    return rig.node.send(
        rig.hot,
        {
            "to": rig.hot.address,
            "gas": 21_000,
            "nonce": nonce,
            "maxFeePerGas": fee_wei,
            "maxPriorityFeePerGas": fee_wei // 2,
        },
    )


# -- 1. a restore from a backup taken before a payout ----------------------------------------


def test_a_restore_from_before_a_payout_pays_nothing_twice_until_ops_resolve_the_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with isolated_database("restore") as url:
        live = url.rsplit("/", 1)[1]
        backup = f"{live}_backup"
        db = Database(url, pool_size=2)
        tenant_id = make_tenant(db).tenant_id
        try:
            with anvil_rig(db, tenant_id) as rig:
                first = rig.deposit(100 * USDC)
                # Given a backup taken while the deposit waited to be paid
                db.dispose()
                clone_database(live, backup)
                # and the deposit then paid
                pipeline = rig.pipeline(rig.parts())
                rig.run_until(pipeline, first, states.CREDITED)
                assert rig.paid() == 100 * USDC - FEE_RAW
                (payout,) = [p["tx_hashes"][0] for p in rig.payments(first)]
                assert rig.hot_nonce() == 1

                # When the database is restored from that backup
                db.dispose()
                drop_database(live)
                clone_database(backup, live)
                restored = Database(url, pool_size=2)
                rig.db = restored
                assert rig.status(first) == states.SOURCE_CONFIRMED
                parts = rig.parts()
                pipeline = rig.pipeline(parts)
                rig.rounds(pipeline, 4)

                # Then nothing is paid again: the chain's nonce is ahead of Settle's count
                assert rig.paid() == 100 * USDC - FEE_RAW
                assert rig.hot_nonce() == 1
                (gap,) = rig.incidents(incident_kinds.NONCE_GAP)
                assert "nonces 0 to 0" in gap.detail
                assert gap.facts is not None
                assert (gap.facts["settleNextNonce"], gap.facts["chainNonce"]) == (0, 1)
                waiting = rig.row(first)
                assert waiting.status == states.SOURCE_CONFIRMED
                assert waiting.wait_reason == states.WAIT_PAYMENTS_PAUSED
                assert gauge(restored, "settle_chain_incidents_open", rig.chain_id) == 1

                # And the operator's commands (the restore runbook, docs/RECONCILE.md)
                chains = tmp_path / "chains.toml"
                chains.write_text(chains_toml(chain_id=rig.chain_id, depth=DEPTH, usdc=rig.token))
                for name, value in {
                    "SETTLE_DATABASE_URL": url,
                    "SETTLE_ENV": "dev",
                    "SETTLE_CHAINS_FILE": str(chains),
                    f"SETTLE_RPC_URL_{rig.chain_id}": rig.node.url,
                    "SETTLE_HOT_WALLET_KEY": rig.hot.key.hex(),
                }.items():
                    monkeypatch.setenv(name, value)
                capsys.readouterr()
                # reconcile lists the payout Settle has no record of, naming its deposit
                window = ["--since", iso_ms(utcnow() - timedelta(hours=1)), "--json"]
                code = cli.main(["reconcile", *window, "--settle-seconds", "3600"])
                report = json.loads(capsys.readouterr().out)
                (unrecorded,) = report["discrepancies"]["unrecorded_payment"]
                assert code == 1 and report["counts"]["payoutsChecked"] == 1
                assert unrecorded["subject"] == payout and unrecorded["tenantId"] == tenant_id
                assert f"deposit {first} (source_confirmed)" in unrecorded["detail"]
                # the incident cannot be resolved while that deposit shows unpaid
                resolve = ["incidents", "resolve", str(gap.id), "--by", "ops-ann"]
                assert cli.main([*resolve, "--reason", "restored from backup"]) == 2
                refused = capsys.readouterr().err
                assert f"settle deposits credit {first} --tx {payout}" in refused
                # ops credit it with the payout the chain shows; reconcile is clean of it
                code = cli.main(["deposits", "credit", first, "--tx", payout, "--by", "ops-ann"])
                assert code == 0, capsys.readouterr().err
                capsys.readouterr()
                cli.main(["reconcile", *window, "--settle-seconds", "3600"])
                report = json.loads(capsys.readouterr().out)
                assert report["discrepancies"]["unrecorded_payment"] == []
                # and the incident is resolved
                assert cli.main([*resolve, "--reason", "restored; credited"]) == 0

                # Then paying resumes, after the nonces the chain used: the next deposit is
                # paid once, with nonce 1
                second = rig.deposit(40 * USDC)
                rig.run_until(pipeline, second, states.CREDITED)
                assert rig.paid() == 140 * USDC - 2 * FEE_RAW
                assert [p["nonce"] for p in rig.payments(second)] == [1]
                assert rig.credited_events(first) == 1
                with restored.reader() as session:
                    (counter,) = session.scalars(
                        sa.select(HotWalletNonce.next_nonce).where(
                            HotWalletNonce.chain_id == rig.chain_id
                        )
                    )
                assert counter == 2
                restored.dispose()
        finally:
            db.dispose()
            drop_database(backup)


def test_a_payout_mined_in_the_same_second_before_a_windows_end_is_in_the_window(
    rig: PayingRig,
) -> None:
    """A block's timestamp is whole seconds and a window's end is not: a block stamped T
    is before an end at T + 0.5 s, so `settle reconcile` (whose end is now by default)
    reads the payout mined a moment before it ran."""
    rig.node.mine()
    block = rig.node.w3.eth.block_number
    stamped = int(rig.node.w3.eth.get_block(block)["timestamp"])
    chain = rig.registry.get(rig.chain_id)
    assert chain is not None
    reader = Web3ChainReader.from_url(rig.node.url, 5.0, rig.chain_id)
    scanner = PayoutScanner(reader, chain, rig.hot.address)
    assert scanner.first_block_at(datetime.fromtimestamp(stamped + 0.5, UTC)) > block
    assert scanner.first_block_at(datetime.fromtimestamp(stamped, UTC)) <= block


def test_a_wallet_that_sent_before_settle_ever_paid_from_it_is_a_gap_too(rig: PayingRig) -> None:
    # Given a hot wallet that already sent a transaction Settle has no record of (a
    # database restored from before Settle's first payout from it looks just the same)
    rig.node.send(rig.hot, {"to": rig.hot.address, "gas": 21_000})
    rig.node.mine()
    deposit_id = rig.deposit(30 * USDC)
    # When the deposit settles
    rig.rounds(rig.pipeline(rig.parts()), 3)
    # Then nothing is paid and the gap is an incident
    assert rig.paid() == 0 and rig.hot_nonce() == 1
    (gap,) = rig.incidents(incident_kinds.NONCE_GAP)
    assert gap.facts is not None and gap.facts["chainNonce"] == 1
    assert rig.row(deposit_id).wait_reason == states.WAIT_PAYMENTS_PAUSED


def test_a_payout_carries_a_tag_naming_its_deposit_on_chain(rig: PayingRig) -> None:
    deposit_id = rig.deposit(25 * USDC)
    rig.run_until(rig.pipeline(rig.parts()), deposit_id, states.CREDITED)
    (payment,) = rig.payments(deposit_id)
    tx = rig.node.rpc("eth_getTransactionByHash", payment["tx_hashes"][0])
    tag = payout_tag.decode(bytes.fromhex(tx["input"][2:]))
    assert tag is not None and tag.deposit_id == deposit_id
    assert tag == payout_tag.tag_for(rig.row(deposit_id))


# -- 2. replaced payments ------------------------------------------------------------------


def _nonce_taken_before_a_replacement(rig: PayingRig) -> tuple[str, int]:
    """A payment whose nonce another transaction took, then replaced (the replacement
    signed after that transaction was mined, before it was deep); its deposit, nonce."""
    deposit_id = rig.deposit(60 * USDC)
    pipeline = rig.pipeline(rig.parts(with_settings(payment_replace_blocks=2)))
    pipeline.settle_round()
    (payment,) = rig.payments(deposit_id)
    nonce = payment["nonce"]
    # Given another transaction takes its nonce and is mined
    cancel_with_nonce(rig, nonce, 50 * GWEI)
    rig.node.mine()
    # and the payment is replaced (the market rose) before that is as deep as the
    # chain's depth
    rig.node.set_next_base_fee(30 * GWEI)
    rig.node.mine()
    pipeline.settle_round()
    (payment,) = rig.payments(deposit_id)
    assert len(payment["tx_hashes"]) == 2, "the test needs a replacement signed after the cancel"
    rig.node.mine(DEPTH + 1)
    return deposit_id, nonce


def test_a_payment_whose_nonce_was_taken_before_its_replacement_is_judged_failed(
    rig: PayingRig,
) -> None:
    deposit_id, nonce = _nonce_taken_before_a_replacement(rig)
    # When the pipeline judges it, the search for what used its nonce starts from its
    # first transaction's block (not the replacement's): it can never be mined, failed,
    # and a new payment (the next nonce) pays the credit once
    rig.run_until(rig.pipeline(rig.parts()), deposit_id, states.CREDITED)
    assert rig.paid() == 60 * USDC - FEE_RAW
    first, second = rig.payments(deposit_id)
    assert (first["nonce"], first["outcome"]) == (nonce, "failed")
    assert (second["nonce"], second["outcome"]) == (nonce + 1, "mined")
    assert rig.credited_events(deposit_id) == 1


def test_ops_may_fail_a_replaced_payment_whose_nonce_was_taken(rig: PayingRig) -> None:
    deposit_id, _ = _nonce_taken_before_a_replacement(rig)
    ops = rig.parts(with_settings(ops_stuck_after_s=0.0)).ops
    deposit = ops.fail(deposit_id, "cancelled by ops", by="ops-ann")
    assert deposit.status == states.FAILED
    assert rig.paid() == 0


# -- 3. fee bumps ------------------------------------------------------------------------------


def test_a_payment_the_node_keeps_losing_is_sent_again_not_bid_up(
    pg_db: Database, tenant: TenantKeys
) -> None:
    from tests.support.rpc_proxy import RpcProxy

    with anvil_rig(pg_db, tenant.tenant_id) as rig, RpcProxy(rig.node.url, hold_s=2) as proxy:
        deposit_id = rig.deposit(45 * USDC)
        # Given a node that takes every broadcast and loses it, in a market that stays put
        proxy.drop_sends(times=None)
        pipeline = rig.pipeline(rig.parts(url=proxy.url))
        rig.rounds(pipeline, 20)
        # Then the payment was never re-priced above the market: it is the same
        # transaction, sent again (a replacement at +12.5 % a time reached 3.65x)
        (payment,) = rig.payments(deposit_id)
        assert len(payment["tx_hashes"]) == 1
        assert proxy.count("eth_sendRawTransaction") >= 10
        # And once the node keeps it, it lands, once
        proxy.clear()
        rig.run_until(pipeline, deposit_id, states.CREDITED)
        assert rig.paid() == 45 * USDC - FEE_RAW


def test_replacements_follow_the_market_up_to_the_cap_then_wait_and_alert(
    rig: PayingRig, caplog: pytest.LogCaptureFixture
) -> None:
    deposit_id = rig.deposit(55 * USDC)
    cap_gwei = 60
    settings = with_settings(
        payment_replace_blocks=2,
        payment_max_fee_gwei={rig.chain_id: Decimal(cap_gwei)},
        payment_max_replacements=10,
    )
    pipeline = rig.pipeline(rig.parts(settings))
    pipeline.settle_round()
    (payment,) = rig.payments(deposit_id)
    offers = [int(payment["tx"]["maxFeePerGas"])]
    # Given the market rises past what the payment offers, and on past the cap (the
    # node drops a payment under the base fee: it is sent again, and replaced when due)
    market = []
    for base_gwei in (5, 5, 12, 12, 26, 26, 70, 70, 70, 70):
        rig.node.set_next_base_fee(base_gwei * GWEI)
        rig.node.mine()
        pipeline.settle_round()
        (payment,) = rig.payments(deposit_id)
        if int(payment["tx"]["maxFeePerGas"]) != offers[-1]:
            offers.append(int(payment["tx"]["maxFeePerGas"]))
            market.append(base_gwei)
    assert rig.paid() == 0
    # Then each replacement asked what the market asked then (2 x base fee + tip: the
    # node's price), never its own last price x 1.125 again and again
    assert len(offers) == len(payment["tx_hashes"]) == 4
    tip = int(rig.node.rpc("eth_maxPriorityFeePerGas"), 16)
    assert (
        offers[1:]
        == [2 * base * GWEI + tip for base in market]
        == [(2 * base + 1) * GWEI for base in (5, 12, 26)]
    )
    # And past the cap it is not replaced: it waits, and ops are paged
    assert max(offers) <= cap_gwei * GWEI
    assert payment["stalled"] == "fee_cap"
    assert gauge(rig.db, "settle_payments_waiting_fee_cap", rig.chain_id) == 1
    assert any("ALERT hot-wallet payment" in r.getMessage() for r in caplog.records)
    # And once the market falls back, the waiting payment lands, once
    rig.node.set_next_base_fee(1 * GWEI)
    rig.run_until(pipeline, deposit_id, states.CREDITED)
    assert rig.paid() == 55 * USDC - FEE_RAW
    assert gauge(rig.db, "settle_payments_waiting_fee_cap", rig.chain_id) == 0


def test_replacements_stop_at_the_most_allowed(rig: PayingRig) -> None:
    deposit_id = rig.deposit(35 * USDC)
    pipeline = rig.pipeline(
        rig.parts(with_settings(payment_replace_blocks=1, payment_max_replacements=2))
    )
    pipeline.settle_round()
    # Given a market that keeps rising, faster than a payment's headroom (2 x base fee)
    base = 10 * GWEI
    for _ in range(8):
        base = base * 3
        rig.node.set_next_base_fee(base)
        rig.node.mine()
        pipeline.settle_round()
    # Then it was replaced twice, no more, and waits with the alert up
    (payment,) = rig.payments(deposit_id)
    assert len(payment["tx_hashes"]) == 3
    assert payment["stalled"] == "max_replacements"
    assert gauge(rig.db, "settle_payments_replacements_exhausted", rig.chain_id) == 1
    rig.node.set_next_base_fee(1 * GWEI)
    rig.run_until(pipeline, deposit_id, states.CREDITED)
    assert rig.paid() == 35 * USDC - FEE_RAW


def test_a_first_payout_over_the_cap_waits_unsigned(rig: PayingRig) -> None:
    # Given the market asks more than the chain's cap when the deposit settles
    rig.node.set_next_base_fee(80 * GWEI)
    rig.node.mine()
    deposit_id = rig.deposit(20 * USDC)
    settings = with_settings(payment_max_fee_gwei={rig.chain_id: Decimal(50)})
    pipeline = rig.pipeline(rig.parts(settings))
    for _ in range(3):
        rig.node.set_next_base_fee(80 * GWEI)
        rig.node.mine()
        pipeline.settle_round()
    # Then nothing is signed: it waits, counted
    assert rig.payments(deposit_id) == []
    assert rig.row(deposit_id).wait_reason == states.WAIT_FEE_CAP
    assert rig.row(deposit_id).settle_attempts == 0
    assert gauge(rig.db, "settle_payments_waiting_fee_cap", rig.chain_id) == 1
    # And once the market is under the cap, it is paid
    rig.node.set_next_base_fee(5 * GWEI)
    rig.run_until(pipeline, deposit_id, states.CREDITED)
    assert rig.row(deposit_id).wait_reason is None


# -- 4. a hot wallet short of a token or of gas ---------------------------------------------------


def test_a_hot_wallet_short_of_tokens_waits_alerts_and_pays_once_topped_up(
    pg_db: Database, tenant: TenantKeys
) -> None:
    with anvil_rig(pg_db, tenant.tenant_id, hot_tokens=10 * USDC) as rig:
        deposit_id = rig.deposit(50 * USDC)
        pipeline = rig.pipeline(rig.parts())
        # When the deposit settles from a wallet holding 10 USDC
        rig.rounds(pipeline, 6)
        # Then it waits, saying why (never a raw revert, never manual review), nothing sent
        row = rig.row(deposit_id)
        assert (row.status, row.wait_reason) == (
            states.SOURCE_CONFIRMED,
            states.WAIT_HOT_WALLET_SHORT,
        )
        assert row.review_reason is None and row.settle_attempts == 0
        assert rig.hot_nonce() == 0
        # and the tenant is told once, with what the wallet holds
        lows = [
            e for e in events_of(pg_db, tenant.tenant_id) if e["type"] == "inventory.low_balance"
        ]
        assert len(lows) == 1
        assert lows[0]["data"]["inventory"]["balance"] == "10"
        # When the wallet is topped up
        rig.node.set_automine(True)
        rig.node.mint(rig.token, rig.hot.address, 1000 * USDC)
        rig.node.set_automine(False)
        # Then it is paid, once, by itself
        rig.run_until(pipeline, deposit_id, states.CREDITED)
        assert rig.paid() == 50 * USDC - FEE_RAW
        assert rig.row(deposit_id).wait_reason is None


def test_a_hot_wallet_short_of_gas_waits_the_same_way(rig: PayingRig) -> None:
    deposit_id = rig.deposit(50 * USDC)
    rig.node.set_balance(rig.hot.address, 10**9)  # a gwei of ETH: no transfer's gas
    pipeline = rig.pipeline(rig.parts())
    rig.rounds(pipeline, 4)
    row = rig.row(deposit_id)
    assert row.wait_reason == states.WAIT_HOT_WALLET_SHORT and row.settle_attempts == 0
    assert rig.hot_nonce() == 0
    rig.node.set_balance(rig.hot.address, 10**19)
    rig.run_until(pipeline, deposit_id, states.CREDITED)
    assert rig.paid() == 50 * USDC - FEE_RAW


def test_a_short_wallet_goes_to_review_after_the_wait_and_retry_brings_it_back(
    pg_db: Database, tenant: TenantKeys
) -> None:
    with anvil_rig(pg_db, tenant.tenant_id, hot_tokens=0) as rig:
        deposit_id = rig.deposit(50 * USDC)
        parts = rig.parts(with_settings(hot_wallet_wait_s=0.0))
        pipeline = rig.pipeline(parts)
        rig.rounds(pipeline, 2)
        # Given the bounded wait is over: a person is asked, saying why
        row = rig.row(deposit_id)
        assert row.status == states.MANUAL_REVIEW_REQUIRED
        assert row.review_reason == states.WAIT_HOT_WALLET_SHORT
        rig.rounds(pipeline, 2)
        assert rig.status(deposit_id) == states.MANUAL_REVIEW_REQUIRED
        # When the wallet is topped up and ops put the deposit back into settlement
        rig.node.set_automine(True)
        rig.node.mint(rig.token, rig.hot.address, 1000 * USDC)
        rig.node.set_automine(False)
        retried = parts.ops.retry(deposit_id, by="ops-ann", reason="wallet topped up")
        assert (retried.status, retried.review_reason) == (states.SOURCE_CONFIRMED, None)
        # Then it is paid, once
        rig.run_until(rig.pipeline(rig.parts()), deposit_id, states.CREDITED)
        assert rig.paid() == 50 * USDC - FEE_RAW
        assert rig.credited_events(deposit_id) == 1


def test_settle_deposits_retry_from_the_command_line(
    pg_db: Database,
    pg_url: str,
    tenant: TenantKeys,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with anvil_rig(pg_db, tenant.tenant_id, hot_tokens=0) as rig:
        deposit_id = rig.deposit(50 * USDC)
        rig.rounds(rig.pipeline(rig.parts(with_settings(hot_wallet_wait_s=0.0))), 2)
        assert rig.status(deposit_id) == states.MANUAL_REVIEW_REQUIRED
        chains = tmp_path / "chains.toml"
        chains.write_text(chains_toml(chain_id=rig.chain_id, depth=DEPTH, usdc=rig.token))
        for name, value in {
            "SETTLE_DATABASE_URL": pg_url,
            "SETTLE_ENV": "dev",
            "SETTLE_CHAINS_FILE": str(chains),
        }.items():
            monkeypatch.setenv(name, value)
        code = cli.main(["deposits", "retry", deposit_id, "--by", "ops-ann"])
        assert code == 0, capsys.readouterr().err
        assert '"status": "source_confirmed"' in capsys.readouterr().out.replace('":"', '": "')
        assert rig.status(deposit_id) == states.SOURCE_CONFIRMED
        # and the tenant's audit log says who put it back, from which status
        with pg_db.reader() as session:
            [entry] = audit.list_events(
                session, tenant.tenant_id, audit.Filters(action="deposit.retried_by_ops"), limit=5
            ).items
        assert (entry.target_id, entry.actor_type, entry.actor_id) == (deposit_id, "ops", "ops-ann")
        assert entry.before["status"] == states.MANUAL_REVIEW_REQUIRED
        assert entry.after["status"] == states.SOURCE_CONFIRMED
        # a deposit not in review is refused, saying so
        assert cli.main(["deposits", "retry", deposit_id]) == 2
        assert "manual_review_required" in capsys.readouterr().err


# -- 5. a watcher pointed at the wrong chain's node ------------------------------------------------


def test_a_watcher_on_another_chains_node_writes_nothing_and_resumes_once_fixed(
    pg_db: Database, tenant: TenantKeys
) -> None:
    with anvil_rig(pg_db, tenant.tenant_id) as rig, AnvilNode(chain_id=1) as mainnet:
        # Given the chain's watcher pointed at a node of another chain
        wrong = new_watcher(pg_db, rig.registry, rig.chain_id, mainnet.url, 0)
        rig.send_deposit(30 * USDC)
        rig.node.mine(DEPTH)
        for _ in range(2):
            wrong.tick()
        # Then nothing was written for the chain: no cursor, no deposit
        with pg_db.reader() as session:
            cursors = session.execute(
                sa.text("SELECT count(*) FROM chain_cursors WHERE chain_id = :c"),
                {"c": rig.chain_id},
            ).scalar_one()
        assert cursors == 0 and rig.deposits() == []
        # and one incident says which chain the node serves
        (incident,) = rig.incidents(incident_kinds.WRONG_CHAIN)
        assert "1" in incident.detail and str(rig.chain_id) in incident.detail
        # When the URL is fixed, the watcher reads the chain from where it was to start
        rig.watcher.tick()
        (deposit,) = rig.deposits()
        assert deposit.status == states.SOURCE_CONFIRMED
        assert rig.incidents(incident_kinds.WRONG_CHAIN) == []


# -- 6. a reorg past depth while the payout is unmined ----------------------------------------


def test_a_reorg_past_depth_cancels_an_unmined_payout_and_raises_the_incident(
    rig: PayingRig,
) -> None:
    tx_block = rig.node.head() + 1
    deposit_id = rig.deposit(70 * USDC)
    pipeline = rig.pipeline(rig.parts())
    pipeline.settle_round()
    (payment,) = rig.payments(deposit_id)
    assert rig.node.pending() == payment["tx_hashes"]
    # When a reorg deeper than the chain's finality takes the deposit's transfer away
    rig.node.reorg(rig.node.head() - tx_block + 1)
    rig.watcher.tick()
    # Then the incident is raised, and the payout is cancelled: same nonce, zero value,
    # to the hot wallet itself
    (incident,) = rig.incidents(incident_kinds.DEEP_REORG)
    assert incident.deposit_id == deposit_id
    rig.rounds(pipeline, DEPTH + 3)
    assert rig.paid() == 0
    (payment,) = rig.payments(deposit_id)
    assert payment["outcome"] == "cancelled" and payment["cancel_tx_hash"]
    cancel = rig.node.rpc("eth_getTransactionByHash", payment["cancel_tx_hash"])
    assert int(cancel["nonce"], 16) == payment["nonce"] and int(cancel["value"], 16) == 0
    assert cancel["to"].lower() == rig.hot.address.lower()
    # and the deposit waits for a person
    row = rig.row(deposit_id)
    assert row.status == states.MANUAL_REVIEW_REQUIRED
    assert (row.review_reason or "").startswith("source_reorged")


def test_a_reorg_past_depth_after_the_payout_was_mined_raises_the_incident_still(
    rig: PayingRig,
) -> None:
    tx_block = rig.node.head() + 1
    deposit_id = rig.deposit(75 * USDC)
    pipeline = rig.pipeline(rig.parts())
    pipeline.settle_round()
    (payment,) = rig.payments(deposit_id)
    raw = rig.node.rpc("eth_getRawTransactionByHash", payment["tx_hashes"][0])
    # When a reorg past depth takes the transfer away, and the new branch holds the payout
    rig.node.reorg(rig.node.head() - tx_block + 1, [(raw, 0)])
    rig.watcher.tick()
    # Then it cannot be cancelled (its nonce is used): the incident is raised all the same
    (incident,) = rig.incidents(incident_kinds.DEEP_REORG)
    assert incident.deposit_id == deposit_id
    rig.rounds(pipeline, DEPTH + 2)
    assert rig.paid() == 75 * USDC - FEE_RAW
    assert rig.status(deposit_id) == states.CREDITED


# -- 7. paid means the token moved, at finality --------------------------------------------------


def test_a_payout_whose_token_did_not_move_is_not_credited(
    pg_db: Database, tenant: TenantKeys
) -> None:
    with anvil_rig(pg_db, tenant.tenant_id, token_contract="QuietToken") as rig:
        deposit_id = rig.deposit(80 * USDC)
        # Given a token that answers a failed transfer with `false` instead of a revert
        rig.node.set_automine(True)
        rig.node.send(
            rig.node.deployer,
            {"to": rig.token, "data": rig.node.token(rig.token).encode_abi("set_quiet", [True])},
            wait=True,
        )
        rig.node.set_automine(False)
        pipeline = rig.pipeline(rig.parts())
        rig.rounds(pipeline, DEPTH + 3)
        # Then its mined, successful transaction is not a payment: no Transfer log
        (payment,) = rig.payments(deposit_id)
        receipt = rig.node.receipt(payment["tx_hashes"][0])
        assert receipt is not None and int(receipt["status"], 16) == 1
        assert rig.paid() == 0
        row = rig.row(deposit_id)
        assert row.status == states.MANUAL_REVIEW_REQUIRED
        assert (row.review_reason or "").startswith(states.REVIEW_PAYOUT_NOT_TRANSFERRED)


def test_a_payout_is_credited_only_at_the_chains_finality(
    pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a chain final at the node's `safe` block (anvil: 32 under the head)
    with anvil_rig(pg_db, tenant.tenant_id, finality_tag="safe") as rig:
        rig.node.mine(40)
        rig.watcher = new_watcher(pg_db, rig.registry, rig.chain_id, rig.node.url, rig.node.head())
        rig.send_deposit(65 * USDC)
        rig.node.mine(36)
        rig.watcher.tick()
        (deposit,) = rig.deposits()
        pipeline = rig.pipeline(rig.parts())
        pipeline.settle_round()
        rig.node.mine(DEPTH + 2)
        pipeline.settle_round()
        # Then deeper than its confirmations, but not under `safe`: not credited yet
        assert rig.paid() == 65 * USDC - FEE_RAW
        assert rig.status(deposit.id) == states.SOURCE_CONFIRMED
        rig.node.mine(30)
        pipeline.settle_round()
        assert rig.status(deposit.id) == states.CREDITED


# -- 8. decimals on chain against the chains file ------------------------------------------------


def test_a_token_whose_decimals_differ_from_the_chains_file_stops_the_chain(
    pg_db: Database, tenant: TenantKeys
) -> None:
    # Given the chains file says 6 decimals and the token on chain has 18
    with anvil_rig(pg_db, tenant.tenant_id, token_decimals=18) as rig:
        rig.send_deposit(30 * USDC)
        rig.node.mine(DEPTH)
        for _ in range(2):
            rig.watcher.tick()
        # Then nothing is recorded for that chain, and the incident names the token
        assert rig.deposits() == []
        (incident,) = rig.incidents(incident_kinds.TOKEN_DECIMALS)
        assert rig.token in incident.detail and "18" in incident.detail
        assert incident.facts == {"token": rig.token, "onChain": 18, "chainsFile": 6}


def test_the_worker_checks_each_chains_node_at_start(
    pg_db: Database, pg_url: str, tenant: TenantKeys, tmp_path: Path
) -> None:
    # Given the worker started on a chain whose token has 18 decimals on chain, 6 in
    # the chains file (the worker's own wiring: build_pipeline)
    with anvil_rig(pg_db, tenant.tenant_id, token_decimals=18) as rig:
        chains = tmp_path / "chains.toml"
        chains.write_text(chains_toml(chain_id=rig.chain_id, depth=DEPTH, usdc=rig.token))
        settings = with_settings(hot_wallet_key=rig.hot.key.hex(), simulated_settlement=False)
        config = core_config(
            pg_url,
            tmp_path,
            chains_file=chains,
            rpc_urls={rig.chain_id: rig.node.url},
            deposits=settings,
        )
        pipeline = build_pipeline(CoreContext.build(config, db=pg_db, identity_db=pg_db))
        # Then the incident is raised at start, before any round
        (incident,) = rig.incidents(incident_kinds.TOKEN_DECIMALS)
        assert incident.facts == {"token": rig.token, "onChain": 18, "chainsFile": 6}
        # and neither its watcher nor its hot wallet touches the chain
        rig.send_deposit(30 * USDC)
        rig.node.mine(DEPTH)
        (watcher,) = pipeline.watchers
        assert watcher.tick().stopped
        assert rig.deposits() == []
        payer = pipeline.settling.settlement.payers[rig.chain_id]
        assert isinstance(payer, EvmPayer) and payer.check is watcher.check
