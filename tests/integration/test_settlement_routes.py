"""Settlement routes on PostgreSQL: inventory, routed providers, health, retries, recovery."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa

from services.core.chains import ChainRegistry
from services.core.deposits import states
from services.core.deposits.models import Deposit, InventoryBalance
from services.core.deposits.outcomes import CreditOrder, Failed, InFlight, Outcome
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import (
    Payer,
    RouteProvider,
    Settlement,
    SimulatedBridge,
    SimulatedPayer,
    set_inventory,
)
from services.core.evm import TransferLog
from shared.db import Database
from shared.timefmt import utcnow
from tests.conftest import TenantKeys
from tests.support.deposits import (
    SENDER,
    TEST_USDC,
    AccountRef,
    DepositParts,
    deposit_event_types,
    deposit_parts,
    deposit_row,
    events_of,
    make_account,
    set_fee,
    small_registry,
    unique_chain_id,
)

pytestmark = pytest.mark.integration

#: This module's own chain id: its fee and transfers meet no other module's.
CHAIN = unique_chain_id()
USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"


@dataclass
class ScriptedProvider:
    """A route provider whose answers the test decides."""

    name: str
    outcome: Outcome | None = None
    problem: str | None = None
    submitted: list[str] = field(default_factory=list)
    idempotent: bool = True
    instant: bool = False

    def supports(self, order: CreditOrder) -> bool:
        return True

    def submit(self, order: CreditOrder) -> Outcome:
        self.submitted.append(order.deposit_id)
        return self.outcome or InFlight(f"ref-{order.deposit_id}")

    def check(self, order: CreditOrder, ref: str) -> Outcome:
        return InFlight(ref)

    def health(self) -> str | None:
        return self.problem


class ForgetfulPayer(SimulatedPayer):
    """A payer that cannot be asked twice (like the hot wallet)."""

    idempotent = False
    instant = False


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def registry() -> ChainRegistry:
    return small_registry(chain_id=CHAIN, depth=3)


@pytest.fixture
def account(pg_db: Database, tenant: TenantKeys, registry: ChainRegistry) -> AccountRef:
    return make_account(
        pg_db, tenant.tenant_id, registry, dest_chain_id=8453, dest_token_address=USDC_BASE
    )


def parts_with(
    db: Database,
    registry: ChainRegistry,
    *,
    payers: dict[int, Payer] | None = None,
    providers: list[RouteProvider] | None = None,
    **settings: object,
) -> DepositParts:
    tuned = PipelineSettings(**{"poll_s": 0.0, "retry_base_s": 0.0, **settings})  # type: ignore[arg-type]
    settlement = Settlement(
        registry,
        payers=payers or {},
        providers=providers or [],
        provider_max_failures=tuned.provider_max_failures,
    )
    return deposit_parts(db, registry, settings=tuned, settlement=settlement)


def confirmed(parts: DepositParts, account: AccountRef, usdc: str) -> str:
    """A transfer recorded and confirmed at depth; its deposit id."""
    transfer = TransferLog(
        chain_id=CHAIN,
        block_number=100,
        block_hash="0x" + secrets.token_hex(32),
        tx_hash="0x" + secrets.token_hex(32),
        log_index=0,
        token_address=TEST_USDC,
        from_address=SENDER,
        to_address=account.address(CHAIN),
        amount_raw=int(Decimal(usdc) * 10**6),
    )
    with parts.db.transaction() as session:
        deposit = parts.detection.record_transfer(session, CHAIN, transfer, confirmations=3)
        assert deposit is not None
        deposit_id = deposit.id
    assert parts.detection.confirm(deposit_id, 3) is not None
    return deposit_id


def test_inventory_pays_at_once_and_warns_when_low(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    # Given 100 USDC of inventory on Base (low under 80) and a route provider
    set_fee(pg_db, CHAIN, "0.25")
    with pg_db.transaction() as session:
        set_inventory(session, 8453, USDC_BASE, "USDC", Decimal(100), Decimal(80), utcnow())
    bridge = SimulatedBridge(unique("bridge"), delay_s=0)
    parts = parts_with(pg_db, registry, payers={8453: SimulatedPayer()}, providers=[bridge])
    # When a 50 USDC deposit settles to Base
    first = confirmed(parts, account, "50")
    assert parts.settling.settle(first) == states.CREDITED
    # Then inventory paid 49.75 at once: no credit_submitted
    row = deposit_row(pg_db, first)
    assert (row.route, row.credit_amount) == ("inventory", "49.750000")
    assert deposit_event_types(pg_db, first) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credited",
    ]
    with pg_db.reader() as session:
        inventory = session.get(InventoryBalance, (8453, USDC_BASE))
        assert inventory is not None and Decimal(inventory.balance) == Decimal("50.25")
    # And the tenant, whose accounts settle there, heard that inventory is low, once
    low = [e for e in events_of(pg_db, account.tenant_id) if e["type"] == "inventory.low_balance"]
    assert len(low) == 1
    assert low[0]["data"]["inventory"]["balance"] == "50.250000"
    assert low[0]["data"]["inventory"]["chainId"] == 8453
    # When the next deposit is more than inventory holds, a provider bridges it
    second = confirmed(parts, account, "60")
    assert parts.settling.settle(second) == states.CREDIT_SUBMITTED
    assert deposit_row(pg_db, second).route == "routed"
    assert parts.settling.poll(second) == states.CREDITED
    assert deposit_event_types(pg_db, second)[-2:] == [
        "deposit.credit_submitted",
        "deposit.credited",
    ]
    low = [e for e in events_of(pg_db, account.tenant_id) if e["type"] == "inventory.low_balance"]
    assert len(low) == 1


def test_failing_health_checks_degrade_a_provider_and_traffic_moves_away(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    set_fee(pg_db, CHAIN, "0.10")
    sick = ScriptedProvider(unique("aaa-sick"), problem="timeout after 5 s")
    well = SimulatedBridge(unique("zzz-well"), delay_s=0)
    parts = parts_with(pg_db, registry, providers=[sick, well], provider_max_failures=3)
    # When the first provider fails three health checks in a row
    for _ in range(3):
        parts.settlement.check_health(pg_db, utcnow())
    # Then it is degraded and tenants are told, once
    degraded = [
        e for e in events_of(pg_db, account.tenant_id) if e["type"] == "route.provider_degraded"
    ]
    assert len(degraded) == 1
    provider = degraded[0]["data"]["provider"]
    assert provider["name"] == sick.name and provider["status"] == "degraded"
    assert "timeout" in provider["reason"]
    parts.settlement.check_health(pg_db, utcnow())
    assert (
        len(
            [
                e
                for e in events_of(pg_db, account.tenant_id)
                if e["type"] == "route.provider_degraded"
            ]
        )
        == 1
    )
    # And new credits go to the healthy provider
    deposit_id = confirmed(parts, account, "20")
    assert parts.settling.settle(deposit_id) == states.CREDIT_SUBMITTED
    assert deposit_row(pg_db, deposit_id).provider == well.name
    assert sick.submitted == []
    # When it recovers, it takes traffic again
    sick.problem = None
    parts.settlement.check_health(pg_db, utcnow())
    other = confirmed(parts, account, "20")
    parts.settling.settle(other)
    assert sick.submitted == [other]


def test_failed_route_moves_to_an_alternate_provider_then_to_manual_review(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    set_fee(pg_db, CHAIN, "0.10")
    broken = ScriptedProvider(unique("aaa-broken"), outcome=Failed("bridge paused"))
    spare = SimulatedBridge(unique("bbb-spare"), delay_s=0)
    parts = parts_with(pg_db, registry, providers=[broken, spare], max_settle_attempts=3)
    # A route that fails is retried on the alternate provider, and credited
    deposit_id = confirmed(parts, account, "15")
    assert parts.settling.settle(deposit_id) == states.SOURCE_CONFIRMED
    assert parts.settling.settle(deposit_id) == states.CREDIT_SUBMITTED
    assert parts.settling.poll(deposit_id) == states.CREDITED
    row = deposit_row(pg_db, deposit_id)
    assert row.failed_providers == [broken.name] and row.provider == spare.name
    # When every provider fails, the deposit goes to a person after the last attempt
    only_broken = parts_with(
        pg_db, registry, providers=[broken], max_settle_attempts=2, provider_max_failures=99
    )
    stuck = confirmed(only_broken, account, "15")
    only_broken.settling.settle(stuck)
    assert only_broken.settling.settle(stuck) == states.MANUAL_REVIEW_REQUIRED
    row = deposit_row(pg_db, stuck)
    assert row.review_reason is not None and row.review_reason.startswith("route_failed")
    assert deposit_event_types(pg_db, stuck)[-1] == "deposit.manual_review_required"


def test_no_route_at_all_ends_in_manual_review(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    set_fee(pg_db, CHAIN, "0.10")
    parts = parts_with(pg_db, registry, max_settle_attempts=2)
    deposit_id = confirmed(parts, account, "15")
    assert parts.settling.settle(deposit_id) == states.SOURCE_CONFIRMED
    assert parts.settling.settle(deposit_id) == states.MANUAL_REVIEW_REQUIRED
    assert deposit_row(pg_db, deposit_id).review_reason == "no_route: no route available"


def _crash_mid_payment(pg_db: Database, deposit_id: str, kind: str, provider: str) -> None:
    """As if a worker died between marking the payment and recording its answer."""
    with pg_db.transaction() as session:
        session.execute(
            sa.update(Deposit)
            .where(Deposit.id == deposit_id)
            .values(
                settle_phase="starting",
                route=kind,
                provider=provider,
                settle_attempts=1,
                updated_at=utcnow() - timedelta(hours=1),
            )
        )


def test_an_interrupted_payment_is_retried_only_when_the_route_is_idempotent(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    set_fee(pg_db, CHAIN, "0.10")
    # A payer that may have paid: a person decides
    risky = parts_with(pg_db, registry, payers={8453: ForgetfulPayer("hot-wallet-x")})
    first = confirmed(risky, account, "12")
    _crash_mid_payment(pg_db, first, "inventory", "hot-wallet-x")
    assert risky.settling.store.interrupted(risky.settling.stuck_cutoff(), 1000).count(first) == 1
    assert risky.settling.recover(first) == states.MANUAL_REVIEW_REQUIRED
    assert deposit_row(pg_db, first).review_reason == "settlement_interrupted"
    # A payer that answers the same for the same deposit: simply asked again
    safe = parts_with(pg_db, registry, payers={8453: SimulatedPayer("sim-x")})
    second = confirmed(safe, account, "12")
    _crash_mid_payment(pg_db, second, "inventory", "sim-x")
    assert safe.settling.recover(second) == states.SOURCE_CONFIRMED
    assert safe.settling.settle(second) == states.CREDITED
    assert deposit_event_types(pg_db, second).count("deposit.credited") == 1
