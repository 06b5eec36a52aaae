"""The deposit state machine: which status may follow which (pure, no I/O).

    source_seen -> source_confirmed -> credit_submitted (best effort) -> credited
    failed and manual_review_required from any non-final state;
    manual_review_required ends in credited or failed (through ops), or goes back to
    source_confirmed (ops: `settle deposits retry`, without an event: see SILENT).

`credit_submitted` may be skipped (inventory and direct routes credit at once), so
`source_confirmed -> credited` is legal. `source_seen -> credited` is not: nothing is
credited before its source transfer is confirmed.
"""

from __future__ import annotations

from itertools import pairwise

from shared import events

SOURCE_SEEN = "source_seen"
SOURCE_CONFIRMED = "source_confirmed"
CREDIT_SUBMITTED = "credit_submitted"
CREDITED = "credited"
FAILED = "failed"
MANUAL_REVIEW_REQUIRED = "manual_review_required"

#: Every status, in lifecycle order.
STATUSES: tuple[str, ...] = (
    SOURCE_SEEN,
    SOURCE_CONFIRMED,
    CREDIT_SUBMITTED,
    CREDITED,
    FAILED,
    MANUAL_REVIEW_REQUIRED,
)
FINAL: frozenset[str] = frozenset({CREDITED, FAILED})

_NEXT: dict[str, frozenset[str]] = {
    SOURCE_SEEN: frozenset({SOURCE_CONFIRMED, FAILED, MANUAL_REVIEW_REQUIRED}),
    SOURCE_CONFIRMED: frozenset({CREDIT_SUBMITTED, CREDITED, FAILED, MANUAL_REVIEW_REQUIRED}),
    CREDIT_SUBMITTED: frozenset({CREDITED, FAILED, MANUAL_REVIEW_REQUIRED}),
    MANUAL_REVIEW_REQUIRED: frozenset({CREDITED, FAILED, SOURCE_CONFIRMED}),
    CREDITED: frozenset(),
    FAILED: frozenset(),
}

#: The event each status change emits.
EVENT_TYPES: dict[str, str] = {
    SOURCE_SEEN: events.DEPOSIT_SOURCE_SEEN,
    SOURCE_CONFIRMED: events.DEPOSIT_SOURCE_CONFIRMED,
    CREDIT_SUBMITTED: events.DEPOSIT_CREDIT_SUBMITTED,
    CREDITED: events.DEPOSIT_CREDITED,
    FAILED: events.DEPOSIT_FAILED,
    MANUAL_REVIEW_REQUIRED: events.DEPOSIT_MANUAL_REVIEW_REQUIRED,
}

#: Moves that emit no event: ops put a deposit in review back into settlement (`settle
#: deposits retry`); its `deposit.source_confirmed` is durable and went out when it was
#: confirmed. Its events then end at `manual_review_required` while it settles again.
SILENT: dict[str, str] = {MANUAL_REVIEW_REQUIRED: SOURCE_CONFIRMED}

#: Event type -> the status it announces.
STATUS_OF_EVENT_TYPE: dict[str, str] = {t: s for s, t in EVENT_TYPES.items()}

#: Failure reasons the pipeline itself writes (ops may write any text).
REASON_REORGED = "reorged"
REASON_BELOW_MINIMUM = "below_minimum"
REASON_BELOW_FEE = "below_fee"
REASON_SANDBOX = "sandbox_outcome"

#: Why a deposit needs a person (`reviewReason`).
REVIEW_UNSUPPORTED_TOKEN = "unsupported_token"
REVIEW_NO_PRICE = "no_price"
#: A dollar stablecoin (arrived or to be paid) priced outside SETTLE_PEG_BAND.
REVIEW_OFF_PEG = "off_peg"
REVIEW_UNSUPPORTED_DESTINATION = "unsupported_destination"
REVIEW_NO_ROUTE = "no_route"
REVIEW_ROUTE_FAILED = "route_failed"
REVIEW_SETTLEMENT_INTERRUPTED = "settlement_interrupted"
REVIEW_SANDBOX = "sandbox_outcome"
#: A confirmed deposit whose transfer's block left the chain (a reorg deeper than the
#: chain's finality), not paid (or its payout cancelled).
REVIEW_SOURCE_REORGED = "source_reorged"
#: A payout mined with status 1 whose token moved nothing to the destination (a token
#: answering `false` instead of reverting, or moving another amount).
REVIEW_PAYOUT_NOT_TRANSFERRED = "payout_not_transferred"

#: Why settlement waits and tries again by itself (`waitReason`); no attempt is spent.
#: The hot wallet holds too little of the token, or of the chain's gas (bounded by
#: SETTLE_HOT_WALLET_WAIT_S, then review with this same reason).
WAIT_HOT_WALLET_SHORT = "hot_wallet_insufficient_balance"
#: Payments on the destination chain are paused: an open incident (a nonce gap) until a
#: person resolves it, or the node is not (yet) the chain the chains file describes.
WAIT_PAYMENTS_PAUSED = "payments_paused"
#: The market asks more per gas than the chain's cap (SETTLE_PAYMENT_MAX_FEE_GWEI).
WAIT_FEE_CAP = "fee_cap"
WAIT_REASONS = (WAIT_HOT_WALLET_SHORT, WAIT_PAYMENTS_PAUSED, WAIT_FEE_CAP)
#: Review reason once a short hot wallet's wait is over.
REVIEW_HOT_WALLET_SHORT = WAIT_HOT_WALLET_SHORT


class DepositStateError(Exception):
    """A domain rule about deposit statuses was broken."""


class IllegalTransition(DepositStateError):
    """The deposit's status may not move to the one asked for."""

    def __init__(self, current: str, target: str) -> None:
        super().__init__(f"a deposit in {current} cannot become {target}")
        self.current = current
        self.target = target


def is_final(status: str) -> bool:
    return status in FINAL


def can_transition(current: str, target: str) -> bool:
    if current not in _NEXT or target not in _NEXT:
        return False
    return target in _NEXT[current]


def transition(current: str, target: str) -> str:
    """`target` when the move is legal; raises IllegalTransition otherwise."""
    if not can_transition(current, target):
        raise IllegalTransition(current, target)
    return target


def is_durable(status: str) -> bool:
    return status in events.DURABLE_DEPOSIT_STATUSES


def event_id(deposit_id: str, status: str) -> str:
    """The durable id `evt_dep_<id>_<status>`, or a fresh id for best-effort statuses."""
    if is_durable(status):
        return events.durable_event_id(deposit_id, status)
    return events.new_event_id()


def _step(before: str, after: str) -> bool:
    """An event may follow another: a lifecycle step, or one after a silent move."""
    silent = SILENT.get(before)
    return can_transition(before, after) or (silent is not None and can_transition(silent, after))


def path_problem(status: str, path: list[str]) -> str | None:
    """What is wrong with a deposit in `status` whose events, in order, announce `path`.

    None when the path is sound: it starts at source_seen, follows the lifecycle step
    by step and ends at the deposit's status. (`settle reconcile` asks this.)
    """
    shown = " > ".join(path) or "none"
    if not path:
        return f"status {status} but no lifecycle event at all"
    problems = []
    if path[0] != SOURCE_SEEN:
        problems.append(f"first event is {path[0]}, not source_seen")
    for before, after in pairwise(path):
        if not _step(before, after):
            problems.append(f"{before} -> {after} is not a lifecycle step")
    if path[-1] != status and SILENT.get(path[-1]) != status:
        problems.append(f"status is {status} but the latest event says {path[-1]}")
    if not problems:
        return None
    return "; ".join(problems) + f" (events: {shown})"
