"""`settle sweep send`: fund each address's gas, broadcast its signed transfers, follow
them to the chain's depth and record each one; safe to run twice, and resumed where a
killed run stopped.

The rules (docs/DEPOSITS.md, "Sweeps"):

- A signed file is checked whole against the plan as the database holds it before
  anything is written: every transaction must be exactly the one planned (sender,
  chain, nonce, token, calldata, gas, fees), for a plan of this chain, at its digest.
- A transfer moves at most once because it is a nonce of its deposit address: every
  transaction ever sent for it is the same signed bytes, and any other transaction with
  that nonce (an older or newer plan's) excludes it. It is final only at the chain's
  depth, its block checked canonical; a reorg that removes it before then sends the same
  bytes again.
- Everything is stored before it is broadcast (the gas top-up, its nonce from the hot
  wallet's allocator, and each transfer marked `sent`), so a run killed at any point is
  resumed by the next from the rows: a stored transaction the node does not know is
  broadcast again, never signed anew.
- Before an address's first broadcast, the chain must still hold what the plan saw (its
  nonce, and each token's amount at least); otherwise its transfers are `stale`, no
  gas is spent on them, and the operator plans again.
- One send per chain at a time (a PostgreSQL advisory lock held for the run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from eth_utils import to_checksum_address

from services.core.chains import Chain
from services.core.deposits import gas_pricing, incidents, payments
from services.core.hot_wallet import Erc20TransferExecutor, Receipt
from services.core.sweeps import store
from services.core.sweeps.chain import SweepChain
from services.core.sweeps.documents import (
    NATIVE_TRANSFER_GAS,
    SweepFileError,
    decode,
    max_gas_cost,
    mismatch,
)
from services.core.sweeps.models import (
    CONFIRMED,
    FAILED,
    NOT_NEEDED,
    OPEN,
    PLANNED,
    REPLACED,
    REVERTED,
    SENT,
    SIGNED,
    STALE,
    SUPERSEDED,
    Sweep,
    SweepFunding,
)
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

#: Replacements a gas top-up may have (then it waits as it is, sent again if lost).
MAX_TOP_UP_REPLACEMENTS = 5


class SendRefused(SweepFileError):
    """Nothing was sent or written: the signed file does not match the stored plan."""


@dataclass(frozen=True)
class Outcome:
    """Where a plan's sweeps stand after a run."""

    plan_id: str
    counts: dict[str, int]
    #: The confirmed sweeps: what moved, with its transaction and block.
    moved: list[dict[str, Any]] = field(default_factory=list)
    #: The sweeps that did not move and why (stale, reverted, superseded).
    not_moved: list[dict[str, Any]] = field(default_factory=list)

    @property
    def open(self) -> int:
        return sum(self.counts.get(s, 0) for s in OPEN)

    def document(self) -> dict[str, Any]:
        return {
            "planId": self.plan_id,
            "done": self.open == 0,
            "counts": self.counts,
            "moved": self.moved,
            "notMoved": self.not_moved,
        }


def _sweep_view(row: Sweep) -> dict[str, Any]:
    return {
        "address": row.deposit_address,
        "token": row.token_address,
        "asset": row.asset,
        "amountRaw": row.amount_raw,
        "nonce": row.nonce,
        "status": row.status,
        "txHash": row.tx_hash,
        "blockNumber": row.block_number,
        "detail": row.detail,
    }


class Sender:
    """Sends the sweeps of one chain's plans through its node and gas wallet."""

    def __init__(
        self,
        db: Database,
        chain: Chain,
        io: SweepChain,
        gas_wallet: Erc20TransferExecutor,
        *,
        replace_after_blocks: int = 12,
        max_fee_wei: int | None = None,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.db = db
        self.chain = chain
        self.io = io
        self.gas = gas_wallet
        #: A gas top-up not mined this many blocks after it was signed is replaced (the
        #: hot wallet's SETTLE_PAYMENT_REPLACE_BLOCKS), never above `max_fee_wei`
        #: (SETTLE_PAYMENT_MAX_FEE_GWEI).
        self.replace_after_blocks = replace_after_blocks
        self.max_fee_wei = max_fee_wei
        self.clock = clock
        self.sleep = sleep

    # -- accepting a signed file -----------------------------------------------------------

    def accept(self, signed: Mapping[str, Any]) -> str:
        """Check a SIGNED.json document against the stored plan and store its transactions;
        the plan id. All or nothing: SendRefused before anything is written."""
        plan_id = str(signed.get("planId"))
        served = self.io.chain_id()
        if served != self.chain.chain_id:
            raise SendRefused(f"the node serves chain {served}, not {self.chain.chain_id}")
        with self.db.transaction() as session:
            plan = store.plan(session, plan_id)
            if plan is None:
                raise SendRefused(f"no plan {plan_id} in this database")
            if signed.get("chainId") != plan.chain_id or plan.chain_id != self.chain.chain_id:
                raise SendRefused(
                    f"plan {plan_id} is for chain {plan.chain_id}; the file says "
                    f"{signed.get('chainId')!r}, this send is for {self.chain.chain_id}"
                )
            if signed.get("planDigest") != plan.digest:
                raise SendRefused(f"signed for another version of plan {plan_id} (digest differs)")
            rows = {
                (r.deposit_address, r.token_address): r
                for r in store.sweeps_of(session, plan_id, lock=True)
            }
            chosen: list[tuple[Sweep, str, str]] = []
            seen: set[tuple[str, str]] = set()
            for item in signed.get("transactions") or []:
                chosen.append(self._checked(item, rows, seen))
            if not chosen:
                raise SendRefused("the signed file holds no transaction")
            now = self.clock()
            for row, raw, tx_hash in chosen:
                if row.status == PLANNED:
                    row.raw_tx, row.tx_hash, row.status, row.updated_at = raw, tx_hash, SIGNED, now
        return plan_id

    def _checked(
        self,
        item: Mapping[str, Any],
        rows: Mapping[tuple[str, str], Sweep],
        seen: set[tuple[str, str]],
    ) -> tuple[Sweep, str, str]:
        try:
            key = (to_checksum_address(item["address"]), to_checksum_address(item["token"]))
            raw = str(item["raw"])
        except (KeyError, TypeError, ValueError):
            raise SendRefused(f"a malformed transaction entry: {dict(item)!r:.200}") from None
        row = rows.get(key)
        if row is None:
            raise SendRefused(f"{key[0]} {key[1]}: not a transfer of this plan")
        if key in seen:
            raise SendRefused(f"{key[0]} {key[1]}: given twice")
        seen.add(key)
        if row.status == REPLACED:
            raise SendRefused(f"{key[0]}: {row.detail}; sign and send that plan instead")
        signed = decode(raw)
        why = mismatch(signed, row.deposit_address, row.tx)
        if why is not None:
            raise SendRefused(f"{key[0]} {row.asset}: {why}")
        if row.raw_tx is not None and row.raw_tx.lower() != raw.lower():
            raise SendRefused(
                f"{key[0]} {row.asset}: this transfer was stored with other signed bytes"
            )
        return row, raw, signed.hash

    # -- running ---------------------------------------------------------------------------

    def run(
        self, plan_id: str, *, wait: bool = True, timeout_s: float = 1800.0, poll_s: float = 2.0
    ) -> Outcome:
        """Work the plan's open sweeps until none is left (or, without `wait`, until each
        was broadcast; or until `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        with self._exclusive():
            while True:
                busy = self.round(plan_id)
                if not busy:
                    break
                if not wait and self._all_broadcast(plan_id):
                    break
                if time.monotonic() >= deadline:
                    log.warning(
                        "sweep send: plan %s still has sweeps open at the deadline", plan_id
                    )
                    break
                self.sleep(poll_s)
        return self.outcome(plan_id)

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        key = f"settle.sweep.send.{self.chain.chain_id}"
        with self.db.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            lock = sa.text("SELECT pg_try_advisory_lock(hashtextextended(:key, 0))")
            if not conn.execute(lock, {"key": key}).scalar():
                raise SendRefused(
                    f"another `settle sweep send` on chain {self.chain.chain_id} is running"
                )
            try:
                yield
            finally:
                conn.execute(
                    sa.text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))"), {"key": key}
                )

    def _all_broadcast(self, plan_id: str) -> bool:
        with self.db.reader() as session:
            return all(s.status != SIGNED for s in store.sweeps_of(session, plan_id))

    def round(self, plan_id: str) -> bool:
        """One pass over the plan's open addresses; False when nothing is left open."""
        with self.db.reader() as session:
            sweeps = store.sweeps_of(session, plan_id)
            fundings = {f.deposit_address: f for f in store.fundings_of(session, plan_id)}
        by_address: dict[str, list[Sweep]] = {}
        for row in sweeps:
            if row.status in OPEN:
                by_address.setdefault(row.deposit_address, []).append(row)
        for address, funding in fundings.items():
            if funding.status == SENT:
                by_address.setdefault(address, [])
        if not by_address:
            return False
        head = self.gas.head()
        for address, items in sorted(by_address.items()):
            self._address(plan_id, address, items, fundings.get(address), head)
        return True

    def _address(
        self,
        plan_id: str,
        address: str,
        items: Sequence[Sweep],
        funding: SweepFunding | None,
        head: int,
    ) -> None:
        funded = self._follow_funding(funding, head) if funding is not None else None
        for row in items:
            if row.status == SENT:
                self._follow(row, head)
        fresh = [r for r in items if r.status == SIGNED]
        if not fresh or any(r.status == SENT for r in items):
            return
        # Someone broadcast these bytes already (a signed file is a set of valid
        # transactions): follow them as sent.
        if any(self.gas.known(r.tx_hash or "") for r in fresh):
            self._mark(fresh, SENT, "found on the node before this run broadcast it")
            return
        why = self._stale(address, fresh)
        if why is not None:
            self._mark(fresh, STALE, why)
            return
        if funding is None:
            funding = self._fund(plan_id, address, fresh)
            funded = funding.status == NOT_NEEDED
        if funding.status == FAILED:
            self._mark(fresh, STALE, f"its gas top-up failed: {funding.detail}")
            return
        if not (funded or funding.status in (NOT_NEEDED, CONFIRMED)):
            return  # the top-up is not mined yet
        # Marked sent before the broadcast: from here on, an error means "unknown".
        self._mark(fresh, SENT, None)
        for row in sorted(fresh, key=lambda r: r.nonce):
            self._broadcast(row.raw_tx or "", f"sweep {row.id}")

    # -- the address's checks --------------------------------------------------------------

    def _stale(self, address: str, fresh: Sequence[Sweep]) -> str | None:
        """Why the chain no longer holds what the plan saw (None: it does)."""
        first = min(r.nonce for r in fresh)
        nonce = self.io.nonces([address], "latest")[address]
        if nonce != first:
            return f"the address's nonce is {nonce}, the plan's {first}: it sent since"
        balances = self.io.token_balances([(r.token_address, address) for r in fresh], "latest")
        for row in fresh:
            held = balances[(row.token_address, address)]
            if held < int(row.amount_raw):
                return f"it holds {held} {row.asset} base units, the plan moves {row.amount_raw}"
        return None

    # -- gas -------------------------------------------------------------------------------

    def _fund(self, plan_id: str, address: str, fresh: Sequence[Sweep]) -> SweepFunding:
        """Store (then broadcast) the address's gas top-up, or record that none is needed."""
        need = sum(max_gas_cost(r.tx) for r in fresh)
        held = self.io.native_balances([address], "latest")[address]
        amount = max(0, need - held)
        now = self.clock()
        row = SweepFunding(
            plan_id=plan_id,
            chain_id=self.chain.chain_id,
            deposit_address=address,
            wallet=self.gas.address,
            amount_wei=str(amount),
            status=NOT_NEEDED if amount == 0 else SENT,
            tx_hashes=[],
            created_at=now,
            updated_at=now,
        )
        if amount == 0:
            with self.db.transaction() as session:
                session.add(row)
            return row
        tx = {
            "chainId": self.chain.chain_id,
            "to": to_checksum_address(address),
            "value": amount,
            "data": "0x",
            "gas": NATIVE_TRANSFER_GAS,
            **self.gas.fees(),
        }
        pending, head = self.gas.nonce("pending"), self.gas.head()
        try:
            with self.db.transaction() as session:
                # The hot wallet's own allocator: payouts and top-ups never share a nonce.
                nonce = payments.allocate_nonce(
                    session, self.chain.chain_id, self.gas.address, pending, now
                )
                signed = self.gas.sign(tx, nonce)
                row.nonce, row.tx, row.raw_tx, row.signed_block = nonce, tx, signed.raw, head
                row.tx_hash, row.tx_hashes = signed.hash, [signed.hash]
                session.add(row)
        except payments.NonceGap as gap:
            # The wallet sent what Settle has no record of: pay nothing from it, as the
            # payouts do, until a person resolves the incident (nothing stored: a later
            # run resumes from here).
            with self.db.transaction() as session:
                incidents.raise_nonce_gap(session, gap, head, now)
            raise
        self._broadcast(signed.raw, f"gas top-up of {address}")
        return row

    def _follow_funding(self, funding: SweepFunding, head: int) -> bool:
        """Whether the address has its gas (the top-up mined, or none needed).

        A top-up holds a nonce of the hot wallet: until it is mined, no payout after it
        can be. So, as a payout, it is replaced (same nonce, higher fees) when not mined
        `replace_after_blocks` after it was signed, and failed only when another
        transaction used its nonce at the chain's depth.
        """
        if funding.status in (NOT_NEEDED, CONFIRMED):
            return True
        if funding.status == FAILED or funding.nonce is None:
            return False
        found = [(h, r) for h in funding.tx_hashes if (r := self._canonical_receipt(h))]
        if not found:
            self._unmined_funding(funding, head)
            return False
        tx_hash, mined = found[0]
        deep = head - mined.block_number + 1 >= self.chain.confirmations
        status = FAILED if mined.status != 1 else CONFIRMED if deep else SENT
        self._update_funding(
            funding,
            status=status,
            tx_hash=tx_hash,
            block_number=mined.block_number,
            block_hash=mined.block_hash,
            detail=None if status != FAILED else f"top-up {tx_hash} reverted",
        )
        return mined.status == 1

    def _unmined_funding(self, funding: SweepFunding, head: int) -> None:
        at_depth = max(0, head - self.chain.confirmations + 1)
        what = f"gas top-up of {funding.deposit_address}"
        if self.gas.nonce(at_depth) > (funding.nonce or 0):
            self._update_funding(
                funding,
                status=FAILED,
                detail=f"nonce {funding.nonce} of the gas wallet was used by another transaction",
            )
        elif head - (funding.signed_block or head) >= self.replace_after_blocks and funding.tx:
            # Priced from the market, as a payout's replacement (gas_pricing.reprice): not
            # at all while the market asks no more than it offers, never past the cap.
            bumped = gas_pricing.reprice(
                funding.tx,
                self.gas.market(),
                self.max_fee_wei,
                len(funding.tx_hashes) - 1,
                MAX_TOP_UP_REPLACEMENTS,
            )
            if isinstance(bumped, gas_pricing.Stall):
                log.warning("sweep send: %s unmined, not replaced: %s", what, bumped.detail)
                return
            if bumped is None:
                if not self.gas.known(funding.tx_hash or ""):
                    self._broadcast(funding.raw_tx or "", what)
                return
            signed = self.gas.sign(bumped, funding.nonce or 0)
            # Stored before it is broadcast; the earlier hashes stay candidates.
            self._update_funding(
                funding,
                tx=bumped,
                raw_tx=signed.raw,
                tx_hash=signed.hash,
                tx_hashes=[*funding.tx_hashes, signed.hash],
                signed_block=head,
            )
            self._broadcast(signed.raw, f"{what} (replaced: fees up)")
        elif not self.gas.known(funding.tx_hash or ""):
            self._broadcast(funding.raw_tx or "", what)

    def _update_funding(self, funding: SweepFunding, **values: Any) -> None:
        with self.db.transaction() as session:
            row = session.get(SweepFunding, funding.id, with_for_update=True)
            assert row is not None
            for name, value in {**values, "updated_at": self.clock()}.items():
                setattr(row, name, value)
                setattr(funding, name, value)

    # -- transfers -------------------------------------------------------------------------

    def _canonical_receipt(self, tx_hash: str) -> Receipt | None:
        """The transaction's receipt when its block is the canonical one at its height."""
        receipt = self.gas.receipt(tx_hash)
        if receipt is None or self.gas.block_hash(receipt.block_number) != receipt.block_hash:
            return None
        return receipt

    def _follow(self, row: Sweep, head: int) -> None:
        tx_hash = row.tx_hash or ""
        receipt = self._canonical_receipt(tx_hash)
        depth = self.chain.confirmations
        if receipt is not None:
            deep = head - receipt.block_number + 1 >= depth
            status = SENT
            if deep:
                status = CONFIRMED if receipt.status == 1 else REVERTED
            self._record(row, status, receipt)
            return
        # Not mined on the canonical chain: used by another transaction (at depth), or
        # not known to the node (dropped, or its block reorged away): the same bytes again.
        at_depth = max(0, head - depth + 1)
        if self.io.nonces([row.deposit_address], at_depth)[row.deposit_address] > row.nonce:
            self._record(
                row, SUPERSEDED, None, f"nonce {row.nonce} was used by another transaction"
            )
        elif not self.gas.known(tx_hash):
            if row.block_number is not None:
                self._record(row, SENT, None, f"its block {row.block_number} left the chain")
            self._broadcast(row.raw_tx or "", f"sweep {row.id}")

    def _record(
        self, row: Sweep, status: str, receipt: Receipt | None, detail: str | None = None
    ) -> None:
        with self.db.transaction() as session:
            stored = session.get(Sweep, row.id, with_for_update=True)
            assert stored is not None
            if stored.status not in OPEN:
                return
            now = self.clock()
            stored.status = status
            stored.block_number = receipt.block_number if receipt else None
            stored.block_hash = receipt.block_hash if receipt else None
            stored.detail = detail
            if status == REVERTED:
                stored.detail = f"{row.tx_hash} reverted: nothing moved"
            if status == CONFIRMED:
                stored.confirmed_at = now
            stored.updated_at = now
        row.status = status
        row.block_number = receipt.block_number if receipt else None

    def _mark(self, rows: Sequence[Sweep], status: str, detail: str | None) -> None:
        now = self.clock()
        with self.db.transaction() as session:
            for row in rows:
                stored = session.get(Sweep, row.id, with_for_update=True)
                assert stored is not None
                if stored.status != SIGNED:
                    continue
                stored.status, stored.detail, stored.updated_at = status, detail, now
                if status == SENT:
                    stored.sent_at = now
                row.status = status

    def _broadcast(self, raw: str, what: str) -> None:
        """Send stored bytes; any error means "unknown" (the next round asks the node)."""
        try:
            self.gas.broadcast(raw)
        except Exception as exc:  # the node's refusal or the network's: judged next round
            log.warning("sweep send: broadcasting %s: %s: %s", what, type(exc).__name__, exc)

    # -- the result ------------------------------------------------------------------------

    def outcome(self, plan_id: str) -> Outcome:
        with self.db.reader() as session:
            rows = store.sweeps_of(session, plan_id)
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        return Outcome(
            plan_id,
            counts,
            moved=[_sweep_view(r) for r in rows if r.status == CONFIRMED],
            not_moved=[_sweep_view(r) for r in rows if r.status in (STALE, REVERTED, SUPERSEDED)],
        )
