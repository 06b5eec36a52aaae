"""Settlement destinations: where an account's deposits settle (chain, wallet, token).

A destination is checked against the chain registry wherever one is supplied (the
policy, account creation, the PATCH): the chain must be active, the token one of
that chain's deposit assets, and the wallet not the zero address nor the token
contract itself (both would burn the settlement).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.core.chains import Chain, ChainRegistry
from shared.api import field_error

ZERO_ADDRESS = "0x" + "0" * 40


@dataclass(frozen=True)
class Destination:
    """A settlement destination; addresses are EIP-55 checksummed."""

    chain_id: int
    address: str
    token_address: str

    def document(self) -> dict[str, Any]:
        """The wire form `{chainId, address, tokenAddress}`."""
        return {
            "chainId": self.chain_id,
            "address": self.address,
            "tokenAddress": self.token_address,
        }


def validate_destination(
    registry: ChainRegistry, destination: Destination, *, field: str = "destination"
) -> Chain:
    """The destination's chain, or the 400 that says what is wrong with it.

    `field` is the destination's path in the request, so errors name the field.
    """
    chain = registry.require_active(destination.chain_id)
    if chain.asset_by_token(destination.token_address) is None:
        accepted = ", ".join(f"{a.symbol} {a.token_address}" for a in chain.assets)
        raise field_error(
            f"{field}.tokenAddress",
            f"{destination.token_address} is not a token Settle settles on chain "
            f"{chain.chain_id} ({chain.name}); accepted: {accepted}",
        )
    if destination.address.lower() == ZERO_ADDRESS:
        raise field_error(f"{field}.address", "the zero address cannot receive a settlement")
    if destination.address.lower() == destination.token_address.lower():
        raise field_error(
            f"{field}.address", "the token contract itself cannot receive a settlement"
        )
    return chain
