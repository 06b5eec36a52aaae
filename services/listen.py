"""`settle listen`: a local webhook receiver for development, like `stripe listen`.

It registers a webhook endpoint pointing at itself (127.0.0.1, a free port), verifies
every delivery with that endpoint's secret, prints it readably (or as JSON lines) and
optionally forwards it, byte for byte with its signature headers, to your own app.
The endpoint is deleted when it stops (Ctrl-C), unless `--keep`. It is ephemeral:
`listen` renews it every third of `--ttl` (300 s by default), and when `listen` dies
without cleaning up (`kill -9`, a closed terminal, Settle restarted) it expires `--ttl`
seconds after the last renewal; it never counts against the tenant's endpoint limit.

Settle refuses http:// and loopback webhook URLs outside dev (SSRF protection), so
this works against `settle dev` (or a service with SETTLE_WEBHOOK_ALLOW_PRIVATE on).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from shared import signing

#: Largest delivery body read (Settle's own are far smaller); more is refused with 413.
MAX_BODY_BYTES = 1024 * 1024
#: Seconds a sender may take to send its request (a trickling sender is cut off).
READ_TIMEOUT_S = 10.0
DEFAULT_API = "http://127.0.0.1:8000"
#: Seconds the ephemeral endpoint outlives the last renewal (the server's default too).
DEFAULT_TTL_S = 300


class ListenError(Exception):
    """Something a person must fix before listening can start (the message says what)."""


@dataclass
class Delivery:
    """One request received, as printed."""

    verified: bool
    event: dict[str, Any] | None
    problem: str | None = None
    forwarded: int | str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def describe(event: dict[str, Any]) -> str:
    """One readable line about an event: its type, id and what it says."""
    data = event.get("data") if isinstance(event.get("data"), dict) else {}
    parts = [str(event.get("type")), str(event.get("id"))]
    deposit = data.get("deposit") if isinstance(data, dict) else None
    if isinstance(deposit, dict):
        parts.append(f"{deposit.get('id')} {deposit.get('status')}")
        amount = f"{deposit.get('amount')} {deposit.get('asset') or deposit.get('tokenAddress')}"
        parts.append(f"{amount} on chain {deposit.get('chainId')}")
        if deposit.get("netAmountUsd") is not None:
            parts.append(f"net ${deposit['netAmountUsd']}")
        if deposit.get("failureReason"):
            parts.append(f"reason {deposit['failureReason']}")
        if deposit.get("reviewReason"):
            parts.append(f"review {deposit['reviewReason']}")
    account = data.get("depositAccount") if isinstance(data, dict) else None
    if isinstance(account, dict):
        parts.append(f"account {account.get('externalUserId')}")
    for key in ("message", "apiKeyId", "reason"):
        if isinstance(data, dict) and key in data:
            parts.append(f"{key} {data[key]}")
    return "  ".join(parts)


class Printer:
    """Writes one line per delivery: readable on a terminal, JSON lines with `--json`."""

    def __init__(self, out: TextIO, *, as_json: bool, colour: bool | None = None) -> None:
        self.out = out
        self.as_json = as_json
        self.colour = out.isatty() if colour is None else colour
        self._lock = threading.Lock()

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text

    def delivery(self, d: Delivery) -> None:
        if self.as_json:
            line = json.dumps(
                {
                    "verified": d.verified,
                    "problem": d.problem,
                    "forwarded": d.forwarded,
                    "deliveryId": d.headers.get(signing.DELIVERY_ID_HEADER),
                    "event": d.event,
                },
                separators=(",", ":"),
            )
        else:
            clock = time.strftime("%H:%M:%S")
            if d.verified and d.event is not None:
                mark = self._paint("verified", "32")
                line = f"{clock}  {mark}  {describe(d.event)}"
            else:
                line = f"{clock}  {self._paint('REFUSED', '31')}  {d.problem}"
            if d.forwarded is not None:
                line += f"  -> forwarded: {d.forwarded}"
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()

    def note(self, text: str) -> None:
        """A status line (on stderr with --json, so stdout stays one JSON object a line)."""
        stream = sys.stderr if self.as_json else self.out
        with self._lock:
            stream.write(text + "\n")
            stream.flush()


class Forwarder:
    """POSTs a verified delivery to the developer's app: same body bytes, same headers."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        import requests

        self.url = url
        self.timeout_s = timeout_s
        self.session = requests.Session()

    def __call__(self, headers: dict[str, str], body: bytes) -> int | str:
        import requests

        keep = {
            name: value
            for name, value in headers.items()
            if name.lower().startswith("x-service-") or name.lower() == "content-type"
        }
        try:
            answer = self.session.post(
                self.url, data=body, headers=keep, timeout=self.timeout_s, allow_redirects=False
            )
        except requests.RequestException as err:
            return f"failed ({type(err).__name__})"
        return answer.status_code


@dataclass
class Receiver:
    """What the HTTP handler needs: the secret, the printer, an optional forwarder."""

    secret: str
    printer: Printer
    forward: Callable[[dict[str, str], bytes], int | str] | None = None
    #: Set once the endpoint (and so the secret) exists; a delivery waits for it.
    ready: threading.Event = field(default_factory=threading.Event)

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        """Verify, print, forward; the status to answer Settle with."""
        if not self.ready.wait(READ_TIMEOUT_S):
            return 503  # no secret to check with yet: Settle retries
        try:
            signing.verify(self.secret, headers, body)
            event = json.loads(body)
        except (signing.SignatureError, ValueError) as err:
            self.printer.delivery(Delivery(False, None, f"{type(err).__name__}: {err}"))
            return 400
        delivery = Delivery(True, event, headers=headers)
        status = 204
        if self.forward is not None:
            delivery.forwarded = self.forward(headers, body)
            # Answer as the app answered, so Settle's retries exercise the app.
            status = delivery.forwarded if isinstance(delivery.forwarded, int) else 502
        self.printer.delivery(delivery)
        return status


def _handler(receiver: Receiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S  # a sender trickling its request is cut off

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per delivery is printed by the receiver

        def _answer(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or "0")
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                receiver.printer.delivery(
                    Delivery(False, None, f"body of {self.headers.get('Content-Length')} bytes")
                )
                self.close_connection = True
                self._answer(413)
                return
            body = self.rfile.read(length)
            headers = {name.lower(): value for name, value in self.headers.items()}
            self._answer(receiver.handle(headers, body))

        def do_GET(self) -> None:
            self._answer(405)

    return Handler


class Api:
    """The few calls `settle listen` makes to Settle's API."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 10.0) -> None:
        import requests

        self.base = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import requests

        try:
            answer = self.session.request(
                method, self.base + path, timeout=self.timeout_s, **kwargs
            )
        except requests.ConnectionError:
            raise ListenError(
                f"nothing answers at {self.base}: start Settle first (settle dev), "
                "or give its URL with --api"
            ) from None
        if answer.status_code >= 400:
            try:
                error = answer.json().get("error", answer.text)
            except ValueError:
                error = answer.text[:200]
            raise ListenError(f"{method} {path} answered {answer.status_code}: {error}")
        return answer.json() if answer.content else None

    def create_endpoint(
        self, name: str, url: str, event_types: list[str], ttl_s: int | None = None
    ) -> tuple[str, str]:
        """A new endpoint -> (id, secret); with `ttl_s` an ephemeral one."""
        body: dict[str, Any] = {"name": name, "url": url, "eventTypes": event_types}
        if ttl_s is not None:
            body["ephemeralTtlSeconds"] = ttl_s
        answer = self._call("POST", "/v1/webhook-endpoints", json=body)
        return answer["webhookEndpoint"]["id"], answer["secret"]

    def renew_endpoint(self, endpoint_id: str, ttl_s: int) -> None:
        self._call("POST", f"/v1/webhook-endpoints/{endpoint_id}/renew", json={"ttlSeconds": ttl_s})

    def delete_endpoint(self, endpoint_id: str) -> None:
        self._call("DELETE", f"/v1/webhook-endpoints/{endpoint_id}")

    def event_types(self) -> list[str]:
        body = self._call("GET", "/v1/event-types")
        return [entry["type"] for entry in body["eventTypes"]]


def _api_key(args: argparse.Namespace) -> str:
    """--api-key, else SETTLE_API_KEY, else the demo key `settle dev` keeps in its data dir."""
    from services.devdata import read_demo
    from shared.settings import data_dir

    key = args.api_key or os.environ.get("SETTLE_API_KEY")
    if not key:
        key = read_demo(data_dir(os.environ)).get("apiKey")
    if not key:
        raise ListenError(
            "no API key: pass --api-key sk_... or set SETTLE_API_KEY (settle dev prints "
            "its demo key; run settle listen inside its project to use that one)"
        )
    return str(key)


def _event_types(args: argparse.Namespace, api: Api) -> list[str]:
    """--events as given (types or patterns such as `deposit.*`); default `*`: every type,
    including ones a newer Settle adds while listen runs. Patterns are checked by Settle."""
    known = api.event_types()
    if not args.events:
        return ["*"]
    chosen = [t.strip() for spec in args.events for t in spec.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in known and not (t == "*" or t.endswith(".*"))]
    if unknown:
        raise ListenError(
            f"unknown event type(s) {', '.join(unknown)}; the event types are: " + ", ".join(known)
        )
    return chosen


def _keep_alive(
    api: Api, endpoint_id: str, ttl_s: int, stopped: threading.Event, printer: Printer
) -> None:
    """Renew the ephemeral endpoint every third of its ttl until `stopped` (a missed
    renewal or two is survived; the endpoint expires only after a whole ttl without one)."""
    while not stopped.wait(ttl_s / 3):
        try:
            api.renew_endpoint(endpoint_id, ttl_s)
        except ListenError as err:
            printer.note(f"could not renew endpoint {endpoint_id}: {err}")


def run_listen(args: argparse.Namespace) -> int:
    printer = Printer(sys.stdout, as_json=args.json)
    try:
        api = Api(args.api, _api_key(args))
        event_types = _event_types(args, api)
    except ListenError as err:
        sys.stderr.write(f"settle listen: {err}\n")
        return 2

    receiver = Receiver(secret="", printer=printer)  # the secret comes with the endpoint
    if args.forward_to:
        receiver.forward = Forwarder(args.forward_to)
    server = http.server.ThreadingHTTPServer((args.host, args.port), _handler(receiver))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}/"
    try:
        endpoint_id, receiver.secret = api.create_endpoint(
            f"settle listen on {host}:{port}", url, event_types, None if args.keep else args.ttl
        )
        receiver.ready.set()
    except ListenError as err:
        server.server_close()
        sys.stderr.write(
            f"settle listen: {err}\n(Settle accepts http:// and loopback endpoints only in "
            "dev: settle dev, or SETTLE_WEBHOOK_ALLOW_PRIVATE=1)\n"
        )
        return 2

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    # Ctrl-C and SIGTERM both stop serving, then the endpoint is deleted.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped = threading.Event()
    if not args.keep:
        threading.Thread(
            target=_keep_alive,
            args=(api, endpoint_id, args.ttl, stopped, printer),
            name="listen-renew",
            daemon=True,
        ).start()
    printer.note(
        f"Ready: listening on {url} as endpoint {endpoint_id} for "
        f"{', '.join(event_types)}; every delivery is verified with its secret"
    )
    printer.note(f"  secret {receiver.secret}")
    if args.forward_to:
        printer.note(f"  forwarding verified deliveries to {args.forward_to}")
    printer.note(
        "  Ctrl-C to stop"
        + (
            ""
            if args.keep
            else f" (the endpoint is then deleted; if listen dies, it expires {args.ttl} s"
            " after its last renewal)"
        )
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        stopped.set()
        server.server_close()
        if not args.keep:
            try:
                api.delete_endpoint(endpoint_id)
                printer.note(f"deleted endpoint {endpoint_id}")
            except ListenError as err:
                printer.note(f"could not delete endpoint {endpoint_id}: {err}")
    return 0


def _ttl(text: str) -> int:
    if not text.isdigit() or not 5 <= int(text) <= 3600:
        raise argparse.ArgumentTypeError("must be a whole number of seconds from 5 to 3600")
    return int(text)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "listen",
        help="receive, verify and print webhooks locally (registers a dev endpoint)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument(
        "--api",
        default=os.environ.get("SETTLE_API_URL", DEFAULT_API),
        help=f"Settle's base URL (default: $SETTLE_API_URL or {DEFAULT_API})",
    )
    p.add_argument("--api-key", help="an API key with webhooks:write (default: $SETTLE_API_KEY)")
    p.add_argument(
        "--events",
        action="append",
        metavar="TYPES",
        help="event types or patterns (deposit.*) to subscribe to, comma-separated or "
        "repeated (default: *, every type)",
    )
    p.add_argument("--forward-to", metavar="URL", help="also POST each verified delivery here")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--json", action="store_true", help="one JSON object per delivery on stdout")
    p.add_argument(
        "--keep",
        action="store_true",
        help="register a permanent endpoint and keep it when stopping (counts against the limit)",
    )
    p.add_argument(
        "--ttl",
        type=_ttl,
        default=DEFAULT_TTL_S,
        metavar="SECONDS",
        help=f"the endpoint expires this long after listen stops renewing it (default "
        f"{DEFAULT_TTL_S}; 5..3600)",
    )
    p.set_defaults(func=run_listen)
