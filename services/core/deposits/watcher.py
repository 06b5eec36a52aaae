"""A chain watcher: ERC-20 transfers to deposit addresses, from a node to deposits.

Each block is read twice, and each reading is trusted only when it is complete:

1. At the tip (`lag_blocks` under the head): transfers become `source_seen` deposits.
2. At finality (under the node's `finalized`/`safe` block where the chain names a tag
   and the node offers it, else `reorg_depth` blocks deep, and never fewer than
   `confirmations`): transfers are confirmed, and any the first reading missed are
   recorded and confirmed at once.

Two cursors in `chain_cursors` say where each reading continues (`next_block`,
`confirmed_block`); they move only by committed ranges, in the same transaction as the
deposits a range produced, so a restart resumes where the last commit left off and a
range read twice (two workers, a retry) records nothing twice.

Complete logs or none. `eth_getLogs` asks for the `Transfer` logs of the chain's token
contracts (recipients are matched in memory, `AddressBook`); a range is refused, and
read again later, when:
- a log's block hash is not the canonical hash at its height (a logs backend on a
  stale fork), or the range's last block changed while it was read (a reorg);
- the node does not have the range's last block when asked by its hash (a logs backend
  behind the head answers `[]` for a range past its head, without an error, but it
  cannot answer for a block hash it has never seen), or its logs asked that way differ
  from the range's. The range is then shortened, so the cursor never passes a block
  the logs backend had not seen;
- a block of the range whose header's `logsBloom` holds the `Transfer` topic and a
  supported token, but whose range logs have no Transfer of that token, shows other
  logs (or an error) when asked by its hash: behind a load balancer the range query and
  the probe of the last block may reach different servers, one behind the other, so the
  probe proves nothing about the blocks before the last. The range is cut before it.
  The same logs by hash are a bloom false positive: accepted (one call, no stall).
A `source_seen` deposit on the canonical chain under the finality cursor (passed by the
reading at finality: a node without blooms) is logged as an error every round and
counted by the `settle_deposits_pending_under_final` gauge.

Reorgs. The hash of the last block of every range read is kept (a checkpoint; all of
them above the finality cursor and 16 under it, then two per power-of-two distance), and
the block under the first one ever read (so no reorg is deeper than every checkpoint,
unless it goes below where watching began). When a checkpoint no longer matches the
node, the fork point is found by comparing them all with the node's hashes (one batch),
and both cursors go back to it. A node whose head is under blocks read before (a node
behind, or a shorter new branch: they cannot be told apart yet) is waited out: nothing
is read or judged until it has them again, when a replaced block shows as a changed
checkpoint. A transfer found again on the new branch (same identity, see detection.py)
moves its deposit; a pending deposit whose transfer has been absent from the canonical
chain for `confirmations` blocks read, and whose height was read again at finality
without it, fails `reorged`. A fork point under the finality cursor is a reorg deeper
than the chain's finality: every confirmed or credited deposit whose block left the
chain becomes a chain incident for ops (`chain_incidents`, and the
`settle_chain_incidents_open` metric), a confirmed one not being paid goes to manual
review, and an unmined payout of one is cancelled.

A chain's first cursor starts both readings one confirmation depth under the head;
when the chain already has deposit addresses, the reading at finality starts instead at
the first block stamped when the earliest of them was given out (less a margin for
clocks), whichever is lower: a deposit sent before any worker looked (a first deployment,
a worker started after the API) is found by it, never silently passed.

Before anything (the first cursor included), the node is checked against the chains
file (`ChainCheck`: its chain id, and with the worker's check each token's decimals):
a node of another chain would have its transfers recorded here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session

from services.core.chains import Chain
from services.core.deposits import cursor_store
from services.core.deposits.addressbook import AddressBook, first_given_out
from services.core.deposits.chain_check import ChainCheck
from services.core.deposits.detection import Detection, Sighting, number_transfers
from services.core.deposits.models import ChainCursor
from services.core.evm import (
    TRANSFER_BLOOM,
    BlockHeader,
    BlockRef,
    ChainReader,
    TransferLog,
    bloom_mask,
    first_block_at,
)

log = logging.getLogger(__name__)

#: Ranges read per reading per round at most, so each round stays short.
MAX_RANGES_PER_TICK = 20
#: Pending deposits examined per round at most.
PENDING_BATCH = 1000
#: Checkpoints kept just under the finality cursor before they thin out.
RECENT_CHECKPOINTS = 16
#: Times a range is halved when the logs backend has not seen its last block.
SHRINK_ATTEMPTS = 4
#: Transfers of unknown tokens kept for ops per range at most.
STRAY_CAP = 20
#: How far before the chain's earliest deposit address a first watching starts: the
#: clocks of the database and of the chain's block producers may differ (DEPLOY.md asks
#: for clocks within a minute), and a block is stamped at its slot's start.
FIRST_LOOK_MARGIN = timedelta(minutes=2)


@dataclass
class TickResult:
    #: Blocks read at the tip, and at finality.
    scanned_blocks: int = 0
    final_blocks: int = 0
    new_deposits: int = 0
    moved: int = 0
    confirmed: int = 0
    reorged: int = 0
    #: Ranges not trusted this round (read again next round).
    refused: int = 0
    reorg_from: int | None = None
    incidents: int = 0
    #: Pending deposits on the canonical chain under the finality cursor: the reading at
    #: finality passed their block without confirming them (it must not happen).
    passed_pending: int = 0
    #: The node is not (yet) the chain the chains file describes: nothing was read.
    stopped: bool = False

    @property
    def caught_up(self) -> bool:
        return self.scanned_blocks == 0 and self.final_blocks == 0


@dataclass
class _Position:
    """The cursors and checkpoints as this round knows them (read once, kept in step
    with what the round commits)."""

    next_block: int
    confirmed_block: int
    #: Checkpoints: block number -> the hash read there.
    checkpoints: dict[int, str]


@dataclass(frozen=True)
class _Range:
    """A range whose logs passed every check."""

    start: int
    end: int
    tip: BlockRef
    logs: list[TransferLog]


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
        addresses: AddressBook | None = None,
        stray_tokens: bool = True,
        stray_cap: int = STRAY_CAP,
        check: ChainCheck | None = None,
    ) -> None:
        self.detection = detection
        self.db = detection.db
        self.chain = chain
        self.reader = reader
        self.lag_blocks = max(0, lag_blocks)
        self.max_range = max(1, max_range)
        self.start_block = start_block
        self.addresses = (
            AddressBook(detection.db, chain.chain_id) if addresses is None else addresses
        )
        self.stray_tokens = stray_tokens
        self.stray_cap = stray_cap
        #: The node against the chains file, before anything is written (the worker's
        #: checks the chain id and decimals; by default the reader's chain id alone).
        self.check = check or ChainCheck(
            detection.db, chain, reader, tokens=False, strict=False, clock=detection.clock
        )
        #: The chain's token contracts, lowercase: what eth_getLogs asks for.
        self.tokens = sorted({a.token_address.lower() for a in chain.assets})
        #: Each token's bits in a block's logsBloom.
        self._token_blooms = [(t, bloom_mask(bytes.fromhex(t[2:]))) for t in self.tokens]

    @property
    def chain_id(self) -> int:
        return self.chain.chain_id

    # --- one round ------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """Follow a reorg, read what is final, read what is new, judge what is pending.

        Nothing at all (not even the first cursor) before the node is known to be the
        chain's: a node of another chain would write its transfers here."""
        result = TickResult()
        if not self.check.ready():
            result.stopped = True
            return result
        head = self.reader.head()
        self._ensure_cursor(head)
        at = self._position()
        if not self._check_reorg(head, at, result):
            return result  # the node has not got every block read before: wait for it
        self.addresses.refresh()
        if self.tokens:
            self._read_final(head, at, result)
            self._read_tip(head, at, result)
        self._judge(head, at, result)
        return result

    def next_block(self) -> int:
        """Where the reading at the tip continues (-1 before the first round)."""
        return self._position().next_block

    def confirmed_block(self) -> int:
        """Where the reading at finality continues (-1 before the first round)."""
        return self._position().confirmed_block

    def final_height(self, head: int) -> int:
        """The highest block a deposit may be confirmed in, with the node at `head`."""
        tag = self.chain.finality_tag
        tagged = self.reader.tagged_block(tag) if tag else None
        return self.chain.final_height(head, None if tagged is None else tagged.number)

    # --- the cursors ----------------------------------------------------------------------

    def _position(self) -> _Position:
        with self.db.reader() as session:
            cursor = cursor_store.find_cursor(session, self.chain_id)
            if cursor is None:
                return _Position(-1, -1, {})
            checkpoints = cursor_store.checkpoints(session, self.chain_id)
            confirmed = cursor.confirmed_block
            return _Position(
                cursor.next_block,
                cursor.next_block if confirmed is None else confirmed,
                checkpoints,
            )

    def _ensure_cursor(self, head: int) -> None:
        with self.db.reader() as session:
            cursor = cursor_store.find_cursor(session, self.chain_id)
            if cursor is not None and cursor.confirmed_block is not None:
                return
        if cursor is None:
            self._create_cursor(head)
            return
        with self.db.transaction() as session:
            cursor = cursor_store.find_cursor(session, self.chain_id, lock=True)
            if cursor is not None and cursor.confirmed_block is None:
                # A cursor from before the reading at finality: start it under the oldest
                # pending deposit, so every one of them is read again before it counts.
                oldest = self._oldest_pending()
                cursor.confirmed_block = min(
                    cursor.next_block, oldest if oldest is not None else cursor.next_block
                )

    def _create_cursor(self, head: int) -> None:
        """A chain's first cursor. The reading at the tip starts one confirmation depth
        under the head (for transfers just before). The reading at finality starts there
        too, or, when the chain already has deposit addresses (given out before any worker
        looked: a first deployment, a worker started after the API), at the block of the
        earliest of them (`_look_back`): it records what it finds there as the reading at
        the tip would have, so a deposit sent before the first look is found, never
        silently passed, and during a long look back the deposits arriving now are seen
        at once (confirmed when the reading at finality reaches them, as always).
        `start_block` (tests) starts both readings there."""
        tip = max(0, head - self.lag_blocks + 1 - self.chain.confirmations)
        if self.start_block is not None:
            tip = final = self.start_block
        else:
            final = min(tip, self._look_back(head))
        # The block under the first one read is the oldest checkpoint: a reorg deeper than
        # every range read is then still followed from where watching began.
        floor = self.reader.block(final - 1) if final > 0 else None
        with self.db.transaction() as session:
            created = cursor_store.create_cursor(
                session,
                self.chain_id,
                tip,
                final,
                None if floor is None else (floor.number, floor.hash),
                self.detection.clock(),
            )
        if created:  # else another worker created it first
            log.info(
                "chain %s: watching from block %s (at finality from block %s)",
                self.chain_id,
                tip,
                final,
            )

    def _look_back(self, head: int) -> int:
        """The first block stamped at or after the chain's earliest deposit address was
        given out, less `FIRST_LOOK_MARGIN` for clocks (head + 1: no address, or no block
        since)."""
        earliest = first_given_out(self.db, self.chain_id)
        if earliest is None:
            return head + 1
        since = first_block_at(self.reader, earliest - FIRST_LOOK_MARGIN)
        if since > head:
            # Nothing stamped since the address was given out: the chain has made no block
            # since (stalled, or a dev chain mining on demand), or its clock is behind the
            # database's by more than the margin. Said, since it would hide a deposit if
            # the chain's clock is what is wrong.
            log.warning(
                "chain %s: no block is stamped after its first deposit address was given "
                "out (%s; head %s): is the chain's clock behind the database's?",
                self.chain_id,
                earliest.isoformat(),
                head,
            )
        else:
            log.info(
                "chain %s: its first deposit address was given out at %s: reading at "
                "finality from block %s",
                self.chain_id,
                earliest.isoformat(),
                since,
            )
        return since

    def _oldest_pending(self) -> int | None:
        pending = self.detection.pending(self.chain_id, 1)
        return pending[0].block_number if pending else None

    # --- reading a range --------------------------------------------------------------------

    def _read(self, start: int, end: int, at: _Position) -> _Range | None:
        """The range's logs if complete and canonical; None to try again later.

        The range may come back shorter than asked (the logs backend is behind).
        """
        for _ in range(SHRINK_ATTEMPTS + 1):
            tip = self.reader.block(end)
            if tip is None:
                return None  # the node is behind its own head: wait
            logs = self.reader.transfer_logs(start, end, self.tokens)
            # Asked by hash, a node that does not have the block answers an error, never
            # a silent []: this is what proves the backend saw the range's last block.
            probe = self.reader.block_transfer_logs(tip.hash, self.tokens)
            at_end = sorted((t.tx_hash, t.log_index) for t in logs if t.block_number == end)
            if probe is None or sorted((t.tx_hash, t.log_index) for t in probe) != at_end:
                if end == start:
                    log.warning(
                        "chain %s: the logs backend has not seen block %s yet", self.chain_id, end
                    )
                    return None
                end = (start + end) // 2
                continue
            heights = {t.block_number for t in logs} | set(range(start, end + 1))
            if start > 0:
                heights.add(start - 1)
            headers = self.reader.block_headers(heights)
            canonical = {n: h.hash for n, h in headers.items()}
            if canonical.get(end) != tip.hash:
                return None  # a reorg while the range was read
            for t in logs:
                if not start <= t.block_number <= end or canonical.get(t.block_number) != (
                    t.block_hash
                ):
                    log.warning(
                        "chain %s: logs of block %s come from another branch (%s); "
                        "range %s-%s refused",
                        self.chain_id,
                        t.block_number,
                        t.block_hash,
                        start,
                        end,
                    )
                    return None
            parent = at.checkpoints.get(start - 1)
            if parent is not None and canonical.get(start - 1) != parent:
                return None  # a reorg under the range: the next round finds its fork
            gap = self._bloom_gap(start, end, headers, logs)
            if gap is not None:
                # The probe of the last block proves nothing about the blocks before it
                # (a load-balanced provider may send the range to a backend behind and
                # the probe to one up to date): keep what is proven, read the rest again.
                if gap == start:
                    log.warning(
                        "chain %s: the logs backend has not seen block %s yet (its "
                        "logsBloom names a supported token's Transfer the logs lack)",
                        self.chain_id,
                        gap,
                    )
                    return None
                end = gap - 1
                continue
            return _Range(start, end, tip, logs)
        return None

    def _bloom_gap(
        self, start: int, end: int, headers: dict[int, BlockHeader], logs: list[TransferLog]
    ) -> int | None:
        """The first block of the range whose logs may be missing, or None.

        A block whose `logsBloom` holds the Transfer topic and a supported token's address
        but whose range logs have no Transfer of that token is asked again by its hash (a
        node that does not have the block answers an error there, never `[]`). Equal
        answers: a bloom false positive (a token's Approval and another token's
        Transfer, say), accepted; else the range logs missed that block.
        """
        tokens_at: dict[int, set[str]] = {}
        for t in logs:
            tokens_at.setdefault(t.block_number, set()).add(t.token_address)
        for number in range(start, end + 1):
            header = headers.get(number)
            if header is None or header.logs_bloom is None:
                continue  # a node without blooms: the probe of the last block is all there is
            bloom = header.logs_bloom
            if bloom & TRANSFER_BLOOM != TRANSFER_BLOOM:
                continue
            have = tokens_at.get(number, set())
            if all(token in have or bloom & mask != mask for token, mask in self._token_blooms):
                continue
            probe = self.reader.block_transfer_logs(header.hash, self.tokens)
            got = sorted((t.tx_hash, t.log_index) for t in logs if t.block_number == number)
            if probe is None or sorted((t.tx_hash, t.log_index) for t in probe) != got:
                return number
        return None

    def _deposits_in(self, logs: list[TransferLog]) -> list[Sighting]:
        """Non-zero transfers to deposit addresses, numbered within their transactions."""
        book = self.addresses
        matched = [t for t in logs if int(t.to_address[2:], 16) in book]
        return [s for s in number_transfers(matched) if s.transfer.amount_raw > 0]

    # --- the two readings -------------------------------------------------------------------

    def _read_final(self, head: int, at: _Position, result: TickResult) -> None:
        final = self.final_height(head)
        for _ in range(MAX_RANGES_PER_TICK):
            start = at.confirmed_block
            end = min(final, start + self.max_range - 1)
            if start > end:
                return
            read = self._read(start, end, at)
            if read is None:
                result.refused += 1
                return
            strays = self._strays(read) if self.stray_tokens else []
            with self.db.transaction() as session:
                cursor = cursor_store.lock_cursor(session, self.chain_id)
                if cursor.confirmed_block != read.start:
                    return  # another worker read it first
                sightings = self._deposits_in(read.logs)
                result.confirmed += self.detection.confirm_final(
                    session, self.chain, sightings, head
                )
                self.detection.record_strays(session, self.chain, strays, self.stray_cap)
                cursor.confirmed_block = read.end + 1
                cursor.next_block = max(cursor.next_block, read.end + 1)
                self._advance(session, cursor, read, head, at)
            result.final_blocks += read.end - read.start + 1

    def _read_tip(self, head: int, at: _Position, result: TickResult) -> None:
        safe = head - self.lag_blocks
        for _ in range(MAX_RANGES_PER_TICK):
            start = at.next_block
            end = min(safe, start + self.max_range - 1)
            if start > end:
                return
            read = self._read(start, end, at)
            if read is None:
                result.refused += 1
                return
            with self.db.transaction() as session:
                cursor = cursor_store.lock_cursor(session, self.chain_id)
                if cursor.next_block != read.start:
                    return  # another worker read it first
                recorded = self.detection.record(
                    session, self.chain, self._deposits_in(read.logs), head
                )
                result.new_deposits += recorded.new
                result.moved += recorded.moved
                cursor.next_block = read.end + 1
                self._advance(session, cursor, read, head, at)
            result.scanned_blocks += read.end - read.start + 1

    def _strays(self, read: _Range) -> list[Sighting]:
        """Transfers of tokens the chain does not support to deposit addresses."""
        known = set(self.tokens)
        logs = self.reader.transfer_logs(read.start, read.end, None)
        return [s for s in self._deposits_in(logs) if s.transfer.token_address not in known]

    def _advance(
        self, session: Session, cursor: ChainCursor, read: _Range, head: int, at: _Position
    ) -> None:
        cursor.head = head
        cursor.updated_at = self.detection.clock()
        cursor_store.put_checkpoint(session, self.chain_id, read.end, read.tip.hash)
        at.checkpoints[read.end] = read.tip.hash
        at.next_block = cursor.next_block
        at.confirmed_block = (
            cursor.next_block if cursor.confirmed_block is None else cursor.confirmed_block
        )
        drop = self._thinned(at.checkpoints, at.confirmed_block)
        if drop:
            cursor_store.drop_checkpoints(session, self.chain_id, drop)
            for number in drop:
                del at.checkpoints[number]

    # --- checkpoints and reorgs ---------------------------------------------------------------

    @staticmethod
    def _thinned(checkpoints: dict[int, str], confirmed_block: int) -> list[int]:
        """Checkpoints to drop: every one from the finality cursor up and the 16 under it
        stay; further down, the oldest and newest at each power-of-two distance. Any fork
        point is then found within a few times its depth, and the first block ever read
        stays known."""
        older = sorted((n for n in checkpoints if n < confirmed_block - 1), reverse=True)
        if len(older) <= RECENT_CHECKPOINTS:
            return []
        oldest: dict[int, int] = {}
        newest: dict[int, int] = {}
        for number in older[RECENT_CHECKPOINTS:]:
            bucket = (confirmed_block - number).bit_length()
            oldest[bucket] = min(number, oldest.get(bucket, number))
            newest[bucket] = max(number, newest.get(bucket, number))
        keep = set(oldest.values()) | set(newest.values())
        return [n for n in older[RECENT_CHECKPOINTS:] if n not in keep]

    def _check_reorg(self, head: int, at: _Position, result: TickResult) -> bool:
        """Move both cursors back to the fork point when read blocks were replaced.

        False when the node has not got every block read before (its head is under
        them, or it cannot show the newest checkpoint): a node behind, or a shorter new
        branch, which cannot be told apart yet. Nothing is read or judged then (a block
        the node has not got is not a block that left the chain); once the node is past
        them again, a replaced block shows as a changed checkpoint.
        """
        known = sorted((n for n in at.checkpoints if n <= head), reverse=True)
        top = self.reader.block(known[0]) if known else None
        if known and top is None:
            return False  # the node is behind its own head
        if top is None or top.hash == at.checkpoints[known[0]]:
            if at.next_block > head + 1:
                log.info(
                    "chain %s: the node's head %s is under blocks read before (up to %s); "
                    "waiting for it",
                    self.chain_id,
                    head,
                    at.next_block - 1,
                )
                return False
            return True  # the usual case: nothing changed
        canonical = self.reader.block_hashes(known)
        matching = [n for n in known if canonical.get(n) == at.checkpoints[n]]
        if matching:
            fork_from = matching[0] + 1
        else:
            # Below the oldest checkpoint, which is the block under the first one read (or,
            # for a cursor older than that floor, the end of the first range read, at most
            # `max_range` blocks long): read again from before it all.
            fork_from = max(0, known[-1] - self.max_range + 1)
            log.critical(
                "chain %s: reorg below every checkpoint kept; reading again from %s",
                self.chain_id,
                fork_from,
            )
        with self.db.transaction() as session:
            cursor = cursor_store.lock_cursor(session, self.chain_id)
            deep = cursor.confirmed_block is not None and cursor.confirmed_block > fork_from
            cursor.next_block = min(cursor.next_block, fork_from)
            if cursor.confirmed_block is not None:
                cursor.confirmed_block = min(cursor.confirmed_block, fork_from)
            cursor.updated_at = self.detection.clock()
            cursor_store.drop_checkpoints_from(session, self.chain_id, fork_from)
            at.next_block = cursor.next_block
            at.confirmed_block = (
                cursor.next_block if cursor.confirmed_block is None else cursor.confirmed_block
            )
        for number in [n for n in at.checkpoints if n >= fork_from]:
            del at.checkpoints[number]
        result.reorg_from = fork_from
        log.warning("chain %s: reorg; reading again from block %s", self.chain_id, fork_from)
        if deep:
            stale = self.detection.settled_above(self.chain_id, fork_from)
            if stale:
                hashes = self.reader.block_hashes({row.block_number for row in stale})
                result.incidents += self.detection.deep_reorg(
                    self.chain_id, fork_from, hashes, stale
                )
        return True

    # --- pending deposits -----------------------------------------------------------------

    def _judge(self, head: int, at: _Position, result: TickResult) -> None:
        """Count confirmations; fail deposits whose transfer has been gone for the depth."""
        next_block = at.next_block
        pending = self.detection.pending(self.chain_id, PENDING_BATCH)
        heights = {d.block_number for d in pending if d.block_number is not None}
        canonical = self.reader.block_hashes(h for h in heights if h <= head) if heights else {}
        counts: dict[str, int] = {}
        for deposit in pending:
            number = deposit.block_number
            if number is None or number not in canonical:
                continue  # past the node's head: judge nothing yet
            if canonical[number] != deposit.block_hash:
                # Its block was replaced and read again without it. Gone once the new
                # branch has been read for the depth from its height (read, not merely
                # mined: a block not read yet may hold the transfer) and its height is
                # final and was read there without it (until then the transfer may come
                # back: a false deposit.failed for money that then arrives is what this
                # avoids). Then it vanished.
                absent = next_block - number
                if (
                    absent >= self.chain.confirmations
                    and number < at.confirmed_block
                    and deposit.block_hash is not None
                ):
                    result.reorged += (
                        self.detection.vanish(deposit.id, deposit.block_hash) is not None
                    )
                continue
            if number < at.confirmed_block:
                # Read at finality without its transfer, yet its block is canonical: the
                # logs of that reading were incomplete. Loud, never silent (the
                # `settle_deposits_pending_under_final` gauge counts them for ops).
                result.passed_pending += 1
                log.error(
                    "chain %s: deposit %s (block %s) is pending under the finality cursor %s: "
                    "the reading at finality missed its transfer",
                    self.chain_id,
                    deposit.id,
                    number,
                    at.confirmed_block,
                )
            count = min(head - number + 1, deposit.required_confirmations)
            if count != deposit.confirmations:
                counts[deposit.id] = count
        self.detection.set_confirmations(counts)
