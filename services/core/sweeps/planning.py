"""`settle sweep plan`: what the deposit addresses of a chain hold, read on the chain, and
the transfers that would bring it to the treasury; nothing is signed.

Balances and nonces are read at one block (the plan's `block`). Each address's
transfers take its next nonces in token order, and its gas top-up is what their gas can
cost at most (gas limit x max fee per gas) minus the native balance it holds: the
sender sends exactly that, so nothing is spent that a transfer could not use.

A transfer's nonce is the address's count at the plan's block, so a plan made while an
older plan's transfer is still unmined asks for the same nonce: at most one of the two
can ever be mined (docs/DEPOSITS.md, "Sweeps").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from eth_utils import to_checksum_address

from services.core.addresses import full_path
from services.core.amounts import format_amount, token_units
from services.core.chains import Chain
from services.core.deposits.pricing import PriceSource, amount_usd
from services.core.evm import ChainIdMismatch
from services.core.hot_wallet import Erc20TransferExecutor
from services.core.sweeps import store
from services.core.sweeps.chain import SweepChain
from services.core.sweeps.documents import (
    NATIVE_TRANSFER_GAS,
    PLAN_KIND,
    VERSION,
    digest,
    max_gas_cost,
    transfer_tx,
)
from services.core.sweeps.models import PLANNED, Sweep, SweepPlan
from shared.db import Database
from shared.ids import new_id
from shared.timefmt import iso_ms, utcnow

#: Wei in one native token.
WEI = Decimal(10) ** 18


class PlanError(RuntimeError):
    """A plan cannot be made (the message says why)."""


@dataclass(frozen=True)
class _Holding:
    token: str
    asset: str
    decimals: int
    amount_raw: int
    amount_usd: Decimal | None


def _usd(wei: int, chain: Chain) -> str:
    return format(Decimal(wei) / WEI * chain.native_usd, ".2f")


def _holdings(
    chain: Chain,
    balances: dict[tuple[str, str], int],
    address: str,
    min_usd: Decimal,
    prices: PriceSource,
) -> list[_Holding]:
    held = []
    for asset in sorted(chain.assets, key=lambda a: a.token_address.lower()):
        amount = balances[(asset.token_address, address)]
        if amount <= 0:
            continue
        usd = amount_usd(
            token_units(amount, asset.decimals), prices.usd_price(chain.chain_id, asset.symbol)
        )
        # Without a price, a floor cannot be checked: kept only when there is none.
        if (usd is None and min_usd > 0) or (usd is not None and usd < min_usd):
            continue
        held.append(_Holding(asset.token_address, asset.symbol, asset.decimals, amount, usd))
    return held


def make_plan(
    db: Database,
    chain: Chain,
    io: SweepChain,
    gas_wallet: Erc20TransferExecutor,
    *,
    destination: str,
    min_usd: Decimal = Decimal(0),
    prices: PriceSource,
    all_addresses: bool = False,
    created_by: str,
    now: datetime | None = None,
) -> dict[str, Any] | None:
    """Read the chain, store the plan and return its file's document ({"digest", "plan"});
    None when no address holds anything worth sweeping."""
    now = now or utcnow()
    destination = to_checksum_address(destination)
    if int(destination, 16) == 0 or destination in {a.token_address for a in chain.assets}:
        raise PlanError(f"{destination} cannot receive a sweep (the zero address or a token)")
    with db.reader() as session:
        if store.is_deposit_address(session, destination):
            raise PlanError(f"{destination} is a deposit address: sweeps go to the treasury")
    served = io.chain_id()
    if served != chain.chain_id:
        raise ChainIdMismatch(f"the node serves chain {served}, not {chain.chain_id}")
    with db.reader() as session:
        candidates = store.candidates(session, chain.chain_id, all_addresses=all_addresses)
    block = io.head()
    pairs = [(a.token_address, c.address) for c in candidates for a in chain.assets]
    balances = io.token_balances(pairs, block)
    holding = [
        (c, h) for c in candidates if (h := _holdings(chain, balances, c.address, min_usd, prices))
    ]
    if not holding:
        return None
    fees = gas_wallet.fees()
    if "maxFeePerGas" not in fees:
        raise PlanError(f"chain {chain.chain_id} has no EIP-1559 base fee: not supported")
    addresses = [c.address for c, _ in holding]
    nonces = io.nonces(addresses, block)
    natives = io.native_balances(addresses, block)
    with db.reader() as session:
        others = store.in_flight(session, chain.chain_id, addresses)
    plan_id = new_id("swp")
    entries, rows = [], []
    totals: dict[str, dict[str, Any]] = {}
    max_gas = top_ups = fundings = 0
    for candidate, held in holding:
        address = candidate.address
        transfers = []
        need = 0
        for n, item in enumerate(held):
            gas = io.transfer_gas(item.token, address, destination, item.amount_raw)
            tx = transfer_tx(
                chain_id=chain.chain_id,
                token=item.token,
                to=destination,
                amount_raw=item.amount_raw,
                nonce=nonces[address] + n,
                gas=gas,
                fees=fees,
            )
            need += max_gas_cost(tx)
            transfers.append(
                {
                    "token": to_checksum_address(item.token),
                    "asset": item.asset,
                    "decimals": item.decimals,
                    "amountRaw": str(item.amount_raw),
                    "amount": format_amount(token_units(item.amount_raw, item.decimals)),
                    "amountUsd": None if item.amount_usd is None else str(item.amount_usd),
                    "tx": tx,
                }
            )
            total = totals.setdefault(item.asset, {"decimals": item.decimals, "raw": 0})
            total["raw"] += item.amount_raw
            rows.append(
                Sweep(
                    plan_id=plan_id,
                    chain_id=chain.chain_id,
                    deposit_address=address,
                    token_address=to_checksum_address(item.token),
                    asset=item.asset,
                    amount_raw=str(item.amount_raw),
                    destination=destination,
                    nonce=tx["nonce"],
                    tx=tx,
                    status=PLANNED,
                    created_at=now,
                    updated_at=now,
                )
            )
        top_up = max(0, need - natives[address])
        max_gas += need
        top_ups += top_up
        fundings += top_up > 0
        entries.append(
            {
                "address": address,
                "key": {
                    "xpub": candidate.xpub,
                    "scheme": candidate.scheme,
                    "index": candidate.index,
                    "path": full_path(candidate.scheme, chain.chain_id, candidate.index),
                },
                "nonce": nonces[address],
                "nativeBalanceWei": str(natives[address]),
                "gasTopUpWei": str(top_up),
                "inFlightInPlan": others.get(address),
                "transfers": transfers,
            }
        )
    funding_gas = fundings * NATIVE_TRANSFER_GAS * int(fees["maxFeePerGas"])
    document = {
        "kind": PLAN_KIND,
        "version": VERSION,
        "planId": plan_id,
        "chainId": chain.chain_id,
        "chainName": chain.name,
        "block": block,
        "createdAt": iso_ms(now),
        "createdBy": created_by,
        "destination": destination,
        "gasWallet": gas_wallet.address,
        "minUsd": str(min_usd),
        "fees": {k: int(v) for k, v in fees.items() if k != "type"},
        "addresses": entries,
        "totals": {
            "addresses": len(entries),
            "transfers": len(rows),
            "assets": {
                asset: {
                    "amountRaw": str(t["raw"]),
                    "amount": format_amount(token_units(t["raw"], t["decimals"])),
                }
                for asset, t in sorted(totals.items())
            },
            "gasTopUpWei": str(top_ups),
            "fundings": fundings,
            "maxCostWei": str(max_gas + funding_gas),
            "maxCostUsd": _usd(max_gas + funding_gas, chain),
            "nativeUsd": str(chain.native_usd),
        },
    }
    plan_digest = digest(document)
    with db.transaction() as session:
        store.record_plan(
            session,
            SweepPlan(
                id=plan_id,
                chain_id=chain.chain_id,
                destination=destination,
                gas_wallet=gas_wallet.address,
                block_number=block,
                digest=plan_digest,
                document=document,
                created_by=created_by[:120],
                created_at=now,
            ),
            rows,
        )
    return {"digest": plan_digest, "plan": document}
