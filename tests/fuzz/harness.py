"""Property-based API fuzzing with schemathesis, in-process against our WSGI apps.

`fuzz(...)` loads a service's own OpenAPI document from the app, runs schemathesis'
engine over every operation (examples, coverage, fuzzing and, with valid
credentials, stateful sequences over links it infers from the document) and
returns what it saw: requests made, statuses, check failures, and which
documented statuses it never met.

Checks: schemathesis' built-ins (no server error, response schema and content
type conformance, 405 for undocumented methods, stateful resource checks) plus
ours: every status must be listed explicitly on its operation (flask-smorest's
`default` response would otherwise document anything) and every error carries
the DESIGN.md shape `{"error": "<code>: ...", "code": ...}` with a code that fits
its status.
"""

from __future__ import annotations

import os
import time
import urllib.parse
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
import sqlalchemy as sa
from flask import Flask
from schemathesis.engine import events, from_schema
from schemathesis.generation.meta import TestPhase

from shared.db import Database
from shared.idempotency import HEADER as IDEMPOTENCY_HEADER
from shared.idempotency import MAX_KEY_LENGTH
from shared.identity import service as identity
from shared.identity.auth import CSRF_HEADER, SESSION_COOKIE
from shared.identity.models import SCOPES, Member
from tests.conftest import TenantKeys

#: Fixed seed with derandomized generation: CI runs the same requests every time.
SEED = 20261121
MEMBER_PASSWORD = "correct horse battery staple"

#: Multiplies every run's max-examples (e.g. 10 for a deep local run); CI uses 1.
SCALE_ENV = "SETTLE_FUZZ_SCALE"


def max_examples(default: int) -> int:
    """`default` scaled by SETTLE_FUZZ_SCALE."""
    scale = float(os.environ.get(SCALE_ENV, "1") or "1")
    return max(1, round(default * scale))


#: Error codes each status may carry (DESIGN.md "Errors", plus the generic codes of
#: shared/errors.py: conflict, unsupported_media_type, service_unavailable).
CODES_BY_STATUS: dict[int, frozenset[str]] = {
    400: frozenset({"invalid_json", "invalid_request", "unsupported_chain"}),
    401: frozenset({"unauthorized"}),
    403: frozenset({"insufficient_scope", "forbidden"}),
    404: frozenset({"not_found"}),
    405: frozenset({"method_not_allowed"}),
    409: frozenset({"account_exists", "idempotency_key_reused", "conflict"}),
    413: frozenset({"payload_too_large"}),
    415: frozenset({"unsupported_media_type"}),
    422: frozenset({"destination_policy_missing"}),
    429: frozenset({"rate_limited"}),
    500: frozenset({"internal_error"}),
    503: frozenset({"service_unavailable"}),
}

#: Built-in checks left out, and why.
DISABLED_CHECKS = {
    # Its no-auth probe passes requests-only options to werkzeug's test client
    # (schemathesis 4.32 + WSGI: TypeError "max_redirects"); the no-key and bad-key
    # runs below test the same thing directly.
    "ignored_auth": False,
    # "Schema-valid" is not "valid": a token must be one of the chain's assets, a
    # cursor one we gave out, an address one of the tenant's. Such rules answer 4xx
    # by design and no schema can state them.
    "positive_data_acceptance": False,
    # OPTIONS on /deposit-accounts/x/destination lists GET because that URL also
    # reads the account whose externalUserId is "x/destination" (ids may hold "/").
    "allow_header_conformance": False,
}


# -- checks -------------------------------------------------------------------------


def _documented_statuses(case: schemathesis.Case) -> set[str]:
    return set(case.operation.definition.raw.get("responses", {}))


def status_code_listed(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """The status is listed on the operation itself, not only covered by `default`."""
    if response.request.method.upper() != case.operation.method.upper():
        return None  # a probe with an undocumented method: unsupported_method judges it
    listed = _documented_statuses(case) - {"default"}
    status = str(response.status_code)
    if status not in listed and f"{status[0]}XX" not in listed:
        raise AssertionError(
            f"{case.operation.label} answered {status}, which its OpenAPI entry does not "
            f"list (listed: {', '.join(sorted(listed))})"
        )
    return True


def error_shape(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """Every 4xx/5xx is `{"error": "<code>: <message>", "code": "<code>", "details"?}`."""
    if response.status_code < 400:
        return None
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"error body is not JSON: {response.text[:200]!r}") from None
    if not isinstance(body, dict):
        raise AssertionError(f"error body is not an object: {body!r}")
    code, error = body.get("code"), body.get("error")
    if not isinstance(code, str) or not isinstance(error, str):
        raise AssertionError(f"error body lacks string `code` and `error`: {body!r}")
    if not error.startswith(f"{code}: ") or len(error) <= len(code) + 2:
        raise AssertionError(f"`error` does not read '{code}: <message>': {error!r}")
    allowed = CODES_BY_STATUS.get(response.status_code)
    if allowed is None or code not in allowed:
        raise AssertionError(f"code {code!r} does not fit status {response.status_code}")
    extra = set(body) - {"error", "code", "details"}
    if extra or not isinstance(body.get("details", {}), dict):
        raise AssertionError(f"unexpected error fields: {body!r}")
    return True


def register_checks() -> None:
    """Register our checks with schemathesis (idempotent)."""
    schemathesis.check(status_code_listed)
    schemathesis.check(error_shape)


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]
) -> None:
    """Stateful sequences: a fresh value for every usable Idempotency-Key.

    Why: the generator repeats small values (e.g. "23505") across scenarios, and the
    same key with the same body is answered with the first response, as the interface
    says, even if that resource was deleted since. Schemathesis' resource check would
    then read the 404 of the next call as "created resource not found". Unusable keys
    are kept (they must still give 400); the other phases keep every generated key.
    """
    meta = case.meta
    key = (case.headers or {}).get(IDEMPOTENCY_HEADER)
    if meta is None or meta.phase.name != TestPhase.STATEFUL or key is None:
        return
    if 1 <= len(key) <= MAX_KEY_LENGTH and key.isprintable():
        case.headers[IDEMPOTENCY_HEADER] = uuid.uuid4().hex


# -- credentials --------------------------------------------------------------------


@dataclass
class Portal:
    """A signed-in owner of the tenant, kept so: the fuzzer may sign out, demote or
    remove the member (with the tenant's key it may), and the next case gets an owner's
    live session again."""

    db: Database
    tenant_id: str
    email: str
    token: str | None = None
    csrf: str | None = None

    @classmethod
    def for_tenant(cls, db: Database, tenant_id: str) -> Portal:
        email = f"fuzz-{uuid.uuid4().hex[:10]}@example.com"
        portal = cls(db, tenant_id, email)
        portal._owner()
        return portal

    def _owner(self) -> Member:
        """The member, an owner, made again if the fuzzer removed it."""
        with self.db.transaction() as session:
            member = session.execute(
                sa.select(Member).where(Member.email == self.email)
            ).scalar_one_or_none()
            if member is None:
                member = identity.add_member(
                    session, self.tenant_id, self.email, "owner", MEMBER_PASSWORD
                )
            member.role = "owner"
            session.flush()
            session.expunge(member)
            return member

    def current(self) -> tuple[str, str]:
        """(session token, CSRF token) of a live owner's session."""
        if self.token is not None and self.csrf is not None:
            live = identity.authenticate_session(self.db, self.token)
            if live is not None and live.role == "owner":
                return self.token, self.csrf
        # A new session without the password check: sign-in has tests of its own.
        member = self._owner()
        with self.db.transaction() as session:
            issued = identity.open_session(session, session.merge(member))
        self.token, self.csrf = issued.token, issued.csrf_token
        return self.token, self.csrf


@dataclass
class KeyHolder:
    """A full-scope key of the tenant, replaced when the fuzzer revokes it (it may:
    `DELETE /v1/api-keys/{apiKeyId}` with the key's own id)."""

    db: Database
    tenant_id: str
    key: str

    def current(self) -> str:
        if identity.authenticate_key(self.db, self.key) is None:
            with self.db.transaction() as session:
                self.key = identity.create_api_key(session, self.tenant_id, SCOPES).api_key
        return self.key


@dataclass(frozen=True)
class Credentials:
    """What a request carries: an API key, and a portal session (cookie + CSRF)."""

    api_key: str | None
    portal: Portal | None = None
    session_token: str | None = None
    csrf_token: str | None = None
    keys: KeyHolder | None = None

    def resolve(self) -> tuple[str | None, str | None, str | None]:
        """(API key, session token, CSRF token), each live when it can be."""
        key = self.keys.current() if self.keys is not None else self.api_key
        if self.portal is not None:
            return (key, *self.portal.current())
        return key, self.session_token, self.csrf_token


def provider_for(credentials: Credentials) -> type:
    """A schemathesis auth provider class that applies `credentials` to every case."""

    class Provider:
        def get(self, case: schemathesis.Case, context: schemathesis.AuthContext) -> Any:
            return credentials.resolve()

        def set(
            self, case: schemathesis.Case, data: Any, context: schemathesis.AuthContext
        ) -> None:
            key, token, csrf = data
            if key is not None:
                case.headers["Authorization"] = f"Bearer {key}"
            if token is not None:
                case.cookies = {**(case.cookies or {}), SESSION_COOKIE: token}
            if csrf is not None:
                case.headers[CSRF_HEADER] = csrf

    return Provider


def valid_credentials(db: Database, tenant: TenantKeys) -> Credentials:
    """Full-scope API key and an owner's live session of `tenant`.

    A request with a key is judged by the key alone, so the session serves only the
    routes members alone reach; `session_credentials` runs everything by session.
    """
    return Credentials(
        tenant.api_key,
        Portal.for_tenant(db, tenant.tenant_id),
        keys=KeyHolder(db, tenant.tenant_id, tenant.api_key),
    )


def session_credentials(db: Database, tenant: TenantKeys) -> Credentials:
    """An owner's live session of `tenant` and no API key: every route by session."""
    return Credentials(None, Portal.for_tenant(db, tenant.tenant_id))


def bad_credentials() -> Credentials:
    """Well-formed but unknown key, session and CSRF token."""
    return Credentials(
        api_key=f"sk_{uuid.uuid4().hex}{uuid.uuid4().hex}",
        session_token=uuid.uuid4().hex,
        csrf_token=uuid.uuid4().hex,
    )


# -- running ------------------------------------------------------------------------


class CountingApp:
    """WSGI middleware counting the requests that reach the app, by status."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.requests = 0
        self.statuses: Counter[int] = Counter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        self.requests += 1

        def counting_start(status: str, headers: Any, *rest: Any) -> Any:
            self.statuses[int(status.split(" ", 1)[0])] += 1
            return start_response(status, headers, *rest)

        return self.app(environ, counting_start)


@dataclass
class Variant:
    """One fuzz run's credentials and budget."""

    name: str
    credentials: Credentials | None
    max_examples: int
    #: Phases to run; the unauthenticated runs skip coverage and stateful (all 401).
    phases: tuple[str, ...] = ("examples", "coverage", "fuzzing", "stateful")
    parameters: dict[str, str] = field(default_factory=dict)
    #: Unauthenticated runs expect 401 from every operation that declares security.
    expect_unauthorized: bool = False


@dataclass
class FuzzReport:
    service: str
    variant: str
    requests: int
    seconds: float
    statuses: Counter[int]
    failures: dict[tuple[str, str], list[str]]
    errors: list[str]
    #: Operation label -> statuses seen in responses to generated cases.
    observed: dict[str, set[int]]
    #: Operation label -> statuses its OpenAPI entry lists.
    documented: dict[str, set[str]]
    operations: int
    transitions: int = 0

    def problems(self) -> list[str]:
        """One paragraph per distinct failure (first example each), then engine errors."""
        out = []
        for (label, check), examples in sorted(self.failures.items()):
            out.append(f"[{self.variant}] {label} -- {check} ({len(examples)}x)\n{examples[0]}")
        out.extend(f"[{self.variant}] {error}" for error in self.errors)
        return out

    def never_seen(self) -> dict[str, list[str]]:
        """Documented statuses no generated request produced (a lead for the docs review)."""
        unseen: dict[str, list[str]] = {}
        for label, listed in sorted(self.documented.items()):
            seen = {str(s) for s in self.observed.get(label, set())}
            missing = sorted(listed - seen - {"default"})
            if missing:
                unseen[label] = missing
        return unseen

    def summary(self) -> str:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items()))
        links = f", {self.transitions} stateful links" if self.transitions else ""
        return (
            f"{self.service} [{self.variant}]: {self.requests} requests over "
            f"{self.operations} operations{links} in {self.seconds:.1f} s ({statuses})"
        )


def fuzz_config(variant: Variant) -> schemathesis.Config:
    """The schemathesis configuration of one run: seeded, derandomized, bounded."""
    checks: dict[str, Any] = {name: {"enabled": on} for name, on in DISABLED_CHECKS.items()}
    phases = {
        name: {"enabled": name in variant.phases}
        for name in ("examples", "coverage", "fuzzing", "stateful")
    }
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {
                "mode": "all",
                "max-examples": variant.max_examples,
                "deterministic": True,
                "database": "none",
                # No generated credentials: the provider sets ours (or none), so the
                # budget goes to inputs; the no-key and bad-key runs cover 401s.
                "with-security-parameters": False,
            },
            "checks": checks,
            "phases": phases,
            "parameters": dict(variant.parameters),
        }
    )


def load_schema(app: Flask, openapi_path: str, variant: Variant) -> tuple[Any, CountingApp]:
    """The app's own OpenAPI document as a schemathesis schema, requests in-process."""
    counting = CountingApp(app)
    schema = schemathesis.openapi.from_wsgi(openapi_path, counting, config=fuzz_config(variant))
    # The document was fetched through the counter: count the fuzzing only.
    counting.requests, counting.statuses = 0, Counter()
    return schema, counting


def fuzz(app: Flask, openapi_path: str, service: str, variant: Variant) -> FuzzReport:
    """Run schemathesis' engine over every operation of `app`'s OpenAPI document."""
    register_checks()
    schema, counting = load_schema(app, openapi_path, variant)
    if variant.credentials is not None:
        # refresh_interval=None: ask for credentials on every case (the session may have
        # been ended by DELETE /v1/sessions/current), and never replay on a 401.
        schema.auth(refresh_interval=None)(provider_for(variant.credentials))
    documented: dict[str, set[str]] = {}
    secured: set[str] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        documented[operation.label] = set(operation.definition.raw.get("responses", {}))
        if operation.definition.raw.get("security"):
            secured.add(operation.label)
    failures: dict[tuple[str, str], list[str]] = defaultdict(list)
    errors: list[str] = []
    observed: dict[str, set[int]] = defaultdict(set)
    transitions = 0
    started = time.monotonic()
    for event in from_schema(schema).execute():
        if isinstance(event, events.PhaseStarted) and isinstance(
            event.payload, events.StatefulPhasePayload
        ):
            transitions = event.payload.transitions_selected
        elif isinstance(event, events.ScenarioFinished):
            _collect(event.recorder, failures, observed, secured, variant)
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.title}: {event.info.message}")
        elif isinstance(event, events.FatalError):
            errors.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.EngineFinished):
            errors.extend(f"after run: {failure.title}" for failure in event.failures)
    return FuzzReport(
        service=service,
        variant=variant.name,
        requests=counting.requests,
        seconds=time.monotonic() - started,
        statuses=counting.statuses,
        failures=dict(failures),
        errors=errors,
        observed=dict(observed),
        documented=documented,
        operations=len(documented),
        transitions=transitions,
    )


def _collect(
    recorder: Any,
    failures: dict[tuple[str, str], list[str]],
    observed: dict[str, set[int]],
    secured: set[str],
    variant: Variant,
) -> None:
    """Failed checks and observed statuses of one scenario; 401 checks when unauthenticated."""
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.failure_info is not None:
                info = check.failure_info
                label = recorder.cases[case_id].value.operation.label
                message = f"{info.failure.title}: {info.failure.message}\n  {info.code_sample}"
                failures[(label, check.name)].append(message)
    for case_id, interaction in recorder.interactions.items():
        node = recorder.cases.get(case_id)
        if node is None or interaction.response is None:
            continue
        case = node.value
        label = case.operation.label
        if case.method.upper() != case.operation.method.upper():
            continue  # a probe with another method (405 checks)
        status = interaction.response.status_code
        observed[label].add(status)
        if variant.expect_unauthorized and label in secured and status != 401:
            if status == 400 and _holds_a_control_character(interaction.request.uri):
                continue  # refused before routing, as the ingress refuses it (issue 23)
            message = f"without valid credentials {label} answered {status}, not 401"
            failures[(label, "unauthenticated_is_401")].append(message)


def _holds_a_control_character(uri: str) -> bool:
    """Whether a request's path or query holds a control character: every route answers
    400 to that before anything else (shared/api.py), as nginx does for its own part."""
    text = urllib.parse.unquote_plus(uri.partition("://")[2] or uri)
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)


# -- reporting ----------------------------------------------------------------------

#: Where each session's reports are kept for the terminal summary.
REPORTS = pytest.StashKey[list[FuzzReport]]()


def remember(config: pytest.Config, report: FuzzReport) -> None:
    config.stash.setdefault(REPORTS, []).append(report)


def summary_lines(reports: Iterable[FuzzReport]) -> list[str]:
    reports = list(reports)
    lines = [report.summary() for report in reports]
    by_service: dict[str, tuple[int, float]] = {}
    for report in reports:
        count, seconds = by_service.get(report.service, (0, 0.0))
        by_service[report.service] = (count + report.requests, seconds + report.seconds)
    for service, (count, seconds) in sorted(by_service.items()):
        lines.append(f"{service}: {count} requests fuzzed in {seconds:.1f} s")
    return lines


# -- body limit ---------------------------------------------------------------------

#: Just over DESIGN.md's 256 KiB body limit.
OVERSIZED = b'{"pad": "' + b"x" * (256 * 1024) + b'"}'
UNSAFE_METHODS = ("post", "put", "patch")


def oversized_body_problems(
    app: Flask, openapi_path: str, credentials: Credentials, path_values: dict[str, str]
) -> tuple[int, list[str]]:
    """Send a body over the limit to every POST/PUT/PATCH; each must answer a documented 413.

    Returns (operations probed, problems). An Idempotency-Key goes along, so even
    routes without a body schema read the body (to fingerprint it).
    """
    client = app.test_client()
    document = client.get(openapi_path).get_json()
    key, token, csrf = credentials.resolve()
    headers = {"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if csrf is not None:
        headers[CSRF_HEADER] = csrf
    if token is not None:
        client.set_cookie(SESSION_COOKIE, token, path="/v1")
    probed, problems = 0, []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method not in UNSAFE_METHODS:
                continue
            probed += 1
            url = _fill(path, path_values)
            response = client.open(url, method=method.upper(), data=OVERSIZED, headers=headers)
            label = f"{method.upper()} {path}"
            body = response.get_json(silent=True) or {}
            if response.status_code != 413 or body.get("code") != "payload_too_large":
                problems.append(f"{label}: {response.status_code} {body} for a body over 256 KiB")
            if "413" not in operation["responses"]:
                problems.append(f"{label}: answers 413 but its OpenAPI entry does not list it")
    return probed, problems


def _fill(path: str, values: dict[str, str]) -> str:
    """`path` with each `{name}` replaced by values[name] or `x`."""
    out, rest = "", path
    while "{" in rest:
        head, _, tail = rest.partition("{")
        name, _, rest = tail.partition("}")
        out += head + values.get(name, "x")
    return out + rest
