"""Simulated blocks for sandbox deposits: they confirm as a real chain would, only faster.

A sandbox chain mines one block every `block_s` seconds since the Unix epoch, so the
head is a pure function of the clock: every API and worker process agrees on it with
nothing stored. A sandbox deposit is "mined" in the head block at creation and gains
one confirmation per simulated block until the chain's depth (the chains file).
`block_s = 0` confirms at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from eth_utils import keccak

from services.core.deposits.models import Deposit
from services.core.deposits.service import DepositService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxChain:
    """The simulated chain every sandbox deposit is mined on."""

    block_s: float = 0.2

    def head(self, now: datetime) -> int:
        if self.block_s <= 0:
            return int(now.timestamp() * 1000)
        return int(now.timestamp() / self.block_s)

    def block_hash(self, chain_id: int, number: int) -> str:
        return "0x" + keccak(text=f"settle:sandbox:{chain_id}:{number}").hex()

    def confirmations(self, deposit: Deposit, now: datetime) -> int:
        """1 in the block it was mined in, +1 per simulated block since; capped at the depth."""
        if self.block_s <= 0 or deposit.block_number is None:
            return deposit.required_confirmations
        elapsed = (now - deposit.created_at).total_seconds()
        count = 1 + int(max(0.0, elapsed) / self.block_s)
        return min(count, deposit.required_confirmations)


class SandboxConfirmer:
    """Counts confirmations of pending sandbox deposits and confirms them at depth."""

    def __init__(
        self,
        service: DepositService,
        chain: SandboxChain,
        *,
        clock: Callable[[], datetime] | None = None,
        batch_size: int = 100,
    ) -> None:
        self.service = service
        self.chain = chain
        self.clock = clock or service.clock
        self.batch_size = batch_size

    def tick(self) -> int:
        """One round; returns how many deposits were confirmed."""
        now = self.clock()
        confirmed = 0
        counts: dict[str, int] = {}
        for deposit in self.service.pending_sandbox(self.batch_size):
            count = self.chain.confirmations(deposit, now)
            if count >= deposit.required_confirmations:
                if self.service.confirm(deposit.id, count, skip_locked=True) is not None:
                    confirmed += 1
            elif count != deposit.confirmations:
                counts[deposit.id] = count
        self.service.set_confirmations(counts)
        return confirmed
