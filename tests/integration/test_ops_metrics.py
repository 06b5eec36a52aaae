"""The metrics ops alert on, read from the real PostgreSQL, RabbitMQ and an anvil node."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from services.core.chains import parse_chains
from services.core.deposits import states
from services.core.deposits.metrics import DepositCollector
from services.core.deposits.models import Deposit
from services.core.deposits.settings import BalanceMinimum
from services.core.evm import connect
from services.core.hot_wallet_balances import HotWalletBalances
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.consumer import store_events
from services.notifier.metrics import DeadLetterCollector, DeliveryQueueCollector
from services.notifier.models import RETRYING, Delivery
from services.notifier.secrets import SecretBox
from shared import events
from shared.bus import BusNames
from shared.db import Database
from shared.timefmt import utcnow
from tests.conftest import make_tenant
from tests.support.anvil import AnvilNode, require_anvil
from tests.support.deposits import chains_toml, make_account
from tests.support.pipeline import delete_bus, isolated_database, unique_prefix
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def db() -> Iterator[Database]:
    """Rows of this module's own: the gauges read whole tables."""
    with isolated_database("ops_metrics") as url:
        database = Database(url, pool_size=4)
        yield database
        database.dispose()


def samples(collector: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """name and labels -> value, for every sample the collector yields."""
    found = {}
    for family in collector.collect():
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_due_deliveries_per_queue_and_how_long_the_oldest_has_been_due(db: Database) -> None:
    # Given an endpoint and five events fanned out to it (five pending deliveries)
    tenant = make_tenant(db)
    with db.transaction() as session:
        endpoint, _ = endpoint_domain.create_endpoint(
            session,
            SecretBox("ops-metrics-secret-key"),
            tenant.tenant_id,
            name="ops",
            url="https://hooks.example.com/ops",
            event_types=[events.DEPOSIT_CREDITED],
            allow_private=False,
            max_endpoints=10,
        )
    bodies = [
        events.encode(events.envelope(events.DEPOSIT_CREDITED, tenant.tenant_id, {"n": i}))
        for i in range(5)
    ]
    store_events(db, bodies)
    with db.reader() as session:
        ids = sorted(
            session.scalars(sa.select(Delivery.id).where(Delivery.endpoint_id == endpoint.id))
        )
    assert len(ids) == 5
    now = utcnow()

    def due(delivery_id: str, seconds_ago: float, *, retry: bool) -> None:
        values: dict[str, Any] = {"next_attempt_at": now - timedelta(seconds=seconds_ago)}
        if retry:
            values.update(status=RETRYING, attempt_count=2)
        with db.transaction() as session:
            session.execute(sa.update(Delivery).where(Delivery.id == delivery_id).values(values))

    # Two first attempts due 40 s and 10 s ago; two retries due 300 s and 5 s ago; one
    # retry due in an hour (not due: not counted, however old its event)
    due(ids[0], 40, retry=False)
    due(ids[1], 10, retry=False)
    due(ids[2], 300, retry=True)
    due(ids[3], 5, retry=True)
    due(ids[4], -3600, retry=True)
    # When the queue gauges are read
    found = samples(DeliveryQueueCollector(db))
    # Then each queue shows its due deliveries and its oldest lateness
    assert found[("settle_webhook_queue_depth", (("queue", "webhooks"),))] == 2
    assert found[("settle_webhook_queue_depth", (("queue", "webhooks.retry"),))] == 2
    first = found[("settle_webhook_queue_oldest_due_seconds", (("queue", "webhooks"),))]
    retry = found[("settle_webhook_queue_oldest_due_seconds", (("queue", "webhooks.retry"),))]
    assert 40 <= first < 60
    assert 300 <= retry < 320


def deposit_values(account: Any, **overrides: Any) -> dict[str, Any]:
    now = utcnow()
    values: dict[str, Any] = {
        "id": f"dep_{uuid.uuid4().hex[:26].upper()}",
        "tenant_id": account.tenant_id,
        "account_pk": account.pk,
        "account_id": account.id,
        "external_user_id": account.external_user_id,
        "chain_id": 8453,
        "deposit_address": account.address(8453),
        "asset": "USDC",
        "token_address": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
        "decimals": 6,
        "amount_raw": "1000000",
        "source_tx_hash": "0x" + uuid.uuid4().hex * 2,
        "log_index": 0,
        "confirmations": 1,
        "required_confirmations": 20,
        "dest_chain_id": 8453,
        "dest_address": "0x" + "1" * 40,
        "dest_token_address": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
        "sandbox": False,
        "failed_providers": [],
        "created_at": now,
        "updated_at": now,
    }
    values.update(overrides)
    return values


def test_pending_deposits_by_status_and_the_oldest_age_leave_out_sandbox_and_final(
    db: Database, core_context: Any
) -> None:
    account = make_account(db, make_tenant(db).tenant_id, core_context.registry, dest_chain_id=8453)
    now = utcnow()
    rows = [
        # Settling for 40 min, and for 1 min
        deposit_values(
            account, status=states.SOURCE_CONFIRMED, created_at=now - timedelta(minutes=40)
        ),
        deposit_values(
            account, status=states.SOURCE_CONFIRMED, created_at=now - timedelta(minutes=1)
        ),
        # In review since two hours
        deposit_values(
            account, status=states.MANUAL_REVIEW_REQUIRED, created_at=now - timedelta(hours=2)
        ),
        # A sandbox deposit settling for a day: moves no money, not counted
        deposit_values(
            account,
            status=states.SOURCE_CONFIRMED,
            sandbox=True,
            created_at=now - timedelta(days=1),
        ),
        # Credited and failed ones: final
        deposit_values(account, status=states.CREDITED, created_at=now - timedelta(days=2)),
        deposit_values(account, status=states.FAILED, created_at=now - timedelta(days=3)),
    ]
    with db.transaction() as session:
        session.execute(sa.insert(Deposit), rows)
    found = samples(DepositCollector(db))
    count = lambda status: found[("settle_deposits_pending", (("status", status),))]  # noqa: E731
    age = lambda status: found[  # noqa: E731
        ("settle_deposits_pending_oldest_seconds", (("status", status),))
    ]
    assert count(states.SOURCE_CONFIRMED) == 2
    assert 40 * 60 <= age(states.SOURCE_CONFIRMED) < 41 * 60
    assert count(states.MANUAL_REVIEW_REQUIRED) == 1
    assert 7200 <= age(states.MANUAL_REVIEW_REQUIRED) < 7260
    # Statuses with none are there at 0 (an alert on them sees a value, not a gap)
    assert count(states.CREDIT_SUBMITTED) == 0 and age(states.CREDIT_SUBMITTED) == 0
    assert not any(labels == (("status", states.CREDITED),) for _, labels in found)


def test_dead_letter_queues_report_their_depth() -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    names = BusNames(unique_prefix())
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        # Given the notifier's dead-letter queue holding two refused events
        channel = connection.channel()
        channel.queue_declare(names.notifier_dead_queue, durable=True)
        for n in range(2):
            channel.basic_publish("", names.notifier_dead_queue, f"refused {n}".encode())
        # And a job queue's dead letters holding one (Dramatiq's .XQ)
        channel.queue_declare(names.queue("webhooks.XQ"), durable=True)
        channel.basic_publish("", names.queue("webhooks.XQ"), b"a job that raised")
        # When the gauge is read (the retry queue's .XQ was never declared)
        found = samples(DeadLetterCollector(AMQP_URL, names))
    finally:
        connection.close()
        delete_bus(names, queues=("webhooks", "webhooks.retry", "webhooks.XQ"))
        cleanup = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        cleanup.channel().queue_delete(names.notifier_dead_queue)
        cleanup.close()
    # Then each queue shows its messages, under its name without the prefix
    gauge = "settle_dead_letter_messages"
    assert found[(gauge, (("queue", "settle.notifier.events.dead"),))] == 2
    assert found[(gauge, (("queue", "webhooks.XQ"),))] == 1
    assert found[(gauge, (("queue", "webhooks.retry.XQ"),))] == 0


def test_hot_wallet_balances_per_chain_and_token_from_the_node() -> None:
    require_anvil()
    with AnvilNode(chain_id=31337) as node:
        # Given a hot wallet holding 2.5 ETH and 1234.5 of a 6-decimals token on chain
        token = node.deploy_token("USDC", 6)
        wallet = "0x" + "ab" * 20
        node.set_balance(wallet, 25 * 10**17)
        node.mint(token, wallet, 1_234_500_000)
        registry = parse_chains(chains_toml(chain_id=31337, usdc=token, depth=1))
        metrics = CollectorRegistry()
        balances = HotWalletBalances(
            registry,
            {31337: connect(node.url, 5.0)},
            wallet,
            (BalanceMinimum(31337, "USDC", Decimal(5000)),),
            metrics,
        )
        # When the worker reads them
        balances.refresh()
        found = samples(balances)
    # Then the gauge shows both, in token units, and the floor ops set
    assert found[("settle_hot_wallet_balance", (("asset", "ETH"), ("chain_id", "31337")))] == 2.5
    assert found[("settle_hot_wallet_balance", (("asset", "USDC"), ("chain_id", "31337")))] == (
        1234.5
    )
    assert (
        found[("settle_hot_wallet_balance_minimum", (("asset", "USDC"), ("chain_id", "31337")))]
        == 5000
    )


def test_a_chain_whose_node_is_gone_shows_no_balance_and_counts_the_error() -> None:
    registry = parse_chains(chains_toml(chain_id=31337, usdc="0x" + "12" * 20, depth=1))
    metrics = CollectorRegistry()
    balances = HotWalletBalances(
        registry, {31337: connect("http://127.0.0.1:9/", 1.0)}, "0x" + "ab" * 20, (), metrics
    )
    balances.refresh()
    assert not any(name == "settle_hot_wallet_balance" for name, _ in samples(balances))
    errors = metrics.get_sample_value(
        "settle_hot_wallet_balance_errors_total", {"chain_id": "31337"}
    )
    assert errors == 1
