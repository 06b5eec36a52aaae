"""Sweeps' SQL: the candidate addresses of a chain, plans and their rows, and the reads
`settle sweep status` and reconcile make. Use cases own the transactions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.addresses import CHAIN_INDEX
from services.core.deposits.models import Deposit
from services.core.models import DepositAccount, DepositAddress, DepositKey
from services.core.sweeps.models import (
    OPEN,
    PLANNED,
    REPLACED,
    Sweep,
    SweepFunding,
    SweepPlan,
)


@dataclass(frozen=True)
class Candidate:
    """A deposit address and how its key is derived."""

    address: str
    index: int
    #: The recorded key's xpub; None for addresses from before keys were recorded
    #: (the deployment's first key, scheme `chain/index`).
    xpub: str | None
    scheme: str


def candidates(session: Session, chain_id: int, *, all_addresses: bool) -> list[Candidate]:
    """The chain's deposit addresses that ever received a (non-sandbox) deposit, or all
    of them; in address order."""
    a, acc, key = DepositAddress.__table__, DepositAccount.__table__, DepositKey.__table__
    query = (
        sa.select(
            a.c.address,
            sa.func.coalesce(acc.c.address_index, acc.c.pk),
            key.c.xpub,
            key.c.scheme,
        )
        .select_from(a.join(acc, acc.c.pk == a.c.account_pk).outerjoin(key, key.c.id == a.c.key_id))
        .where(a.c.chain_id == chain_id)
        .order_by(a.c.address)
    )
    if not all_addresses:
        received = (
            sa.select(sa.literal(1))
            .select_from(Deposit)
            .where(
                Deposit.chain_id == chain_id,
                Deposit.deposit_address == a.c.address,
                Deposit.sandbox.is_(False),
            )
            .exists()
        )
        query = query.where(received)
    return [
        Candidate(address, int(index), xpub, scheme or CHAIN_INDEX)
        for address, index, xpub, scheme in session.execute(query)
    ]


def is_deposit_address(session: Session, address: str) -> bool:
    """Whether `address` (EIP-55) is any account's deposit address, on any chain."""
    found = session.scalar(
        sa.select(sa.literal(1)).where(DepositAddress.address == address).limit(1)
    )
    return found is not None


def in_flight(session: Session, chain_id: int, addresses: Iterable[str]) -> dict[str, str]:
    """{address: plan id} of sweeps signed or sent and not final, on these addresses."""
    rows = session.execute(
        sa.select(Sweep.deposit_address, Sweep.plan_id).where(
            Sweep.chain_id == chain_id,
            Sweep.status.in_(OPEN),
            Sweep.deposit_address.in_(list(addresses)),
        )
    )
    return {address: plan_id for address, plan_id in rows}


def record_plan(session: Session, plan: SweepPlan, sweeps: Sequence[Sweep]) -> int:
    """Store a plan and its sweeps; earlier plans' sweeps of the chain never signed are
    `replaced` (a plan is a picture of the chain: the newest one is what to sign).
    Returns how many were replaced."""
    replaced = session.execute(
        sa.update(Sweep)
        .where(Sweep.chain_id == plan.chain_id, Sweep.status == PLANNED)
        .values(status=REPLACED, detail=f"replaced by plan {plan.id}", updated_at=plan.created_at)
    ).rowcount
    session.add(plan)
    session.flush()
    session.add_all(sweeps)
    return int(replaced or 0)


def plan(session: Session, plan_id: str) -> SweepPlan | None:
    return session.get(SweepPlan, plan_id)


def sweeps_of(session: Session, plan_id: str, *, lock: bool = False) -> list[Sweep]:
    query = (
        sa.select(Sweep)
        .where(Sweep.plan_id == plan_id)
        .order_by(Sweep.deposit_address, Sweep.nonce)
        .execution_options(populate_existing=True)
    )
    if lock:
        query = query.with_for_update()
    return list(session.scalars(query))


def funding(session: Session, plan_id: str, address: str) -> SweepFunding | None:
    return session.scalars(
        sa.select(SweepFunding)
        .where(SweepFunding.plan_id == plan_id, SweepFunding.deposit_address == address)
        .execution_options(populate_existing=True)
    ).one_or_none()


def fundings_of(session: Session, plan_id: str) -> list[SweepFunding]:
    return list(
        session.scalars(
            sa.select(SweepFunding)
            .where(SweepFunding.plan_id == plan_id)
            .order_by(SweepFunding.deposit_address)
        )
    )


def plans(session: Session, chain_id: int | None, limit: int) -> list[SweepPlan]:
    query = sa.select(SweepPlan).order_by(SweepPlan.created_at.desc(), SweepPlan.id.desc())
    if chain_id is not None:
        query = query.where(SweepPlan.chain_id == chain_id)
    return list(session.scalars(query.limit(limit)))


def status_counts(session: Session, plan_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """{plan id: {status: sweeps}}."""
    rows = session.execute(
        sa.select(Sweep.plan_id, Sweep.status, sa.func.count())
        .where(Sweep.plan_id.in_(list(plan_ids)))
        .group_by(Sweep.plan_id, Sweep.status)
    )
    out: dict[str, dict[str, int]] = {}
    for plan_id, status, count in rows:
        out.setdefault(plan_id, {})[status] = int(count)
    return out
