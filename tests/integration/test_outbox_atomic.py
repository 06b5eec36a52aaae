"""Every use case that emits an event writes it in the transaction of its change: when the
use case fails after the event was written, the event rolls back with the change.

Each case runs a use case with the function that writes its event wrapped: the event is
written, then the use case fails right after (a later step that raises). Nothing of it
may remain: no event, no change. Account creation is not here: its account, addresses
and event are one INSERT statement (`accounts._write_statement`), there is no later step.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from services.core import accounts, api_keys, outbox
from services.core.deposits import transitions
from services.core.deposits.detection import Sighting
from services.core.deposits.settlement import Settlement, SimulatedPayer
from services.core.destinations import Destination
from services.core.evm import TransferLog
from services.core.models import OutboxEvent
from shared.db import Database
from shared.identity.models import ApiKey
from shared.timefmt import utcnow
from tests.conftest import TenantKeys
from tests.integration.conftest import WALLET_2
from tests.support.deposits import (
    TEST_USDC,
    AccountRef,
    DepositParts,
    FakeClock,
    deposit_parts,
    deposits_of,
    make_account,
    small_registry,
    unique_chain_id,
)

pytestmark = pytest.mark.integration


class Boom(Exception):
    """The use case's failure after its event was written."""


@dataclass
class World:
    db: Database
    parts: DepositParts
    chain_id: int
    account: AccountRef
    tenant: TenantKeys
    clock: FakeClock

    def sandbox_deposit(self) -> str:
        deposit = self.parts.sandbox.create(
            self.tenant.tenant_id,
            chain_id=self.chain_id,
            deposit_address=self.account.address(self.chain_id),
            asset="USDC",
            amount=Decimal("25"),
        )
        return deposit.id


@pytest.fixture
def world(pg_db: Database, tenant: TenantKeys) -> Iterator[World]:
    chain_id = unique_chain_id()
    registry = small_registry(chain_id=chain_id, depth=3, min_deposit_usd=1.0)
    settlement = Settlement(registry, payers={chain_id: SimulatedPayer()})
    clock = FakeClock(utcnow())
    parts = deposit_parts(pg_db, registry, settlement=settlement, clock=clock)
    account = make_account(pg_db, tenant.tenant_id, registry, dest_chain_id=chain_id)
    yield World(pg_db, parts, chain_id, account, tenant, clock)


def _transfer(world: World, block: int) -> TransferLog:
    return TransferLog(
        chain_id=world.chain_id,
        block_number=block,
        block_hash="0x" + secrets.token_hex(32),
        tx_hash="0x" + secrets.token_hex(32),
        log_index=0,
        token_address=TEST_USDC.lower(),
        from_address="0x2222222222222222222222222222222222222222",
        to_address=world.account.address(world.chain_id).lower(),
        amount_raw=30 * 10**6,
    )


# -- each use case: set up (committed), then `act(fail)` runs it and `state()` reads what it
# changes. A use case run in the caller's session fails at the end of that transaction, after
# it returned (`fail`): a commit of its own on the way would leave its event behind. One that
# owns its transaction fails right after the call that wrote its event.


def _fail_here(fail: bool) -> None:
    if fail:
        raise Boom("the use case's transaction fails after it wrote its event")


def _revoke_key(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    key_id = world.tenant.api_key_id

    def act(fail: bool) -> None:
        with world.db.transaction() as session:
            api_keys.revoke_key(session, key_id, tenant_id=world.tenant.tenant_id)
            _fail_here(fail)

    def state() -> Any:
        with world.db.reader() as session:
            return session.get(ApiKey, key_id).revoked_at  # type: ignore[union-attr]

    return act, state


def _repoint_account(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    registry = world.parts.registry

    def act(fail: bool) -> None:
        with world.db.transaction() as session:
            accounts.update_destination(
                session,
                registry,
                world.tenant.tenant_id,
                world.account.external_user_id,
                Destination(world.chain_id, WALLET_2, TEST_USDC),
                api_key_id=world.tenant.api_key_id,
            )
            _fail_here(fail)

    def state() -> Any:
        with world.db.reader() as session:
            found = accounts.find_account(
                session, world.tenant.tenant_id, world.account.external_user_id
            )
            assert found is not None
            return found.dest_address

    return act, state


def _deposit_state(world: World) -> Callable[[], Any]:
    def state() -> Any:
        return sorted((d.id, d.status) for d in deposits_of(world.db, world.account))

    return state


def _record_transfer(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    def act(fail: bool) -> None:
        with world.db.transaction() as session:
            world.parts.detection.record_transfer(
                session, world.chain_id, _transfer(world, 10), confirmations=1
            )
            _fail_here(fail)

    return act, _deposit_state(world)


def _confirm_at_finality(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    transfer = _transfer(world, 20)
    with world.db.transaction() as session:
        world.parts.detection.record_transfer(session, world.chain_id, transfer, confirmations=1)
    chain = world.parts.registry.get(world.chain_id)
    assert chain is not None

    def act(fail: bool) -> None:
        with world.db.transaction() as session:
            world.parts.detection.confirm_final(session, chain, [Sighting(transfer, 0)], 30)
            _fail_here(fail)

    return act, _deposit_state(world)


def _sandbox_create(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    return lambda _: world.sandbox_deposit(), _deposit_state(world)


def _confirm(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    deposit_id = world.sandbox_deposit()
    return lambda _: world.parts.detection.confirm(deposit_id, 3), _deposit_state(world)


def _vanish(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    deposit_id = world.sandbox_deposit()
    (deposit,) = [d for d in deposits_of(world.db, world.account) if d.id == deposit_id]
    block_hash = deposit.block_hash
    return lambda _: world.parts.detection.vanish(deposit_id, block_hash), _deposit_state(world)


def _settle(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    deposit_id = world.sandbox_deposit()
    assert world.parts.detection.confirm(deposit_id, 3) is not None
    return lambda _: world.parts.settling.settle(deposit_id), _deposit_state(world)


def _ops_fail(world: World) -> tuple[Callable[[bool], Any], Callable[[], Any]]:
    deposit_id = world.sandbox_deposit()
    world.clock.advance(hours=1)  # ops may end a deposit the pipeline left for 30 minutes
    act = lambda _: world.parts.ops.fail(deposit_id, "refunded to sender", by="ops")  # noqa: E731
    return act, _deposit_state(world)


#: (use case, how it is set up, the module and name of the function that writes its event,
#: whether it runs in the caller's session and so fails at that transaction's end)
CASES: list[tuple[str, Callable[[World], Any], Any, str, bool]] = [
    ("revoke an API key", _revoke_key, api_keys, "emit", True),
    ("re-point an account", _repoint_account, outbox, "emit", True),
    ("record a transfer (source_seen)", _record_transfer, outbox, "emit_many", True),
    ("confirm at finality (many at once)", _confirm_at_finality, outbox, "emit_many", True),
    ("create a sandbox deposit", _sandbox_create, transitions, "emit", False),
    ("confirm a deposit", _confirm, transitions, "emit", False),
    ("fail a vanished deposit (reorged)", _vanish, transitions, "emit", False),
    ("settle a deposit (credited)", _settle, transitions, "emit", False),
    ("ops: fail a deposit by hand", _ops_fail, transitions, "emit", False),
]


def _events(db: Database, tenant_id: str) -> list[tuple[str, str]]:
    with db.reader() as session:
        rows = session.execute(
            sa.select(OutboxEvent.event_id, OutboxEvent.event_type).where(
                OutboxEvent.tenant_id == tenant_id
            )
        )
        return sorted((str(a), str(b)) for a, b in rows)


@pytest.mark.parametrize(
    ("name", "setup", "module", "attr", "in_callers_session"), CASES, ids=[c[0] for c in CASES]
)
def test_a_use_case_failing_after_its_event_rolls_the_event_back(
    name: str,
    setup: Callable[[World], Any],
    module: Any,
    attr: str,
    in_callers_session: bool,
    world: World,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the use case ready to run, and what the database holds before it
    act, state = setup(world)
    before = (_events(world.db, world.tenant.tenant_id), state())
    # When it fails after writing its event
    written: list[object] = []
    real = getattr(module, attr)

    def write_then_fail(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if result not in (False, 0):  # an event was written (False/0: none, already there)
            written.append(result)
            if not in_callers_session:
                raise Boom(f"{name} fails after writing its event")
        return result

    monkeypatch.setattr(module, attr, write_then_fail)
    with pytest.raises(Boom):
        act(True)
    # Then the event was written and rolled back with the change: nothing remains of either
    assert written, f"{name}: no event was written (the case no longer emits there)"
    monkeypatch.undo()
    assert (_events(world.db, world.tenant.tenant_id), state()) == before
    # And the same use case, not failing, does write its event and its change
    if name != "revoke an API key":  # (a key revoked ends the tenant fixture's key)
        act(False)
        assert (_events(world.db, world.tenant.tenant_id), state()) != before
