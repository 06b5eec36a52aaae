"""`settle dev`: the whole of Settle in one process, for a first run and for demos.

An embedded PostgreSQL server in SETTLE_DATA_DIR (started here, stopped on the way
out; `shared/embedded_postgres.py`), the in-process event bus instead of RabbitMQ,
Dramatiq's StubBroker with worker threads, the relay, fee oracle, deposit pipeline and
sweeper as threads, and both APIs on one port, routed as the ingress routes them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from services.core.config import CoreConfig
from services.devdata import read_demo, write_demo
from services.notifier.config import NotifierConfig
from shared import logs
from shared.db import Database, normalize_url
from shared.identity import service as identity
from shared.identity.models import Tenant
from shared.routing import is_notifier_path
from shared.settings import SettingsError, data_dir, env_bool

log = logging.getLogger(__name__)

#: A wallet and Base's USDC, for the printed examples.
DEMO_WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
BASE_USDC = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class PathDispatcher:
    """One WSGI app in front of core and the notifier, split as the ingress splits."""

    def __init__(self, core: WSGIApp, notifier: WSGIApp) -> None:
        self._core = core
        self._notifier = notifier

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        app = self._notifier if is_notifier_path(environ.get("PATH_INFO", "")) else self._core
        return app(environ, start_response)


@dataclass(frozen=True)
class DemoTenant:
    tenant_id: str
    api_key: str
    api_key_id: str


def ensure_demo_tenant(db: Database, folder: Path) -> DemoTenant:
    """The demo tenant of this data dir and its API key, both made on the first run.

    Later runs reuse the recorded key while it is valid, so starting `settle dev`
    again does not mint one more full-scope key (a revoked key is replaced).
    """
    record = read_demo(folder)
    tenant_id, api_key = record.get("tenantId"), record.get("apiKey")
    if api_key:
        active = identity.authenticate_key(db, api_key)
        if active is not None and active.tenant_id == tenant_id:
            return DemoTenant(tenant_id, api_key, active.id)
    with db.transaction() as session:
        if tenant_id and session.get(Tenant, tenant_id) is not None:
            issued = identity.create_api_key(session, tenant_id, identity.SCOPES)
        else:
            tenant, issued = identity.create_tenant(session, "Demo tenant", sandbox=True)
            tenant_id = tenant.id
        demo = DemoTenant(tenant_id, issued.api_key, issued.record.id)
    write_demo(folder, demo.tenant_id, demo.api_key, demo.api_key_id)
    return demo


def claim_port(host: str, port: int) -> socket.socket:
    """Bind the HTTP port now, before anything else starts; PortInUse when taken.

    The bound socket is handed to the server later, so nothing can take the port in
    between, and a busy port is reported before the database or a key is touched.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise PortInUse(
            f"cannot listen on {host}:{port}: {err.strerror or err} (another settle dev?). "
            "Choose another port: settle dev --port N, or make dev PORT=N"
        ) from None
    sock.listen(128)
    return sock


class PortInUse(Exception):
    """The port `settle dev` was asked for cannot be bound."""


def embedded_configs(env: dict[str, str]) -> tuple[CoreConfig, NotifierConfig]:
    """Dev settings: no broker URL, sandbox on, local receivers allowed unless turned off."""
    env.setdefault("SETTLE_ENV", "dev")
    if env["SETTLE_ENV"] != "dev":
        raise SettingsError("settle dev is the embedded dev mode: SETTLE_ENV must be dev")
    core = replace(CoreConfig.from_env(env), amqp_url=None)
    notifier = replace(
        NotifierConfig.from_env(env),
        amqp_url=None,
        allow_private=env_bool(env, "SETTLE_WEBHOOK_ALLOW_PRIVATE", True),
    )
    return core, notifier


def banner(host: str, port: int, demo: DemoTenant, database_url: str) -> str:
    base = f"http://{host}:{port}"
    return f"""
Settle is running (embedded) on {base}
  database   {database_url}
  tenant     {demo.tenant_id} (sandbox)
  API key    {demo.api_key}
  key id     {demo.api_key_id}

Try:
  export KEY={demo.api_key}
  curl -s {base}/v1/chains
  curl -s -X PUT {base}/v1/destination-policy -H "Authorization: Bearer $KEY" \\
    -H 'Content-Type: application/json' \\
    -d '{{"destination":{{"chainId":8453,"address":"{DEMO_WALLET}","tokenAddress":"{BASE_USDC}"}}}}'
  curl -s -X POST {base}/v1/deposit-accounts -H "Authorization: Bearer $KEY" \\
    -H 'Content-Type: application/json' -d '{{"externalUserId":"user-1"}}'
  curl -s {base}/v1/deposits -H "Authorization: Bearer $KEY"
OpenAPI: {base}/v1/openapi.json and {base}/v1/notifier/openapi.json
Portal:  {base}/ (add a member first: settle members add --tenant {demo.tenant_id} \
           --email you@example.com --role owner, password on stdin)
"""


def run_dev(args: argparse.Namespace) -> int:
    recursion_limit = sys.getrecursionlimit()
    from werkzeug.serving import make_server

    from services.core.app import create_app as create_core_app
    from services.core.backfill import run_address_backfill
    from services.core.deposits.worker import run_pipeline
    from services.core.fee_oracle import run_fee_oracle
    from services.core.fees import refresh_fees
    from services.core.relay import start_relay_thread
    from services.core.worker import outbox_maintainer
    from services.notifier.app import create_app as create_notifier_app
    from services.notifier.delivery_engine import start_embedded

    try:
        listener = claim_port(args.host, args.port)
    except PortInUse as err:
        sys.stderr.write(f"settle dev: {err}\n")
        return 2
    # The pipeline imports web3, whose py_ecc raised the limit to 100000 (for pairing
    # code Settle never runs). This process serves HTTP: at that depth a runaway
    # recursion overflows the C stack and kills it instead of raising RecursionError.
    sys.setrecursionlimit(recursion_limit)
    env = dict(os.environ)
    core_config, notifier_config = embedded_configs(env)
    folder = data_dir(env)
    folder.mkdir(parents=True, exist_ok=True)
    from shared import components, migrate  # Alembic: loaded only when dev runs

    # Resolved once here: an embedded URL starts (or joins) the data dir's server now.
    core_url = normalize_url(core_config.database_url)
    notifier_url = normalize_url(notifier_config.database_url)
    identity_url = normalize_url(core_config.identity_database_url)
    core_config = replace(core_config, database_url=core_url, identity_database_url=identity_url)
    notifier_config = replace(
        notifier_config, database_url=notifier_url, identity_database_url=identity_url
    )
    migrate.upgrade(components.IDENTITY, identity_url)
    migrate.upgrade(components.CORE, core_url)
    migrate.upgrade(components.NOTIFIER, notifier_url)

    # Imported here: the contexts pull in web3 and friends, which `settle --help` and
    # every other command would otherwise pay for at start.
    from services.core.context import CoreContext

    db = Database(core_config.database_url)
    core_ctx = CoreContext.build(core_config, db=db, identity_db=db)
    notifier_db = (
        db
        if notifier_config.database_url == core_config.database_url
        else Database(notifier_config.database_url)
    )
    refresh_fees(db, core_ctx.registry)
    demo = ensure_demo_tenant(db, folder)

    stop = threading.Event()
    embedded = start_embedded(notifier_config, db=notifier_db, identity_db=db)
    start_relay_thread(db, lambda: embedded.bus, stop, poll_s=1.0)
    for name, target in (
        ("fee-oracle", run_fee_oracle),
        ("deposit-pipeline", run_pipeline),
        ("address-backfill", run_address_backfill),
    ):
        threading.Thread(target=target, args=(core_ctx, stop), name=name, daemon=True).start()
    # The outbox's partitions, as the core worker keeps them (the notifier's: start_embedded).
    outbox = outbox_maintainer(core_config, db)
    threading.Thread(target=outbox.run, args=(stop,), name="partitions", daemon=True).start()

    apps = (create_core_app(context=core_ctx), create_notifier_app(context=embedded.ctx))
    for each in apps:
        each.config[logs.ACCESS_LOG] = False  # the request handler below logs each request
    app = PathDispatcher(*apps)
    sys.stdout.write(banner(args.host, args.port, demo, core_config.database_url))
    sys.stdout.flush()
    # SIGTERM unwinds like Ctrl-C, so the embedded PostgreSQL is stopped with us (atexit).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    server = make_server(
        args.host,
        args.port,
        app,
        threaded=True,
        request_handler=_request_handler(),
        fd=listener.fileno(),
    )
    try:
        server.serve_forever()
    finally:
        stop.set()
        embedded.stop()
    return 0


def _request_handler() -> type[Any]:
    """Werkzeug's handler, logging one plain line per request with its latency.

    Werkzeug's own line carries a second timestamp and ANSI colour codes even when the
    output is a file.
    """
    import time

    from werkzeug.serving import WSGIRequestHandler

    http_log = logging.getLogger("settle.http")

    class Handler(WSGIRequestHandler):
        _code: int | str = "-"
        _request_id = ""

        def run_wsgi(self) -> None:
            started = time.monotonic()
            self._code, self._request_id = "-", ""
            try:
                super().run_wsgi()
            finally:
                elapsed_ms = (time.monotonic() - started) * 1000
                path = getattr(self, "path", "?").translate(self._control_char_table)
                http_log.info(
                    "%s %s -> %s in %.0f ms%s",
                    getattr(self, "command", "?"),
                    path,
                    self._code,
                    elapsed_ms,
                    f" [{self._request_id}]" if self._request_id else "",
                )

        def send_header(self, keyword: str, value: str) -> None:
            if keyword.lower() == "x-request-id":
                self._request_id = value
            super().send_header(keyword, value)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            self._code = code  # logged once the response is out (run_wsgi)

        def log(self, type: str, message: str, *args: Any) -> None:
            getattr(http_log, type, http_log.info)(message.rstrip("\n"), *args)

    return Handler


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)
