"""The statement use case: check the period, read it in one snapshot, write, sign.

The statement is written to a temporary file as its rows stream from the database
(memory holds one batch of rows, never the statement), then signed through a
read-only memory map of that file, and served from it. At most `max_deposits` rows
and `max_days` days: a bigger period is refused before a row is written.
"""

from __future__ import annotations

import mmap
import tempfile
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import IO

from services.core.statements import queries, render
from services.core.statements.period import Period, period
from services.core.statements.queries import Figures, TokenTotals
from services.core.statements.settings import StatementSettings
from services.core.statements.signing import StatementSigner
from shared.db import Database
from shared.errors import ApiError, ServiceUnavailable
from shared.timefmt import iso_ms, utcnow


class StatementTooLarge(ApiError):
    status, code = 422, "statement_too_large"


class StatementInconsistent(RuntimeError):
    """The deposits listed do not add up to the totals read with them: never signed."""


@dataclass
class SignedStatement:
    """A statement's bytes (a file positioned at 0, the caller closes it) and signature."""

    file: IO[bytes]
    size: int
    media_type: str
    filename: str
    signature: bytes
    key_id: str


class Statements:
    def __init__(
        self,
        db: Database,
        settings: StatementSettings,
        signer: StatementSigner,
        *,
        slots: threading.BoundedSemaphore | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.settings = settings
        self.signer = signer
        #: The process's statements at once (`settings.concurrency`); None: unbounded.
        self.slots = slots
        self.clock = clock

    def build(
        self,
        tenant_id: str,
        *,
        start: datetime,
        end: datetime | None,
        sandbox: bool,
        fmt: str,
    ) -> SignedStatement:
        """The tenant's signed statement of `[start, end)` (`end` None: now)."""
        now = self.clock()
        bounds = period(start, end, now=now, max_days=self.settings.max_days)
        if self.slots is not None and not self.slots.acquire(blocking=False):
            raise ServiceUnavailable(
                "this process is making as many statements as it may at once; retry in 5 s",
                headers={"Retry-After": "5"},
            )
        try:
            return self._build(tenant_id, bounds, now, sandbox=sandbox, fmt=fmt)
        finally:
            if self.slots is not None:
                self.slots.release()

    def _build(
        self, tenant_id: str, bounds: Period, now: datetime, *, sandbox: bool, fmt: str
    ) -> SignedStatement:
        header = render.Header(tenant_id, sandbox, bounds, now, self.signer.key_id)
        with ExitStack() as on_error:
            # Closed here if anything fails; else handed to the caller, who closes it.
            out = on_error.enter_context(tempfile.TemporaryFile(prefix="settle-statement-"))
            with queries.snapshot(self.db) as conn:
                totals = queries.totals(conn, tenant_id, sandbox, bounds)
                self._check_size(totals)
                writer = render.writer(fmt, out, header, totals)
                writer.start()
                listed: dict[tuple[int, str], Figures] = {}
                for row in queries.deposits(conn, tenant_id, sandbox, bounds):
                    writer.deposit(row)
                    key = (row.chain_id, row.token_address)
                    listed[key] = listed.get(key, Figures()) + Figures.of(row)
                _check_sums(totals, listed)
                writer.finish()
            size = out.tell()
            out.flush()
            with mmap.mmap(out.fileno(), size, access=mmap.ACCESS_READ) as view:
                signature = self.signer.sign(view)
            out.seek(0)
            on_error.pop_all()
        name = f"settle-statement-{iso_ms(bounds.start)}-{iso_ms(bounds.end)}.{fmt}"
        return SignedStatement(
            file=out,
            size=size,
            media_type=render.MEDIA_TYPES[fmt],
            filename=name.replace(":", ""),
            signature=signature,
            key_id=self.signer.key_id,
        )

    def _check_size(self, totals: list[TokenTotals]) -> None:
        count = sum(t.period.deposits for t in totals)
        limit = self.settings.max_deposits
        if count > limit:
            raise StatementTooLarge(
                f"the period holds {count} deposits, more than the {limit} a statement may "
                "list; ask for shorter periods",
                details={"deposits": count, "maxDeposits": limit},
            )


def _check_sums(totals: list[TokenTotals], listed: dict[tuple[int, str], Figures]) -> None:
    """The listed deposits add up to the period's totals, token by token (one snapshot
    gives both, so only a bug can break this; a statement that breaks it is not signed)."""
    expected = {t.key: t.period for t in totals if t.period.deposits}
    if expected != listed:
        raise StatementInconsistent(f"totals {expected} but the deposits listed add to {listed}")
