"""The fee oracle loop: keeps `chain_fees` fresh from each chain's node, or the file."""

from __future__ import annotations

import logging
import threading

from services.core.chains import Chain
from services.core.context import CoreContext
from services.core.fees import GasPriceSource, refresh_fees

log = logging.getLogger(__name__)

#: JSON-RPC timeout when reading a gas price.
RPC_TIMEOUT_S = 5.0


def gas_price_source(rpc_urls: dict[int, str]) -> GasPriceSource:
    """Reads `eth_gasPrice` from the chain's configured node; None without one."""
    from services.core.evm import Web3ChainReader

    readers: dict[int, Web3ChainReader] = {}

    def read(chain: Chain) -> int | None:
        url = rpc_urls.get(chain.chain_id)
        if url is None:
            return None
        if chain.chain_id not in readers:
            readers[chain.chain_id] = Web3ChainReader.from_url(url, timeout=RPC_TIMEOUT_S)
        return readers[chain.chain_id].gas_price_wei()

    return read


def run_fee_oracle(ctx: CoreContext, stop: threading.Event) -> None:
    """Refresh every `fee_refresh_s` until stopped. A failed round is retried next time."""
    source = gas_price_source(dict(ctx.config.rpc_urls))
    while not stop.is_set():
        try:
            fees = refresh_fees(ctx.db, ctx.registry, source)
            log.debug("fees refreshed: %s", fees)
        except Exception:
            log.exception("fee refresh failed; keeping the stored fees")
        stop.wait(ctx.config.fee_refresh_s)
