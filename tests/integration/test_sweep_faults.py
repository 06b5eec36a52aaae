"""Sweeps on the operator's worst day, on a real node (anvil, mining by hand): a gas
top-up that lands while the sweep is dropped, a reorg that removes a mined sweep, a plan
gone stale, a tampered or foreign signed file, a run that dies midway, two plans for one
balance. Each test moves nothing twice and says what would have gone wrong."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from services import reconcile as rc
from services.core import accounts
from services.core.accounts import NewAccount
from services.core.addresses import AddressDeriver
from services.core.chains import Chain, load_chains
from services.core.deposits import incidents as incident_kinds
from services.core.deposits import payments
from services.core.deposits.pricing import StaticPrices
from services.core.destinations import Destination
from services.core.hot_wallet import Erc20TransferExecutor
from services.core.keyfiles import SigningKey, new_mnemonic
from services.core.sweeps.audit import ChainBalances
from services.core.sweeps.chain import SweepChain
from services.core.sweeps.documents import digest
from services.core.sweeps.models import (
    CONFIRMED,
    PLANNED,
    REPLACED,
    SENT,
    SIGNED,
    STALE,
    SUPERSEDED,
)
from services.core.sweeps.planning import PlanError, make_plan
from services.core.sweeps.sending import Sender, SendRefused
from services.core.sweeps.signer import sign_plan
from shared.db import Database
from shared.timefmt import utcnow
from tests.conftest import TenantKeys
from tests.support.anvil import AnvilNode
from tests.support.deposits import unique_chain_id
from tests.support.sweeps import DEPTH, USDC, SweepRig, fundings_on, sweeps_on

pytestmark = pytest.mark.integration


@dataclass
class Chain1:
    """One anvil chain mining by hand, three funded deposit addresses, a sender."""

    node: AnvilNode
    chain: Chain
    token: str
    key: SigningKey
    addresses: list[str]
    gas: Erc20TransferExecutor
    io: SweepChain
    treasury: str
    db: Database

    def plan(self, **kwargs: Any) -> dict[str, Any]:
        plan = make_plan(
            self.db,
            self.chain,
            self.io,
            self.gas,
            destination=kwargs.pop("destination", self.treasury),
            prices=StaticPrices(),
            all_addresses=True,
            created_by="test",
            **kwargs,
        )
        assert plan is not None
        return plan

    def signed(self, plan: dict[str, Any]) -> dict[str, Any]:
        return sign_plan(plan, [self.key])[0]

    def sender(self) -> Sender:
        return Sender(self.db, self.chain, self.io, self.gas)

    def rounds(self, sender: Sender, plan_id: str, times: int, mine: int = 1) -> None:
        """`times` rounds of a send, mining `mine` blocks after each."""
        for _ in range(times):
            sender.round(plan_id)
            self.node.mine(mine)

    def finish(self, sender: Sender, plan_id: str) -> dict[str, int]:
        for _ in range(40):
            if not sender.round(plan_id):
                break
            self.node.mine(1)
        return sender.outcome(plan_id).counts

    def statuses(self, plan_id: str) -> list[str]:
        return [s.status for s in sweeps_on(self.db, self.chain.chain_id) if s.plan_id == plan_id]


AMOUNTS = (25 * USDC, 40 * USDC + 1, 7 * USDC + 333)


@pytest.fixture
def one(pg_db: Database, tenant: TenantKeys, tmp_path: Path) -> Iterator[Chain1]:
    with AnvilNode(unique_chain_id()) as node:
        token = node.deploy_token("USDC", 6)
        hot = node.accounts[1]
        rig = SweepRig(
            nodes={node.chain_id: node}, tokens={node.chain_id: token}, hot=hot, customer=hot
        )
        registry = load_chains(rig.write_chains_file(tmp_path))
        chain = registry.get(node.chain_id)
        assert chain is not None
        key = SigningKey.from_mnemonic(new_mnemonic())
        deriver = AddressDeriver(key.xpub)
        addresses = []
        for n, amount in enumerate(AMOUNTS):
            document = accounts.create_account(
                pg_db,
                registry,
                deriver,
                tenant.tenant_id,
                NewAccount(
                    f"faults-{node.chain_id}-{n}", Destination(node.chain_id, hot.address, token)
                ),
                api_key_id=None,
            )
            address = document["depositAddresses"][0]["address"]
            node.mint(token, address, amount)
            addresses.append(address)
        node.set_automine(False)
        gas = Erc20TransferExecutor.from_url(node.url, hot.key, 10.0, chain_id=node.chain_id)
        yield Chain1(
            node,
            chain,
            token,
            key,
            addresses,
            gas,
            SweepChain(gas.w3),
            Account.create().address,
            pg_db,
        )


def _treasury(one: Chain1) -> int:
    return one.node.balance_of(one.token, one.treasury)


def test_a_sweep_dropped_after_its_gas_landed_is_sent_again_as_the_same_transaction(
    one: Chain1,
) -> None:
    # Given a signed plan whose gas top-ups are mined
    sender = one.sender()
    plan_id = sender.accept(one.signed(one.plan()))
    one.rounds(sender, plan_id, 1)  # the top-ups, mined
    sender.round(plan_id)  # the sweeps, broadcast
    hashes = {s.deposit_address: s.tx_hash for s in sweeps_on(one.db, one.chain.chain_id)}
    assert sorted(one.node.pending()) == sorted(hashes.values())
    # When the node drops every sweep from its pool (gas spent on top-ups, nothing moved)
    for tx_hash in hashes.values():
        one.node.drop(tx_hash or "")
    assert one.node.pending() == []
    # Then the next rounds broadcast the same bytes again, and each lands once
    assert one.finish(sender, plan_id) == {CONFIRMED: 3}
    assert {s.deposit_address: s.tx_hash for s in sweeps_on(one.db, one.chain.chain_id)} == hashes
    assert _treasury(one) == sum(AMOUNTS)
    # And no second top-up was paid: one gas transaction per address
    assert one.node.nonce(one.gas.address) == 3


def test_a_gas_top_up_priced_out_is_replaced_and_holds_no_payout_back(one: Chain1) -> None:
    # Given top-ups broadcast (nonces 0-2 of the hot wallet, which pays credits too)
    sender = Sender(one.db, one.chain, one.io, one.gas, replace_after_blocks=3)
    plan_id = sender.accept(one.signed(one.plan()))
    sender.round(plan_id)
    (first, *_) = fundings_on(one.db, one.chain.chain_id)
    assert first.tx is not None
    base = int(one.node.rpc("eth_getBlockByNumber", "latest", False)["baseFeePerGas"], 16)
    high = 3 * int(first.tx["maxFeePerGas"])
    # When the base fee jumps above what they offer, and stays there
    for _ in range(6):
        one.node.set_next_base_fee(high)
        one.node.mine(1)
        sender.round(plan_id)
    # Then each was replaced (same nonce, fees up) and mined while fees stayed high: the
    # hot wallet's later nonces (its next payout) are not held back behind them
    fundings = fundings_on(one.db, one.chain.chain_id)
    assert [len(f.tx_hashes) for f in fundings] == [2, 2, 2]
    assert all(f.block_number is not None and f.tx_hash == f.tx_hashes[1] for f in fundings)
    assert one.node.nonce(one.gas.address) == 3
    # And once fees fall back, the sweeps (priced at plan time) land as planned
    one.node.set_next_base_fee(base)
    assert one.finish(sender, plan_id) == {CONFIRMED: 3}
    assert _treasury(one) == sum(AMOUNTS)


def test_a_reorg_that_removes_a_mined_sweep_before_the_depth_sends_it_again(one: Chain1) -> None:
    sender = one.sender()
    plan_id = sender.accept(one.signed(one.plan()))
    one.rounds(sender, plan_id, 2)  # top-ups mined, then the sweeps mined in one block
    mined = {s.id: s.block_number for s in sweeps_on(one.db, one.chain.chain_id)}
    assert set(mined.values()) == {None} or len(set(mined.values())) == 1
    sender.round(plan_id)
    assert {s.status for s in sweeps_on(one.db, one.chain.chain_id)} == {SENT}
    assert _treasury(one) == sum(AMOUNTS)
    # When a reorg replaces the sweeps' block (anvil drops its transactions) before depth
    one.node.reorg(2)
    assert _treasury(one) == 0
    # Then the sweeps are sent again and confirmed once, at a canonical block
    assert one.finish(sender, plan_id) == {CONFIRMED: 3}
    assert _treasury(one) == sum(AMOUNTS)
    for sweep in sweeps_on(one.db, one.chain.chain_id):
        assert sweep.block_hash == one.node.block_hash(sweep.block_number or 0)


def test_a_plan_gone_stale_moves_nothing_and_spends_no_gas_on_it(one: Chain1) -> None:
    # Given a signed plan
    plan = one.plan()
    signed = one.signed(plan)
    # When, before it is sent, one address's balance is moved by someone holding its key
    thief = one.addresses[0]
    one.node.set_balance(thief, 10**18)
    one.node.rpc("anvil_impersonateAccount", thief)
    data = one.node.token(one.token).encode_abi("transfer", args=[Account.create().address, USDC])
    one.node.rpc("eth_sendTransaction", {"from": thief, "to": one.token, "data": data})
    one.node.mine(1)
    # And another address receives more than the plan saw
    one.node.set_automine(True)
    one.node.mint(one.token, one.addresses[1], 5 * USDC)
    one.node.set_automine(False)
    sender = one.sender()
    plan_id = sender.accept(signed)
    counts = one.finish(sender, plan_id)
    # Then the stale address's sweep is not sent and gets no gas; the others move
    # exactly what was planned (the rest waits for the next plan)
    assert counts == {STALE: 1, CONFIRMED: 2}
    stale = next(s for s in sweeps_on(one.db, one.chain.chain_id) if s.status == STALE)
    assert stale.deposit_address == thief and "nonce" in (stale.detail or "")
    assert one.node.nonce(one.gas.address) == 2
    assert _treasury(one) == AMOUNTS[1] + AMOUNTS[2]
    assert one.node.balance_of(one.token, one.addresses[1]) == 5 * USDC


def _no_change(one: Chain1, plan_id: str) -> None:
    assert set(one.statuses(plan_id)) == {PLANNED}
    assert one.node.nonce(one.gas.address) == 0
    assert one.node.pending() == []


def test_a_tampered_signed_file_is_refused_whole_before_anything_is_sent(one: Chain1) -> None:
    plan = one.plan()
    signed = one.signed(plan)
    plan_id = plan["plan"]["planId"]

    def refused(change: Any, match: str) -> None:
        copy = json.loads(json.dumps(signed))
        change(copy)
        with pytest.raises(SendRefused, match=match):
            one.sender().accept(copy)
        _no_change(one, plan_id)

    def flip(doc: dict[str, Any]) -> None:
        raw = doc["transactions"][1]["raw"]
        doc["transactions"][1]["raw"] = raw[:-10] + ("0" if raw[-10] != "0" else "1") + raw[-9:]

    def swap(doc: dict[str, Any]) -> None:
        t = doc["transactions"]
        t[0]["raw"], t[1]["raw"] = t[1]["raw"], t[0]["raw"]

    refused(flip, "signed by|not a signed")
    refused(swap, "signed by")
    refused(lambda d: d.update(chainId=1), "chain")
    refused(lambda d: d.update(planDigest="0" * 64), "digest")
    refused(lambda d: d.update(planId="swp_none"), "no plan")
    refused(lambda d: d["transactions"].append(d["transactions"][0]), "twice")


def test_a_plan_edited_before_signing_is_refused_by_send(one: Chain1) -> None:
    # Given a plan whose destination was changed on its way to the signer (and its
    # digest recomputed), signed with the real key
    plan = one.plan()
    edited = json.loads(json.dumps(plan))
    edited["plan"]["destination"] = Account.create().address
    edited["digest"] = digest(edited["plan"])
    with pytest.raises(Exception, match="not the one its fields describe"):
        sign_plan(edited, [one.key])
    for entry in edited["plan"]["addresses"]:  # a careful forger rewrites the calldata too
        for transfer in entry["transfers"]:
            transfer["tx"]["data"] = (
                "0xa9059cbb"
                + "0" * 24
                + edited["plan"]["destination"][2:].lower()
                + transfer["tx"]["data"][74:]
            )
    edited["digest"] = digest(edited["plan"])
    signed, _ = sign_plan(edited, [one.key])
    # Then send refuses it whole: the database's plan is what may move
    with pytest.raises(SendRefused, match="digest"):
        one.sender().accept(signed)
    # Also when the forger puts the stored plan's digest back into the signed file
    signed["planDigest"] = plan["digest"]
    with pytest.raises(SendRefused, match="data is"):
        one.sender().accept(signed)
    _no_change(one, plan["plan"]["planId"])


def test_a_signed_file_for_another_chain_is_refused(one: Chain1, tmp_path: Path) -> None:
    plan = one.plan()
    signed = one.signed(plan)
    # Sent to a node of another chain (a wrong SETTLE_RPC_URL)
    with AnvilNode(unique_chain_id()) as other:
        gas = Erc20TransferExecutor.from_url(other.url, one.node.accounts[1].key, 10.0)
        sender = Sender(one.db, one.chain, SweepChain(gas.w3), gas)
        with pytest.raises(SendRefused, match="node serves chain"):
            sender.accept(signed)
    _no_change(one, plan["plan"]["planId"])


def test_a_run_that_dies_between_the_top_up_and_the_sweep_resumes_to_one_of_each(
    one: Chain1,
) -> None:
    sender = one.sender()
    plan_id = sender.accept(one.signed(one.plan()))

    class Died(Exception):
        pass

    calls: list[str] = []

    def dying(raw: str, what: str) -> None:
        calls.append(what)
        if what.startswith("sweep"):
            raise Died  # the process is gone right after marking its sweeps sent
        one.gas.broadcast(raw)

    sender._broadcast = dying  # type: ignore[method-assign]
    sender.round(plan_id)
    one.node.mine(1)
    with pytest.raises(Died):
        sender.round(plan_id)
    assert SENT in one.statuses(plan_id) and one.node.pending() == []
    # When a new run starts (a new process: nothing of the old one's memory)
    counts = one.finish(one.sender(), plan_id)
    # Then each address got one top-up and its sweep landed once
    assert counts == {CONFIRMED: 3}
    assert one.node.nonce(one.gas.address) == 3
    assert _treasury(one) == sum(AMOUNTS)


def test_two_plans_for_one_balance_move_it_once(one: Chain1) -> None:
    # Given plan A sent (top-ups and sweeps in the pool, not mined)
    first = one.sender()
    a = first.accept(one.signed(one.plan()))
    one.rounds(first, a, 1)
    first.round(a)
    assert set(one.statuses(a)) == {SENT}
    # When plan B is made for the same balances (the same nonces), signed and sent
    b_plan = one.plan()
    assert [e["nonce"] for e in b_plan["plan"]["addresses"]] == [0, 0, 0]
    second = one.sender()
    b = second.accept(one.signed(b_plan))
    one.finish(second, b)
    one.finish(first, a)
    # Then each balance moved once: per address one plan's sweep confirmed, the other's
    # superseded or stale
    both = sweeps_on(one.db, one.chain.chain_id)
    for address in one.addresses:
        mine = sorted(s.status for s in both if s.deposit_address == address)
        assert mine.count(CONFIRMED) == 1 and set(mine) <= {CONFIRMED, SUPERSEDED, STALE}, mine
    assert _treasury(one) == sum(AMOUNTS)


def test_a_new_plan_replaces_an_unsigned_one(one: Chain1) -> None:
    old = one.plan()
    new = one.plan()
    assert set(one.statuses(old["plan"]["planId"])) == {REPLACED}
    with pytest.raises(SendRefused, match="replaced"):
        one.sender().accept(one.signed(old))
    assert set(one.statuses(new["plan"]["planId"])) == {PLANNED}


def test_only_one_send_runs_per_chain(one: Chain1) -> None:
    sender = one.sender()
    plan_id = sender.accept(one.signed(one.plan()))
    with sender._exclusive(), pytest.raises(SendRefused, match="another"):
        one.sender().run(plan_id, timeout_s=1)
    assert set(one.statuses(plan_id)) == {SIGNED}


def _reconcile(one: Chain1) -> list[rc.Discrepancy]:
    now = utcnow()
    chains = {
        one.chain.chain_id: ChainBalances(one.io, (one.token,), all_addresses=True),
    }
    report = rc.reconcile(
        one.db, one.db, now - timedelta(minutes=10), now + timedelta(seconds=1), chains=chains
    )
    chain = f"chain {one.chain.chain_id}"
    return [
        d
        for d in report.discrepancies()
        if d.subject.startswith(f"{one.chain.chain_id} ") or chain in d.detail
    ]


def _pairs(one: Chain1) -> list[tuple[str, str]]:
    return sorted((rc.UNEXPLAINED_BALANCE, f"{one.chain.chain_id} {a}") for a in one.addresses)


def test_reconcile_reports_balances_no_deposit_explains_and_a_confirmed_sweep_reorged(
    one: Chain1,
) -> None:
    # Given deposit addresses holding tokens no recorded deposit explains (a transfer the
    # watcher never saw): each is reported with what it holds
    found = _reconcile(one)
    assert sorted((d.kind, d.subject) for d in found) == _pairs(one)
    # When they are swept (nothing then remains at the addresses) and confirmed
    sender = one.sender()
    plan_id = sender.accept(one.signed(one.plan()))
    assert one.finish(sender, plan_id) == {CONFIRMED: 3}
    one.node.mine(DEPTH)
    # Then the addresses stay reported: the sweeps moved tokens no deposit explains
    # (until ops account for them, an auditor sees them)
    swept = _reconcile(one)
    assert sorted(d.subject for d in swept) == sorted(f[1] for f in _pairs(one))
    assert all(d.kind == rc.UNEXPLAINED_BALANCE and "holds 0 " in d.detail for d in swept)
    # When a reorg deeper than the depth takes the confirmed sweeps' block away
    mined = {s.block_number for s in sweeps_on(one.db, one.chain.chain_id)}
    one.node.reorg(one.node.head() - min(b or 0 for b in mined) + 1)
    # Then each sweep is reported as reorged, and each address's balance as unexplained
    # (the tokens are back; the database says they left)
    kinds = sorted(d.kind for d in _reconcile(one))
    assert kinds == sorted([rc.SWEEP_REORGED] * 3 + [rc.UNEXPLAINED_BALANCE] * 3)


def test_reconcile_reports_a_sweep_left_unconfirmed(one: Chain1) -> None:
    sender = one.sender()
    sender.accept(one.signed(one.plan()))  # signed, never sent
    found = _reconcile(one)
    assert (
        sorted(d.kind for d in found if d.kind == rc.SWEEP_UNCONFIRMED)
        == [rc.SWEEP_UNCONFIRMED] * 3
    )


def test_a_plan_never_sends_to_a_deposit_address_a_token_or_nowhere(one: Chain1) -> None:
    for bad in (one.addresses[0], one.token, "0x" + "0" * 40):
        with pytest.raises(PlanError, match=r"cannot receive|deposit address"):
            one.plan(destination=bad)
    assert one.statuses("") == []


def test_a_gas_wallet_used_outside_settle_pauses_top_ups_with_the_nonce_gap_incident(
    one: Chain1,
) -> None:
    # Given the gas wallet (the hot wallet) sent a transaction Settle has no record of
    # (a database restored from a backup, or the key used by hand)
    hot = one.node.accounts[1]
    assert one.gas.address == hot.address
    one.node.send(hot, {"to": hot.address, "gas": 21_000})
    one.node.mine(1)
    # When a signed plan is sent
    sender = one.sender()
    plan_id = sender.accept(one.signed(one.plan()))
    with pytest.raises(payments.NonceGap):
        sender.round(plan_id)
    # Then no top-up was signed or broadcast (the wallet's count on chain did not move),
    # and the chain's payments are paused by the incident a person resolves
    one.node.mine(1)
    assert one.node.nonce(hot.address) == 1
    assert all(f.tx_hash is None for f in fundings_on(one.db, one.chain.chain_id))
    with one.db.reader() as session:
        incident = incident_kinds.pausing(session, one.chain.chain_id)
    assert incident is not None and incident.kind == incident_kinds.NONCE_GAP
