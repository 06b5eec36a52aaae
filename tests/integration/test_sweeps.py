"""Sweeps on real nodes: deposits credited by the real pipeline (watchers and hot-wallet
payouts on two anvil chains), then planned, signed offline and sent to the treasury.
Every balance is checked to the wei; each hostile case is a test of its own."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from services import reconcile as rc
from services.core import accounts
from services.core.accounts import NewAccount
from services.core.addresses import AddressDeriver
from services.core.chains import ChainRegistry, load_chains
from services.core.context import CoreContext
from services.core.deposits import states
from services.core.deposits.pricing import StaticPrices
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.worker import build_pipeline, run
from services.core.destinations import Destination
from services.core.hot_wallet import Erc20TransferExecutor
from services.core.keyfiles import (
    SigningKey,
    load_key_file,
    mnemonic_document,
    new_mnemonic,
    write_new,
)
from services.core.sweeps.audit import ChainBalances
from services.core.sweeps.chain import SweepChain
from services.core.sweeps.models import CONFIRMED, NOT_NEEDED
from services.core.sweeps.planning import make_plan
from services.core.sweeps.sending import Outcome, Sender
from services.core.sweeps.signer import sign_plan
from shared.db import Database
from shared.timefmt import utcnow
from tests.conftest import TenantKeys, core_config
from tests.support import keys
from tests.support.deposits import set_fee
from tests.support.pipeline import wait_until
from tests.support.sweeps import (
    USDC,
    SweepRig,
    deposits_on,
    fundings_on,
    gas_paid,
    payout_hashes,
    sweep_chains,
    sweeps_on,
)

pytestmark = pytest.mark.integration

PRICES = StaticPrices()


@dataclass
class Funded:
    """The rig, after the pipeline credited deposits to accounts of both key kinds."""

    rig: SweepRig
    registry: ChainRegistry
    key_files: list[Path]
    #: {chain id: {deposit address: raw amount deposited}}
    deposited: dict[int, dict[str, int]]


def _pipeline_settings(rig: SweepRig) -> PipelineSettings:
    return PipelineSettings(
        hot_wallet_key="0x" + bytes(rig.hot.key).hex(),
        simulated_settlement=False,
        poll_s=0.05,
        watcher_poll_s=0.1,
        watcher_lag_blocks=0,
        retry_base_s=0.2,
        payment_replace_blocks=50,
    )


def _legacy_key_file(folder: Path) -> Path:
    path = folder / "old-deposit-xprv.json"
    write_new(path, {"xprv": keys.test_xprv(), "xpub": keys.test_xpub()})
    return path


def _new_key_file(folder: Path) -> Path:
    path = folder / "deposit-key.json"
    write_new(path, mnemonic_document(new_mnemonic()))
    return path


@pytest.fixture
def funded(pg_url: str, pg_db: Database, tenant: TenantKeys, tmp_path: Path) -> Iterator[Funded]:
    with sweep_chains() as rig:
        chains_file = rig.write_chains_file(tmp_path)
        registry = load_chains(chains_file)
        for chain_id in rig.chain_ids:
            set_fee(pg_db, chain_id, "0.25")
        old_file, new_file = _legacy_key_file(tmp_path), _new_key_file(tmp_path)
        # Accounts of a deployment that began with a root key (settle keys xpub), then
        # rotated to a mnemonic's key (settle keys new): each chain has both kinds.
        derivers = [AddressDeriver(keys.test_xpub())] + [
            AddressDeriver(load_key_file(new_file).xpub)
        ] * 4
        addresses: dict[int, list[str]] = {}
        for chain_id in rig.chain_ids:
            destination = Destination(chain_id, rig.wallets[chain_id], rig.tokens[chain_id])
            for deriver in derivers:
                document = accounts.create_account(
                    pg_db,
                    registry,
                    deriver,
                    tenant.tenant_id,
                    NewAccount(f"sweep-{chain_id}-{len(addresses.get(chain_id, []))}", destination),
                    api_key_id=None,
                )
                (address,) = {
                    a["address"] for a in document["depositAddresses"] if a["chainId"] == chain_id
                }
                addresses.setdefault(chain_id, []).append(address)
        config = core_config(
            pg_url,
            tmp_path,
            chains_file=chains_file,
            rpc_urls=rig.rpc_urls(),
            deposits=_pipeline_settings(rig),
        )
        pipeline = build_pipeline(CoreContext.build(config, db=pg_db, identity_db=pg_db))
        stop = threading.Event()
        worker = threading.Thread(target=run, args=(pipeline, stop), daemon=True)
        worker.start()
        try:
            # Given 20 deposits (two to each address, five addresses per chain)
            wait_until(lambda: all(w.tick() is not None for w in pipeline.watchers), 10, "watchers")
            deposited: dict[int, dict[str, int]] = {}
            for chain_id, node in rig.nodes.items():
                for n, address in enumerate(addresses[chain_id]):
                    for k in (1, 2):
                        amount = (10 + 7 * n + k) * USDC + 123_457 * k
                        node.transfer(
                            rig.tokens[chain_id], rig.customer, address, amount, wait=False
                        )
                        per_chain = deposited.setdefault(chain_id, {})
                        per_chain[address] = per_chain.get(address, 0) + amount
            # When the pipeline credits them all
            wait_until(
                lambda: all(
                    len(ds) == 10 and all(d.status == states.CREDITED for d in ds)
                    for ds in (deposits_on(pg_db, c) for c in rig.chain_ids)
                ),
                120,
                "20 credited deposits",
                interval=0.25,
            )
        finally:
            stop.set()
            worker.join(15)
        yield Funded(rig, registry, [old_file, new_file], deposited)


def _sweep(db: Database, funded: Funded, chain_id: int, **run: Any) -> tuple[Sender, str, Outcome]:
    rig = funded.rig
    chain = funded.registry.get(chain_id)
    assert chain is not None
    gas = Erc20TransferExecutor.from_url(
        rig.nodes[chain_id].url, rig.hot.key, 10.0, chain_id=chain_id
    )
    io = SweepChain(gas.w3)
    plan = make_plan(db, chain, io, gas, destination=rig.treasury, prices=PRICES, created_by="test")
    assert plan is not None
    signed, _ = sign_plan(plan, [load_key_file(f) for f in funded.key_files])
    sender = Sender(db, chain, io, gas)
    plan_id = sender.accept(signed)
    outcome = sender.run(plan_id, timeout_s=run.get("timeout_s", 60.0), poll_s=0.1)
    return sender, plan_id, outcome


def test_twenty_deposits_credited_on_two_chains_are_swept_to_the_treasury_to_the_wei(
    pg_db: Database, funded: Funded
) -> None:
    rig = funded.rig
    for chain_id, node in rig.nodes.items():
        token = rig.tokens[chain_id]
        deposited = funded.deposited[chain_id]
        credits = sum(
            int(Decimal(d.credit_amount or 0) * USDC) for d in deposits_on(pg_db, chain_id)
        )
        hot_nonce = node.nonce(rig.hot.address)

        # Given reconcile lists the chain's ten deposits as not yet swept, and finds
        # every address's balance explained by its deposits
        before = _reconcile(pg_db, funded, chain_id)
        assert sorted(u.amount_raw for u in before.unswept if u.chain_id == chain_id) == sorted(
            int(d.amount_raw) for d in deposits_on(pg_db, chain_id)
        )
        assert before.counts.balances_checked == 5
        assert _mine(before, chain_id) == []

        # When the chain's deposits are planned, signed offline and sent
        _, plan_id, outcome = _sweep(pg_db, funded, chain_id)

        # Then every sweep is confirmed, one per address (each address held one token)
        assert outcome.counts == {CONFIRMED: 5}, outcome.document()
        sweeps = sweeps_on(pg_db, chain_id)
        assert {s.deposit_address: int(s.amount_raw) for s in sweeps} == deposited
        # And the treasury holds exactly what customers deposited; the addresses nothing
        assert node.balance_of(token, rig.treasury) == sum(deposited.values())
        assert all(node.balance_of(token, a) == 0 for a in deposited)
        # And the tenant's wallet got exactly the credits, paid from the hot wallet
        assert node.balance_of(token, rig.wallets[chain_id]) == credits
        assert node.balance_of(token, rig.hot.address) == rig.hot_token_start[chain_id] - credits
        # And the hot wallet's native balance is its start minus every payout's gas and
        # every gas top-up (value and gas), to the wei
        fundings = fundings_on(pg_db, chain_id)
        paid_out = [h for h in payout_hashes(pg_db, chain_id) if node.receipt(h)]
        topped = [f for f in fundings if f.status != NOT_NEEDED]
        spent = sum(gas_paid(node, h) for h in paid_out) + sum(
            int(f.amount_wei) + gas_paid(node, f.tx_hash or "") for f in topped
        )
        assert node.balance(rig.hot.address) == rig.hot_native_start[chain_id] - spent
        # And each deposit address holds its top-up minus its sweep's gas, to the wei
        for address in deposited:
            top_up = sum(int(f.amount_wei) for f in topped if f.deposit_address == address)
            used = sum(
                gas_paid(node, s.tx_hash or "") for s in sweeps if s.deposit_address == address
            )
            assert node.balance(address) == top_up - used
        # And the hot wallet's nonces went to payouts and top-ups only, none reused
        assert node.nonce(rig.hot.address) == hot_nonce + len(topped)

        # And reconcile finds nothing left to sweep and nothing unexplained
        after = _reconcile(pg_db, funded, chain_id)
        assert [u for u in after.unswept if u.chain_id == chain_id] == []
        assert _mine(after, chain_id) == [] and after.counts.balances_checked == 5

        # When the same signed file is sent again: nothing moves
        before = (
            node.nonce(rig.hot.address),
            node.balance_of(token, rig.treasury),
            [node.nonce(a) for a in deposited],
        )
        again = _resend(pg_db, funded, chain_id, plan_id)
        assert again.counts == {CONFIRMED: 5}
        assert before == (
            node.nonce(rig.hot.address),
            node.balance_of(token, rig.treasury),
            [node.nonce(a) for a in deposited],
        )


def _reconcile(db: Database, funded: Funded, chain_id: int) -> rc.Report:
    rig = funded.rig
    io = SweepChain(rig.nodes[chain_id].w3)
    now = utcnow()
    chains = {chain_id: ChainBalances(io, (rig.tokens[chain_id],))}
    return rc.reconcile(
        db, db, now - timedelta(minutes=10), now + timedelta(seconds=1), chains=chains
    )


def _mine(report: rc.Report, chain_id: int) -> list[rc.Discrepancy]:
    """The report's sweep and balance discrepancies about this chain."""
    kinds = (rc.SWEEP_UNCONFIRMED, rc.SWEEP_REORGED, rc.UNEXPLAINED_BALANCE)
    return [
        d
        for d in report.discrepancies()
        if d.kind in kinds
        and (d.subject.startswith(f"{chain_id} ") or f"chain {chain_id}" in d.detail)
    ]


def _resend(db: Database, funded: Funded, chain_id: int, plan_id: str) -> Outcome:
    rig = funded.rig
    chain = funded.registry.get(chain_id)
    assert chain is not None
    gas = Erc20TransferExecutor.from_url(
        rig.nodes[chain_id].url, rig.hot.key, 10.0, chain_id=chain_id
    )
    sender = Sender(db, chain, SweepChain(gas.w3), gas)
    return sender.run(plan_id, timeout_s=10.0, poll_s=0.1)


def test_the_plan_names_each_addresses_key_and_path(funded: Funded, pg_db: Database) -> None:
    rig = funded.rig
    chain_id = rig.chain_ids[0]
    chain = funded.registry.get(chain_id)
    assert chain is not None
    gas = Erc20TransferExecutor.from_url(
        rig.nodes[chain_id].url, rig.hot.key, 10.0, chain_id=chain_id
    )
    plan = make_plan(
        pg_db,
        chain,
        SweepChain(gas.w3),
        gas,
        destination=rig.treasury,
        prices=PRICES,
        created_by="test",
        min_usd=Decimal(0),
    )
    assert plan is not None
    entries = plan["plan"]["addresses"]
    schemes = sorted(e["key"]["scheme"] for e in entries)
    assert schemes == ["bip44"] * 4 + ["chain/index"]
    new_xpub = SigningKey.from_mnemonic(
        json.loads(funded.key_files[1].read_text())["mnemonic"]
    ).xpub
    for entry in entries:
        if entry["key"]["scheme"] == "bip44":
            assert entry["key"]["xpub"] == new_xpub
            assert entry["key"]["path"] == f"m/44'/60'/0'/0/{entry['key']['index']}"
        else:
            assert entry["key"]["path"] == f"m/{chain_id}/{entry['key']['index']}"
