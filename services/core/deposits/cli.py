"""`settle deposits credit|fail`: ops resolve a deposit by hand, recording who and why;
`settle deposits retry`: a deposit in manual review back into settlement.
`settle incidents list|resolve`: the chain incidents Settle raised (incidents.py).

Allowed for deposits in manual review, or stuck (no progress for
SETTLE_OPS_STUCK_AFTER_S); also days later: the transition is emitted as its durable
event like any other. Never while a hot-wallet payment of the deposit may still be
mined, unless `--tx` is one of its transactions (the refusal says why and what to do).
Prints `{"deposit": {...}}` (`{"chainIncidents": [...]}`,
`{"chainIncident": {...}}`); errors go to stderr with exit 2.
"""

from __future__ import annotations

import argparse
import getpass
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from services import output
from services.commands import guarded
from services.support import add_deposit_commands, ops_only

if TYPE_CHECKING:
    from services.core.deposits.incidents import Incidents
    from services.core.deposits.models import Deposit
    from services.core.deposits.ops import Ops

_TX_HASH = re.compile(r"^0x[0-9a-fA-F]{64}$")


def build_ops() -> Ops:
    """The ops use case from the environment (the CLI's own small pool)."""
    # Imported here, not at the top: settlement pulls in web3, which every other
    # `settle` command would otherwise load at start.
    from services.core.chains import load_chains
    from services.core.config import CoreConfig
    from services.core.deposits.ops import Ops
    from services.core.deposits.settlement import Settlement
    from services.core.deposits.worker import build_payers
    from shared.db import Database

    config = CoreConfig.from_env()
    registry = load_chains(config.chains_file)
    # The payers the worker has: an in-flight hot-wallet payment is checked on its chain
    # before ops may resolve the deposit by hand.
    payers = build_payers(registry, config.rpc_urls, config.deposits)
    separate_log = config.identity_database_url != config.database_url
    return Ops(
        Database(config.database_url, pool_size=1),
        registry,
        Settlement(registry, payers=payers),
        config.deposits,
        audit_log=Database(config.identity_database_url, pool_size=1) if separate_log else None,
    )


def build_incidents() -> Incidents:
    """The incidents use case from the environment (the CLI's own small pool), with each
    chain's hot-wallet payouts where a node and the key are set (a nonce gap is checked
    on chain before it is resolved)."""
    from services.core.chains import load_chains
    from services.core.config import CoreConfig
    from services.core.deposits.incidents import Incidents
    from services.core.deposits.payout_audit import scanners_from
    from shared.db import Database

    config = CoreConfig.from_env()
    registry = load_chains(config.chains_file)
    return Incidents(
        Database(config.database_url, pool_size=1),
        scanners=scanners_from(registry, config.rpc_urls, config.deposits),
    )


def _print(deposit: Deposit) -> None:
    from services.core.deposits.serialize import deposit_document

    output.emit({"deposit": deposit_document(deposit)})


def _operator(name: str | None) -> str:
    if name:
        return name
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "ops"


def _with_ops(ops: Ops | None, act: Callable[[Ops], Deposit]) -> int:
    """Run an ops use case (on the environment's when none is given) and print the
    deposit it returns."""
    own = ops is None
    ops = ops or build_ops()
    try:
        deposit = act(ops)
    finally:
        if own:
            ops.db.dispose()
    _print(deposit)
    return 0


def credit(args: argparse.Namespace, ops: Ops | None = None) -> int:
    if not _TX_HASH.match(args.tx):
        sys.stderr.write("error: invalid_request: --tx must be 0x followed by 64 hex characters\n")
        return 2
    by = _operator(args.by)
    return _with_ops(
        ops, lambda o: o.credit(args.deposit_id, args.tx.lower(), by=by, reason=args.reason)
    )


def fail(args: argparse.Namespace, ops: Ops | None = None) -> int:
    if not args.reason.strip():
        sys.stderr.write("error: invalid_request: --reason must not be empty\n")
        return 2
    by = _operator(args.by)
    return _with_ops(ops, lambda o: o.fail(args.deposit_id, args.reason.strip(), by=by))


def retry(args: argparse.Namespace, ops: Ops | None = None) -> int:
    by = _operator(args.by)
    return _with_ops(ops, lambda o: o.retry(args.deposit_id, by=by, reason=args.reason))


def incidents_list(args: argparse.Namespace, incidents: Incidents | None = None) -> int:
    from services.core.deposits.incidents import incident_document

    own = incidents is None
    incidents = incidents or build_incidents()
    try:
        rows = incidents.list(chain_id=args.chain, include_resolved=args.all, limit=args.limit)
    finally:
        if own:
            incidents.db.dispose()
    output.emit({"chainIncidents": [incident_document(i) for i in rows]})
    return 0


def incidents_resolve(args: argparse.Namespace, incidents: Incidents | None = None) -> int:
    from services.core.deposits.incidents import incident_document

    own = incidents is None
    incidents = incidents or build_incidents()
    try:
        incident = incidents.resolve(args.incident_id, by=_operator(args.by), reason=args.reason)
    finally:
        if own:
            incidents.db.dispose()
    output.emit({"chainIncident": incident_document(incident)})
    return 0


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 1000")
    return int(text)


def _chain_id(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 2**31:
        raise argparse.ArgumentTypeError(f"not a chain id: {text[:40]!r}")
    return int(text)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    deposits = sub.add_parser(
        "deposits",
        help="deposits: list and show over the API; credit, fail, retry (ops-only, server-side)",
    ).add_subparsers(dest="action", required=True)
    add_deposit_commands(deposits)
    p = deposits.add_parser(
        "credit",
        help="ops-only, server-side: mark a deposit credited by hand (manual review or stuck)",
    )
    p.add_argument("deposit_id", metavar="DEPOSIT_ID")
    p.add_argument("--tx", required=True, help="hash of the transaction that paid the credit")
    p.add_argument("--by", help="who is acting (default: the OS user)")
    p.add_argument("--reason", help="why, for the record")
    ops_only(p, "deposits credit", guarded(credit))
    p = deposits.add_parser("fail", help="ops-only, server-side: mark a deposit failed by hand")
    p.add_argument("deposit_id", metavar="DEPOSIT_ID")
    p.add_argument("--reason", required=True, help="becomes the deposit's failureReason")
    p.add_argument("--by", help="who is acting (default: the OS user)")
    ops_only(p, "deposits fail", guarded(fail))
    p = deposits.add_parser(
        "retry",
        help="ops-only, server-side: put a deposit in manual review back into settlement",
    )
    p.add_argument("deposit_id", metavar="DEPOSIT_ID")
    p.add_argument("--reason", help="why, for the record (e.g. the hot wallet was topped up)")
    p.add_argument("--by", help="who is acting (default: the OS user)")
    ops_only(p, "deposits retry", guarded(retry))

    incidents = sub.add_parser(
        "incidents", help="chain incidents Settle raised (ops)"
    ).add_subparsers(dest="action", required=True)
    p = incidents.add_parser("list", help="open chain incidents, newest first")
    p.add_argument("--chain", type=_chain_id, help="only this chain id")
    p.add_argument("--all", action="store_true", help="resolved ones too")
    p.add_argument("--limit", type=_limit, default=100, help="at most this many (1-1000)")
    p.set_defaults(func=guarded(incidents_list))
    p = incidents.add_parser(
        "resolve",
        help="close an incident, saying why (a nonce gap: checked on chain, then payments resume)",
    )
    p.add_argument("incident_id", metavar="INCIDENT_ID")
    p.add_argument("--reason", required=True, help="what was checked or done, for the record")
    p.add_argument("--by", help="who is acting (default: the OS user)")
    p.set_defaults(func=guarded(incidents_resolve))
