"""Waking the outbox relay after a commit, with `NOTIFY` sent outside the writer's transaction.

PostgreSQL serialises the commits of transactions that sent `NOTIFY`: the sender
takes a database-wide lock on the notification queue at commit and keeps it through
the commit's WAL flush. With `NOTIFY` inside every request's transaction, no two
API commits could share a flush (docs/PERFORMANCE.md has the figures). So a writer
only marks its session (`request_wakeup`); after the
commit, an `after_commit` callback pokes this process's `RelayWaker`, whose own
thread sends `NOTIFY settle_outbox` on its own autocommit connection. Pokes that
arrive while one `NOTIFY` is under way, or within `MIN_GAP_S` of it, are covered by
the next one: at most one `NOTIFY` per 50 ms per process, not one per commit. The
relay, once woken, looks again every few milliseconds for longer than the gap
(`relay.HOT_WINDOW_S`), so a commit in the gap waits for its next look, not the gap.

The wake-up is an optimisation of latency only: the relay polls as well, so a lost
`NOTIFY` (notifier connection down, process killed between commit and poke) delays
publication until the next poll and loses nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from contextlib import suppress
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from shared.db import Database, after_commit, database_of

log = logging.getLogger(__name__)

#: The PostgreSQL channel the relay LISTENs on.
NOTIFY_CHANNEL = "settle_outbox"
#: Database attachment key of the notifier.
ATTACHMENT = "settle.outbox_notifier"
#: How long the notifier thread sleeps between checks of `close()` while idle.
IDLE_WAIT_S = 1.0
#: At most this long is spent at interpreter exit sending a wake-up still owed.
EXIT_FLUSH_S = 1.0
#: At most one NOTIFY per this many seconds (per process): commits within it share the
#: next one, and the relay's looks after a wake-up (relay.HOT_WINDOW_S) find them
#: sooner. Each NOTIFY costs a thread switch, a round trip and server CPU (about
#: 0.2 ms of the machine's CPU, docs/PERFORMANCE.md); at one per 5 ms, a busy API's
#: wake-ups made its throughput swing by a third from run to run (docs/PERFORMANCE.md).
#: A commit after a quiet spell still sends at once.
MIN_GAP_S = 0.05
#: Pause after a failed NOTIFY before connecting again (the relay polls meanwhile).
RETRY_PAUSE_S = 1.0
CONNECT_TIMEOUT_S = 5


def request_wakeup(session: Session) -> None:
    """Wake the relay once this session's transaction commits."""
    db = database_of(session)
    if db is None:
        return
    after_commit(session, db.attachment(ATTACHMENT, RelayWaker).poke)


def wake_relay(db: Database) -> None:
    """Wake the relay now: for outbox rows committed outside a session."""
    db.attachment(ATTACHMENT, RelayWaker).poke()


class RelayWaker:
    """A per-process thread sending coalesced `NOTIFY settle_outbox` on its own connection.

    Started lazily by the first `poke` (no import-time side effects, and after a
    gunicorn fork rather than before). A daemon, so it never holds the process up;
    at interpreter exit a wake-up still owed is sent first (bounded by
    `EXIT_FLUSH_S`), so a short-lived command's event is not left to the poll.
    """

    #: Shown in pg_stat_activity, so operators can tell these connections apart.
    APPLICATION_NAME = "settle-outbox-notifier"

    def __init__(self, db: Database, *, channel: str = NOTIFY_CHANNEL) -> None:
        self._url = db.libpq_url
        self._statement = f"NOTIFY {channel}"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        #: A commit happened since the last NOTIFY was sent (set by poke, cleared by the thread).
        self._owed = False
        self._thread: threading.Thread | None = None
        self._pid = 0
        #: NOTIFY statements sent (a burst of pokes counts once).
        self.sent = 0

    def poke(self) -> None:
        """Ask for a NOTIFY soon; cheap and non-blocking (called after each outbox commit)."""
        if self._pid != os.getpid():
            self._start()
        if self._owed:
            # Already owed: whoever set it woke the thread, and the thread clears the
            # flag before it sends, so that NOTIFY still comes after this commit.
            return
        self._owed = True
        self._wake.set()

    def _start(self) -> None:
        with self._lock:
            if self._closed.is_set() or self._pid == os.getpid():
                return
            # A forked child inherits this object but not the thread: it starts its own
            # (and not the parent's debt: its own pokes set `_owed` and wake it).
            self._wake = threading.Event()
            self._owed = False
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="outbox-notifier", daemon=True)
            self._thread.start()
            atexit.register(self.close, EXIT_FLUSH_S)

    def close(self, timeout_s: float = EXIT_FLUSH_S) -> None:
        """Send what is owed, then stop the thread (waiting at most `timeout_s`)."""
        atexit.unregister(self.close)
        self._closed.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while True:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                if self._owed:
                    # Cleared before sending: a commit landing meanwhile is owed another.
                    self._owed = False
                    started = time.monotonic()
                    conn = self._notify(conn)
                    # Commits meanwhile wait for the gap's end (close() cuts it short).
                    self._closed.wait(started + MIN_GAP_S - time.monotonic())
                if self._closed.is_set() and not self._owed:
                    return
        finally:
            if conn is not None:
                conn.close()

    def _notify(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any] | None:
        """Send one NOTIFY; the connection to keep (None after a failure).

        A dead connection (server restarted, idle timeout) is replaced and the NOTIFY
        sent again at once; if that fails too the wake-up is dropped, logged, and the
        relay's poll picks the rows up.
        """
        for attempt in (1, 2):
            try:
                if conn is None:
                    conn = psycopg.connect(
                        self._url,
                        autocommit=True,
                        connect_timeout=CONNECT_TIMEOUT_S,
                        application_name=self.APPLICATION_NAME,
                    )
                conn.execute(self._statement)
                self.sent += 1
                return conn
            except psycopg.Error as err:
                if conn is not None:
                    conn.close()
                conn = None
                if attempt == 2:
                    log.warning("outbox NOTIFY failed (%s); the relay's poll covers it", err)
                    self._closed.wait(RETRY_PAUSE_S)  # no hot loop while the server is down
        return None


#: How often a listener asleep looks at its stop flag (a commit wakes it at once).
STOP_CHECK_S = 1.0
#: Whether the relay has work: an index probe of the unpublished rows' partial index.
_ROWS_WAIT = "SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL)"


class OutboxListener:
    """A dedicated autocommit connection LISTENing on the outbox channel: what the relay
    and the deposit settlement loop sleep on, so an idle worker waits on a socket and
    wakes the moment core commits an event."""

    def __init__(self, db: Database, *, channel: str = NOTIFY_CHANNEL) -> None:
        self._url = db.libpq_url
        self._channel = channel
        self._conn: psycopg.Connection[Any] | None = None

    def wait(self, timeout: float) -> bool:
        """Block until a NOTIFY (True) or the timeout (False). Reconnects on error."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._url, autocommit=True, connect_timeout=5)
                self._conn.execute(f"LISTEN {self._channel}")
                # Rows may have been committed before LISTEN: look once before sleeping.
                return True
            woke = False
            for _ in self._conn.notifies(timeout=timeout, stop_after=1):
                woke = True
            if woke:
                # Coalesce the burst: every commit since has been seen by this wake-up.
                for _ in self._conn.notifies(timeout=0.0):
                    pass
            return woke
        except psycopg.Error as err:
            log.warning("outbox LISTEN connection failed (%s); polling until it is back", err)
            self.close()
            time.sleep(min(timeout, 1.0))
            return False

    def sleep(self, stop: threading.Event, seconds: float) -> bool:
        """Until a commit (True), `seconds` or `stop` (False); `stop` is seen within
        STOP_CHECK_S."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.wait(min(remaining, STOP_CHECK_S)):
                return True
        return False

    def rows_wait(self) -> bool:
        """Whether an unpublished row is there, read on this connection (never a pool's:
        a probe must not wait for a connection). True when it cannot tell (no
        connection: the relay round then meets the error and backs off)."""
        if self._conn is None or self._conn.closed:
            return True
        try:
            row = self._conn.execute(_ROWS_WAIT).fetchone()
        except psycopg.Error:
            self.close()
            return True
        return bool(row and row[0])

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(psycopg.Error):
                conn.close()
