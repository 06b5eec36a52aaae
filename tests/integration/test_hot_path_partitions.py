"""The delivery hot path reads one partition of each partitioned table.

A year-old database keeps a partition per day (30-90 of each notifier table). A
statement whose partitions PostgreSQL cannot prune (a join or a correlated subquery
decides them) opens every partition's index on each execution: the claim cost
PostgreSQL 13.6 ms per delivery that way (docs/PERFORMANCE.md, "The claim"). Each hot
statement is explained here with its parameters, as psycopg runs it, on such a
database; its plan may name at most one partition of each table.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from services.notifier import delivery_store
from shared.db import Database, DriverStatement
from shared.timefmt import utcnow
from tests.support.partitions import steady_state_partitions
from tests.support.pipeline import isolated_database

pytestmark = pytest.mark.integration

PARTITIONED = ("notifier_events", "webhook_deliveries", "webhook_attempts")


@pytest.fixture(scope="module")
def db() -> Iterator[Database]:
    with isolated_database("hot_path") as url:
        assert steady_state_partitions(url) > 150
        database = Database(url, pool_size=2)
        try:
            yield database
        finally:
            database.dispose()


def _relations(plan: dict[str, Any], seen: Counter[str]) -> Counter[str]:
    if "Relation Name" in plan:
        seen[plan["Relation Name"]] += 1
    for child in plan.get("Plans", []):
        _relations(child, seen)
    return seen


def _partitions_read(db: Database, statement: DriverStatement, values: dict[str, Any]) -> dict:
    with db.driver_autocommit() as conn:
        # EXPLAIN without ANALYZE: planned with these values as the statement would be,
        # nothing written.
        row = conn.execute("EXPLAIN (FORMAT JSON) " + statement.sql, statement.bind(values))
        plan = row.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    names = _relations(plan[0]["Plan"], Counter())
    return {
        parent: sorted(n for n in names if n.startswith(parent + "_")) for parent in PARTITIONED
    }


def _values() -> dict[str, Any]:
    now = utcnow()
    return {
        "delivery_id": "whd_01M8J0H1JEQRYTWVY9B5H3FW0J",
        "now": now,
        "due_by": now,
        "lease": now + timedelta(seconds=30),
        "gap_cutoff": now - timedelta(seconds=5),
        "event_id": "evt_x",
        "received_at": now,
        "attempt_count": 1,
        "last_attempt_at": now,
        "last_response_status": 200,
        "latency_ms": 1.0,
        "last_error": None,
        "response_body": "",
        "signature_header": "",
        "webhook_signature": "",
        "status": "succeeded",
        "next_attempt_at": None,
        "succeeded_at": now,
        "updated_at": now,
    }


@pytest.mark.parametrize(
    "name",
    ["unordered claim", "unclaimed", "event gone", "event body", "record"],
)
def test_each_hot_statement_reads_one_partition_per_table(db: Database, name: str) -> None:
    statement = {
        "unordered claim": lambda: delivery_store._claim_statement(ordered=False),
        "unclaimed": lambda: delivery_store._UNCLAIMED,
        "event gone": lambda: delivery_store._END_EVENT_GONE,
        "event body": lambda: delivery_store._EVENT,
        "record": delivery_store._record_statement,
    }[name]()
    read = _partitions_read(db, db.driver_statement(statement), _values())
    assert all(len(names) <= 1 for names in read.values()), read


def test_the_ordered_claim_is_the_one_that_reads_every_partition(db: Database) -> None:
    # The price named in ordering.may_start, paid only by ordered endpoints: if this
    # ever reads one partition, the split of the claim can go.
    statement = db.driver_statement(delivery_store._claim_statement(ordered=True))
    read = _partitions_read(db, statement, _values())
    assert len(read["webhook_deliveries"]) > 10
