"""A chain watcher: ERC-20 transfers to deposit addresses, from a node to deposits.

Per chain, a persisted cursor says which block comes next; the watcher scans forward
from it (never a sliding window, so no block is ever skipped), at most up to the head
minus a safe distance. The deposits a range yields and the cursor's advance commit in
one transaction: a restart resumes exactly where the last commit left off, and a range
scanned twice (two workers, a retry) records nothing twice.

Reorgs: the hash of the last block of every scanned range is kept (a checkpoint). When
the newest checkpoint's block has a new hash, the watcher walks back to the last
checkpoint that still matches and rescans from there. A pending deposit whose block is
no longer canonical, and whose transfer the rescan did not find again, ends `failed`
with `reorged`: it is never credited. Each deposit is only confirmed after re-reading
its block's hash at its depth.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa

from services.core.chains import Chain
from services.core.deposits.detection import Detection
from services.core.deposits.models import ChainCheckpoint, ChainCursor
from services.core.evm import BlockRef, ChainReader
from services.core.models import DepositAddress

log = logging.getLogger(__name__)

#: Ranges scanned per round at most, so confirmations keep being counted while catching up.
MAX_RANGES_PER_TICK = 20
#: Pending deposits examined per round at most.
PENDING_BATCH = 1000


@dataclass
class TickResult:
    scanned_blocks: int = 0
    new_deposits: int = 0
    confirmed: int = 0
    reorged: int = 0
    reorg_from: int | None = None

    @property
    def caught_up(self) -> bool:
        return self.scanned_blocks == 0


class ChainWatcher:
    """Follows one chain through a ChainReader."""

    def __init__(
        self,
        detection: Detection,
        chain: Chain,
        reader: ChainReader,
        *,
        lag_blocks: int = 1,
        max_range: int = 500,
        start_block: int | None = None,
    ) -> None:
        self.detection = detection
        self.db = detection.db
        self.chain = chain
        self.reader = reader
        self.lag_blocks = max(0, lag_blocks)
        self.max_range = max(1, max_range)
        self.start_block = start_block
        #: Checkpoints kept: enough to find a fork point within the confirmation depth.
        self.checkpoints_kept = chain.confirmations + 16
        self._addresses: list[str] = []
        self._address_count = -1

    @property
    def chain_id(self) -> int:
        return self.chain.chain_id

    # --- one round ------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """Check for a reorg, scan what is new, count confirmations."""
        result = TickResult()
        head = self.reader.head()
        safe = head - self.lag_blocks
        self._ensure_cursor(safe)
        result.reorg_from = self._check_reorg()
        for _ in range(MAX_RANGES_PER_TICK):
            start = self.next_block()
            if start > safe:
                break
            end = min(safe, start + self.max_range - 1)
            found = self._scan(start, end, head)
            if found is None:
                break
            result.scanned_blocks += end - start + 1
            result.new_deposits += found
        # A reorg right after the scan is handled next round, before anything is judged.
        again = self._check_reorg()
        if again is not None:
            result.reorg_from = again
            return result
        result.confirmed, result.reorged = self._count(head)
        return result

    def next_block(self) -> int:
        with self.db.reader() as session:
            cursor = session.get(ChainCursor, self.chain_id)
            return -1 if cursor is None else cursor.next_block

    # --- the cursor -----------------------------------------------------------------------

    def _ensure_cursor(self, safe: int) -> None:
        with self.db.reader() as session:
            if session.get(ChainCursor, self.chain_id) is not None:
                return
        if self.start_block is not None:
            first = self.start_block
        else:
            # First start: look back one confirmation depth, for transfers just before.
            first = max(0, safe + 1 - self.chain.confirmations)
        with self.db.transaction() as session:
            try:
                with session.begin_nested():
                    session.add(
                        ChainCursor(
                            chain_id=self.chain_id,
                            next_block=first,
                            head=None,
                            updated_at=self.detection.clock(),
                        )
                    )
            except sa.exc.IntegrityError:
                pass  # another worker created it
        log.info("chain %s: watching from block %s", self.chain_id, first)

    def _lock_cursor(self, session: sa.orm.Session) -> ChainCursor:
        stmt = (
            sa.select(ChainCursor)
            .where(ChainCursor.chain_id == self.chain_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        return session.scalars(stmt).one()

    # --- addresses ------------------------------------------------------------------------

    def addresses(self) -> list[str]:
        """This chain's deposit addresses (reloaded when new ones appear)."""
        with self.db.reader() as session:
            count = session.scalar(
                sa.select(sa.func.count()).where(DepositAddress.chain_id == self.chain_id)
            )
            # Addresses are never deleted, so an unchanged count is an unchanged set.
            if count != self._address_count:
                self._addresses = list(
                    session.scalars(
                        sa.select(DepositAddress.address).where(
                            DepositAddress.chain_id == self.chain_id
                        )
                    )
                )
                self._address_count = int(count or 0)
        return self._addresses

    # --- scanning -------------------------------------------------------------------------

    def _checkpoint(self, number: int) -> str | None:
        with self.db.reader() as session:
            row = session.get(ChainCheckpoint, (self.chain_id, number))
            return None if row is None else row.hash

    def _scan(self, start: int, end: int, head: int) -> int | None:
        """Scan [start, end]; the number of new deposits, or None when it must wait."""
        addresses = self.addresses()
        tip = self.reader.block(end)
        if tip is None:
            return None
        parent_hash = self._checkpoint(start - 1)
        logs = self.reader.transfers(start, end, None, addresses) if addresses else []
        # The range is read in several calls: trust it only if the chain did not change
        # under it (same tip) and it extends what was scanned before (same parent).
        if self.reader.block(end) != tip:
            return None
        if parent_hash is not None and _hash(self.reader.block(start - 1)) != parent_hash:
            return None
        found = 0
        with self.db.transaction() as session:
            cursor = self._lock_cursor(session)
            if cursor.next_block != start:
                return None  # another worker scanned it first
            for transfer in logs:
                if not start <= transfer.block_number <= end:
                    continue
                confirmations = head - transfer.block_number + 1
                deposit = self.detection.record_transfer(
                    session, self.chain_id, transfer, confirmations=confirmations
                )
                found += deposit is not None
            cursor.next_block = end + 1
            cursor.head = head
            cursor.updated_at = self.detection.clock()
            session.merge(ChainCheckpoint(chain_id=self.chain_id, number=end, hash=tip.hash))
            session.flush()
            self._prune_checkpoints(session)
        return found

    def _prune_checkpoints(self, session: sa.orm.Session) -> None:
        keep_from = (
            sa.select(ChainCheckpoint.number)
            .where(ChainCheckpoint.chain_id == self.chain_id)
            .order_by(ChainCheckpoint.number.desc())
            .limit(1)
            .offset(self.checkpoints_kept - 1)
            .scalar_subquery()
        )
        session.execute(
            sa.delete(ChainCheckpoint).where(
                ChainCheckpoint.chain_id == self.chain_id, ChainCheckpoint.number < keep_from
            )
        )

    # --- reorgs ---------------------------------------------------------------------------

    def _check_reorg(self) -> int | None:
        """Rewind the cursor to the fork point when scanned blocks were replaced."""
        with self.db.reader() as session:
            checkpoints = list(
                session.execute(
                    sa.select(ChainCheckpoint.number, ChainCheckpoint.hash)
                    .where(ChainCheckpoint.chain_id == self.chain_id)
                    .order_by(ChainCheckpoint.number.desc())
                ).all()
            )
        if not checkpoints:
            return None
        top = self.reader.block(checkpoints[0].number)
        if top is None or top.hash == checkpoints[0].hash:
            return None  # unchanged (or the node is behind: wait, judge nothing)
        fork_from = None
        for number, block_hash in checkpoints[1:]:
            if _hash(self.reader.block(number)) == block_hash:
                fork_from = number + 1
                break
        if fork_from is None:
            fork_from = checkpoints[-1].number
            log.error(
                "chain %s: reorg deeper than the checkpoints kept; rescanning from %s",
                self.chain_id,
                fork_from,
            )
        with self.db.transaction() as session:
            cursor = self._lock_cursor(session)
            cursor.next_block = min(cursor.next_block, fork_from)
            cursor.updated_at = self.detection.clock()
            session.execute(
                sa.delete(ChainCheckpoint).where(
                    ChainCheckpoint.chain_id == self.chain_id,
                    ChainCheckpoint.number >= fork_from,
                )
            )
        log.warning("chain %s: reorg; rescanning from block %s", self.chain_id, fork_from)
        return fork_from

    # --- confirmations --------------------------------------------------------------------

    def _count(self, head: int) -> tuple[int, int]:
        """Confirm deposits at depth; fail those whose transfer vanished. (confirmed, reorged)"""
        next_block = self.next_block()
        counts: dict[str, int] = {}
        blocks: dict[int, BlockRef | None] = {}
        confirmed = reorged = 0
        for deposit in self.detection.store.pending_on_chain(self.chain_id, PENDING_BATCH):
            number = deposit.block_number
            if number is None:
                continue
            if number not in blocks:
                blocks[number] = self.reader.block(number)
            canonical = blocks[number]
            if canonical is None:
                continue  # the node is behind this block: judge nothing yet
            if canonical.hash != deposit.block_hash:
                # Rescanned on the new branch without finding it again: it vanished.
                if number < next_block and deposit.block_hash is not None:
                    reorged += (
                        self.detection.mark_reorged(deposit.id, deposit.block_hash) is not None
                    )
                continue
            count = head - number + 1
            if count >= deposit.required_confirmations:
                done = self.detection.confirm(
                    deposit.id, count, block_hash=canonical.hash, skip_locked=True
                )
                confirmed += done is not None
            elif count != deposit.confirmations:
                counts[deposit.id] = count
        self.detection.set_confirmations(counts)
        return confirmed, reorged


def _hash(block: BlockRef | None) -> str | None:
    return None if block is None else block.hash
