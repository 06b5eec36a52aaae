"""`settle sweep plan|sign|send|status`: ops bring the deposits to the treasury.

    settle sweep plan --chain ID [--min-usd N] [--to ADDRESS] [--all-addresses] --out PLAN.json
    settle sweep sign --plan PLAN.json --key-file FILE [--key-file FILE]...
                      [--expect-destination ADDRESS] --out SIGNED.json      # offline
    settle sweep send SIGNED.json [--no-wait] [--timeout S] [--poll S]
    settle sweep status [--chain ID] [--plan ID] [--limit N]

`sign` reads only its files (no database, no network, no settings). The others read
core's settings: the database, `SETTLE_RPC_URL_<chainId>`, the gas wallet
(`SETTLE_GAS_WALLET_KEY`, else `SETTLE_HOT_WALLET_KEY`) and the default destination
(`SETTLE_TREASURY_ADDRESS`, else the hot wallet's address). Results print as JSON (or a
listing on a terminal); refusals go to stderr with exit 2; a send that ends with
sweeps still open exits 1 (run it again, or `status`).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services import output

if TYPE_CHECKING:
    from services.core.chains import Chain
    from services.core.hot_wallet import Erc20TransferExecutor
    from services.core.sweeps.chain import SweepChain
    from shared.db import Database


class _Setup(RuntimeError):
    """A setting or argument the command cannot run without."""


def _operator() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "ops"


def _refuse(command: str, message: str) -> int:
    sys.stderr.write(f"settle sweep {command}: {message}\n")
    return 2


def _write_new(path: Path, text: str) -> None:
    """Write a file that must not exist yet (a plan or signed file is never overwritten)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


def _chain_setup(chain_id: int) -> tuple[Database, Chain, SweepChain, Erc20TransferExecutor]:
    """The database, the chain, its node and the gas wallet, from core's settings."""
    from services.core.chains import load_chains
    from services.core.config import CoreConfig
    from services.core.hot_wallet import Erc20TransferExecutor
    from services.core.sweeps.chain import SweepChain
    from services.core.sweeps.settings import SweepSettings
    from shared.db import Database

    config = CoreConfig.from_env()
    chain = load_chains(config.chains_file).get(chain_id)
    if chain is None or not chain.assets:
        raise _Setup(f"chain {chain_id} has no supported token in the chains file")
    url = config.rpc_urls.get(chain_id)
    if not url:
        raise _Setup(f"SETTLE_RPC_URL_{chain_id} is not set: sweeps read and send on the chain")
    key = SweepSettings.from_env().gas_wallet_key or config.deposits.hot_wallet_key
    if not key:
        raise _Setup("no gas wallet: set SETTLE_GAS_WALLET_KEY or SETTLE_HOT_WALLET_KEY")
    gas = Erc20TransferExecutor.from_url(url, key, config.deposits.rpc_timeout_s, chain_id=chain_id)
    return Database(config.database_url, pool_size=2), chain, SweepChain(gas.w3), gas


def plan(args: argparse.Namespace) -> int:
    from eth_utils import is_address, is_checksum_address, to_checksum_address

    from services.core.config import CoreConfig
    from services.core.deposits.pricing import PriceFeed, build_prices
    from services.core.evm import ChainIdMismatch
    from services.core.sweeps.documents import canonical
    from services.core.sweeps.planning import PlanError, make_plan
    from services.core.sweeps.settings import SweepSettings

    out = Path(args.out)
    if out.exists():
        return _refuse("plan", f"{out} exists; a plan file is never overwritten")
    try:
        db, chain, io, gas = _chain_setup(args.chain)
    except _Setup as exc:
        return _refuse("plan", str(exc))
    to = args.to or SweepSettings.from_env().treasury_address or gas.address
    if not is_address(to) or (to != to.lower() and not is_checksum_address(to)):
        return _refuse("plan", f"{to!r} is not an address (a mixed-case address must be EIP-55)")
    config = CoreConfig.from_env()
    prices = build_prices(config.deposits)
    if isinstance(prices, PriceFeed):
        prices.refresh()
    try:
        document = make_plan(
            db,
            chain,
            io,
            gas,
            destination=to_checksum_address(to),
            min_usd=args.min_usd,
            prices=prices,
            all_addresses=args.all_addresses,
            created_by=args.by or _operator(),
        )
    except (PlanError, ChainIdMismatch) as exc:
        return _refuse("plan", str(exc))
    finally:
        db.dispose()
    if document is None:
        output.emit({"planId": None, "chainId": chain.chain_id, "addresses": 0})
        return 0
    _write_new(out, canonical(document).decode() + "\n")
    body = document["plan"]
    output.emit(
        {
            "planId": body["planId"],
            "digest": document["digest"],
            "file": str(out.absolute()),
            "chainId": body["chainId"],
            "destination": body["destination"],
            **body["totals"],
        }
    )
    return 0


def sign(args: argparse.Namespace) -> int:
    from services.core.keyfiles import KeyFileError, load_key_file
    from services.core.sweeps.documents import PLAN_KIND, SweepFileError, canonical, load
    from services.core.sweeps.signer import sign_plan

    out = Path(args.out)
    if out.exists():
        return _refuse("sign", f"{out} exists; a signed file is never overwritten")
    try:
        document = load(Path(args.plan).read_text(encoding="utf-8"), PLAN_KIND)
        keys = [load_key_file(Path(f)) for f in args.key_file]
        signed, summary = sign_plan(document, keys, expect_destination=args.expect_destination)
    except (OSError, KeyFileError, SweepFileError) as exc:
        return _refuse("sign", f"refused, nothing signed: {exc}")
    _write_new(out, canonical(signed).decode() + "\n")
    sys.stderr.write("".join(f"  {line}\n" for line in summary.lines()))
    output.emit(
        {
            "planId": summary.plan_id,
            "planDigest": summary.digest,
            "chainId": summary.chain_id,
            "destination": summary.destination,
            "transactions": summary.transactions,
            "assets": summary.assets,
            "file": str(out.absolute()),
        }
    )
    return 0


def send(args: argparse.Namespace) -> int:
    from services.core.config import CoreConfig
    from services.core.deposits.payments import NonceGap
    from services.core.sweeps.documents import SIGNED_KIND, SweepFileError, load
    from services.core.sweeps.sending import Sender

    try:
        signed = load(Path(args.signed).read_text(encoding="utf-8"), SIGNED_KIND)
        chain_id = int(signed["chainId"])
    except (OSError, KeyError, TypeError, ValueError) as exc:
        return _refuse("send", f"refused, nothing sent: {exc}")
    try:
        db, chain, io, gas = _chain_setup(chain_id)
    except _Setup as exc:
        return _refuse("send", str(exc))
    try:
        config = CoreConfig.from_env()
        cap = config.deposits.fee_cap_gwei(chain)  # the chain's, as its payouts'
        sender = Sender(
            db,
            chain,
            io,
            gas,
            replace_after_blocks=config.deposits.payment_replace_blocks,
            max_fee_wei=None if cap is None else int(cap * 10**9),
        )
        plan_id = sender.accept(signed)
        outcome = sender.run(
            plan_id, wait=not args.no_wait, timeout_s=args.timeout, poll_s=args.poll
        )
    except SweepFileError as exc:
        return _refuse("send", f"refused, nothing sent: {exc}")
    except NonceGap as gap:
        return _refuse(
            "send",
            f"stopped: {gap}. Gas top-ups and payouts on chain {chain_id} are paused until "
            "a person resolves its nonce_gap incident (settle incidents list; "
            "docs/RECONCILE.md); then run this send again: it resumes",
        )
    finally:
        db.dispose()
    output.emit(outcome.document())
    return 0 if outcome.open == 0 or args.no_wait else 1


def status(args: argparse.Namespace) -> int:
    from services.core.config import CoreConfig
    from services.core.sweeps import store
    from shared.db import Database

    db = Database(CoreConfig.from_env().database_url, pool_size=1)
    try:
        with db.reader() as session:
            if args.plan:
                found = store.plan(session, args.plan)
                if found is None:
                    return _refuse("status", f"no plan {args.plan}")
                plans = [found]
            else:
                plans = store.plans(session, args.chain, args.limit)
            counts = store.status_counts(session, [p.id for p in plans])
            payload: dict[str, Any] = {
                "plans": [
                    {
                        "planId": p.id,
                        "chainId": p.chain_id,
                        "createdAt": p.document.get("createdAt"),
                        "destination": p.destination,
                        "sweeps": counts.get(p.id, {}),
                    }
                    for p in plans
                ]
            }
            if args.plan:
                payload["sweeps"] = [
                    {
                        "address": s.deposit_address,
                        "asset": s.asset,
                        "amountRaw": s.amount_raw,
                        "nonce": s.nonce,
                        "status": s.status,
                        "txHash": s.tx_hash,
                        "block": s.block_number,
                        "detail": s.detail,
                    }
                    for s in store.sweeps_of(session, args.plan)
                ]
                payload["gasTopUps"] = [
                    {
                        "address": f.deposit_address,
                        "amountWei": f.amount_wei,
                        "status": f.status,
                        "txHash": f.tx_hash,
                        "block": f.block_number,
                    }
                    for f in store.fundings_of(session, args.plan)
                ]
    finally:
        db.dispose()
    output.emit(payload)
    return 0


def _usd(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError("must be a number >= 0")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sweep = sub.add_parser(
        "sweep", help="deposits to the treasury (plan, sign offline, send, status)"
    ).add_subparsers(dest="action", required=True)

    p = sweep.add_parser("plan", help="what the chain's deposit addresses hold and would move")
    p.add_argument("--chain", type=int, required=True, metavar="ID")
    p.add_argument(
        "--min-usd",
        type=_usd,
        default=Decimal(0),
        metavar="N",
        help="only tokens worth at least N USD at an address (default 0: any)",
    )
    p.add_argument(
        "--to",
        metavar="ADDRESS",
        help="destination (default SETTLE_TREASURY_ADDRESS, else the hot wallet)",
    )
    p.add_argument(
        "--all-addresses",
        action="store_true",
        help="read every deposit address, not only those that received a deposit",
    )
    p.add_argument("--by", metavar="NAME", help="who plans (default: the OS user)")
    p.add_argument("--out", required=True, metavar="PLAN.json")
    p.set_defaults(func=plan)

    p = sweep.add_parser("sign", help="sign a plan with the deposit key (offline)")
    p.add_argument("--plan", required=True, metavar="PLAN.json")
    p.add_argument(
        "--key-file",
        required=True,
        action="append",
        metavar="FILE",
        help="a key file (words or xprv); repeat for a plan spanning a rotation",
    )
    p.add_argument(
        "--expect-destination",
        metavar="ADDRESS",
        help="refuse unless the plan pays this address (the treasury you know)",
    )
    p.add_argument("--out", required=True, metavar="SIGNED.json")
    # Offline: neither a database nor a data dir (services.cli checks this flag).
    p.set_defaults(func=sign, needs_data_dir=False)

    p = sweep.add_parser("send", help="fund gas, broadcast, follow to depth, record")
    p.add_argument("signed", metavar="SIGNED.json")
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="return once everything is broadcast (run again, or status, to follow)",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=1800.0,
        metavar="S",
        help="stop following after S seconds (default 1800); run again to resume",
    )
    p.add_argument("--poll", type=_seconds, default=2.0, metavar="S", help="seconds between looks")
    p.set_defaults(func=send)

    p = sweep.add_parser("status", help="plans and their sweeps")
    p.add_argument("--chain", type=int, metavar="ID")
    p.add_argument("--plan", metavar="ID", help="one plan, with each sweep and gas top-up")
    p.add_argument("--limit", type=int, default=20, metavar="N")
    p.set_defaults(func=status)
