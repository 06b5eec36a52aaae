"""Write compose's .env from .env.example, with every secret generated.

    python3 deploy/make_env.py [--xpub XPUB] [--out .env]

Fills the required settings of .env.example that are secrets: SETTLE_SECRET_KEY (32
random bytes), the PostgreSQL, RabbitMQ (one per service user) and Grafana passwords
(URL-safe: they go into URLs). SETTLE_DEPOSIT_XPUB is the public half of a key pair made
offline (`settle keys new --out FILE`): pass it with --xpub, or fill it in after.
Every other line of .env.example is kept, so the optional settings are there to
uncomment. An existing file is never overwritten; the new one is readable by its owner
only. Python's standard library only: it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / ".env.example"
#: Generated secrets: name -> how many random bytes (URL-safe base64).
SECRETS = {
    "SETTLE_SECRET_KEY": 32,
    "SETTLE_POSTGRES_PASSWORD": 24,
    "SETTLE_AMQP_CORE_PASSWORD": 24,
    "SETTLE_AMQP_NOTIFIER_PASSWORD": 24,
    "SETTLE_GRAFANA_ADMIN_PASSWORD": 24,
}
_XPUB = re.compile(r"^[tx]pub[1-9A-HJ-NP-Za-km-z]{100,112}$")


def render(example: str, xpub: str | None) -> str:
    """.env.example with its secrets (and the xpub, when given) filled in."""
    values = {name: secrets.token_urlsafe(size) for name, size in SECRETS.items()}
    if xpub:
        values["SETTLE_DEPOSIT_XPUB"] = xpub
    lines = []
    for line in example.splitlines():
        name, sep, value = line.partition("=")
        if sep and name in values and not value.strip():
            line = f"{name}={values.pop(name)}"
        lines.append(line)
    missing = sorted(set(values) - ({"SETTLE_DEPOSIT_XPUB"} if xpub else set()))
    if missing:
        raise ValueError(f".env.example has no empty line for {', '.join(missing)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xpub", help="the deposit key's xpub (settle keys new)")
    parser.add_argument("--out", type=Path, default=ROOT / ".env")
    parser.add_argument("--example", type=Path, default=EXAMPLE)
    args = parser.parse_args(argv)
    if args.xpub and not _XPUB.match(args.xpub):
        parser.error("--xpub is not an extended public key (xpub...)")
    if args.out.exists():
        parser.error(f"{args.out} exists; it is never overwritten (move it away first)")
    text = render(args.example.read_text(encoding="utf-8"), args.xpub)
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {args.out} (mode 0600): {', '.join(SECRETS)} generated", file=sys.stderr)
    if not args.xpub:
        print(
            "SETTLE_DEPOSIT_XPUB is still empty: run `settle keys new --out FILE` "
            "and put the xpub it prints there",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
