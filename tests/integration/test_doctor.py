"""`settle doctor` against the real PostgreSQL, RabbitMQ and an anvil node: each check
passes on a sound deployment and fails, named, when its condition breaks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from services import cli, doctor
from services.doctor import FAIL, OK, SKIP, Result
from services.notifier import queue_admin
from services.notifier.consumer import declare_topology
from shared.bus import BusNames
from tests.support import keys
from tests.support.anvil import AnvilNode, require_anvil
from tests.support.deposits import chains_toml
from tests.support.pipeline import delete_bus, isolated_database, unique_prefix
from tests.support.processes import free_port
from tests.support.services import AMQP_URL, create_database, drop_database, require_service

pytestmark = pytest.mark.integration

STRONG_KEY = "Jq3v8XwR2mZt9LpA7cNd5YhKs1BfGe6UoTiVrPxQzWy"


@pytest.fixture(scope="module")
def migrated() -> Iterator[str]:
    with isolated_database("doctor") as url:
        yield url


@pytest.fixture
def bus() -> Iterator[BusNames]:
    """A broker with the notifier's topology declared under a prefix of the test's own."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    names = BusNames(unique_prefix())
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        declare_topology(connection.channel(), names)
        queue_admin.declare_all(connection.channel(), names.prefix)
    finally:
        connection.close()
    yield names
    delete_bus(names)
    cleanup = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = cleanup.channel()
    for queue in (names.notifier_queue, names.notifier_dead_queue):
        channel.queue_delete(queue)
    cleanup.close()


def base_env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(tmp_path),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
        **extra,
    }


def by_check(results: list[Result]) -> dict[str, Result]:
    return {result.check: result for result in results}


def test_a_sound_deployment_passes_every_check(
    migrated: str, bus: BusNames, tmp_path: Path
) -> None:
    env = base_env(
        migrated,
        tmp_path,
        SETTLE_AMQP_URL=AMQP_URL,
        SETTLE_AMQP_PREFIX=bus.prefix,
        SETTLE_CORE_AMQP_USER="settle-core-test",
        SETTLE_SECRET_KEY=STRONG_KEY,
    )
    results = doctor.run_checks(env)
    assert [r for r in results if r.status == FAIL] == []
    found = by_check(results)
    for name in ("settings", "database", "broker", "lease", "secret key", "clock"):
        assert found[name].status == OK, found[name]
    # The notifier side's queues were looked at (guest is not the trusted core user here)
    assert "notifier's quorum queues present" in found["broker"].detail


def test_an_unreachable_or_unmigrated_database_fails(migrated: str, tmp_path: Path) -> None:
    closed = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    found = by_check(doctor.run_checks(base_env(closed, tmp_path)))
    assert found["database"].status == FAIL and "does not answer" in found["database"].detail
    assert found["clock"].status == FAIL
    # A database that exists but was never migrated names the components behind
    name = f"settle_test_doctor_empty_{free_port()}"
    empty = create_database(name)
    try:
        found = by_check(doctor.run_checks(base_env(empty, tmp_path)))
    finally:
        drop_database(name)
    assert found["database"].status == FAIL
    assert "identity, core, notifier behind" in found["database"].detail


def test_the_broker_check_fails_unreachable_without_queues_or_as_guest(
    migrated: str, bus: BusNames, tmp_path: Path
) -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    # Nothing listening
    env = base_env(
        migrated, tmp_path, SETTLE_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    )
    assert by_check(doctor.run_checks(env))["broker"].status == FAIL
    # The notifier's user, but its queues were never declared (another prefix)
    env = base_env(
        migrated,
        tmp_path,
        SETTLE_AMQP_URL=AMQP_URL,
        SETTLE_AMQP_PREFIX=unique_prefix(),
        SETTLE_CORE_AMQP_USER="settle-core-test",
    )
    broker = by_check(doctor.run_checks(env))["broker"]
    assert broker.status == FAIL and "missing exchange" in broker.detail
    assert "notifier.events" in broker.detail
    # guest in production
    settings = doctor.Settings(
        core=_core(migrated, tmp_path, amqp_url=AMQP_URL, env="production"),
        notifier=_notifier(migrated, tmp_path, amqp_url=AMQP_URL),
        env={"SETTLE_AMQP_PREFIX": bus.prefix},
    )
    guest = doctor.check_broker(settings)
    assert guest.status == FAIL and "guest in production" in guest.detail
    # No broker URL at all: nothing to check here (core's API)
    settings = doctor.Settings(
        core=_core(migrated, tmp_path, amqp_url=None),
        notifier=_notifier(migrated, tmp_path, amqp_url=None),
        env={},
    )
    assert doctor.check_broker(settings).status == SKIP


def _core(url: str, tmp_path: Path, **overrides: object) -> object:
    from dataclasses import replace

    from services.core.config import CoreConfig

    return replace(CoreConfig.from_env(base_env(url, tmp_path)), **overrides)


def _notifier(url: str, tmp_path: Path, **overrides: object) -> object:
    from dataclasses import replace

    from services.notifier.config import NotifierConfig

    return replace(NotifierConfig.from_env(base_env(url, tmp_path)), **overrides)


def test_a_lease_no_longer_than_the_attempt_deadline_fails(migrated: str, tmp_path: Path) -> None:
    settings = doctor.Settings(
        core=_core(migrated, tmp_path),
        notifier=_notifier(migrated, tmp_path, webhook_timeout_s=10.0, lease_margin_s=0.0),
        env={},
    )
    lease = doctor.check_lease(settings)
    assert lease.status == FAIL and "lease 10 s, attempt deadline 10 s" in lease.detail
    settings = doctor.Settings(settings.core, _notifier(migrated, tmp_path), {})
    assert doctor.check_lease(settings).status == OK


@pytest.mark.parametrize(
    ("key", "mode", "status"),
    [
        (STRONG_KEY, "production", OK),
        ("short-key", "production", FAIL),
        ("settle-dev-secret-key-not-for-production", "production", FAIL),
        ("a" * 64, "production", FAIL),
        ("", "production", FAIL),
        ("", "dev", OK),
    ],
)
def test_the_secret_key_is_strong_in_production(
    migrated: str, tmp_path: Path, key: str, mode: str, status: str
) -> None:
    settings = doctor.Settings(
        core=_core(migrated, tmp_path, env=mode),
        notifier=_notifier(migrated, tmp_path),
        env={"SETTLE_SECRET_KEY": key} if key else {},
    )
    assert doctor.check_secret_key(settings).status == status


def test_each_node_must_answer_with_its_chains_id_and_the_hot_wallet_its_floor(
    migrated: str, tmp_path: Path
) -> None:
    require_anvil()
    with AnvilNode(chain_id=31337) as node:
        token = node.deploy_token("USDC", 6)
        hot = node.accounts[2]
        node.mint(token, hot.address, 100 * 10**6)
        chains = tmp_path / "chains.toml"
        chains.write_text(chains_toml(chain_id=31337, usdc=token, depth=1), encoding="utf-8")
        common = {"SETTLE_CHAINS_FILE": str(chains), "SETTLE_HOT_WALLET_KEY": hot.key.hex()}
        # Given the node configured for its own chain, a floor it meets
        env = base_env(
            migrated,
            tmp_path,
            **common,
            SETTLE_RPC_URL_31337=node.url,
            SETTLE_HOT_WALLET_MIN_BALANCE="31337:USDC=50",
        )
        found = by_check(doctor.run_checks(env))
        assert found["chain 31337"].status == OK
        assert found["hot wallet 31337"].status == OK
        assert "100 USDC" in found["hot wallet 31337"].detail
        assert found["chain 8453"].status == SKIP  # active, no node
        # When the floor is over the balance, the hot wallet check fails naming the asset
        env["SETTLE_HOT_WALLET_MIN_BALANCE"] = "31337:USDC=500"
        wallet = by_check(doctor.run_checks(env))["hot wallet 31337"]
        assert wallet.status == FAIL and "USDC 100 < 500" in wallet.detail
        # When a node of another chain is configured for Base, that chain fails
        env = base_env(migrated, tmp_path, **common, SETTLE_RPC_URL_8453=node.url)
        base = by_check(doctor.run_checks(env))["chain 8453"]
        assert base.status == FAIL and "is chain 31337, not 8453" in base.detail
        # And a node that does not answer fails, its URL's path (an API key) not shown
        env = base_env(
            migrated, tmp_path, SETTLE_RPC_URL_8453=f"http://127.0.0.1:{free_port()}/key123"
        )
        down = by_check(doctor.run_checks(env))["chain 8453"]
        assert down.status == FAIL and "does not answer" in down.detail
        assert "key123" not in down.detail


def test_a_clock_off_from_the_databases_fails(migrated: str, tmp_path: Path) -> None:
    import time

    settings = doctor.Settings(_core(migrated, tmp_path), _notifier(migrated, tmp_path), {})
    assert doctor.check_clock(settings).status == OK
    ahead = doctor.check_clock(settings, clock=lambda: time.time() + 30)
    assert ahead.status == FAIL and ahead.detail.startswith(("-29.", "-30."))


def test_the_command_prints_a_line_per_check_and_exits_1_naming_failures(
    migrated: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in base_env(migrated, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SETTLE_RPC_URL_8453", f"http://127.0.0.1:{free_port()}/")
    assert cli.main(["doctor"]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["ok", "settings"]
    assert any(line.startswith("FAIL  chain 8453") for line in lines)
    assert err.strip() == "settle doctor: 1 failed: chain 8453"
    assert cli.main(["doctor", "--json"]) == 1
    results = json.loads(capsys.readouterr().out)
    assert {"check": "database", "status": "ok"}.items() <= results[1].items()
    monkeypatch.delenv("SETTLE_RPC_URL_8453")
    assert cli.main(["doctor"]) == 0
