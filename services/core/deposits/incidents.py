"""Chain incidents: what the watchers found that a person must look at, listed and
resolved by ops (`settle incidents list|resolve`, CLI in `cli.py`).

The watcher raises them (`Detection.deep_reorg`: a confirmed or credited deposit whose
block left the canonical chain, a reorg deeper than the chain's finality). An incident
stays open, and counts in the `settle_chain_incidents_open` gauge, until ops resolve
it. Resolving records who and why in the incident's `detail`; it does not touch the
deposit: a deposit held in manual review (`source_reorged`) is settled by hand with
`settle deposits credit|fail` once its transfer has been checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from services.core.deposits.models import ChainIncident
from shared.db import Database
from shared.errors import Conflict, InvalidRequest, NotFound
from shared.timefmt import iso_ms, utcnow

Clock = Callable[[], datetime]

#: What an incident id looks like (anything else is not found without a query).
INCIDENT_ID = re.compile(r"^[1-9][0-9]{0,17}$")
#: Incidents listed at most.
MAX_LIST = 1000


class Incidents:
    """Listing and resolving chain incidents."""

    def __init__(self, db: Database, *, clock: Clock = utcnow) -> None:
        self.db = db
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
        """Close an open incident, recording who and why."""
        if not INCIDENT_ID.match(incident_id):
            raise NotFound(f"no chain incident {incident_id[:60]}")
        reason = reason.strip()
        if not reason:
            raise InvalidRequest("--reason must say why the incident is resolved")
        with self.db.transaction() as session:
            incident = session.get(ChainIncident, int(incident_id), with_for_update=True)
            if incident is None:
                raise NotFound(f"no chain incident {incident_id}")
            if incident.resolved_at is not None:
                raise Conflict(
                    f"chain incident {incident_id} was resolved at {iso_ms(incident.resolved_at)}"
                )
            incident.resolved_at = self.clock()
            # No columns of their own yet (a migration for two notes was not worth one
            # more schema change this session): who and why end the detail.
            incident.detail = f"{incident.detail}\nresolved by {by}: {reason[:500]}"
            return incident


def incident_document(incident: ChainIncident) -> dict[str, Any]:
    """An incident as ops' commands print it."""
    return {
        "id": incident.id,
        "chainId": incident.chain_id,
        "kind": incident.kind,
        "depositId": incident.deposit_id,
        "blockNumber": incident.block_number,
        "detail": incident.detail,
        "createdAt": iso_ms(incident.created_at),
        "resolvedAt": None if incident.resolved_at is None else iso_ms(incident.resolved_at),
    }
