"""The sweep commands' own settings (the rest is core's: the database, the nodes, the hot
wallet)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eth_utils import is_address, is_checksum_address

from shared.settings import SettingsError, env_str, environ


@dataclass(frozen=True)
class SweepSettings:
    #: Where a plan sends deposits unless `--to` says otherwise (None: the hot wallet).
    treasury_address: str | None = None
    #: Hex private key of the wallet that pays deposit addresses' gas (None: the hot
    #: wallet's key, SETTLE_HOT_WALLET_KEY).
    gas_wallet_key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SweepSettings:
        env = environ() if env is None else env
        treasury = env_str(env, "SETTLE_TREASURY_ADDRESS")
        if treasury is not None and (
            not is_address(treasury)
            or (treasury != treasury.lower() and not is_checksum_address(treasury))
        ):
            raise SettingsError(f"SETTLE_TREASURY_ADDRESS: {treasury!r} is not an address")
        return cls(treasury_address=treasury, gas_wallet_key=env_str(env, "SETTLE_GAS_WALLET_KEY"))
