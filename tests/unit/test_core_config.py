"""Core settings read from the environment."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from services.core.config import CoreConfig
from services.core.deposits.settings import BalanceMinimum, PipelineSettings
from services.notifier.config import NotifierConfig
from shared import embedded_postgres
from shared.settings import SettingsError


def test_the_interval_setting_must_be_positive() -> None:
    base = {"SETTLE_ENV": "dev"}
    assert CoreConfig.from_env(base).address_backfill_interval_s == 300.0
    config = CoreConfig.from_env({**base, "SETTLE_ADDRESS_BACKFILL_INTERVAL_S": "2.5"})
    assert config.address_backfill_interval_s == 2.5
    with pytest.raises(SettingsError, match="SETTLE_ADDRESS_BACKFILL_INTERVAL_S"):
        CoreConfig.from_env({**base, "SETTLE_ADDRESS_BACKFILL_INTERVAL_S": "0"})


def test_without_a_database_url_dev_names_the_embedded_server_of_the_data_dir(
    tmp_path: Path,
) -> None:
    # Given dev settings with no SETTLE_DATABASE_URL
    env = {"SETTLE_ENV": "dev", "SETTLE_DATA_DIR": str(tmp_path / "data")}

    # Then both services name the same embedded database, and reading settings started nothing
    core, notifier = CoreConfig.from_env(env), NotifierConfig.from_env(env)
    assert core.database_url == notifier.database_url == core.identity_database_url
    assert core.database_url == f"embedded-postgresql://{(tmp_path / 'data').resolve()}"
    assert embedded_postgres.is_embedded_url(core.database_url)
    assert not (tmp_path / "data").exists()


def test_production_requires_a_database_url() -> None:
    env = {"SETTLE_ENV": "production", "SETTLE_DEPOSIT_XPUB": "xpub-not-read-here"}
    with pytest.raises(SettingsError, match="SETTLE_DATABASE_URL"):
        CoreConfig.from_env(env)


def test_the_public_url_is_a_base_url() -> None:
    base = {"SETTLE_ENV": "dev"}
    assert CoreConfig.from_env(base).public_url is None
    config = CoreConfig.from_env({**base, "SETTLE_PUBLIC_URL": "https://settle.example.com/"})
    assert config.public_url == "https://settle.example.com"
    for bad in ("settle.example.com", "ftp://x", "https://x/#frag", "https://x/?a=1"):
        with pytest.raises(SettingsError):
            CoreConfig.from_env({**base, "SETTLE_PUBLIC_URL": bad})


def test_hot_wallet_floors_are_read_per_chain_and_asset_and_a_typo_is_refused() -> None:
    settings = PipelineSettings.from_env(
        {"SETTLE_HOT_WALLET_MIN_BALANCE": "8453:USDC=5000, 8453:ETH=0.05"}
    )
    assert settings.hot_wallet_minimums == (
        BalanceMinimum(8453, "USDC", Decimal(5000)),
        BalanceMinimum(8453, "ETH", Decimal("0.05")),
    )
    for bad in ("8453=USDC:5000", "8453:USDC=5000@10", "8453:USDC=lots"):
        with pytest.raises(SettingsError, match="SETTLE_HOT_WALLET_MIN_BALANCE"):
            PipelineSettings.from_env({"SETTLE_HOT_WALLET_MIN_BALANCE": bad})
