"""RabbitMQ definitions for Settle: its users and its quorum queues.

One user per service, each with least privilege:

    settle-core      declares and publishes to `settle.events`; reads nothing
    settle-notifier  declares, binds and consumes its own queues, dead-letters to
                     `settle.events.dlx`, publishes its delivery jobs through the
                     default exchange; it cannot publish to `settle.events`

and no guest: RabbitMQ does not create its default user when it loads definitions
at boot. compose runs this script once (service `rabbitmq-definitions`), and the
broker loads the file on every start (`deploy/rabbitmq/rabbitmq.conf`), so a changed
password takes effect with a restart. `rabbitmqctl import_definitions FILE` loads
it into a running broker (it adds and updates, never deletes).

Passwords come from the environment and are stored only as salted SHA-256 hashes
(RabbitMQ's `rabbit_password_hashing_sha256`). They also go in AMQP URLs: use
URL-safe characters, e.g. `python -c "import secrets; print(secrets.token_urlsafe(24))"`.

    SETTLE_AMQP_CORE_PASSWORD, SETTLE_AMQP_NOTIFIER_PASSWORD   required
    SETTLE_AMQP_CORE_USER (settle-core), SETTLE_AMQP_NOTIFIER_USER (settle-notifier),
    SETTLE_AMQP_VHOST (/), SETTLE_AMQP_PREFIX (empty: the services' own prefix)

The exchanges, queues and bindings are Settle's topology (shared/topology.py): quorum
queues with a delivery limit and dead-letter queues, so a cluster replicates them from
its first boot. The services declare the same. A deployment whose queues are classic
ones (from before) runs `settle notifier upgrade-queues` before its broker loads this
file (docs/DEPLOY.md): RabbitMQ refuses a queue declared again with another type.

Standard library only: it runs in a plain python image, with shared/topology.py
mounted next to it (compose) or found in the checkout it belongs to.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).parent)]
try:
    from shared import topology
except ImportError:  # compose: topology.py mounted next to this file
    import topology  # type: ignore[no-redef]

#: Queues of the notifier's delivery jobs (Dramatiq adds `.DQ` and `.XQ` to each).
JOB_QUEUES = topology.JOB_QUEUE


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))."""
    salt = secrets.token_bytes(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def permissions(prefix: str = "") -> dict[str, dict[str, str]]:
    """Configure, write and read patterns of each role, for names under `prefix`."""
    p = re.escape(prefix)
    events = rf"{p}settle\.events"
    own = rf"{p}settle\.notifier\..*|{p}{JOB_QUEUES}(\..*)?"
    return {
        "core": {"configure": rf"^{events}$", "write": rf"^{events}$", "read": "^$"},
        "notifier": {
            # It declares the events exchange too, so it may start before core.
            "configure": rf"^({events}|{events}\.dlx|{own})$",
            # No settle.events: it cannot publish an event. Jobs go through the
            # default exchange; a message it sent straight to its event queue that way
            # would carry its own user_id, which the consumer dead-letters.
            "write": rf"^({events}\.dlx|{own}|amq\.default)$",
            "read": rf"^({events}|{events}\.dlx|{own})$",
        },
    }


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise SystemExit(f"set {name} (the RabbitMQ password of that service)")
    return value


def definitions(env: Mapping[str, str]) -> dict[str, Any]:
    """The definitions document for the users, passwords and vhost in `env`."""
    vhost = env.get("SETTLE_AMQP_VHOST") or "/"
    roles = {
        "core": (
            env.get("SETTLE_AMQP_CORE_USER") or "settle-core",
            _required(env, "SETTLE_AMQP_CORE_PASSWORD"),
        ),
        "notifier": (
            env.get("SETTLE_AMQP_NOTIFIER_USER") or "settle-notifier",
            _required(env, "SETTLE_AMQP_NOTIFIER_PASSWORD"),
        ),
    }
    prefix = env.get("SETTLE_AMQP_PREFIX", "")
    patterns = permissions(prefix)
    return {
        "users": [
            {
                "name": name,
                "password_hash": password_hash(password),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                # No tags: above all not `impersonator`, which may forge user_id.
                "tags": [],
            }
            for name, password in roles.values()
        ],
        "vhosts": [{"name": vhost}],
        "permissions": [
            {"user": name, "vhost": vhost, **patterns[role]}
            for role, (name, _password) in roles.items()
        ],
        **topology_definitions(prefix, vhost),
    }


def topology_definitions(prefix: str, vhost: str) -> dict[str, list[dict[str, Any]]]:
    """Settle's exchanges, quorum queues and bindings, as definitions."""
    queues = topology.queues(prefix)
    return {
        "exchanges": [
            {
                "name": name,
                "vhost": vhost,
                "type": kind,
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
            for name, kind in topology.exchanges(prefix)
        ],
        "queues": [
            {
                "name": queue.name,
                "vhost": vhost,
                "durable": True,
                "auto_delete": False,
                "arguments": queue.arguments,
            }
            for queue in queues
        ],
        "bindings": [
            {
                "source": exchange,
                "vhost": vhost,
                "destination": queue.name,
                "destination_type": "queue",
                "routing_key": routing_key,
                "arguments": {},
            }
            for queue in queues
            for exchange, routing_key in queue.bindings
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, help="where to write the definitions JSON")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(definitions(os.environ), indent=2) + "\n"
    # Readable by the broker's own user in its container; the hashes are salted.
    out.write_text(text, encoding="utf-8")
    out.chmod(0o644)
    names = ", ".join(u["name"] for u in json.loads(text)["users"])
    print(f"wrote RabbitMQ definitions for {names} to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
