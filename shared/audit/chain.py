"""The audit log's hash chain: the canonical form of an entry, its hash, and the check.

Each tenant's entries form one chain, ordered by `sequence` (1, 2, 3 ... without gaps).
An entry's `hash` is SHA-256 (lower-case hex) of its canonical form, and its
`prevHash` is the hash of the tenant's entry before it (`GENESIS`, 64 zeros, for the
first). Changing any stored field of an entry changes its hash; rewriting the hash too
breaks the next entry's `prevHash`.

The canonical form (version 1), byte for byte: the UTF-8 JSON text of the object

    {"action", "actor": {"id", "name", "type"}, "after", "before", "createdAt", "id",
     "ip", "prevHash", "requestId", "sequence", "target": {"id", "type"}, "tenantId",
     "v": 1}

with keys sorted (by code point) at every level, no whitespace (separators `,` and
`:`), non-ASCII characters escaped as `\\uXXXX` (so the text is ASCII), absent values
as `null`, `createdAt` as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC, microseconds), and
`sequence` an integer. `before` and `after` hold only objects, arrays, strings,
integers, booleans and null: a float has no single text, so none is recorded.
That is Python's `json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=True, allow_nan=False)`; any language with a sorted-keys JSON writer
can recompute it from the API's audit events (`GET /v1/audit-events` shows every
field that goes in, with the same names).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

#: The prevHash of a chain's first entry.
GENESIS = "0" * 64
#: Version of the canonical form (it is part of what is hashed).
VERSION = 1


class Entry(Protocol):
    """What the chain covers of a stored entry (the ORM row has these)."""

    id: str
    tenant_id: str
    sequence: int
    created_at: datetime
    action: str
    actor_type: str
    actor_id: str | None
    actor_name: str | None
    target_type: str
    target_id: str | None
    before: Any
    after: Any
    ip: str | None
    request_id: str | None
    prev_hash: str
    hash: str


def chain_time(value: datetime) -> str:
    """`createdAt` as the canonical form writes it (UTC, microseconds)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_recordable(value: Any, where: str = "value") -> None:
    """Refuse what has no single canonical text (floats, other types) before storing it."""
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be strings")
            check_recordable(item, f"{where}.{key}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_recordable(item, f"{where}[{index}]")
        return
    raise TypeError(f"{where}: {type(value).__name__} cannot be recorded (no canonical form)")


def hashed_fields(entry: Entry) -> dict[str, Any]:
    """The fields the hash covers, named as the API shows them (`createdAt` here with
    microseconds: the API's `chainTime`)."""
    return {
        "id": entry.id,
        "tenantId": entry.tenant_id,
        "sequence": entry.sequence,
        "createdAt": chain_time(entry.created_at),
        "action": entry.action,
        "actor": {"type": entry.actor_type, "id": entry.actor_id, "name": entry.actor_name},
        "target": {"type": entry.target_type, "id": entry.target_id},
        "before": entry.before,
        "after": entry.after,
        "ip": entry.ip,
        "requestId": entry.request_id,
        "prevHash": entry.prev_hash,
    }


def canonical(entry: Entry) -> bytes:
    """The bytes that are hashed (version 1, see the module's docstring)."""
    text = json.dumps(
        {"v": VERSION, **hashed_fields(entry)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return text.encode("ascii")


def entry_hash(entry: Entry) -> str:
    return hashlib.sha256(canonical(entry)).hexdigest()


@dataclass(frozen=True)
class Break:
    """The first entry of a chain that does not check, and why."""

    id: str
    tenant_id: str
    sequence: int
    reason: str

    def document(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenantId": self.tenant_id,
            "sequence": self.sequence,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Head:
    """Where a chain that checks ends: anchor it elsewhere to catch a rewritten tail."""

    tenant_id: str
    sequence: int
    hash: str


def check_chain(entries: Iterable[Entry], anchor: Head | None = None) -> Iterator[Break | Head]:
    """Walk one tenant's entries in sequence order; yields its first Break (and stops),
    or its Head when every entry checks.

    An entry breaks when its sequence is not the next one (a row deleted or inserted),
    its prevHash is not the previous entry's hash (a row replaced), or its hash is not
    the hash of its own fields (a field edited). With an `anchor` (a head recorded
    earlier, kept elsewhere), the chain must still hold that entry with that hash: a
    rewritten or cut tail, which the chain alone cannot show, breaks it.
    """
    previous_hash, expected = GENESIS, 1
    last: Entry | None = None
    for entry in entries:
        reason = _fault(entry, previous_hash, expected, anchor)
        if reason is not None:
            yield Break(entry.id, entry.tenant_id, entry.sequence, reason)
            return
        previous_hash, expected, last = entry.hash, expected + 1, entry
    if anchor is not None and (last is None or last.sequence < anchor.sequence):
        yield Break(
            last.id if last else "",
            anchor.tenant_id,
            last.sequence if last else 0,
            f"the chain ends before the anchored head (sequence {anchor.sequence}): entries "
            "were removed",
        )
    elif last is not None:
        yield Head(last.tenant_id, last.sequence, last.hash)


def _fault(entry: Entry, previous_hash: str, expected: int, anchor: Head | None) -> str | None:
    """Why `entry` does not check where it stands in its chain, or None."""
    if anchor is not None and entry.sequence == anchor.sequence and entry.hash != anchor.hash:
        return "hash differs from the anchored head (the chain was rewritten from here or before)"
    if entry.sequence != expected:
        return (
            f"sequence {entry.sequence} where {expected} was next (an entry is missing or was "
            "added)"
        )
    if entry.prev_hash != previous_hash:
        return "prevHash is not the hash of the entry before it"
    if entry.hash != entry_hash(entry):
        return "hash does not match the entry's fields (it was edited)"
    return None
