"""Where a chain watcher keeps its place: its cursor (`chain_cursors`) and the hashes of
the blocks it read (`chain_checkpoints`). The watcher (`watcher.py`) decides when they
move; these read and write them, in the caller's session.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.deposits.models import ChainCheckpoint, ChainCursor


def find_cursor(session: Session, chain_id: int, *, lock: bool = False) -> ChainCursor | None:
    """The chain's cursor (None: none yet); with `lock`, locked for this transaction."""
    return session.get(ChainCursor, chain_id, with_for_update=True if lock else None)


def lock_cursor(session: Session, chain_id: int) -> ChainCursor:
    """The chain's cursor (it exists), locked for this transaction and read afresh."""
    return session.scalars(
        sa.select(ChainCursor)
        .where(ChainCursor.chain_id == chain_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()


def create_cursor(
    session: Session,
    chain_id: int,
    next_block: int,
    confirmed_block: int,
    floor: tuple[int, str] | None,
    now: datetime,
) -> bool:
    """A new cursor: the reading at the tip from `next_block`, the reading at finality
    from `confirmed_block` (never above it), with `floor` (number, hash) as its first
    checkpoint; False when another worker created one first."""
    if confirmed_block > next_block:
        raise ValueError(f"confirmed_block {confirmed_block} above next_block {next_block}")
    try:
        with session.begin_nested():
            session.add(
                ChainCursor(
                    chain_id=chain_id,
                    next_block=next_block,
                    confirmed_block=confirmed_block,
                    head=None,
                    updated_at=now,
                )
            )
            if floor is not None:
                put_checkpoint(session, chain_id, *floor)
    except sa.exc.IntegrityError:
        return False
    return True


def checkpoints(session: Session, chain_id: int) -> dict[int, str]:
    """Block number -> the hash read there."""
    rows = session.execute(
        sa.select(ChainCheckpoint.number, ChainCheckpoint.hash).where(
            ChainCheckpoint.chain_id == chain_id
        )
    )
    return {number: block_hash for number, block_hash in rows}


def put_checkpoint(session: Session, chain_id: int, number: int, block_hash: str) -> None:
    session.merge(ChainCheckpoint(chain_id=chain_id, number=number, hash=block_hash))


def drop_checkpoints(session: Session, chain_id: int, numbers: list[int]) -> None:
    session.execute(
        sa.delete(ChainCheckpoint).where(
            ChainCheckpoint.chain_id == chain_id, ChainCheckpoint.number.in_(numbers)
        )
    )


def drop_checkpoints_from(session: Session, chain_id: int, number: int) -> None:
    """Every checkpoint at or above `number` (a reorg's fork point)."""
    session.execute(
        sa.delete(ChainCheckpoint).where(
            ChainCheckpoint.chain_id == chain_id, ChainCheckpoint.number >= number
        )
    )
