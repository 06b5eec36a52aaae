"""What a sweep costs: gas units measured on a real node, priced on each chain.

    .venv/bin/python bench/sweep_cost.py [--addresses 20]

Runs the real `settle sweep` code (plan, offline sign, send) on an anvil node and a
fresh PostgreSQL database: N deposit addresses holding a test ERC-20, each swept with a
gas top-up from the hot wallet. Prints the gas units each sweep used (the top-up and the
transfer, from their receipts), the native token left at each address (what the gas
limit's margin and the max fee did not spend: it stays, and the next plan's top-up
counts it), and the cost per sweep on each chain of the shipped chains file, at its
configured gas price and native token price (services/core/chains.toml). A real token's
transfer costs more or less than the test token's: `settle sweep plan` prints the node's
estimate for the tokens it moves.
"""

from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eth_account import Account

from bench.harness import fresh_database
from services.core import accounts
from services.core.accounts import NewAccount
from services.core.addresses import AddressDeriver
from services.core.chains import load_chains, parse_chains
from services.core.deposits.pricing import StaticPrices
from services.core.destinations import Destination
from services.core.hot_wallet import Erc20TransferExecutor
from services.core.keyfiles import SigningKey, new_mnemonic
from services.core.sweeps.chain import SweepChain
from services.core.sweeps.planning import make_plan
from services.core.sweeps.sending import Sender
from services.core.sweeps.signer import sign_plan
from shared.db import Database
from shared.identity import service as identity
from tests.support.anvil import AnvilNode
from tests.support.sweeps import SweepRig, fundings_on, sweeps_on

CHAIN_ID = 990_001


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--addresses", type=int, default=20)
    args = parser.parse_args()
    url = fresh_database("settle_bench_sweep")
    db = Database(url, pool_size=2)
    with AnvilNode(CHAIN_ID, block_time_s=0.2) as node:
        token = node.deploy_token("USDC", 6)
        hot = node.accounts[1]
        rig = SweepRig(nodes={CHAIN_ID: node}, tokens={CHAIN_ID: token}, hot=hot, customer=hot)
        registry = parse_chains(rig.chains_toml())
        chain = registry.get(CHAIN_ID)
        assert chain is not None
        key = SigningKey.from_mnemonic(new_mnemonic())
        deriver = AddressDeriver(key.xpub)
        with db.transaction() as session:
            tenant_id = identity.create_tenant(session, "bench")[0].id
        for n in range(args.addresses):
            document = accounts.create_account(
                db,
                registry,
                deriver,
                tenant_id,
                NewAccount(f"bench-{n}", Destination(CHAIN_ID, hot.address, token)),
                api_key_id=None,
            )
            node.mint(token, document["depositAddresses"][0]["address"], (10 + n) * 10**6)
        gas = Erc20TransferExecutor.from_url(node.url, hot.key, 10.0, chain_id=CHAIN_ID)
        io = SweepChain(gas.w3)
        plan = make_plan(
            db,
            chain,
            io,
            gas,
            destination=Account.create().address,
            prices=StaticPrices(),
            all_addresses=True,
            created_by="bench",
        )
        assert plan is not None
        signed, _ = sign_plan(plan, [key])
        sender = Sender(db, chain, io, gas)
        outcome = sender.run(sender.accept(signed), timeout_s=120, poll_s=0.1)
        assert outcome.open == 0, outcome.document()
        used = [_gas(node, s.tx_hash or "") for s in sweeps_on(db, CHAIN_ID)]
        top_ups = [_gas(node, f.tx_hash or "") for f in fundings_on(db, CHAIN_ID) if f.tx_hash]
        left = [node.balance(s.deposit_address) for s in sweeps_on(db, CHAIN_ID)]
    db.dispose()
    per_sweep = sum(used) / len(used) + sum(top_ups) / len(used)
    print(f"sweeps: {len(used)} (one token each), top-ups: {len(top_ups)}")
    print(f"gas per transfer: {min(used)}-{max(used)}; per top-up: {min(top_ups)}-{max(top_ups)}")
    print(f"gas per sweep (top-up + transfer): {per_sweep:.0f}")
    print(f"native left per address (wei): {min(left)}-{max(left)}")
    print("cost per sweep at the chains file's gas price and native price:")
    for shipped in load_chains().active():
        wei = Decimal(per_sweep) * shipped.gas_price_gwei * 10**9
        usd = wei / 10**18 * shipped.native_usd
        print(
            f"  chain {shipped.chain_id:>5} ({shipped.name}): {shipped.gas_price_gwei} gwei,"
            f" {shipped.native_symbol} at {shipped.native_usd} USD -> {usd:.4f} USD"
        )


def _gas(node: AnvilNode, tx_hash: str) -> int:
    receipt = node.receipt(tx_hash)
    assert receipt is not None
    return int(receipt["gasUsed"], 16)


if __name__ == "__main__":
    main()
