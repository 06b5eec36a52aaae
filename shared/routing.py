"""Which service owns a path: the ingress rule, also used by the embedded mode."""

from __future__ import annotations

#: Path prefixes the notifier serves; everything else under /v1 is core's.
NOTIFIER_ROOTS = ("/v1/webhook-endpoints", "/v1/webhook-deliveries")
NOTIFIER_PREFIX = "/v1/notifier/"


def is_notifier_path(path: str) -> bool:
    """True for the notifier's routes: the roots themselves, anything below them, /v1/notifier/."""
    if path.startswith(NOTIFIER_PREFIX):
        return True
    return any(path == root or path.startswith(root + "/") for root in NOTIFIER_ROOTS)
