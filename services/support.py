"""Support commands from a laptop: `settle deliveries|endpoints|events|deposits ...` over
Settle's API with an API key, as tables (`--json` for scripts).

`--api-url`/`--api-key` (or SETTLE_API_URL/SETTLE_API_KEY) make a command talk to the
API as that key's tenant. Without an API URL, `deliveries list|show|replay` and
`endpoints list` run server-side against the database, across tenants (`--tenant`
narrows), as ops always did (services/notifier/ops.py); `endpoints disable|enable` and
the deposit actions `credit|fail|retry` are ops-only and say so.

Imports nothing heavy (the standard library's HTTP client): `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services import output
from services.commands import Handler
from services.notifier.statuses import DELIVERY_STATUSES
from shared.events import EVENT_TYPES

URL_ENV = "SETTLE_API_URL"
KEY_ENV = "SETTLE_API_KEY"
#: Seconds one API call may take.
TIMEOUT_S = 30.0
#: Columns of each table on a terminal (`--json` prints every field).
DELIVERY_COLUMNS = (
    "id",
    "createdAt",
    "eventType",
    "status",
    "attemptCount",
    "lastResponseStatus",
    "lastError",
)
ENDPOINT_COLUMNS = ("id", "name", "url", "eventTypes", "status", "signatureScheme")
DEPOSIT_COLUMNS = ("id", "createdAt", "chainId", "status", "amount", "asset", "externalUserId")
ATTEMPT_COLUMNS = ("number", "attemptedAt", "responseStatus", "latencyMs", "error")


class RemoteError(Exception):
    """The API refused, or could not be reached: a message for a person."""


class Remote:
    """Settle's API as one tenant's API key sees it (standard library HTTP, JSON)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = TIMEOUT_S):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        auth: bool = True,
    ) -> dict[str, Any]:
        if auth and not self.api_key:
            raise RemoteError(f"no API key: give --api-key or set {KEY_ENV}")
        kept = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.base_url + path + (f"?{urllib.parse.urlencode(kept)}" if kept else "")
        headers = {"Accept": "application/json", "User-Agent": "settle-cli"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 (the operator's URL)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                raw = response.read()
        except urllib.error.HTTPError as err:
            raise RemoteError(f"{method} {path}: {err.code} {_error_of(err.read())}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise RemoteError(f"cannot reach {self.base_url}: {reason}") from None
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            raise RemoteError(f"{method} {path}: the answer is not JSON") from None
        return answer if isinstance(answer, dict) else {"result": answer}


def _error_of(raw: bytes) -> str:
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        error = None
    return error if isinstance(error, str) else raw[:200].decode("utf-8", "replace")


def api_url(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_url", None) or os.environ.get(URL_ENV) or None


def remote_of(args: argparse.Namespace) -> Remote:
    url = api_url(args)
    if not url:
        raise RemoteError(f"no API URL: give --api-url or set {URL_ENV}")
    return Remote(url, getattr(args, "api_key", None) or os.environ.get(KEY_ENV))


def _local(args: argparse.Namespace) -> bool:
    """True when the command runs server-side (no API URL): it needs the data dir."""
    return api_url(args) is None


# -- printing -----------------------------------------------------------------------


def _rows(items: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    return [{c: item.get(c) for c in columns} for item in items]


def show_list(body: dict[str, Any], key: str, columns: Sequence[str]) -> None:
    """A list answer: every field as JSON for scripts, the main columns as a table."""
    if output.wants_json():
        output.emit(body)
        return
    shown: dict[str, Any] = {key: _rows(body.get(key) or [], columns)}
    if body.get("nextCursor"):
        shown["nextCursor"] = body["nextCursor"]
    output.emit(shown)


def show_one(body: dict[str, Any]) -> None:
    output.emit(body)


# -- commands -----------------------------------------------------------------------

RemoteCommand = Callable[[Remote, argparse.Namespace], None]


def _remote(fn: RemoteCommand, name: str) -> Handler:
    def run(args: argparse.Namespace) -> int:
        if getattr(args, "tenant", None):
            sys.stderr.write(
                f"settle {name}: --tenant is for the server-side ops command; an API key "
                "acts for its own tenant only\n"
            )
            return 2
        try:
            fn(remote_of(args), args)
        except RemoteError as err:
            sys.stderr.write(f"settle {name}: {err}\n")
            return 2
        return 0

    return run


def _either(fn: RemoteCommand, name: str, server: Handler | None) -> Handler:
    """Over the API when an API URL is given; else server-side (`server`), or an error."""
    remote = _remote(fn, name)

    def run(args: argparse.Namespace) -> int:
        if api_url(args) is not None:
            return remote(args)
        if server is not None:
            return server(args)
        sys.stderr.write(
            f"settle {name}: talks to Settle's API: give --api-url (or {URL_ENV}) and "
            f"--api-key (or {KEY_ENV})\n"
        )
        return 2

    return run


def server_only(name: str, server: Handler) -> Handler:
    """An ops-only command: it refuses an API URL, saying it runs on the server."""

    def run(args: argparse.Namespace) -> int:
        if api_url(args) is not None:
            sys.stderr.write(
                f"settle {name}: ops-only: runs on a Settle server with database access, "
                f"never over the API (unset {URL_ENV})\n"
            )
            return 2
        return server(args)

    return run


def ops_only(p: argparse.ArgumentParser, name: str, server: Handler) -> None:
    """Make `p` an ops-only command: given an API URL it says so instead of running."""
    p.add_argument("--api-url", help=argparse.SUPPRESS)
    p.set_defaults(func=server_only(name, server), needs_data_dir=_local)


def deliveries_list(api: Remote, args: argparse.Namespace) -> None:
    query = {
        "endpointId": args.endpoint,
        "eventId": args.event,
        "eventType": args.type,
        "status": args.status,
        "createdAfter": args.since,
        "createdBefore": args.until,
        "limit": args.limit,
        "cursor": args.cursor,
    }
    body = api.call("GET", "/v1/webhook-deliveries", query=query)
    show_list(body, "webhookDeliveries", DELIVERY_COLUMNS)


def deliveries_show(api: Remote, args: argparse.Namespace) -> None:
    body = api.call("GET", f"/v1/webhook-deliveries/{_segment(args.delivery_id)}")
    if output.wants_json():
        output.emit(body)
        return
    delivery = dict(body.get("webhookDelivery") or {})
    attempts = delivery.pop("attempts", [])
    for bulky in ("event", "requestBody"):
        delivery.pop(bulky, None)
    output.emit({**delivery, "attempts": _rows(attempts, ATTEMPT_COLUMNS)})


def deliveries_replay(api: Remote, args: argparse.Namespace) -> None:
    path = f"/v1/webhook-deliveries/{_segment(args.delivery_id)}/replay"
    show_one(api.call("POST", path, body={}))


def endpoints_list(api: Remote, args: argparse.Namespace) -> None:
    query = {"limit": args.limit, "cursor": args.cursor}
    body = api.call("GET", "/v1/webhook-endpoints", query=query)
    show_list(body, "webhookEndpoints", ENDPOINT_COLUMNS)


def endpoints_show(api: Remote, args: argparse.Namespace) -> None:
    show_one(api.call("GET", f"/v1/webhook-endpoints/{_segment(args.endpoint_id)}"))


def endpoints_test(api: Remote, args: argparse.Namespace) -> None:
    body = {"eventType": args.type} if args.type else {}
    path = f"/v1/webhook-endpoints/{_segment(args.endpoint_id)}/test"
    show_one(api.call("POST", path, body=body))


def endpoints_recover(api: Remote, args: argparse.Namespace) -> None:
    body = {"since": args.since, **({"until": args.until} if args.until else {})}
    path = f"/v1/webhook-endpoints/{_segment(args.endpoint_id)}/recover"
    show_list(api.call("POST", path, body=body), "webhookDeliveries", DELIVERY_COLUMNS)


def deposits_list(api: Remote, args: argparse.Namespace) -> None:
    query = {
        "externalUserId": args.user,
        "status": args.status,
        "chainId": args.chain,
        "createdAfter": args.since,
        "createdBefore": args.until,
        "limit": args.limit,
        "cursor": args.cursor,
    }
    show_list(api.call("GET", "/v1/deposits", query=query), "deposits", DEPOSIT_COLUMNS)


def deposits_show(api: Remote, args: argparse.Namespace) -> None:
    show_one(api.call("GET", f"/v1/deposits/{_segment(args.deposit_id)}"))


def events_list(api: Remote, args: argparse.Namespace) -> None:
    body = api.call("GET", "/v1/event-types", auth=False)
    if output.wants_json():
        output.emit(body)
        return
    types = [
        {"type": t.get("type"), "description": (t.get("description") or "").split(". ")[0]}
        for t in body.get("eventTypes") or []
    ]
    patterns = [
        {"pattern": p.get("pattern"), "covers": ", ".join(p.get("eventTypes") or [])}
        for p in body.get("patterns") or []
    ]
    output.emit({"eventTypes": types, "patterns": patterns})


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


# -- registration -------------------------------------------------------------------


def _connection(p: argparse.ArgumentParser, *, server_side: bool = False) -> None:
    """--api-url and --api-key; `server_side`: without a URL it runs against the database."""
    p.add_argument("--api-url", help=f"Settle's API, e.g. https://api.example.com ({URL_ENV})")
    p.add_argument("--api-key", help=f"an API key of the tenant ({KEY_ENV})")
    p.set_defaults(needs_data_dir=_local if server_side else False)


def _page(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=_limit, default=50, metavar="1..1000")
    p.add_argument("--cursor", help="the next page: the nextCursor a list printed")


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 1000")
    return int(text)


ContextFactory = Callable[[], Any]


def _ops(name: str, make_context: ContextFactory | None) -> Handler:
    """The server-side command `name` of services/notifier/ops.py (imported when run)."""

    def run(args: argparse.Namespace) -> int:
        from services.notifier import ops

        factory = make_context or ops.default_context
        return ops.command(getattr(ops, name), factory)(args)

    return run


def _sla_since(text: str) -> Any:
    from services.notifier import ops  # sla's rules (heavy): imported only to parse --since

    return ops.sla_since(text)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    make_context: ContextFactory | None = None,
) -> None:
    """`settle deliveries ...`, `settle endpoints ...`, `settle sla`, `settle events list`.

    `make_context` builds the notifier context of the server-side commands (tests).
    """
    group = sub.add_parser(
        "deliveries", help="webhook deliveries (over the API with a key, or server-side)"
    )
    actions = group.add_subparsers(dest="action", required=True)
    p = actions.add_parser("list", help="deliveries, newest first")
    _connection(p, server_side=True)
    p.add_argument("--tenant", help="server-side only: only this tenant's")
    p.add_argument("--endpoint", help="only to this endpoint (we_...)")
    p.add_argument("--event", help="only of this event (evt_...)")
    p.add_argument("--type", choices=EVENT_TYPES, help="only of this event type")
    p.add_argument("--status", choices=DELIVERY_STATUSES)
    p.add_argument("--since", help="created at or after (ISO 8601)")
    p.add_argument("--until", help="created before (ISO 8601)")
    _page(p)
    p.set_defaults(
        func=_either(deliveries_list, "deliveries list", _ops("deliveries_list", make_context))
    )

    p = actions.add_parser("show", help="one delivery with its attempts")
    _connection(p, server_side=True)
    p.add_argument("delivery_id", metavar="DELIVERY_ID")
    p.add_argument("--tenant", help="server-side only: refuse unless it is this tenant's")
    p.set_defaults(
        func=_either(deliveries_show, "deliveries show", _ops("deliveries_show", make_context))
    )

    p = actions.add_parser("replay", help="send a delivery's event again as a new delivery")
    _connection(p, server_side=True)
    p.add_argument("delivery_id", metavar="DELIVERY_ID")
    p.add_argument("--tenant", help="server-side only: refuse unless it is this tenant's")
    p.add_argument(
        "--wait",
        type=float,
        nargs="?",
        const=120.0,
        default=0.0,
        metavar="SECONDS",
        help="server-side only: wait (default 120 s) until it has been attempted",
    )
    p.set_defaults(
        func=_either(
            deliveries_replay, "deliveries replay", _ops("deliveries_replay", make_context)
        )
    )

    group = sub.add_parser(
        "endpoints", help="webhook endpoints (over the API with a key, or server-side)"
    )
    actions = group.add_subparsers(dest="action", required=True)
    p = actions.add_parser("list", help="live endpoints, newest first")
    _connection(p, server_side=True)
    p.add_argument("--tenant", help="server-side only: only this tenant's")
    _page(p)
    p.set_defaults(
        func=_either(endpoints_list, "endpoints list", _ops("endpoints_list", make_context))
    )
    p = actions.add_parser("show", help="one endpoint (never its secret)")
    _connection(p)
    p.add_argument("endpoint_id", metavar="ENDPOINT_ID")
    p.set_defaults(func=_either(endpoints_show, "endpoints show", None))
    p = actions.add_parser("test", help="send a test delivery to one endpoint")
    _connection(p)
    p.add_argument("endpoint_id", metavar="ENDPOINT_ID")
    p.add_argument("--type", choices=EVENT_TYPES, help="send the catalog's example of this type")
    p.set_defaults(func=_either(endpoints_test, "endpoints test", None))
    p = actions.add_parser(
        "recover", help="send again what failed to reach an endpoint in a time window"
    )
    _connection(p)
    p.add_argument("endpoint_id", metavar="ENDPOINT_ID")
    p.add_argument("--since", required=True, help="start of the window (ISO 8601)")
    p.add_argument("--until", help="end of the window (ISO 8601; default now)")
    p.set_defaults(func=_either(endpoints_recover, "endpoints recover", None))
    for action in ("disable", "enable"):
        p = actions.add_parser(action, help=f"{action} an endpoint (ops-only, server-side)")
        p.add_argument("endpoint_id", metavar="ENDPOINT_ID")
        p.add_argument("--tenant", help="refuse unless it is this tenant's")
        ops_only(p, f"endpoints {action}", _ops(f"endpoints_{action}", make_context))

    p = sub.add_parser(
        "sla",
        help="delivery SLA per tenant and endpoint: counts, success rate, p50/p99 of "
        "first-attempt latency and commit-to-success time, oldest pending",
    )
    p.add_argument(
        "--since",
        type=_sla_since,
        default=None,
        help="deliveries made since: 7d, 24h, 30m (s, m, h, d, w) or an ISO 8601 time (default 7d)",
    )
    p.add_argument("--tenant", help="only this tenant's endpoints")
    ops_only(p, "sla", _ops("sla_report", make_context))

    group = sub.add_parser("events", help="the event catalog: every type and pattern")
    actions = group.add_subparsers(dest="action", required=True)
    p = actions.add_parser("list", help="every event type and subscription pattern")
    _connection(p)
    p.set_defaults(func=_either(events_list, "events list", None))


def add_deposit_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`settle deposits list|show` (over the API) beside the ops actions on deposits."""
    p = actions.add_parser("list", help="the tenant's deposits, newest first (over the API)")
    _connection(p)
    p.add_argument("--user", help="only this externalUserId's")
    p.add_argument("--status", help="only in this status")
    p.add_argument("--chain", type=int, help="only on this chain id")
    p.add_argument("--since", help="created at or after (ISO 8601)")
    p.add_argument("--until", help="created before (ISO 8601)")
    _page(p)
    p.set_defaults(func=_either(deposits_list, "deposits list", None))
    p = actions.add_parser("show", help="one deposit (over the API)")
    _connection(p)
    p.add_argument("deposit_id", metavar="DEPOSIT_ID")
    p.set_defaults(func=_either(deposits_show, "deposits show", None))
