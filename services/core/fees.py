"""The live flat settlement fee: gas units x gas price x native token USD price.

The worker's fee oracle refreshes `chain_fees` from each chain's node (gas price)
when one is configured, from the chains file otherwise. Readers never compute a
fee: they read the stored value.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from decimal import ROUND_UP, Decimal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.chains import Chain, ChainRegistry
from services.core.models import ChainFee
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

WEI_PER_GWEI = Decimal(10**9)
WEI_PER_ETHER = Decimal(10**18)
#: USD figures are kept to the micro-dollar; fees round up so Settle never undercharges gas.
USD_QUANTUM = Decimal("0.000001")

#: Reads a chain's gas price in wei from its node, or None when it has no node.
GasPriceSource = Callable[[Chain], int | None]


def settlement_fee_usd(
    gas_units: int, gas_price_wei: int | Decimal, native_usd: Decimal
) -> Decimal:
    """Fee of one settlement transfer in USD, rounded up to the micro-dollar."""
    fee = Decimal(gas_units) * Decimal(gas_price_wei) / WEI_PER_ETHER * native_usd
    return fee.quantize(USD_QUANTUM, rounding=ROUND_UP)


def configured_gas_price(chain: Chain) -> int:
    return int(chain.gas_price_gwei * WEI_PER_GWEI)


def refresh_fees(
    db: Database, registry: ChainRegistry, gas_price: GasPriceSource | None = None
) -> dict[int, Decimal]:
    """Recompute and store every chain's fee; a node that fails falls back to the file."""
    fees: dict[int, Decimal] = {}
    with db.transaction() as session:
        for chain in registry.chains:
            source, price = "configured", configured_gas_price(chain)
            if chain.is_active and gas_price is not None:
                try:
                    from_node = gas_price(chain)
                except Exception as exc:  # a node outage must not stop the oracle
                    log.warning("gas price of chain %s unavailable: %s", chain.chain_id, exc)
                    from_node = None
                if from_node is not None:
                    source, price = "rpc", from_node
            fee = (
                settlement_fee_usd(chain.settlement_gas_units, price, chain.native_usd)
                if chain.is_active
                else Decimal(0)
            )
            row = session.get(ChainFee, chain.chain_id) or ChainFee(chain_id=chain.chain_id)
            row.settlement_fee_usd = fee
            row.gas_price_wei = Decimal(price)
            row.native_usd = chain.native_usd
            row.gas_units = chain.settlement_gas_units
            row.source = source
            row.updated_at = utcnow()
            session.add(row)
            fees[chain.chain_id] = fee
    return fees


def stored_fees(session: Session) -> dict[int, Decimal]:
    return {
        row.chain_id: row.settlement_fee_usd
        for row in session.execute(sa.select(ChainFee)).scalars()
    }


def fee_for(session: Session, chain: Chain) -> Decimal:
    """The stored live fee of a chain (0 for a declared chain)."""
    if not chain.is_active:
        return Decimal(0)
    row = session.get(ChainFee, chain.chain_id)
    # Before the oracle's first run: the configured value.
    return fee_for_missing(chain) if row is None else row.settlement_fee_usd


class FeeCache:
    """Stored fees, re-read at most every `ttl_s` seconds (GET /v1/chains is hot)."""

    def __init__(self, db: Database, registry: ChainRegistry, ttl_s: float = 1.0) -> None:
        self._db = db
        self._registry = registry
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._fees: dict[int, Decimal] = {}
        self._read_at = float("-inf")

    def get(self) -> dict[int, Decimal]:
        now = time.monotonic()
        if now - self._read_at < self._ttl_s:
            return self._fees
        with self._lock:
            if now - self._read_at >= self._ttl_s:
                with self._db.reader() as session:
                    fees = stored_fees(session)
                for chain in self._registry.chains:
                    if chain.chain_id not in fees:
                        fees[chain.chain_id] = fee_for_missing(chain)
                self._fees, self._read_at = fees, time.monotonic()
        return self._fees


def fee_for_missing(chain: Chain) -> Decimal:
    if not chain.is_active:
        return Decimal(0)
    return settlement_fee_usd(
        chain.settlement_gas_units, configured_gas_price(chain), chain.native_usd
    )
