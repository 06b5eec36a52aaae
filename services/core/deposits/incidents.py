"""Chain incidents: what the watchers and the paying side found that a person must look
at, listed and resolved by ops (`settle incidents list|resolve`, CLI in `cli.py`).

Kinds:

- `deep_reorg` (the watcher, `Detection.deep_reorg`): a confirmed or credited deposit
  whose block left the canonical chain, a reorg deeper than the chain's finality. Its
  unmined payout, if any, is cancelled.
- `nonce_gap` (the paying side, `payments.allocate_nonce`): the hot wallet's nonce on
  chain is ahead of Settle's own count: transactions Settle has no record of (a
  database restored from a backup taken before some payouts, or the key used
  elsewhere). It pauses the chain's payments until a person resolves it; resolving
  adopts the chain's count (`payments.acknowledge_gap`), and is refused while a tagged
  payout of the gap names a deposit Settle still shows unpaid.
- `wrong_chain` (the watcher and the payer, `chain_check.ChainCheck`): the node
  configured for a chain serves another one. Nothing is read or paid there meanwhile.
- `token_decimals` (the same check, at start): a token's `decimals()` on chain is not
  the chains file's. Nothing is read or paid on that chain meanwhile.

The last two are resolved by Settle itself once the check passes (the URL or the file
fixed, the process restarted); the others only by a person. An incident stays open,
and counts in the `settle_chain_incidents_open` gauge, until resolved.

`Incidents.resolve` is the one place a person resolves an incident: who, why, and what
resolving does (for a nonce gap: the check on chain, then Settle's count moved).
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.deposits import payments, payout_audit
from services.core.deposits.models import ChainIncident
from services.core.deposits.payout_audit import PayoutScanner
from shared.db import Database
from shared.errors import Conflict, InvalidRequest, NotFound
from shared.timefmt import iso_ms, utcnow

Clock = Callable[[], datetime]

log = logging.getLogger(__name__)

#: A confirmed or credited deposit whose block left the canonical chain.
DEEP_REORG = "deep_reorg"
#: The hot wallet's nonce on chain is ahead of Settle's count.
NONCE_GAP = "nonce_gap"
#: The chain's node serves another chain.
WRONG_CHAIN = "wrong_chain"
#: A token's decimals on chain differ from the chains file.
TOKEN_DECIMALS = "token_decimals"
KINDS = (DEEP_REORG, NONCE_GAP, WRONG_CHAIN, TOKEN_DECIMALS)
#: Kinds that pause the chain's hot-wallet payments until a person resolves them.
PAUSING = (NONCE_GAP,)
#: Kinds Settle resolves itself when its check of the node passes again.
SELF_CLEARING = (WRONG_CHAIN, TOKEN_DECIMALS)

#: What an incident id looks like (anything else is not found without a query).
INCIDENT_ID = re.compile(r"^[1-9][0-9]{0,17}$")
#: Incidents listed at most.
MAX_LIST = 1000


# --- in the caller's transaction (raising, pausing, clearing) ------------------------------


def _serialize(session: Session, chain_id: int, kind: str) -> None:
    """Hold (chain, kind) for the rest of the transaction, so two processes that find the
    same thing at once raise one incident."""
    key = zlib.crc32(f"chain_incident:{chain_id}:{kind}".encode())
    session.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))


def open_incident(
    session: Session,
    chain_id: int,
    kind: str,
    *,
    deposit_id: str | None = None,
    block_number: int | None = None,
) -> ChainIncident | None:
    """The open incident of this kind on the chain (for this deposit and block, when
    given)."""
    stmt = sa.select(ChainIncident).where(
        ChainIncident.chain_id == chain_id,
        ChainIncident.kind == kind,
        ChainIncident.resolved_at.is_(None),
    )
    if deposit_id is not None:
        stmt = stmt.where(ChainIncident.deposit_id == deposit_id)
    if block_number is not None:
        stmt = stmt.where(ChainIncident.block_number == block_number)
    return session.scalars(stmt.order_by(ChainIncident.id).limit(1)).first()


def raise_once(
    session: Session,
    chain_id: int,
    kind: str,
    detail: str,
    now: datetime,
    *,
    facts: dict[str, Any] | None = None,
    deposit_id: str | None = None,
    block_number: int | None = None,
) -> ChainIncident | None:
    """Open an incident, unless one of this kind is open on the chain already (for this
    deposit and block, when given). Returns the new incident, None when one was open."""
    _serialize(session, chain_id, kind)
    found = open_incident(session, chain_id, kind, deposit_id=deposit_id, block_number=block_number)
    if found is not None:
        return None
    incident = ChainIncident(
        chain_id=chain_id,
        kind=kind,
        deposit_id=deposit_id,
        block_number=block_number,
        detail=detail,
        facts=facts,
        created_at=now,
    )
    session.add(incident)
    session.flush()
    return incident


def raise_nonce_gap(session: Session, gap: payments.NonceGap, head: int, now: datetime) -> None:
    """Pause the chain's payments (payouts and sweeps' gas top-ups): the incident a person
    resolves (docs/RECONCILE.md)."""
    detail = (
        f"{gap}. Settle pays nothing more on chain {gap.chain_id} until a person resolves "
        "this incident: list the payouts Settle has no record of (settle reconcile), "
        "credit the deposits they paid, then settle incidents resolve (docs/RECONCILE.md)"
    )
    raised = raise_once(
        session, gap.chain_id, NONCE_GAP, detail, now, facts=payments.gap_facts(session, gap, head)
    )
    if raised is not None:
        log.critical("chain %s: %s", gap.chain_id, detail)


def pausing(session: Session, chain_id: int) -> ChainIncident | None:
    """The open incident that pauses the chain's hot-wallet payments, if any."""
    return session.scalars(
        sa.select(ChainIncident)
        .where(
            ChainIncident.chain_id == chain_id,
            ChainIncident.kind.in_(PAUSING),
            ChainIncident.resolved_at.is_(None),
        )
        .order_by(ChainIncident.id)
        .limit(1)
    ).first()


def clear(session: Session, chain_id: int, kinds: tuple[str, ...], note: str, now: datetime) -> int:
    """Settle resolves its own incidents of these kinds on the chain (its check passed);
    how many."""
    rows = list(
        session.scalars(
            sa.select(ChainIncident)
            .where(
                ChainIncident.chain_id == chain_id,
                ChainIncident.kind.in_(kinds),
                ChainIncident.resolved_at.is_(None),
            )
            .with_for_update()
        )
    )
    for incident in rows:
        incident.resolved_at = now
        incident.detail = f"{incident.detail}\nresolved by settle: {note}"
    return len(rows)


# --- ops ------------------------------------------------------------------------------------


class Incidents:
    """Listing and resolving chain incidents.

    `scanners`: each chain's hot-wallet payouts read from its node (payout_audit), which
    resolving a nonce gap checks first; without one for the gap's chain it is refused.
    """

    def __init__(
        self,
        db: Database,
        *,
        scanners: Mapping[int, PayoutScanner] | None = None,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.scanners = dict(scanners or {})
        self.clock = clock

    def list(
        self, *, chain_id: int | None = None, include_resolved: bool = False, limit: int = 100
    ) -> list[ChainIncident]:
        """Open incidents (with `include_resolved`, every one), newest first."""
        stmt = sa.select(ChainIncident).order_by(ChainIncident.id.desc())
        if chain_id is not None:
            stmt = stmt.where(ChainIncident.chain_id == chain_id)
        if not include_resolved:
            stmt = stmt.where(ChainIncident.resolved_at.is_(None))
        with self.db.reader() as session:
            return list(session.scalars(stmt.limit(max(1, min(limit, MAX_LIST)))))

    def resolve(self, incident_id: str, *, by: str, reason: str) -> ChainIncident:
        """A person closes an open incident, saying who and why (the audited act).

        A nonce gap is checked on chain first (`_gap_refusal`: refused while a payout the
        chain shows names a deposit Settle still shows unpaid), and resolving it moves
        Settle's count to the chain's, so payments resume after those nonces.
        """
        if not INCIDENT_ID.match(incident_id):
            raise NotFound(f"no chain incident {incident_id[:60]}")
        reason = reason.strip()
        if not reason:
            raise InvalidRequest("--reason must say why the incident is resolved")
        with self.db.reader() as session:
            seen = session.get(ChainIncident, int(incident_id))
            if seen is None:
                raise NotFound(f"no chain incident {incident_id}")
            session.expunge(seen)
        if seen.kind == NONCE_GAP and seen.resolved_at is None:
            refusal = self._gap_refusal(seen)  # reads the chain: outside any transaction
            if refusal is not None:
                raise Conflict(refusal)
        with self.db.transaction() as session:
            incident = session.get(ChainIncident, int(incident_id), with_for_update=True)
            if incident is None:
                raise NotFound(f"no chain incident {incident_id}")
            if incident.resolved_at is not None:
                raise Conflict(
                    f"chain incident {incident_id} was resolved at {iso_ms(incident.resolved_at)}"
                )
            now = self.clock()
            if incident.kind == NONCE_GAP:
                payments.acknowledge_gap(session, incident, now)
            incident.resolved_at = now
            # No columns of their own yet (a migration for two notes was not worth one
            # more schema change this session): who and why end the detail.
            incident.detail = f"{incident.detail}\nresolved by {by}: {reason[:500]}"
            return incident

    def _gap_refusal(self, incident: ChainIncident) -> str | None:
        """Why a nonce gap may not be resolved yet; None when it may."""
        scanner = self.scanners.get(incident.chain_id)
        if scanner is None:
            return (
                f"chain incident {incident.id} is a nonce gap: resolving it is checked on the "
                f"chain first, and there is no node to check it here (set "
                f"SETTLE_RPC_URL_{incident.chain_id} and SETTLE_HOT_WALLET_KEY)"
            )
        facts = incident.facts or {}
        try:
            with self.db.reader() as session:
                unpaid = payout_audit.unpaid_payouts(
                    session,
                    scanner,
                    int(facts.get("settleNextNonce", 0)),
                    int(facts.get("scanFrom", 0)),
                )
        except payout_audit.ChainUnreadable as exc:
            return f"chain incident {incident.id}: the chain could not be read ({exc})"
        if not unpaid:
            return None
        lines = "; ".join(
            f"payout {p.payout.tx_hash} (nonce {p.payout.nonce}) paid deposit {p.deposit_id}, "
            f"which is {p.deposit_status}: settle deposits credit {p.deposit_id} "
            f"--tx {p.payout.tx_hash}"
            for p in unpaid
        )
        return (
            f"chain incident {incident.id}: the chain shows payouts Settle does not show paid, "
            f"and resuming payments would pay them again: {lines}"
        )


def incident_document(incident: ChainIncident) -> dict[str, Any]:
    """An incident as ops' commands print it."""
    return {
        "id": incident.id,
        "chainId": incident.chain_id,
        "kind": incident.kind,
        "depositId": incident.deposit_id,
        "blockNumber": incident.block_number,
        "detail": incident.detail,
        "facts": incident.facts,
        "createdAt": iso_ms(incident.created_at),
        "resolvedAt": None if incident.resolved_at is None else iso_ms(incident.resolved_at),
    }
