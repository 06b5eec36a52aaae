"""`settle doctor`: is this deployment wired right? One line per check; exit 1 names what failed.

Run it where a Settle process runs, with that process's settings (`docker compose exec
core-worker settle doctor`, and the same in a notifier container: each checks the broker
as its own user). Checks, in order:

- settings: core's and the notifier's settings load (production refuses dev-only ones);
- database: each database answers, and each component (identity, core, notifier) is at
  its migrations' head;
- broker: RabbitMQ answers as the URL's user on every node SETTLE_AMQP_URL lists, a
  user that is not `guest` in production; the events exchange is there, and for the
  notifier's user its queues (events, dead letters, delivery jobs), each a quorum queue
  (a classic one from an older deployment fails: `settle notifier upgrade-queues`), with
  the dead letters waiting named; the user the notifier trusts is core's, not `guest`;
- lease: a delivery's lease outlasts an attempt's deadline;
- secret key: SETTLE_SECRET_KEY is 32 random bytes or more (the dev default only in dev);
- chain N: each configured node answers with chain id N (and active chains without one);
- hot wallet N: its balances on chain N, each at or above SETTLE_HOT_WALLET_MIN_BALANCE;
- clock: this machine's clock and the database's agree within MAX_SKEW_S.

A check that cannot run here says `skip` (no broker URL in core's API, no hot wallet key).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

OK, FAIL, SKIP = "ok", "FAIL", "skip"
#: Largest difference between this clock and the database's that passes.
MAX_SKEW_S = 2.0
#: Timeout of each network check (database, broker, node).
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Result:
    check: str
    status: str
    detail: str


def _public(url: str) -> str:
    """A URL without its password, path or query (a node URL's path often holds an API key)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}"


# --- settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    core: Any  # CoreConfig
    notifier: Any  # NotifierConfig
    env: dict[str, str]


def load_settings(env: dict[str, str]) -> tuple[Result, Settings | None]:
    from services.core.config import CoreConfig
    from services.notifier.config import NotifierConfig
    from shared.settings import SettingsError

    try:
        settings = Settings(CoreConfig.from_env(env), NotifierConfig.from_env(env), env)
    except SettingsError as err:
        return Result("settings", FAIL, str(err)), None
    return Result("settings", OK, f"{settings.core.env} mode"), settings


# --- database -------------------------------------------------------------------------


def check_database(settings: Settings) -> Result:
    """Every database answers, and each component's tables are at its head revision."""
    from shared import components, migrate
    from shared.db import normalize_url

    urls = {
        components.IDENTITY: settings.core.identity_database_url,
        components.CORE: settings.core.database_url,
        components.NOTIFIER: settings.notifier.database_url,
    }
    behind = []
    for component, url in urls.items():
        try:
            if not migrate.is_current(component, normalize_url(url)):
                behind.append(component.name)
        except Exception as err:
            return Result("database", FAIL, f"{_public(url)} does not answer: {_reason(err, url)}")
    if behind:
        return Result(
            "database",
            FAIL,
            f"not migrated: {', '.join(behind)} behind the code's head (run settle db upgrade)",
        )
    return Result("database", OK, "reachable; identity, core, notifier at their head revision")


# --- broker ---------------------------------------------------------------------------


def check_broker(settings: Settings) -> Result:
    import pika
    import pika.exceptions

    from services.notifier import queue_admin
    from services.notifier.broker import DeliveryQueues
    from shared import topology
    from shared.bus import BusNames, amqp_nodes, node_parameters

    url = settings.core.amqp_url
    production = settings.core.env == "production"
    if not url:
        detail = "SETTLE_AMQP_URL unset: " + (
            "this process needs no broker (core's API, migrate)"
            if production
            else "settle dev's in-process broker"
        )
        return Result("broker", SKIP, detail)
    nodes = amqp_nodes(url)
    params = node_parameters(url, timeout_s=TIMEOUT_S)
    for node in params:
        node.blocked_connection_timeout = TIMEOUT_S
    user = params[0].credentials.username
    trusted = settings.notifier.core_amqp_user
    if production and user == "guest":
        return Result("broker", FAIL, "connects as guest in production (one user per service)")
    names = BusNames.from_env(settings.env)
    notifier_side = user != trusted
    # Every node of the cluster must answer: one that does not is a cluster running short.
    connection, down = None, []
    for node_url, node in zip(nodes, params, strict=True):
        try:
            opened = pika.BlockingConnection(node)
        except Exception as err:
            down.append(f"{_public(node_url)} refuses {user}: {_reason(err, node_url)}")
            continue
        if connection is None:
            connection = opened
        else:
            opened.close()
    if connection is None or down:
        if connection is not None:
            connection.close()
        return Result("broker", FAIL, "; ".join(down))
    missing, classic, dead = [], [], []
    try:
        channel = connection.channel()
        try:
            channel.exchange_declare(names.exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker as err:
            missing.append(f"exchange {names.exchange} ({err.reply_code})")
        # The notifier's queues: those its processes consume (the delay queues are
        # declared by its workers on their first delayed job).
        consumed = {
            names.notifier_queue,
            names.notifier_dead_queue,
            *(names.queue(q) for q in (DeliveryQueues.QUEUE, DeliveryQueues.RETRY_QUEUE)),
        }
        dead_letters = {names.notifier_dead_queue} | {
            topology.dead_job_queue(names.queue(q)) for q in topology.JOB_QUEUES
        }
        for state in queue_admin.survey(connection, names.prefix) if notifier_side else []:
            if state.messages is None:
                if state.name in consumed:
                    missing.append(f"queue {state.name} (404)")
            elif not state.current:
                classic.append(state.name)
            elif state.name in dead_letters and state.messages:
                dead.append(f"{state.name} {state.messages}")
    finally:
        if connection.is_open:
            connection.close()
    if missing:
        return Result("broker", FAIL, f"as {user}: missing {', '.join(missing)}")
    if classic:
        return Result(
            "broker",
            FAIL,
            f"not quorum queues (an older deployment's): {', '.join(classic)}; "
            "run settle notifier upgrade-queues (docs/DEPLOY.md)",
        )
    if notifier_side and production and trusted in ("", "guest"):
        return Result("broker", FAIL, "SETTLE_CORE_AMQP_USER must be core's user, not guest")
    role = "notifier (trusts events from " + trusted + ")" if notifier_side else "core's relay"
    seen = "the exchange" + (" and the notifier's quorum queues" if notifier_side else "")
    letters = f"; dead letters waiting: {', '.join(dead)}" if dead else ""
    where = ", ".join(_public(node_url) for node_url in nodes)
    return Result("broker", OK, f"{where} as {user}, {role}: {seen} present{letters}")


# --- lease, secret key ----------------------------------------------------------------


def check_lease(settings: Settings) -> Result:
    from services.notifier.config import MIN_LEASE_MARGIN_S

    config = settings.notifier
    lease, deadline = config.lease_s, config.webhook_timeout_s
    detail = f"lease {lease:g} s, attempt deadline {deadline:g} s"
    if lease - deadline < MIN_LEASE_MARGIN_S:
        return Result(
            "lease",
            FAIL,
            f"{detail}: a lease must outlast the deadline by {MIN_LEASE_MARGIN_S:g} s or the "
            "sweeper sends a delivery again while its attempt runs",
        )
    return Result("lease", OK, detail)


def check_secret_key(settings: Settings) -> Result:
    from shared.settings import DEV_SECRET_KEY, MAKE_SECRET_KEY, secret_key_weakness

    key = settings.env.get("SETTLE_SECRET_KEY") or ""
    if not key:
        if settings.core.env == "production":
            return Result("secret key", FAIL, "SETTLE_SECRET_KEY is unset")
        return Result("secret key", OK, "the dev default (dev mode)")
    problem = secret_key_weakness(key)
    if problem == "is the dev default" and settings.core.env != "production":
        return Result("secret key", OK, "the dev default (dev mode)")
    if problem or key == DEV_SECRET_KEY:
        return Result(
            "secret key", FAIL, f"SETTLE_SECRET_KEY {problem}; make one: {MAKE_SECRET_KEY}"
        )
    return Result("secret key", OK, f"{len(key)} characters, not the dev default")


# --- chains and the hot wallet --------------------------------------------------------


def check_chains(settings: Settings, registry: Any) -> Iterator[Result]:
    """Each configured node answers with its chain's id; active chains without one say so."""
    from services.core.evm import connect

    urls = settings.core.rpc_urls
    for chain_id in sorted(set(urls) | {c.chain_id for c in registry.active()}):
        name = f"chain {chain_id}"
        url = urls.get(chain_id)
        if url is None:
            yield Result(name, SKIP, f"no node (SETTLE_RPC_URL_{chain_id}): deposits not watched")
            continue
        try:
            answered = int(connect(url, TIMEOUT_S).eth.chain_id)
        except Exception as err:
            yield Result(name, FAIL, f"{_public(url)} does not answer: {_reason(err, url)}")
            continue
        if answered != chain_id:
            yield Result(name, FAIL, f"{_public(url)} is chain {answered}, not {chain_id}")
        elif registry.get(chain_id) is None or chain_id not in {
            c.chain_id for c in registry.active()
        }:
            yield Result(name, OK, f"{_public(url)} answers; the chain is not active")
        else:
            yield Result(name, OK, f"{_public(url)} answers with chain id {chain_id}")


def check_hot_wallet(settings: Settings, registry: Any) -> Iterator[Result]:
    """The hot wallet's balances on each chain with a node, against their floors."""
    from eth_account import Account

    from services.core.evm import connect
    from services.core.hot_wallet_balances import HotWalletBalances

    deposits = settings.core.deposits
    urls = settings.core.rpc_urls
    if not deposits.hot_wallet_key:
        yield Result("hot wallet", SKIP, "SETTLE_HOT_WALLET_KEY unset: credits are not paid here")
        return
    wallet = Account.from_key(deposits.hot_wallet_key).address
    floors = {(m.chain_id, m.asset): m.amount for m in deposits.hot_wallet_minimums}
    for chain in registry.active():
        if chain.chain_id not in urls:
            continue
        name = f"hot wallet {chain.chain_id}"
        balances = HotWalletBalances(
            registry, {chain.chain_id: connect(urls[chain.chain_id], TIMEOUT_S)}, wallet
        )
        try:
            read = balances.read(chain)
        except Exception as err:
            yield Result(name, FAIL, f"balances not readable: {_reason(err, urls[chain.chain_id])}")
            continue
        shown = ", ".join(f"{amount.normalize():f} {asset}" for (_, asset), amount in read.items())
        short = [
            f"{asset} {amount.normalize():f} < {floors[(cid, asset)]:f}"
            for (cid, asset), amount in read.items()
            if (cid, asset) in floors and amount < floors[(cid, asset)]
        ]
        if short:
            yield Result(name, FAIL, f"{wallet} under its floor: {'; '.join(short)}")
        else:
            yield Result(name, OK, f"{wallet}: {shown}")


# --- clock ----------------------------------------------------------------------------


def check_clock(settings: Settings, clock: Callable[[], float] = time.time) -> Result:
    """This clock against the database's, the round trip's middle against its reading."""
    import psycopg

    from shared.db import normalize_url

    url = normalize_url(settings.core.database_url).replace(
        "postgresql+psycopg://", "postgresql://"
    )
    try:
        with psycopg.connect(url, connect_timeout=int(TIMEOUT_S)) as conn:
            sent = clock()
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
            received = clock()
    except Exception as err:
        return Result("clock", FAIL, f"the database does not answer: {_reason(err)}")
    assert row is not None
    skew = float(row[0]) - (sent + received) / 2
    detail = f"{skew:+.3f} s against the database (round trip {received - sent:.3f} s)"
    if abs(skew) > MAX_SKEW_S:
        return Result(
            "clock",
            FAIL,
            f"{detail}: over {MAX_SKEW_S:g} s; due times and leases go wrong (run NTP)",
        )
    return Result("clock", OK, detail)


# --- the command ----------------------------------------------------------------------


def _reason(err: BaseException, url: str | None = None) -> str:
    """The error's first line, with `url`'s secrets (password, path, query) cut out."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    if url:
        parts = urlsplit(url)
        for secret in (url, parts.password, parts.query, parts.path if len(parts.path) > 1 else ""):
            if secret:
                text = text.replace(secret, "...")
    return text


def run_checks(env: dict[str, str], clock: Callable[[], float] = time.time) -> list[Result]:
    """Every check, in order; a check that raises is a failure, never a traceback."""
    result, settings = load_settings(env)
    results = [result]
    if settings is None:
        return results
    from services.core.chains import load_chains

    checks: list[Callable[[], Result | Iterator[Result]]] = [
        lambda: check_database(settings),
        lambda: check_broker(settings),
        lambda: check_lease(settings),
        lambda: check_secret_key(settings),
    ]
    try:
        registry = load_chains(settings.core.chains_file)
    except Exception as err:
        results.append(Result("chains file", FAIL, _reason(err)))
    else:
        checks += [
            lambda: check_chains(settings, registry),
            lambda: check_hot_wallet(settings, registry),
        ]
    checks.append(lambda: check_clock(settings, clock))
    for check in checks:
        try:
            outcome = check()
            results.extend([outcome] if isinstance(outcome, Result) else list(outcome))
        except Exception as err:
            results.append(Result(getattr(check, "__name__", "check"), FAIL, _reason(err)))
    return results


def doctor(args: argparse.Namespace) -> int:
    import logging
    import os

    # pika narrates every connection and logs the 404 a missing queue answers: the
    # results say it once.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    results = run_checks(dict(os.environ))
    failed = [r.check for r in results if r.status == FAIL]
    if args.json:
        print(json.dumps([r.__dict__ for r in results]))
    else:
        width = max(len(r.check) for r in results)
        for r in results:
            print(f"{r.status:<4}  {r.check:<{width}}  {r.detail}")
    if failed:
        sys.stderr.write(f"settle doctor: {len(failed)} failed: {', '.join(failed)}\n")
        return 1
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check this deployment's wiring (exit 1 names a failure)")
    p.add_argument("--json", action="store_true", help="the results as a JSON list")
    p.set_defaults(func=doctor)
