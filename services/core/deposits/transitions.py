"""A deposit's status change and its event, written in the caller's transaction.

The caller holds the deposit's row lock (`store.lock`), so a step that runs twice (two
workers, a retry) finds the status already moved. Durable events
(`evt_dep_<id>_<status>`) are written in a savepoint: the outbox's unique event id
turns a racing duplicate into a no-op, so the database itself guarantees "at most once".
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.core import outbox
from services.core.deposits import states
from services.core.deposits.models import Deposit
from services.core.deposits.serialize import deposit_document
from shared.db import is_unique_violation

log = logging.getLogger(__name__)


def emit(session: Session, deposit: Deposit, status: str, now: datetime) -> bool:
    """Write the status's event; a durable one already written is a no-op (False)."""
    event_type = states.EVENT_TYPES[status]
    data = {"deposit": deposit_document(deposit)}
    event_id = states.event_id(deposit.id, status)
    if not states.is_durable(status):
        outbox.emit(session, event_type, deposit.tenant_id, data, event_id=event_id, created_at=now)
        return True
    try:
        with session.begin_nested():
            outbox.emit(
                session, event_type, deposit.tenant_id, data, event_id=event_id, created_at=now
            )
    except IntegrityError as exc:
        if not is_unique_violation(exc):
            raise
        log.info("event %s was already emitted", event_id)
        return False
    return True


def move(session: Session, deposit: Deposit, target: str, now: datetime, **fields: Any) -> None:
    """Change the status (legal moves only), then write its event."""
    states.transition(deposit.status, target)
    log.info("deposit %s: %s -> %s", deposit.id, deposit.status, target)
    for name, value in fields.items():
        setattr(deposit, name, value)
    deposit.status = target
    deposit.updated_at = now
    # A status change ends any wait (`waitReason` is about settling, while it retries).
    deposit.wait_reason = None
    deposit.waiting_since = None
    if target == states.SOURCE_CONFIRMED:
        deposit.confirmed_at = now
    if target == states.CREDITED:
        deposit.credited_at = now
    if states.is_final(target):
        deposit.settle_phase = None
        deposit.next_attempt_at = None
    session.flush()
    emit(session, deposit, target, now)


def review(session: Session, deposit: Deposit, now: datetime, reason: str, **fields: Any) -> None:
    """Hand the deposit to a person, saying why."""
    move(session, deposit, states.MANUAL_REVIEW_REQUIRED, now, review_reason=reason[:500], **fields)


def back_to_settlement(session: Session, deposit: Deposit, now: datetime, **fields: Any) -> None:
    """manual_review_required -> source_confirmed, settled afresh (ops: `settle deposits
    retry`). No event (states.SILENT): `deposit.source_confirmed` is durable and went out
    when it was confirmed; tenants hear of it next as `credited` (or another review)."""
    states.transition(deposit.status, states.SOURCE_CONFIRMED)
    log.info("deposit %s: %s -> %s (retry)", deposit.id, deposit.status, states.SOURCE_CONFIRMED)
    for name, value in fields.items():
        setattr(deposit, name, value)
    deposit.status = states.SOURCE_CONFIRMED
    deposit.review_reason = None
    deposit.settle_attempts = 0
    deposit.failed_providers = []
    deposit.provider_ref = None
    deposit.settle_phase = None
    deposit.next_attempt_at = None
    deposit.wait_reason = None
    deposit.waiting_since = None
    deposit.updated_at = now
    session.flush()
