"""The deposit settlement loop at rest: asleep on core's outbox channel, woken by a commit
or by the next due time, never polling every few milliseconds (PostgreSQL)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa

from services.core.context import CoreContext
from services.core.deposits import states
from services.core.deposits import worker as worker_module
from services.core.deposits.models import Deposit
from services.core.deposits.sandbox import SandboxConfirmer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.worker import Pipeline, settle_loop
from shared.db import Database
from shared.timefmt import utcnow
from tests.conftest import make_tenant
from tests.support.deposits import AccountRef, deposit_parts, deposit_row, make_account
from tests.support.pipeline import isolated_database, wait_until

pytestmark = pytest.mark.integration

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
#: Base's sandbox depth (20) in 0.2 s.
SETTINGS = PipelineSettings(sandbox_block_s=0.01, batch_size=100, poll_s=0.05)
#: An idle loop's fallback in these tests: far longer than any wait they allow.
LONG_IDLE_S = 60.0


@pytest.fixture(scope="module")
def db() -> Iterator[Database]:
    """Deposits of this module's own: the loop's next-work read sees only them."""
    with isolated_database("pipeline_idle") as url:
        database = Database(url, pool_size=4)
        yield database
        database.dispose()


@pytest.fixture
def pipeline(db: Database, core_context: CoreContext) -> Pipeline:
    parts = deposit_parts(db, core_context.registry, settings=SETTINGS)
    return Pipeline(
        settling=parts.settling,
        sandbox=SandboxConfirmer(parts.detection, parts.sandbox.chain, batch_size=100),
        settings=SETTINGS,
    )


@pytest.fixture
def account(db: Database, core_context: CoreContext) -> AccountRef:
    tenant = make_tenant(db, sandbox=True)
    return make_account(
        db,
        tenant.tenant_id,
        core_context.registry,
        dest_chain_id=8453,
        dest_token_address=USDC_BASE,
    )


@pytest.fixture(autouse=True)
def long_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "IDLE_POLL_S", LONG_IDLE_S)


@pytest.fixture(autouse=True)
def nothing_open(db: Database) -> None:
    """Each test starts with no open deposit (earlier tests' are closed)."""
    with db.transaction() as session:
        session.execute(
            sa.update(Deposit)
            .where(
                Deposit.status.in_(
                    (states.SOURCE_SEEN, states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED)
                )
            )
            .values(status=states.FAILED, failure_reason="test_cleanup")
        )


def sandbox_deposit(pipeline: Pipeline, account: AccountRef, db: Database) -> str:
    parts = deposit_parts(db, pipeline.settling.registry, settings=SETTINGS)
    deposit = parts.sandbox.create(
        account.tenant_id,
        chain_id=8453,
        deposit_address=account.address(8453),
        asset="USDC",
        amount=Decimal("125.50"),
    )
    return deposit.id


class CountedRounds:
    """The loop's settlement rounds, counted."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.count = 0
        real = pipeline.settle_round

        def counted() -> int:
            self.count += 1
            return real()

        pipeline.settle_round = counted  # type: ignore[method-assign]


def running(pipeline: Pipeline) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=settle_loop, args=(pipeline, stop), daemon=True)
    thread.start()
    return stop, thread


def test_an_idle_loop_sleeps_and_a_commit_wakes_it_at_once(
    pipeline: Pipeline, account: AccountRef, db: Database
) -> None:
    rounds = CountedRounds(pipeline)
    # Given the settlement loop with nothing to do and a fallback poll of a minute
    stop, thread = running(pipeline)
    try:
        time.sleep(0.5)
        before = rounds.count
        # When it is left alone for a second
        time.sleep(1.0)
        idle_rounds = rounds.count - before
        # And then a sandbox deposit is committed (its source_seen event NOTIFYs)
        deposit_id = sandbox_deposit(pipeline, account, db)
        # Then the loop wakes, counts its blocks and credits it, long before the fallback
        wait_until(
            lambda: deposit_row(db, deposit_id).status == states.CREDITED,
            10,
            "the sandbox deposit credited",
        )
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    # And the idle second ran no round (the loop polled every 50 ms before)
    assert idle_rounds == 0, f"{idle_rounds} settlement rounds in an idle second"


def test_the_loop_sleeps_until_the_next_due_time(
    pipeline: Pipeline, account: AccountRef, db: Database
) -> None:
    # Given nothing open: the fallback
    assert pipeline.idle_wait(0.05) == LONG_IDLE_S
    # Given a confirmed deposit whose next attempt is 3 s away
    now = utcnow()
    with db.transaction() as session:
        session.execute(
            sa.insert(Deposit).values(
                **_deposit_values(
                    account,
                    status=states.SOURCE_CONFIRMED,
                    next_attempt_at=now + timedelta(seconds=3),
                )
            )
        )
    # Then the loop sleeps about 3 s, not the fallback
    assert 2.0 < pipeline.idle_wait(0.05) <= 3.0
    # Given one more, mid-call since a while: its recovery is due `stuck_payment_s` after
    stuck_s = SETTINGS.stuck_payment_s
    with db.transaction() as session:
        session.execute(
            sa.insert(Deposit).values(
                **_deposit_values(
                    account,
                    status=states.SOURCE_CONFIRMED,
                    settle_phase="paying",
                    updated_at=now - timedelta(seconds=stuck_s - 1.5),
                )
            )
        )
    assert 0.5 < pipeline.idle_wait(0.05) <= 1.5
    # Given a sandbox deposit waiting for its blocks: one simulated block (at least the
    # loop's idle pause)
    with db.transaction() as session:
        session.execute(
            sa.insert(Deposit).values(
                **_deposit_values(account, status=states.SOURCE_SEEN, sandbox=True)
            )
        )
    assert pipeline.idle_wait(0.05) == 0.05
    assert pipeline.idle_wait(0.001) == SETTINGS.sandbox_block_s
    # Given a deposit due now that a round could not take (another worker holds it): the
    # idle pause, never a spin
    with db.transaction() as session:
        session.execute(
            sa.insert(Deposit).values(
                **_deposit_values(account, status=states.SOURCE_CONFIRMED, next_attempt_at=None)
            )
        )
    assert pipeline.idle_wait(0.05) == 0.05


def _deposit_values(account: AccountRef, **overrides: object) -> dict[str, object]:
    """A deposit row of `account` on Base, with `overrides`."""
    now = utcnow()
    values: dict[str, object] = {
        "id": f"dep_IDLE{secrets.token_hex(11).upper()}",
        "tenant_id": account.tenant_id,
        "account_pk": account.pk,
        "account_id": account.id,
        "external_user_id": account.external_user_id,
        "chain_id": 8453,
        "deposit_address": account.address(8453),
        "asset": "USDC",
        "token_address": USDC_BASE,
        "decimals": 6,
        "amount_raw": "1000000",
        "source_tx_hash": "0x" + secrets.token_hex(32),
        "log_index": 0,
        "confirmations": 1,
        "required_confirmations": 20,
        "dest_chain_id": 8453,
        "dest_address": "0x" + "1" * 40,
        "dest_token_address": USDC_BASE,
        "sandbox": False,
        "failed_providers": [],
        "created_at": now,
        "updated_at": now,
    }
    values.update(overrides)
    return values
