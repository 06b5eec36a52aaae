"""What an endpoint's `eventTypes` subscribes to: event types, `"*"`, and `"<prefix>.*"`.

An entry is an event type (exact), `"*"` (every type, today's and any added in a later
release) or a prefix pattern such as `"deposit.*"` (every type whose name starts with
`deposit.`, today's and later ones). A pattern's prefix must be the namespace of a type
Settle emits today (`deposit`, `deposit.account`, `webhook`, ...), so a typo is refused
rather than silently matching nothing. The one matching rule (`matches`) is used by the
notifier's fan-out, `settle reconcile` and the catalog's `patterns`.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared import events

#: Subscribes to every event type, today's and future ones.
WILDCARD = "*"
#: A prefix pattern ends with this (`deposit.*`).
PATTERN_SUFFIX = ".*"


def namespaces(event_types: Iterable[str] = events.EVENT_TYPES) -> tuple[str, ...]:
    """Every dotted prefix of a known type (`deposit`, `deposit.account`, ...), sorted."""
    found: set[str] = set()
    for event_type in event_types:
        parts = event_type.split(".")
        found.update(".".join(parts[:n]) for n in range(1, len(parts)))
    return tuple(sorted(found))


def patterns() -> tuple[str, ...]:
    """Every pattern an endpoint may subscribe to: `*`, then `<namespace>.*`."""
    return (WILDCARD, *(ns + PATTERN_SUFFIX for ns in namespaces()))


def is_pattern(entry: str) -> bool:
    return entry == WILDCARD or entry.endswith(PATTERN_SUFFIX)


def matches(entry: str, event_type: str) -> bool:
    """True when the subscription entry `entry` covers events of `event_type`."""
    if entry == WILDCARD:
        return True
    if entry.endswith(PATTERN_SUFFIX):
        return event_type.startswith(entry[:-1])  # keeps the dot: `deposit.` not `depositx`
    return entry == event_type


def subscribes(entries: Iterable[str] | None, event_type: str) -> bool:
    """True when an endpoint subscribed to `entries` wants events of `event_type`."""
    return any(matches(entry, event_type) for entry in entries or ())


def receives(entries: Iterable[str] | None) -> list[str]:
    """Today's event types that `entries` covers, in the catalog's order."""
    kept = list(entries or ())
    return [t for t in events.EVENT_TYPES if subscribes(kept, t)]


def problem(entry: object) -> str | None:
    """Why `entry` cannot be subscribed to, or None when it can."""
    if not isinstance(entry, str):
        return "must be a string"
    if entry in events.EVENT_TYPES or entry == WILDCARD:
        return None
    if entry.endswith(PATTERN_SUFFIX):
        if entry[: -len(PATTERN_SUFFIX)] in namespaces():
            return None
        shown = entry if len(entry) <= 80 else entry[:77] + "..."
        return (
            f"unknown event type pattern {shown!r}; the patterns are: "
            + ", ".join(patterns())
            + " (GET /v1/event-types lists what each covers)"
        )
    return (
        events.unknown_type_message(entry)
        + '; or a pattern: "*" (every type) or "<prefix>.*" such as "deposit.*"'
    )


def catalog_patterns() -> list[dict[str, object]]:
    """`patterns` of GET /v1/event-types: each pattern and the types it covers today."""
    return [{"pattern": p, "eventTypes": receives([p])} for p in patterns()]
