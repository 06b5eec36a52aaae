"""Soak: the production processes under load and faults, then `settle reconcile` finds nothing.

`settle core worker` (outbox relay + deposit pipeline), `settle notifier consume` and two
`settle notifier worker` processes run on the real PostgreSQL and RabbitMQ (names unique
to the test). Core's API runs in-process against the same database. Several sandbox
tenants open accounts, simulate deposits with every outcome and change destinations
while some receivers fail, hang or drop connections and then recover, a worker and the
consumer are SIGKILLed, and RabbitMQ is restarted once. Once everything is quiet, the
reconcile (in-process and as the CLI) must be clean and every event must have reached
every endpoint of its tenant, byte for byte as stored. Bounded to a few minutes.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from services.core.app import create_app as create_core_app
from services.core.context import CoreContext
from services.core.deposits.models import Deposit
from services.core.deposits.settings import PipelineSettings
from services.core.models import OutboxEvent
from services.notifier.app import create_app as create_notifier_app
from services.notifier.context import NotifierContext
from services.notifier.models import SUCCEEDED, Attempt, Delivery, StoredEvent
from services.reconcile import reconcile
from shared import events, signing
from shared.bus import BusNames
from shared.db import Database
from shared.identity import service as identity
from shared.timefmt import iso_ms, parse_iso, utcnow
from tests.conftest import PASSWORD, TenantKeys, core_config, make_tenant
from tests.support import keys
from tests.support.hostile import HostileClients, sign_in
from tests.support.pipeline import delete_bus, isolated_database, notifier_config, unique_prefix
from tests.support.processes import (
    ROOT,
    Api,
    SettleProcess,
    SettleProcesses,
    settle_argv,
    start_api,
)
from tests.support.receiver import Answer, Hit, Receiver
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.soak

SECRET_KEY = "soak-secret-key"
WORKER_THREADS = 4
CONSUMER_READY = "notifier consumer ready"
WORKER_READY = "notifier worker ready"
RELAY_READY = "outbox relay started"
#: Fast retries: a receiver that recovers within ~10 s still gets every event.
RETRY_SCHEDULE = "0.2s,0.5s,1s,2s,3s,5s"
SANDBOX_BLOCK_S = 0.05
#: Final deposit statuses: nothing more will happen to them.
FINAL = ("credited", "failed", "manual_review_required")
USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
WALLETS = (
    "0x1111111111111111111111111111111111111111",
    "0x3333333333333333333333333333333333333333",
)
#: Every event type a deposit or an account of these tenants emits.
SUBSCRIBED = [
    events.ACCOUNT_CREATED,
    events.ACCOUNT_DESTINATION_UPDATED,
    events.DEPOSIT_SOURCE_SEEN,
    events.DEPOSIT_SOURCE_CONFIRMED,
    events.DEPOSIT_CREDIT_SUBMITTED,
    events.DEPOSIT_CREDITED,
    events.DEPOSIT_FAILED,
    events.DEPOSIT_MANUAL_REVIEW_REQUIRED,
]
TENANTS = 5
ROUNDS = 10
ROUND_S = 2.5
DEPOSITS_PER_ROUND = 3
QUIET_TIMEOUT_S = 120.0
#: How long a receiver misbehaves: well inside the ~12 s the retry schedule spans.
FAULT_WINDOW_S = 5.0
#: Bounds of the RabbitMQ restart's commands.
RABBIT_CMD_TIMEOUT_S = 60.0
RABBIT_DOWN_S = 3.0


@dataclass
class TenantRun:
    """One tenant of the soak: its keys, endpoints (path -> id) and accounts."""

    keys: TenantKeys
    paths: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    accounts: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Tally:
    """What the driver did, for the printout and docs/RELIABILITY.md."""

    accounts: int = 0
    deposits: Counter[str] = field(default_factory=Counter)
    destination_changes: int = 0
    faults: Counter[str] = field(default_factory=Counter)


@pytest.fixture(scope="module")
def soak_url() -> Iterator[str]:
    """A database of the soak's own: the processes relay and sweep every row they see."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    if shutil.which("rabbitmqctl") is None:
        message = "rabbitmqctl is not on PATH (the soak restarts RabbitMQ with it)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with isolated_database("soak") as url:
        yield url


def _env(url: str, names: BusNames, data_dir: Path) -> dict[str, str]:
    return {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(data_dir),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
        "SETTLE_AMQP_URL": AMQP_URL,
        "SETTLE_AMQP_PREFIX": names.prefix,
        "SETTLE_SECRET_KEY": SECRET_KEY,
        "SETTLE_RATE_LIMIT_PER_KEY": "0",
        "SETTLE_RATE_LIMIT_PER_IP": "0",
        "SETTLE_SANDBOX_BLOCK_S": str(SANDBOX_BLOCK_S),
        "SETTLE_SIMULATED_BRIDGE_S": "0.3",
        "SETTLE_PIPELINE_POLL_S": "0.2",
        "SETTLE_WEBHOOK_ALLOW_PRIVATE": "true",
        "SETTLE_WEBHOOK_RETRY_SCHEDULE": RETRY_SCHEDULE,
        "SETTLE_WEBHOOK_TIMEOUT_S": "1",
        "SETTLE_WEBHOOK_ENDPOINT_CONCURRENCY": str(WORKER_THREADS),
        "SETTLE_WEBHOOK_SWEEP_INTERVAL_S": "0.5",
        "SETTLE_WEBHOOK_SWEEP_GRACE_S": "1",
        "SETTLE_WEBHOOK_LEASE_MARGIN_S": "0.5",
    }


def _ok(response: Any) -> dict[str, Any]:
    assert response.status_code in (200, 201), (response.status_code, response.get_json())
    body: dict[str, Any] = response.get_json()
    return body


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(
        ["rabbitmqctl", *args], check=True, capture_output=True, timeout=RABBIT_CMD_TIMEOUT_S
    )


def restart_rabbitmq() -> None:
    """Stop and start the RabbitMQ application (not the node); always started again."""
    try:
        _rabbitmqctl("stop_app")
        time.sleep(RABBIT_DOWN_S)
    finally:
        _rabbitmqctl("start_app")
        _rabbitmqctl("await_startup")


class Background:
    """A call in a thread of its own, so the driver keeps committing meanwhile."""

    def __init__(self, target: Callable[[], None]) -> None:
        self.error: BaseException | None = None
        self._target = target
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._target()
        except BaseException as err:  # reported by join()
            self.error = err

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout}s"
        if self.error is not None:
            raise self.error


def wait_for(check: Callable[[], list[str]], timeout: float, what: str) -> None:
    """Until `check` reports nothing left (an empty list); else fail naming what is left."""
    deadline = time.monotonic() + timeout
    left = check()
    while left:
        if time.monotonic() > deadline:
            shown = "\n  ".join(left[:30])
            raise AssertionError(f"not quiet after {timeout:.0f}s ({what}):\n  {shown}")
        time.sleep(0.5)
        left = check()


class Soak:
    """The processes, the in-process APIs, the receiver and the driver's bookkeeping."""

    def __init__(
        self, url: str, procs: SettleProcesses, rx: Receiver, tmp: Path, rng: random.Random
    ) -> None:
        self.url = url
        self.db = Database(url, pool_size=4)
        self.procs = procs
        self.rx = rx
        self.rng = rng
        self.tally = Tally()
        # The API stamps sandbox deposits with the block time the worker confirms them by.
        config = replace(
            core_config(url, tmp / "core-data"),
            deposits=PipelineSettings(sandbox_block_s=SANDBOX_BLOCK_S),
        )
        core_ctx = CoreContext.build(config, db=self.db, identity_db=self.db)
        core_app = create_core_app(context=core_ctx)
        core_app.testing = True
        self.core: FlaskClient = core_app.test_client()
        notifier_ctx = NotifierContext.build(
            notifier_config(url, secret_key=SECRET_KEY), db=self.db, identity_db=self.db
        )
        notifier_app = create_notifier_app(context=notifier_ctx)
        notifier_app.testing = True
        self.notifier: FlaskClient = notifier_app.test_client()
        self.tenants: list[TenantRun] = []
        self.workers: list[SettleProcess] = []
        self.consumer: SettleProcess | None = None
        self.member = ""

    # -- processes -------------------------------------------------------------------

    def start(self) -> None:
        # Started together, waited for together: each spends seconds importing.
        started = [
            self.procs.start("core-worker", "core", "worker", ready=RELAY_READY, wait=False),
            self.procs.start("consume", "notifier", "consume", ready=CONSUMER_READY, wait=False),
        ]
        self.consumer = started[1]
        for name in ("worker-a", "worker-b"):
            argv = ("notifier", "worker", "--threads", str(WORKER_THREADS))
            self.workers.append(self.procs.start(name, *argv, ready=WORKER_READY, wait=False))
        for process in started + self.workers:
            process.wait_ready()

    def kill_and_restart(self, *processes: SettleProcess) -> None:
        for process in processes:
            self.tally.faults[f"SIGKILL {process.name}"] += 1
            process.kill()
        for process in processes:
            process.start(wait=False)
        for process in processes:
            process.wait_ready()

    def check_alive(self) -> None:
        """A process that died by itself is a bug: the supervisor would hide it."""
        for process in self.procs.processes:
            assert process.running, f"{process.name} exited:\n{process.output()[-3000:]}"

    def start_hostile_clients(self) -> tuple[HostileClients, dict[str, tuple[Api, set[int]]]]:
        """`settle core api` and `settle notifier api` (one gunicorn worker each) under attack."""
        apis = {
            "core": start_api(self.procs, "core", "/v1/status"),
            "notifier": start_api(self.procs, "notifier", "/v1/notifier/status"),
        }
        self.member = f"member-{uuid.uuid4().hex[:8]}@example.com"
        with self.db.transaction() as session:
            identity.add_member(
                session, self.tenants[0].keys.tenant_id, self.member, "viewer", PASSWORD
            )
        # The member has signed in from their usual address (127.0.0.1) before
        assert sign_in(apis["core"].port, self.member, PASSWORD) == (200, "None")
        hostile = HostileClients(
            apis["core"].port, apis["notifier"].port, self.tenants[0].keys.api_key, self.member
        ).start()
        return hostile, {name: (api, api.workers()) for name, api in apis.items()}

    def check_hostile_clients(
        self, hostile: HostileClients, apis: dict[str, tuple[Api, set[int]]]
    ) -> None:
        """Every hostile request got its 4xx, no API worker died, the member still signs in."""
        hostile.stop()
        assert hostile.problems() == []
        # The flood was contained: throttled (429) once counters filled, and refused at
        # once (503) while a password was being checked; how the two split depends on how
        # fast the machine hashes
        refused = hostile.count("sign-in", 429) + hostile.count("sign-in", 503)
        assert hostile.count("nested") > 20 and hostile.count("sign-in", 429) >= 1
        assert refused > hostile.count("sign-in", 401), hostile.answers
        for name, (api, workers) in apis.items():
            assert api.workers() == workers, f"a {name} API worker died and was replaced"
        # (the flood came from addresses of its own; the member signs in from theirs)
        assert sign_in(apis["core"][0].port, self.member, PASSWORD) == (200, "None")
        self.tally.faults["hostile: nested JSON bodies"] = hostile.count("nested")
        self.tally.faults["hostile: wrong sign-ins"] = hostile.count("sign-in")
        self.tally.faults["hostile: sign-ins throttled (429)"] = hostile.count("sign-in", 429)

    # -- tenants ---------------------------------------------------------------------

    def add_tenant(self, flaky: str | None) -> TenantRun:
        """A sandbox tenant with a policy, a healthy endpoint and maybe a flaky one."""
        run = TenantRun(make_tenant(self.db, sandbox=True))
        destination = {"chainId": 8453, "address": WALLETS[0], "tokenAddress": USDC_BASE}
        _ok(
            self.core.put(
                "/v1/destination-policy",
                json={"destination": destination},
                headers=run.keys.headers,
            )
        )
        tag = uuid.uuid4().hex[:6]
        for kind in ("healthy", flaky):
            if kind is None:
                continue
            path = f"/{tag}/{kind}"
            hook = {"name": kind, "url": self.rx.url(path), "eventTypes": SUBSCRIBED}
            endpoint = _ok(
                self.notifier.post("/v1/webhook-endpoints", json=hook, headers=run.keys.headers)
            )
            run.paths[path] = endpoint["webhookEndpoint"]["id"]
            run.secrets[path] = endpoint["secret"]
        self.tenants.append(run)
        return run

    def open_account(self, run: TenantRun) -> None:
        external = f"user-{uuid.uuid4().hex[:10]}"
        account = _ok(
            self.core.post(
                "/v1/deposit-accounts",
                json={"externalUserId": external},
                headers=run.keys.headers,
            )
        )["depositAccount"]
        run.accounts.append(account)
        self.tally.accounts += 1

    def deposit(self, run: TenantRun) -> None:
        account = self.rng.choice(run.accounts)
        addresses = {a["chainId"]: a["address"] for a in account["depositAddresses"]}
        # Mostly Base (direct credit); some Ethereum, bridged (credit_submitted first).
        chain_id = 1 if 1 in addresses and self.rng.random() < 0.25 else 8453
        outcome = self.rng.choices(("credited", "failed", "manual_review"), (7, 2, 1))[0]
        body = {
            "depositAddress": addresses.get(chain_id, next(iter(addresses.values()))),
            "chainId": chain_id if chain_id in addresses else next(iter(addresses)),
            "asset": "USDC",
            "amount": f"{self.rng.randint(20, 900)}.{self.rng.randint(0, 99):02d}",
            "outcome": outcome,
        }
        _ok(self.core.post("/v1/sandbox/deposits", json=body, headers=run.keys.headers))
        self.tally.deposits[outcome] += 1

    def change_destination(self, run: TenantRun) -> None:
        account = self.rng.choice(run.accounts)
        wallet = WALLETS[self.tally.destination_changes % 2]
        destination = {"chainId": 8453, "address": wallet, "tokenAddress": USDC_BASE}
        external = account["externalUserId"]
        _ok(
            self.core.patch(
                f"/v1/deposit-accounts/{external}/destination",
                json={"destination": destination},
                headers=run.keys.headers,
            )
        )
        self.tally.destination_changes += 1

    # -- the databases ---------------------------------------------------------------

    def rows(self, query: sa.Select[Any]) -> list[sa.Row[Any]]:
        with self.db.reader() as session:
            return list(session.execute(query))

    def pending(self) -> list[str]:
        """Everything not yet settled: deposits, outbox, stored events, deliveries, hits."""
        left = [
            f"deposit {r.id} is {r.status}"
            for r in self.rows(
                sa.select(Deposit.id, Deposit.status).where(Deposit.status.not_in(FINAL))
            )
        ]
        unpublished = self.rows(
            sa.select(OutboxEvent.event_id).where(OutboxEvent.published_at.is_(None))
        )
        left += [f"outbox {r.event_id} unpublished" for r in unpublished]
        stored = {r.id for r in self.rows(sa.select(StoredEvent.id))}
        outbox = self.rows(sa.select(OutboxEvent.event_id))
        left += [f"event {r.event_id} not stored" for r in outbox if r.event_id not in stored]
        open_deliveries = self.rows(
            sa.select(Delivery.id, Delivery.event_id, Delivery.status).where(
                Delivery.status != SUCCEEDED
            )
        )
        left += [f"delivery {r.id} of {r.event_id} is {r.status}" for r in open_deliveries]
        return left

    def expected(self) -> dict[str, dict[str, str]]:
        """Receiver path -> {event id: stored body} of every event its endpoint must get."""
        bodies = {r.id: r.body for r in self.rows(sa.select(StoredEvent.id, StoredEvent.body))}
        outbox = self.rows(
            sa.select(OutboxEvent.event_id, OutboxEvent.tenant_id, OutboxEvent.event_type)
        )
        by_tenant: dict[str, list[str]] = defaultdict(list)
        for row in outbox:
            if row.event_type in SUBSCRIBED:
                by_tenant[row.tenant_id].append(row.event_id)
        return {
            path: {eid: bodies[eid] for eid in by_tenant[run.keys.tenant_id] if eid in bodies}
            for run in self.tenants
            for path in run.paths
        }

    def missing_hits(self) -> list[str]:
        received = {path: _accepted(self.rx.hits(path)) for path in self.rx_paths()}
        return [
            f"{path}: {eid} not accepted"
            for path, wanted in self.expected().items()
            for eid in wanted
            if eid not in received[path]
        ]

    def rx_paths(self) -> list[str]:
        return [path for run in self.tenants for path in run.paths]


def _accepted(hits: list[Hit]) -> dict[str, list[Hit]]:
    """Event id -> the requests of it the receiver answered 2xx (timeouts do not count)."""
    found: dict[str, list[Hit]] = defaultdict(list)
    for hit in hits:
        if hit.answered is not None and 200 <= hit.answered < 300:
            found[hit.headers["x-service-event-id"]].append(hit)
    return found


def _reconcile_cli(env: dict[str, str], since: str, until: str) -> subprocess.CompletedProcess[str]:
    argv = settle_argv(
        "reconcile", "--since", since, "--until", until, "--settle-seconds", "0",
        "--require-delivered", "--json",
    )  # fmt: skip
    return subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_soak_faults_and_load_lose_nothing(soak_url: str, tmp_path: Path) -> None:
    started = time.monotonic()
    since = utcnow() - timedelta(seconds=1)
    names = BusNames(unique_prefix())
    (tmp_path / "data").mkdir()
    (tmp_path / "logs").mkdir()
    env = _env(soak_url, names, tmp_path / "data")
    procs = SettleProcesses(env, tmp_path / "logs")
    rng = random.Random(20261121)
    #: Faults running beside the driver; RabbitMQ must be up again before the test ends.
    background: list[Background] = []
    databases: list[Database] = []
    try:
        with Receiver() as rx, procs:
            soak = Soak(soak_url, procs, rx, tmp_path, rng)
            databases.append(soak.db)
            # Given five sandbox tenants, each with a healthy endpoint; four also have one
            # that will fail with 500, hang past the timeout, drop the connection, or
            # trickle its answer a byte at a time (cut at the 1 s attempt deadline); the
            # fifth is the healthy tenant
            flaky_kinds = ["fail", "hang", "close", "trickle", None]
            for kind in flaky_kinds[:TENANTS]:
                run = soak.add_tenant(kind)
                soak.open_account(run)
            # And the production processes: core worker, consumer, two notifier workers
            soak.start()
            # And hostile clients against core's and the notifier's API processes the whole
            # time: nested JSON bodies, and a sign-in flood guessing a member's password
            hostile, apis = soak.start_hostile_clients()
            flaky = {p: p.rsplit("/", 1)[1] for run in soak.tenants for p in run.paths}
            faults = {
                "fail": Answer.fail(500),
                "hang": Answer.hang(2.5),
                "close": Answer.close(),
                "trickle": Answer.trickle(0.2),
            }
            #: Healthy endpoints answer 200 with 16 MiB bodies in the first window.
            huge = Answer.huge(16 << 20)

            def fault_window(only: str | None = None) -> None:
                """Misbehave for FAULT_WINDOW_S of wall time, then answer 200 again."""
                kinds = [(p, k) for p, k in flaky.items() if k in faults and only in (None, k)]
                healthy = [p for p, k in flaky.items() if k == "healthy" and only is None]
                for path, kind in kinds:
                    rx.script(path, faults[kind])
                for path in healthy:
                    rx.script(path, huge)
                time.sleep(FAULT_WINDOW_S)
                for path, _ in kinds:
                    rx.script(path, Answer.ok())
                for path in healthy:
                    rx.script(path, Answer.ok())

            def kill_and_restart() -> None:
                assert soak.consumer is not None
                soak.kill_and_restart(soak.workers[0], soak.consumer)

            # When the tenants open accounts, deposit and change destinations, round by
            # round, while the faults happen beside them (each on a clock of its own, so a
            # slow restart cannot stretch a receiver's outage past the retry schedule)
            for round_no in range(ROUNDS):
                round_started = time.monotonic()
                if round_no == 1:
                    background.append(Background(fault_window))
                    for kind in faults:
                        soak.tally.faults[f"receiver {kind} window"] += 1
                if round_no == 3:
                    background.append(Background(kill_and_restart))
                if round_no == 5:
                    # While RabbitMQ is down, core keeps committing (the relay must wait)
                    background.append(Background(restart_rabbitmq))
                    soak.tally.faults["RabbitMQ restart"] += 1
                if round_no == 6:
                    background.append(Background(lambda: fault_window("fail")))
                    soak.tally.faults["receiver fail window"] += 1
                for run in soak.tenants:
                    soak.open_account(run)
                    for _ in range(DEPOSITS_PER_ROUND):
                        soak.deposit(run)
                    if round_no % 2 == 1:
                        soak.change_destination(run)
                time.sleep(max(0.0, ROUND_S - (time.monotonic() - round_started)))
            for task in background:
                task.join(RABBIT_CMD_TIMEOUT_S * 3)
            driven_s = time.monotonic() - started
            soak.check_hostile_clients(hostile, apis)

            # Then everything settles: deposits final, events stored, deliveries succeeded
            wait_for(soak.pending, QUIET_TIMEOUT_S, "deposits, outbox, deliveries")
            wait_for(soak.missing_hits, 30, "receiver hits")
            soak.check_alive()
            # (and the faults did happen: each flaky receiver turned requests away)
            for path, kind in flaky.items():
                refused = [h for h in rx.hits(path) if h.answered != 200]
                assert bool(refused) == (kind in faults), (path, len(refused))
            until = utcnow() + timedelta(seconds=1)

            # And reconcile finds no discrepancy, in-process and as the CLI
            report = reconcile(soak.db, soak.db, since, until, require_delivered=True)
            assert report.clean, report.render()
            cli = _reconcile_cli(procs.env, iso_ms(since), iso_ms(until))
            assert cli.returncode == 0, cli.stdout[-4000:] + cli.stderr[-4000:]
            assert json.loads(cli.stdout)["clean"] is True

            # And every event reached every endpoint of its tenant exactly as stored, signed
            expected = soak.expected()
            hits_total = 0
            redelivered = 0
            for run in soak.tenants:
                for path in run.paths:
                    accepted = _accepted(rx.hits(path))
                    hits_total += len(rx.hits(path))
                    for event_id, body in expected[path].items():
                        for hit in accepted[event_id]:
                            assert hit.body == body.encode(), (path, event_id)
                            signing.verify(run.secrets[path], hit.headers, hit.body)
                        redelivered += len(accepted[event_id]) - 1
                    # Nothing of another tenant's, nothing unknown
                    assert set(accepted) <= set(expected[path]), set(accepted) - set(expected[path])

            # And no durable deposit event was emitted twice (one per deposit and status)
            outbox = soak.rows(sa.select(OutboxEvent.event_type, OutboxEvent.body))
            durable = Counter(
                (row.event_type, json.loads(row.body)["data"]["deposit"]["id"])
                for row in outbox
                if row.event_type in _DURABLE_TYPES
            )
            assert [k for k, n in durable.items() if n > 1] == []
            deposits = soak.rows(sa.select(Deposit.status))
            assert len(deposits) == sum(soak.tally.deposits.values())

            # And the healthy tenant's deliveries stayed on time beside the hostile ones
            # (commit in core to the first 2xx, faults and restarts included)
            healthy_tenant = soak.tenants[flaky_kinds.index(None)]
            on_time = _commit_to_receipt(rx, list(healthy_tenant.paths))
            others = _commit_to_receipt(
                rx,
                [p for p, k in flaky.items() if k == "healthy" and p not in healthy_tenant.paths],
            )
            # The outages (kill, RabbitMQ restart) delay everyone alike; the hostile
            # receivers must not delay the tenant that has none more than the others.
            # The slack is for a loaded CI machine (a clean-clone run beside other work saw
            # p50 0.68 s against 0.11 s); starvation by receivers that hang past the 1 s
            # deadline shows as seconds more, which this still catches.
            assert on_time["p50"] <= others["p50"] * 1.5 + 1.5, (on_time, others)
            assert on_time["p99"] <= others["p99"] * 1.5 + 3.0, (on_time, others)

            # Print the figures (docs/RELIABILITY.md quotes them)
            statuses = Counter(
                r.status for r in soak.rows(sa.select(Delivery.status).select_from(Delivery))
            )
            attempts = soak.rows(sa.select(sa.func.count()).select_from(Attempt))[0][0]
            figures = {
                "tenants": len(soak.tenants),
                "endpoints": sum(len(r.paths) for r in soak.tenants),
                "accounts": soak.tally.accounts,
                "deposits": dict(soak.tally.deposits),
                "depositStatuses": dict(Counter(r.status for r in deposits)),
                "destinationChanges": soak.tally.destination_changes,
                "faults": dict(soak.tally.faults),
                "events": len(outbox),
                "eventsByType": dict(Counter(r.event_type for r in outbox)),
                "deliveries": dict(statuses),
                "attempts": attempts,
                "receiverRequests": hits_total,
                "redelivered": redelivered,
                "commitToReceiptS": {
                    "healthyTenant": on_time,
                    "otherTenantsHealthyEndpoints": others,
                },
                "reconcile": report.counts.to_dict(),
                "discrepancies": len(report.discrepancies()),
                "drivenSeconds": round(driven_s, 1),
                "totalSeconds": round(time.monotonic() - started, 1),
            }
            sys.stdout.write("\nSOAK " + json.dumps(figures, indent=2) + "\n")
    except BaseException:
        sys.stdout.write("\n" + procs.logs() + "\n")
        raise
    finally:
        for task in background:  # RabbitMQ is always running again before the next test
            with contextlib.suppress(Exception):
                task.join(RABBIT_CMD_TIMEOUT_S * 3)
        for db in databases:
            db.dispose()
        delete_bus(names)


def _commit_to_receipt(rx: Receiver, paths: list[str]) -> dict[str, float]:
    """p50, p99 and max seconds from an event's commit in core to its first 2xx at `paths`."""
    seconds = sorted(
        min(h.received_at for h in hits)
        - parse_iso(json.loads(hits[0].body)["createdAt"]).timestamp()
        for path in paths
        for hits in _accepted(rx.hits(path)).values()
    )
    if not seconds:
        return {}
    pick = lambda q: round(seconds[min(len(seconds) - 1, round(q * (len(seconds) - 1)))], 3)  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": round(seconds[-1], 3)}


#: Durable deposit event types (their ids are `evt_dep_<depositId>_<status>`).
_DURABLE_TYPES = {f"deposit.{s}" for s in events.DURABLE_DEPOSIT_STATUSES}
