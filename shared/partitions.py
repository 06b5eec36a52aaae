"""Time-partitioned tables: partitions made ahead of time, old ones dropped whole.

Tables that grow with traffic (the notifier's events, deliveries and attempts; core's
published outbox rows) are PostgreSQL range-partitioned tables, a partition per
period (a day by default, SETTLE_PARTITION_DAYS). The worker's maintenance step
(`Maintainer`) makes the partitions of the next few periods ahead of need and drops,
detach then DROP, each partition whose whole range is older than its table's
retention: no row is ever deleted on the hot path, and a drop frees its disk at once
(docs/DECISIONS.md, "Bounded data").

A partition's range is kept in its name (`<stem>_<from>_<to>`, days as YYYYMMDD), so
planning reads only the catalog. The key is either a timestamp column or a ULID id
column (`id_prefix`): ids sort by creation time, so a day of ids is a range of ids
(`shared.ids.ulid_time_prefix`), and a lookup by id alone finds its one partition.

Each partitioned table has a DEFAULT partition: a row no partition covers yet (the
worker was down longer than the periods made ahead, a clock far off) is kept there,
never refused; making its range's partition later moves such rows into it, and
pruning deletes the few left there once older than the retention.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from shared.ids import ulid_time_prefix
from shared.settings import SettingsError, env_float, env_int

log = logging.getLogger(__name__)

EPOCH = date(1970, 1, 1)
#: How long a maintenance statement waits for a lock before giving up until next round:
#: DETACH and ATTACH queue behind readers, and writers would queue behind them.
LOCK_TIMEOUT = "2s"
#: Rows of a seen-ids table deleted per statement when pruning (short transactions).
DELETE_BATCH = 10_000
_NAME = re.compile(r"^(?P<stem>.+)_(?P<start>\d{8})_(?P<end>\d{8})$")


@dataclass(frozen=True)
class PartitionSettings:
    """How long a period is, how many are made ahead, how often the worker checks."""

    #: Days per partition.
    days: int = 1
    #: Periods made ahead of the current one.
    ahead: int = 3
    #: Seconds between maintenance rounds (the thread sleeps on an Event meanwhile).
    interval_s: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PartitionSettings:
        days = env_int(env, "SETTLE_PARTITION_DAYS", 1)
        ahead = env_int(env, "SETTLE_PARTITIONS_AHEAD", 3)
        interval = env_float(env, "SETTLE_PARTITION_MAINTENANCE_S", 3600.0)
        if not 1 <= days <= 31:
            raise SettingsError(f"SETTLE_PARTITION_DAYS must be 1 to 31, got {days}")
        if not 1 <= ahead <= 60:
            raise SettingsError(f"SETTLE_PARTITIONS_AHEAD must be 1 to 60, got {ahead}")
        if not 1 <= interval <= 86400:
            raise SettingsError(
                f"SETTLE_PARTITION_MAINTENANCE_S must be 1 to 86400 seconds, got {interval}"
            )
        return cls(days=days, ahead=ahead, interval_s=interval)


def env_retention_days(env: Mapping[str, str], name: str, default: int) -> timedelta:
    """A retention in whole days, at least 1."""
    days = env_int(env, name, default)
    if days < 1:
        raise SettingsError(f"{name} must be a whole number of days, at least 1, got {days}")
    return timedelta(days=days)


@dataclass(frozen=True)
class SeenIds:
    """A plain table keeping ids unique across the partitions (a unique index on a
    partitioned table must include its key): pruned with the partitions it covers."""

    table: str
    time_column: str


@dataclass(frozen=True)
class PartitionedTable:
    """A range-partitioned table and how long its rows are kept."""

    parent: str
    #: The partition key's column.
    key: str
    retention: timedelta
    #: The ids' prefix (`whd_`) when the key is a ULID id column; None: a timestamp.
    id_prefix: str | None = None
    #: A constant leading bound (SQL literal) when the key leads with a class of rows.
    lead: str | None = None
    #: The partitions' name stem and the DEFAULT partition's name.
    stem: str = ""
    default: str = ""
    #: SQL condition selecting this spec's rows in the DEFAULT partition (with `lead`).
    lead_condition: str | None = None
    seen_ids: SeenIds | None = None
    #: Days per partition of this table when not the settings' (a long retention's).
    period_days: int | None = None
    #: SQL condition on a partition's rows that holds it back from a drop (e.g. rows
    #: not yet published): reported as held, dropped once no row matches.
    hold_if: str | None = None

    def __post_init__(self) -> None:
        if not self.stem:
            object.__setattr__(self, "stem", self.parent)
        if not self.default:
            object.__setattr__(self, "default", f"{self.parent}_default")

    def days(self, settings: PartitionSettings) -> int:
        return self.period_days or settings.days

    def bound(self, day: date) -> str:
        """SQL literal of the key value at 00:00 UTC of `day`."""
        at = datetime(day.year, day.month, day.day, tzinfo=UTC)
        if self.id_prefix is not None:
            value = f"'{self.id_prefix}{ulid_time_prefix(int(at.timestamp() * 1000))}'"
        else:
            value = f"'{at.isoformat()}'::timestamptz"
        return value if self.lead is None else f"{self.lead}, {value}"

    def key_value(self, day: date) -> str:
        """SQL literal of the key column alone at 00:00 UTC of `day`."""
        bound = self.bound(day)
        return bound if self.lead is None else bound.split(", ", 1)[1]


@dataclass(frozen=True)
class Partition:
    table: str
    name: str
    start: date
    end: date

    def as_json(self, size: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "table": self.table,
            "partition": self.name,
            "from": self.start.isoformat(),
            "to": self.end.isoformat(),
        }
        if size is not None:
            out["bytes"] = size
        return out


@dataclass
class PruneReport:
    """What a prune dropped and deleted (or would, with `dry_run`)."""

    dry_run: bool
    now: datetime
    partitions: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: Partitions past their retention kept by their table's `hold_if`.
    held: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "dryRun": self.dry_run,
            "now": self.now.isoformat().replace("+00:00", "Z"),
            "partitions": self.partitions,
            "rows": self.rows,
            "held": self.held,
        }

    def extend(self, other: PruneReport) -> None:
        self.partitions.extend(other.partitions)
        self.rows.extend(other.rows)
        self.held.extend(other.held)

    def dumps(self) -> str:
        return json.dumps(self.as_json(), indent=2)


# -- planning (no SQL) ----------------------------------------------------------------


def period_start(day: date, days: int) -> date:
    """The first day of the period `day` falls in (periods count from 1970-01-01)."""
    offset = (day - EPOCH).days
    return EPOCH + timedelta(days=offset - offset % days)


def wanted(spec: PartitionedTable, now: datetime, settings: PartitionSettings) -> list[Partition]:
    """The current period's partition and `ahead` more."""
    start = period_start(now.astimezone(UTC).date(), spec.days(settings))
    step = timedelta(days=spec.days(settings))
    return [
        _partition(spec, start + step * n, start + step * (n + 1))
        for n in range(settings.ahead + 1)
    ]


def span(
    spec: PartitionedTable, first: datetime, now: datetime, settings: PartitionSettings
) -> list[Partition]:
    """The partitions from the period of `first` to `wanted`'s last (when migrating rows)."""
    ahead = wanted(spec, now, settings)
    step = timedelta(days=spec.days(settings))
    start = period_start(first.astimezone(UTC).date(), spec.days(settings))
    before = []
    while start < ahead[0].start:
        before.append(_partition(spec, start, start + step))
        start += step
    return [*before, *ahead]


def drop_before(spec: PartitionedTable, now: datetime) -> date:
    """Partitions ending on or before this day hold only rows older than the retention."""
    return (now.astimezone(UTC) - spec.retention).date()


def expired(
    spec: PartitionedTable, existing: Sequence[Partition], now: datetime
) -> list[Partition]:
    cutoff = drop_before(spec, now)
    return [p for p in existing if p.end <= cutoff]


def missing(
    spec: PartitionedTable,
    existing: Sequence[Partition],
    now: datetime,
    settings: PartitionSettings,
) -> list[Partition]:
    """Wanted partitions that overlap none there (a changed period length keeps the old)."""
    return [
        p
        for p in wanted(spec, now, settings)
        if not any(p.start < e.end and e.start < p.end for e in existing)
    ]


def _partition(spec: PartitionedTable, start: date, end: date) -> Partition:
    return Partition(spec.parent, f"{spec.stem}_{start:%Y%m%d}_{end:%Y%m%d}", start, end)


# -- the catalog and DDL ---------------------------------------------------------------
# (SQL built from names and dates in code, never from input: hence the S608 waivers.)

_CHILDREN = sa.text(
    "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_inherits i "
    "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
    "WHERE p.relname = :parent AND p.relnamespace = c.relnamespace "
    "AND p.relnamespace = to_regnamespace(current_schema())::oid"
)


def is_there(conn: sa.Connection, spec: PartitionedTable) -> bool:
    """The parent table exists here (core's and the notifier's may be apart)."""
    return conn.scalar(sa.text("SELECT to_regclass(:t)"), {"t": spec.parent}) is not None


def existing(conn: sa.Connection, spec: PartitionedTable) -> dict[Partition, int]:
    """The spec's partitions (by name) and their size in bytes."""
    out: dict[Partition, int] = {}
    for name, size in conn.execute(_CHILDREN, {"parent": spec.parent}):
        match = _NAME.match(name)
        if match is None or match["stem"] != spec.stem:
            continue
        start = datetime.strptime(match["start"], "%Y%m%d").date()
        end = datetime.strptime(match["end"], "%Y%m%d").date()
        out[Partition(spec.parent, name, start, end)] = int(size)
    return out


def is_held(conn: sa.Connection, spec: PartitionedTable, partition: Partition) -> bool:
    """A row of the partition matches the table's `hold_if`."""
    query = f"SELECT EXISTS (SELECT 1 FROM {partition.name} WHERE {spec.hold_if})"  # noqa: S608
    return bool(conn.execute(sa.text(query)).scalar_one())


def _lock_timeout(conn: sa.Connection) -> None:
    conn.execute(sa.text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))


def create_default(conn: sa.Connection, spec: PartitionedTable) -> None:
    conn.execute(sa.text(f"CREATE TABLE {spec.default} PARTITION OF {spec.parent} DEFAULT"))


def create(conn: sa.Connection, spec: PartitionedTable, partition: Partition) -> None:
    """Make `partition` (in the caller's transaction), moving in rows of its range the
    DEFAULT partition holds. Built apart, then attached: ATTACH takes a lighter lock on
    the parent than CREATE TABLE ... PARTITION OF, so writers go on meanwhile."""
    _lock_timeout(conn)
    name, key = partition.name, spec.key
    low, high = spec.key_value(partition.start), spec.key_value(partition.end)
    # No row may reach the DEFAULT partition between the move and ATTACH's check of it
    # (a row of this range written meanwhile fails the ATTACH: under steady traffic the
    # day's partition would never be made). EXCLUSIVE lets readers on.
    conn.execute(sa.text(f"LOCK TABLE {spec.default} IN EXCLUSIVE MODE"))
    conn.execute(
        sa.text(f"CREATE TABLE {name} (LIKE {spec.parent} INCLUDING DEFAULTS INCLUDING STORAGE)")
    )
    in_range = f"{key} >= {low} AND {key} < {high}"
    if spec.lead_condition is not None:
        in_range = f"{spec.lead_condition} AND {in_range}"
    conn.execute(
        sa.text(
            f"WITH moved AS (DELETE FROM {spec.default} WHERE {in_range} RETURNING *) "  # noqa: S608
            f"INSERT INTO {name} SELECT * FROM moved"
        )
    )
    conn.execute(
        sa.text(
            f"ALTER TABLE {spec.parent} ATTACH PARTITION {name} "
            f"FOR VALUES FROM ({spec.bound(partition.start)}) TO ({spec.bound(partition.end)})"
        )
    )


def drop(conn: sa.Connection, spec: PartitionedTable, partition: Partition) -> None:
    """Detach, then drop, `partition` (in the caller's transaction)."""
    _lock_timeout(conn)
    conn.execute(sa.text(f"ALTER TABLE {spec.parent} DETACH PARTITION {partition.name}"))
    conn.execute(sa.text(f"DROP TABLE {partition.name}"))


def _stale_in_default(spec: PartitionedTable, cutoff: date) -> str:
    condition = f"{spec.key} < {spec.key_value(cutoff)}"
    if spec.lead_condition is not None:
        condition = f"{spec.lead_condition} AND {condition}"
    if spec.hold_if is not None:
        condition = f"{condition} AND NOT ({spec.hold_if})"
    return condition


def _seen_condition(spec: PartitionedTable, cutoff: date) -> str:
    assert spec.seen_ids is not None
    at = datetime(cutoff.year, cutoff.month, cutoff.day, tzinfo=UTC).isoformat()
    return f"{spec.seen_ids.time_column} < '{at}'::timestamptz"


def count_stale_rows(
    conn: sa.Connection, spec: PartitionedTable, cutoff: date
) -> list[dict[str, Any]]:
    """Rows a prune deletes: the DEFAULT partition's older than the cutoff, and the
    seen ids the dropped partitions covered."""
    out = []
    where = _stale_in_default(spec, cutoff)
    count = f"SELECT count(*) FROM {spec.default} WHERE {where}"  # noqa: S608
    n = conn.execute(sa.text(count)).scalar_one()
    if n:
        out.append({"table": spec.default, "before": cutoff.isoformat(), "rows": int(n)})
    if spec.seen_ids is not None:
        table, where = spec.seen_ids.table, _seen_condition(spec, cutoff)
        count = f"SELECT count(*) FROM {table} WHERE {where}"  # noqa: S608
        n = conn.execute(sa.text(count)).scalar_one()
        if n:
            out.append({"table": table, "before": cutoff.isoformat(), "rows": int(n)})
    return out


def delete_stale_rows(engine: sa.Engine, spec: PartitionedTable, cutoff: date) -> None:
    """`count_stale_rows`' rows deleted, a batch per transaction (maintenance only)."""
    statements = [f"DELETE FROM {spec.default} WHERE {_stale_in_default(spec, cutoff)}"]  # noqa: S608
    if spec.seen_ids is not None:
        table, where = spec.seen_ids.table, _seen_condition(spec, cutoff)
        statements.append(
            f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("  # noqa: S608
            f"SELECT ctid FROM {table} WHERE {where} LIMIT {DELETE_BATCH}))"
        )
    for statement in statements:
        while True:
            with engine.begin() as conn:
                if conn.execute(sa.text(statement)).rowcount < DELETE_BATCH:
                    break
    if spec.seen_ids is not None:
        # The space of the ids just deleted is reused by the next days' (autovacuum
        # would get there, later): the table stays the size of the retention's ids.
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                sa.text(f"VACUUM {spec.seen_ids.table}")
            )


# -- the two operations -----------------------------------------------------------------


def ensure(
    engine: sa.Engine,
    specs: Sequence[PartitionedTable],
    settings: PartitionSettings,
    now: datetime,
) -> list[Partition]:
    """Make the partitions of the current and the next `ahead` periods; returns those made.
    Each in its own short transaction: one that cannot take its lock waits for next round."""
    made = []
    for spec in specs:
        with engine.connect() as conn:
            if not is_there(conn, spec):
                continue
            there = existing(conn, spec)
        for partition in missing(spec, list(there), now, settings):
            if _in_own_transaction(engine, create, spec, partition):
                made.append(partition)
    return made


def _in_own_transaction(
    engine: sa.Engine,
    work: Callable[[sa.Connection, PartitionedTable, Partition], None],
    spec: PartitionedTable,
    partition: Partition,
) -> bool:
    """`work` (create or drop) in a transaction of its own; a failure (a lock not had
    within the timeout, another worker's round that made or dropped it first) is logged
    and leaves it to the next round, not the rest of this one."""
    try:
        with engine.begin() as conn:
            work(conn, spec, partition)
    except sa.exc.DBAPIError as err:
        log.warning(
            "partitions: %s %s waits for the next round (%s)", work.__name__, partition.name, err
        )
        return False
    return True


def prune(
    engine: sa.Engine,
    specs: Sequence[PartitionedTable],
    now: datetime,
    *,
    dry_run: bool = False,
) -> PruneReport:
    """Drop each partition past its table's retention (with `dry_run`, only say which),
    then delete the rows a dropped range leaves elsewhere (see `count_stale_rows`)."""
    report = PruneReport(dry_run, now)
    for spec in specs:
        with engine.connect() as conn:
            if not is_there(conn, spec):
                continue
            there = existing(conn, spec)
            gone = []
            for partition in sorted(expired(spec, list(there), now), key=lambda p: p.start):
                if spec.hold_if is not None and is_held(conn, spec, partition):
                    report.held.append(partition.as_json(there[partition]))
                else:
                    gone.append(partition)
            # Rows elsewhere go with the dropped ranges only: never before a kept
            # partition's start (a period longer than a day may straddle the cutoff).
            kept = [p.start for p in there if p not in gone]
            cutoff = min([drop_before(spec, now), *kept])
            stale_rows = count_stale_rows(conn, spec, cutoff)
        kept_back = False
        for partition in gone:
            if dry_run or _in_own_transaction(engine, drop, spec, partition):
                report.partitions.append(partition.as_json(there[partition]))
            else:
                kept_back = True
        if kept_back:
            # A range still stored keeps its rows elsewhere too (its events' seen ids).
            continue
        report.rows.extend(stale_rows)
        if not dry_run and stale_rows:
            delete_stale_rows(engine, spec, cutoff)
    return report


class Maintainer:
    """The worker's maintenance step: partitions made ahead, old ones dropped, every
    `settings.interval_s` (an hour by default). Between rounds the thread waits on the
    stop Event: nothing runs at rest."""

    def __init__(
        self,
        engine: sa.Engine,
        specs: Callable[[], Sequence[PartitionedTable]] | Sequence[PartitionedTable],
        settings: PartitionSettings,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.engine = engine
        self._specs = specs
        self.settings = settings
        self.clock = clock or (lambda: datetime.now(UTC))

    @property
    def specs(self) -> Sequence[PartitionedTable]:
        return self._specs() if callable(self._specs) else self._specs

    def run_once(self) -> PruneReport:
        now = self.clock()
        made = ensure(self.engine, self.specs, self.settings, now)
        for partition in made:
            log.info("partitions: made %s", partition.name)
        report = prune(self.engine, self.specs, now)
        for dropped in report.partitions:
            log.info("partitions: dropped %s (%s bytes)", dropped["partition"], dropped["bytes"])
        return report

    def run(self, stop: threading.Event) -> None:
        """A round now, then one every interval until `stop`; errors are logged, never fatal."""
        while True:
            try:
                self.run_once()
            except Exception:
                log.exception(
                    "partition maintenance failed; trying again in %.0fs", self.settings.interval_s
                )
            if stop.wait(self.settings.interval_s):
                return
