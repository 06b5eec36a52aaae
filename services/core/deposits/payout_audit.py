"""Hot-wallet payouts as the chain shows them, matched against what Settle recorded.

A payout is an ERC-20 `Transfer` of a chain's supported token from the hot wallet; its
transaction carries a tag naming its deposit (`payout_tag`). `settle reconcile` lists
the payouts of a window that Settle has no record of (after a database restore, the
payouts made after the backup); resolving a `nonce_gap` incident is refused while one
of them names a deposit Settle still shows unpaid (`unpaid_payouts`), since resuming
payments would pay it again.

Recorded means: the transaction is one of a stored payment's (`hot_wallet_payments`,
any of its hashes or its cancel), or the `creditTxHash` of a deposit (ops credited it
by hand with that transaction).

Reads only: the node through `PayoutScanner` (logs by sender, which any full node
serves for the whole history), the database through the caller's connection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from services.core.chains import Chain, ChainRegistry
from services.core.checksums import checksum
from services.core.deposits import payout_tag, states
from services.core.deposits.models import Deposit, HotWalletPayment
from services.core.deposits.payout_tag import PayoutTag

if TYPE_CHECKING:
    from services.core.deposits.settings import PipelineSettings
    from services.core.evm import Web3ChainReader

#: Blocks per `eth_getLogs` when scanning a range (the reader halves it on refusal).
SCAN_SPAN = 5_000


class ChainUnreadable(RuntimeError):
    """The node could not answer what the audit asked."""


@dataclass(frozen=True)
class OnChainPayout:
    """A token transfer from the hot wallet, as the chain shows it."""

    chain_id: int
    tx_hash: str
    nonce: int
    block_number: int
    token_address: str
    to_address: str
    amount_raw: int
    #: The tag its calldata carries (None: not a tagged Settle payout).
    tag: PayoutTag | None


class PayoutScanner:
    """One chain's hot-wallet payouts, read from its node."""

    def __init__(self, reader: Web3ChainReader, chain: Chain, wallet: str) -> None:
        self.reader = reader
        self.chain = chain
        self.wallet = checksum(wallet)
        self.tokens = sorted({a.token_address.lower() for a in chain.assets})

    @property
    def chain_id(self) -> int:
        return self.chain.chain_id

    def head(self) -> int:
        try:
            return self.reader.head()
        except Exception as exc:  # any transport or node error: the audit cannot run
            raise ChainUnreadable(f"{type(exc).__name__}: {exc}") from exc

    def between(self, from_block: int, to_block: int) -> list[OnChainPayout]:
        """Every payout mined in [from_block, to_block], oldest first."""
        if from_block > to_block or not self.tokens:
            return []
        try:
            logs = []
            for start in range(max(0, from_block), to_block + 1, SCAN_SPAN):
                end = min(to_block, start + SCAN_SPAN - 1)
                logs += self.reader.transfer_logs(start, end, self.tokens, sender=self.wallet)
            payouts = []
            facts: dict[str, Any] = {}
            for log in logs:
                tx = facts.get(log.tx_hash)
                if tx is None:
                    tx = facts[log.tx_hash] = self.reader.transaction(log.tx_hash)
                if tx is None:
                    continue  # gone since the logs were read (a reorg): not mined now
                payouts.append(
                    OnChainPayout(
                        self.chain_id,
                        log.tx_hash,
                        tx.nonce,
                        log.block_number,
                        log.token_address,
                        log.to_address,
                        log.amount_raw,
                        payout_tag.decode(tx.input),
                    )
                )
        except Exception as exc:
            raise ChainUnreadable(f"{type(exc).__name__}: {exc}") from exc
        return payouts

    def first_block_at(self, when: datetime) -> int:
        """The first block whose timestamp is at or after `when` (head + 1 if none)."""
        from services.core.evm import first_block_at

        try:
            return first_block_at(self.reader, when)
        except Exception as exc:
            raise ChainUnreadable(f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class Unrecorded:
    """A payout Settle has no record of, and the deposit its tag names, if any."""

    payout: OnChainPayout
    deposit_id: str | None
    deposit_status: str | None
    tenant_id: str | None
    detail: str

    @property
    def pays_an_open_deposit(self) -> bool:
        """Its deposit is not final: Settle would pay it (again)."""
        return self.deposit_status is not None and not states.is_final(self.deposit_status)


_DEPOSITS: sa.Table = Deposit.__table__  # type: ignore[assignment]
_PAYMENTS: sa.Table = HotWalletPayment.__table__  # type: ignore[assignment]
_TAG_COLUMNS = (
    _DEPOSITS.c.id,
    _DEPOSITS.c.status,
    _DEPOSITS.c.tenant_id,
    _DEPOSITS.c.chain_id,
    _DEPOSITS.c.source_tx_hash,
    _DEPOSITS.c.token_address,
    _DEPOSITS.c.deposit_address,
    _DEPOSITS.c.transfer_seq,
    _DEPOSITS.c.credit_tx_hash,
)


def _strings(values: Iterable[str]) -> sa.BindParameter[list[str]]:
    return sa.bindparam(None, sorted(set(values)), type_=ARRAY(sa.String()))


def unrecorded(
    db: Session | sa.Connection, wallet: str, payouts: Sequence[OnChainPayout]
) -> list[Unrecorded]:
    """The payouts Settle has no record of, each with the deposit its tag names."""
    if not payouts:
        return []
    chain_id = payouts[0].chain_id
    hashes = [p.tx_hash.lower() for p in payouts]
    known: set[str] = set()
    for tx_hashes, cancel in db.execute(
        sa.select(_PAYMENTS.c.tx_hashes, _PAYMENTS.c.cancel_tx_hash).where(
            _PAYMENTS.c.chain_id == chain_id,
            _PAYMENTS.c.wallet == wallet,
            _PAYMENTS.c.nonce
            == sa.any_(
                sa.bindparam(None, sorted({p.nonce for p in payouts}), type_=ARRAY(sa.BigInteger()))
            ),
        )
    ):
        known.update(h.lower() for h in tx_hashes)
        if cancel:
            known.add(cancel.lower())
    known.update(
        h.lower()
        for h in db.execute(
            sa.select(_DEPOSITS.c.credit_tx_hash).where(
                sa.func.lower(_DEPOSITS.c.credit_tx_hash) == sa.any_(_strings(hashes))
            )
        ).scalars()
    )
    missing = [p for p in payouts if p.tx_hash.lower() not in known]
    if not missing:
        return []
    named = {
        row.id: row
        for row in db.execute(
            sa.select(*_TAG_COLUMNS).where(
                _DEPOSITS.c.id == sa.any_(_strings(p.tag.deposit_id for p in missing if p.tag))
            )
        )
    }
    by_source = _open_by_source(
        db, chain_id, [p for p in missing if p.tag and p.tag.deposit_id not in named]
    )
    return [_explain(p, named, by_source) for p in missing]


def _open_by_source(
    db: Session | sa.Connection, chain_id: int, payouts: Sequence[OnChainPayout]
) -> dict[bytes, Any]:
    """Open deposits paid on this chain, by their source digest, when some tag names a
    deposit Settle does not have (detected again, under another id, after a restore)."""
    if not payouts:
        return {}
    rows = db.execute(
        sa.select(*_TAG_COLUMNS).where(
            _DEPOSITS.c.dest_chain_id == chain_id,
            _DEPOSITS.c.status.not_in(states.FINAL),
        )
    )
    return {payout_tag.tag_for(row).source_digest: row for row in rows}


def _explain(
    payout: OnChainPayout, named: dict[str, Any], by_source: dict[bytes, Any]
) -> Unrecorded:
    amount = f"{payout.amount_raw} base units of {payout.token_address} to {payout.to_address}"
    where = f"nonce {payout.nonce}, block {payout.block_number}: {amount}"
    if payout.tag is None:
        return Unrecorded(payout, None, None, None, f"{where}; no Settle tag")
    row = named.get(payout.tag.deposit_id)
    how = "its tag names"
    if row is not None and payout_tag.tag_for(row).source_digest != payout.tag.source_digest:
        how = "its tag names (with another source transfer: check it)"
    if row is None:
        row = by_source.get(payout.tag.source_digest)
        how = f"its tag names {payout.tag.deposit_id}, not in the database; by its source it is"
    if row is None:
        return Unrecorded(
            payout, None, None, None, f"{where}; its tag names {payout.tag.deposit_id}, unknown"
        )
    state = f"{row.status}" + (f", credited by {row.credit_tx_hash}" if row.credit_tx_hash else "")
    return Unrecorded(
        payout, row.id, row.status, row.tenant_id, f"{where}; {how} deposit {row.id} ({state})"
    )


def unpaid_payouts(
    session: Session, scanner: PayoutScanner, from_nonce: int, scan_from: int
) -> list[Unrecorded]:
    """Payouts from `from_nonce` on (mined from block `scan_from`) that Settle has no record
    of and whose deposit it shows unpaid: resuming payments would pay those again."""
    payouts = [p for p in scanner.between(scan_from, scanner.head()) if p.nonce >= from_nonce]
    return [u for u in unrecorded(session, scanner.wallet, payouts) if u.pays_an_open_deposit]


def scanners_from(
    registry: ChainRegistry, rpc_urls: Mapping[int, str], settings: PipelineSettings
) -> dict[int, PayoutScanner]:
    """A scanner of each active chain with a node, for the hot wallet of the key set (none
    without SETTLE_HOT_WALLET_KEY)."""
    if not settings.hot_wallet_key:
        return {}
    from eth_account import Account

    from services.core.evm import Web3ChainReader

    wallet = str(Account.from_key(settings.hot_wallet_key).address)
    scanners = {}
    for chain in registry.active():
        url = rpc_urls.get(chain.chain_id)
        if url:
            reader = Web3ChainReader.from_url(url, settings.rpc_timeout_s, chain.chain_id)
            scanners[chain.chain_id] = PayoutScanner(reader, chain, wallet)
    return scanners
