"""What `settle reconcile` checks about sweeps (docs/RECONCILE.md, "Sweeps"):

- deposits not yet swept: per (chain, address, token), the confirmed sweeps cover the
  deposits oldest first; what they do not cover is still at the address (information,
  not a discrepancy: deposits wait for the next plan);
- sweeps not confirmed: signed or sent, and not final after the settle time;
- sweeps reorged: confirmed ones whose block is no longer the canonical block at its
  height (read on the chain);
- balances no deposit explains: each (address, token)'s balance on the chain, read at
  the block under the watcher's finality cursor, against the deposits final there minus
  the sweeps confirmed there. An address with a sweep in flight is left for the next run.

Reads one database snapshot (the caller's connection) and, for the chain checks, each
chain's node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from services.core.deposits.models import ChainCursor, Deposit
from services.core.models import DepositAddress
from services.core.sweeps.models import CONFIRMED, OPEN, Sweep
from shared.timefmt import iso_ms

if TYPE_CHECKING:
    # web3, only where a node is read: reconcile imports this module for every run.
    from services.core.sweeps.chain import SweepChain

#: Pair of (chain id, address, token address lowercase).
Holding = tuple[int, str, str]


@dataclass(frozen=True)
class ChainBalances:
    """A chain to read for reconcile: its node, its supported tokens, which addresses."""

    io: SweepChain
    tokens: tuple[str, ...]
    #: Every deposit address of the chain, not only those with deposits or sweeps.
    all_addresses: bool = False


@dataclass(frozen=True)
class Unswept:
    deposit_id: str
    tenant_id: str
    chain_id: int
    address: str
    asset: str
    #: Base units of the deposit still at the address (all of it, or what a sweep left).
    amount_raw: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "depositId": self.deposit_id,
            "tenantId": self.tenant_id,
            "chainId": self.chain_id,
            "address": self.address,
            "asset": self.asset,
            "amountRaw": str(self.amount_raw),
        }


@dataclass(frozen=True)
class Finding:
    """A sweep or a balance that is wrong: what it is about and why."""

    subject: str
    detail: str


_LIVE = (
    Deposit.sandbox.is_(False),
    Deposit.source_vanished_at.is_(None),
    Deposit.asset.is_not(None),
)


def _swept(conn: sa.Connection, *, at_block: Mapping[int, int] | None = None) -> dict[Holding, int]:
    """Base units moved out by confirmed sweeps (at or under `at_block[chain]` if given)."""
    rows = conn.execute(
        sa.select(
            Sweep.chain_id,
            Sweep.deposit_address,
            Sweep.token_address,
            Sweep.amount_raw,
            Sweep.block_number,
        ).where(Sweep.status == CONFIRMED)
    )
    out: dict[Holding, int] = {}
    for chain_id, address, token, amount, block in rows:
        if at_block is not None and (chain_id not in at_block or (block or 0) > at_block[chain_id]):
            continue
        key = (int(chain_id), address, token.lower())
        out[key] = out.get(key, 0) + int(amount)
    return out


def unswept_deposits(conn: sa.Connection, tenant_ids: Iterable[str] | None = None) -> list[Unswept]:
    """Deposits (non-sandbox, on the chain) whose tokens no confirmed sweep has moved."""
    left = _swept(conn)
    query = (
        sa.select(
            Deposit.id,
            Deposit.tenant_id,
            Deposit.chain_id,
            Deposit.deposit_address,
            Deposit.token_address,
            Deposit.asset,
            Deposit.amount_raw,
        )
        .where(*_LIVE)
        .order_by(Deposit.chain_id, Deposit.block_number, Deposit.log_index, Deposit.id)
    )
    tenants = set(tenant_ids) if tenant_ids is not None else None
    out = []
    for dep_id, tenant_id, chain_id, address, token, asset, amount in conn.execute(query):
        key = (int(chain_id), address, token.lower())
        amount = int(amount)
        covered = min(amount, left.get(key, 0))
        left[key] = left.get(key, 0) - covered
        if covered < amount and (tenants is None or tenant_id in tenants):
            out.append(
                Unswept(dep_id, tenant_id, int(chain_id), address, str(asset), amount - covered)
            )
    return out


def unconfirmed_sweeps(conn: sa.Connection, older_than: datetime) -> list[Finding]:
    rows = conn.execute(
        sa.select(
            Sweep.plan_id,
            Sweep.chain_id,
            Sweep.deposit_address,
            Sweep.asset,
            Sweep.amount_raw,
            Sweep.status,
            Sweep.tx_hash,
            Sweep.updated_at,
        )
        .where(Sweep.status.in_(OPEN), Sweep.updated_at < older_than)
        .order_by(Sweep.id)
    )
    return [
        Finding(
            f"{plan_id} {address}",
            f"chain {chain_id}: {amount} {asset} base units {status} since {iso_ms(updated)}"
            f" ({tx_hash or 'not broadcast'}); run `settle sweep send` again",
        )
        for plan_id, chain_id, address, asset, amount, status, tx_hash, updated in rows
    ]


def reorged_sweeps(
    conn: sa.Connection, chain_id: int, io: SweepChain, since: datetime, until: datetime
) -> list[Finding]:
    """Sweeps confirmed in [since, until) whose block is no longer canonical."""
    rows = list(
        conn.execute(
            sa.select(
                Sweep.plan_id,
                Sweep.deposit_address,
                Sweep.tx_hash,
                Sweep.block_number,
                Sweep.block_hash,
            ).where(
                Sweep.chain_id == chain_id,
                Sweep.status == CONFIRMED,
                Sweep.confirmed_at >= since,
                Sweep.confirmed_at < until,
            )
        )
    )
    hashes = io.block_hashes([int(block) for *_, block, _ in rows])
    return [
        Finding(
            f"{plan_id} {address}",
            f"chain {chain_id}: confirmed in block {block} ({block_hash}), now "
            f"{hashes.get(int(block))}: sweep {tx_hash} left the chain",
        )
        for plan_id, address, tx_hash, block, block_hash in rows
        if hashes.get(int(block)) != block_hash
    ]


def unexplained_balances(
    conn: sa.Connection,
    chain_id: int,
    tokens: Iterable[str],
    io: SweepChain,
    *,
    all_addresses: bool = False,
) -> tuple[list[Finding], int]:
    """Balances at the block under the finality cursor that deposits and sweeps do not
    explain; and how many (address, token) pairs were compared."""
    confirmed = conn.execute(
        sa.select(ChainCursor.confirmed_block).where(ChainCursor.chain_id == chain_id)
    ).scalar()
    block = (int(confirmed) - 1) if confirmed else io.head()  # no watcher: the head
    deposits: dict[Holding, int] = {}
    for address, token, amount in conn.execute(
        sa.select(Deposit.deposit_address, Deposit.token_address, Deposit.amount_raw).where(
            Deposit.chain_id == chain_id, Deposit.block_number <= block, *_LIVE
        )
    ):
        key = (chain_id, address, token.lower())
        deposits[key] = deposits.get(key, 0) + int(amount)
    swept = _swept(conn, at_block={chain_id: block})
    busy = {
        address
        for (address,) in conn.execute(
            sa.select(Sweep.deposit_address).where(
                Sweep.chain_id == chain_id, Sweep.status.in_(OPEN)
            )
        )
    }
    if all_addresses:
        addresses = [
            a
            for (a,) in conn.execute(
                sa.select(DepositAddress.address).where(DepositAddress.chain_id == chain_id)
            )
        ]
    else:
        addresses = sorted({address for _, address, _ in deposits} | {a for _, a, _ in swept})
    pairs = [(token, a) for a in addresses if a not in busy for token in tokens]
    balances = io.token_balances(pairs, block)
    findings = []
    for (token, address), held in balances.items():
        key = (chain_id, address, token.lower())
        expected = deposits.get(key, 0) - swept.get(key, 0)
        if held != expected:
            findings.append(
                Finding(
                    f"{chain_id} {address}",
                    f"token {token}: holds {held} base units at block {block}; deposits less "
                    f"sweeps explain {expected} ({held - expected:+d})",
                )
            )
    return findings, len(pairs)
