"""Prices with a guard: a stablecoin off its peg is never credited at 1 USD.

The watcher and settling on PostgreSQL over an in-memory chain; prices from the
configured source (the fixed table, or a JSON document served over HTTP on 127.0.0.1).
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import pytest

from services.core.deposits import states
from services.core.deposits.pricing import PriceSource, StaticPrices
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import Settlement, SimulatedPayer
from services.core.deposits.watcher import ChainWatcher
from services.core.evm import InMemoryChain
from shared.db import Database
from tests.conftest import TenantKeys
from tests.support.deposits import (
    TEST_USDC,
    AccountRef,
    DepositParts,
    deposit_parts,
    deposits_of,
    make_account,
    set_fee,
    small_registry,
    unique_chain_id,
)

pytestmark = pytest.mark.integration

USDC = 10**6
SENDER = "0x2222222222222222222222222222222222222222"


@dataclass
class World:
    db: Database
    chain_id: int
    chain: InMemoryChain
    account: AccountRef
    tenant: TenantKeys

    def parts(self, settings: PipelineSettings, prices: PriceSource | None = None) -> DepositParts:
        registry = small_registry(chain_id=self.chain_id, depth=3, min_deposit_usd=1.0)
        settlement = Settlement(registry, payers={self.chain_id: SimulatedPayer()})
        return deposit_parts(
            self.db, registry, settings=settings, settlement=settlement, prices=prices
        )

    def settle(self, parts: DepositParts, amount_raw: int) -> str:
        """A transfer seen, confirmed and settled; the deposit's id."""
        registry_chain = parts.registry.get(self.chain_id)
        assert registry_chain is not None
        watcher = ChainWatcher(
            parts.detection, registry_chain, self.chain, lag_blocks=0, start_block=1
        )
        before = {d.id for d in deposits_of(self.db, self.account)}
        self.chain.transfer(TEST_USDC, SENDER, self.account.address(self.chain_id), amount_raw)
        self.chain.mine(4)
        watcher.tick()
        watcher.tick()
        (deposit,) = [d for d in deposits_of(self.db, self.account) if d.id not in before]
        assert deposit.status == states.SOURCE_CONFIRMED
        parts.settling.settle(deposit.id)
        return deposit.id

    def deposit(self, deposit_id: str) -> object:
        return next(d for d in deposits_of(self.db, self.account) if d.id == deposit_id)


@pytest.fixture
def world(pg_db: Database, tenant: TenantKeys) -> World:
    chain_id = unique_chain_id()
    registry = small_registry(chain_id=chain_id, depth=3, min_deposit_usd=1.0)
    account = make_account(pg_db, tenant.tenant_id, registry, dest_chain_id=chain_id)
    set_fee(pg_db, chain_id, "0.10")
    chain = InMemoryChain(chain_id)
    chain.mine(2)
    return World(pg_db, chain_id, chain, account, tenant)


def test_a_stablecoin_off_its_peg_goes_to_review_not_credited_at_a_dollar(world: World) -> None:
    # Given the configured prices say USDC trades at 0.95 (off its peg by 5 %, band 2 %)
    settings = PipelineSettings(prices_usd={"USDC": Decimal("0.95")})
    deposit_id = world.settle(world.parts(settings), 100 * USDC)
    deposit = world.deposit(deposit_id)
    # Then a person decides: it is not credited
    assert deposit.status == states.MANUAL_REVIEW_REQUIRED  # type: ignore[attr-defined]
    assert deposit.review_reason.startswith("off_peg: USDC at 0.95")  # type: ignore[attr-defined]
    assert deposit.credit_tx_hash is None  # type: ignore[attr-defined]


def test_a_stablecoin_within_its_band_is_credited_at_its_price(world: World) -> None:
    settings = PipelineSettings(prices_usd={"USDC": Decimal("0.995")})
    deposit_id = world.settle(world.parts(settings), 100 * USDC)
    deposit = world.deposit(deposit_id)
    assert deposit.status == states.CREDITED  # type: ignore[attr-defined]
    assert deposit.amount_usd == Decimal("99.5")  # type: ignore[attr-defined]


class _PriceServer:
    """A JSON price document on 127.0.0.1 (what SETTLE_PRICE_SOURCE points at)."""

    def __init__(self, prices: dict[str, str]) -> None:
        self.prices = prices
        self.up = True
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if not owner.up:
                    self.send_error(503)
                    return
                body = json.dumps({"prices": owner.prices}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/prices.json"


@pytest.fixture
def price_server() -> Iterator[_PriceServer]:
    server = _PriceServer({"USDC": "0.90"})
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_prices_from_a_configured_source_guard_the_peg(
    world: World, price_server: _PriceServer
) -> None:
    from services.core.deposits.pricing import PriceFeed, build_prices

    # Given the price source is a JSON document saying USDC is at 0.90
    settings = PipelineSettings.from_env(
        {"SETTLE_PRICE_SOURCE": price_server.url, "SETTLE_PRICE_MAX_AGE_S": "300"}
    )
    prices = build_prices(settings)
    assert isinstance(prices, PriceFeed)
    assert prices.refresh() is True
    deposit_id = world.settle(world.parts(settings, prices), 50 * USDC)
    deposit = world.deposit(deposit_id)
    # Then the deposit is valued at that price and held for review
    assert deposit.amount_usd == Decimal("45")  # type: ignore[attr-defined]
    assert deposit.status == states.MANUAL_REVIEW_REQUIRED  # type: ignore[attr-defined]
    assert deposit.review_reason.startswith("off_peg: USDC at 0.9")  # type: ignore[attr-defined]
    # And a source that stops answering never leaves a stale price in use for long
    price_server.up = False
    assert prices.refresh() is False
    assert prices.usd_price(world.chain_id, "USDC") == Decimal("0.90")  # still fresh
    stale = PriceFeed(price_server.url, max_age_s=0.0)
    assert stale.refresh() is False and stale.usd_price(world.chain_id, "USDC") is None


def test_the_fixed_table_is_the_default_source() -> None:
    from services.core.deposits.pricing import build_prices

    prices = build_prices(PipelineSettings.from_env({}))
    assert isinstance(prices, StaticPrices)
    assert prices.usd_price(1, "DAI") == Decimal(1)


def test_a_deposit_seen_during_a_price_outage_is_valued_when_it_settles(
    world: World, price_server: _PriceServer
) -> None:
    from services.core.deposits.pricing import build_prices

    settings = PipelineSettings.from_env({"SETTLE_PRICE_SOURCE": price_server.url})
    prices = build_prices(settings)
    parts = world.parts(settings, prices)
    registry_chain = parts.registry.get(world.chain_id)
    assert registry_chain is not None
    watcher = ChainWatcher(
        parts.detection, registry_chain, world.chain, lag_blocks=0, start_block=1
    )
    # Given the source had not answered yet when the transfer was seen and confirmed
    world.chain.transfer(TEST_USDC, SENDER, world.account.address(world.chain_id), 20 * USDC)
    world.chain.mine(4)
    watcher.tick()
    watcher.tick()
    (deposit,) = deposits_of(world.db, world.account)
    assert deposit.status == states.SOURCE_CONFIRMED and deposit.amount_usd is None
    # When it answers (USDC at 0.999) before the deposit settles
    price_server.prices = {"USDC": "0.999"}
    assert prices.refresh() is True  # type: ignore[attr-defined]
    parts.settling.settle(deposit.id)
    # Then the deposit is valued now and credited, not left in review for want of a price
    (deposit,) = deposits_of(world.db, world.account)
    assert deposit.status == states.CREDITED
    assert deposit.amount_usd == Decimal("19.98") and deposit.net_usd == Decimal("19.88")
