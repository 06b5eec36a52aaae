"""The audit chain's canonical form is fixed (stored hashes depend on it), and the check
names the first entry that does not fit, whatever was done to it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shared.audit import chain
from shared.identity.models import AuditEvent


def entry(sequence: int = 1, prev_hash: str = chain.GENESIS, **changes: Any) -> AuditEvent:
    fields: dict[str, Any] = dict(
        id=f"aud_{sequence:026d}",
        tenant_id="6f1c2a43-1b9e-4d5c-9a57-0f3c8d2e1b7a",
        sequence=sequence,
        created_at=datetime(2026, 11, 21, 4, 11, 28, 123000, tzinfo=UTC),
        action="destination_policy.updated",
        actor_type="member",
        actor_id="mem_01JD3Y9X8M2K4Q7R5T6V8W0Z1A",
        actor_name="ops@example.com",
        target_type="destination_policy",
        target_id="6f1c2a43-1b9e-4d5c-9a57-0f3c8d2e1b7a",
        before=None,
        after={"destination": {"chainId": 8453, "address": "0xAb"}, "venue": "é"},
        ip="203.0.113.7",
        request_id="req_1",
        prev_hash=prev_hash,
    )
    row = AuditEvent(**{**fields, **changes}, hash="")  # the stored row, not stored here
    row.hash = chain.entry_hash(row)
    return row


def test_the_canonical_form_is_fixed() -> None:
    # The exact bytes of version 1 (docs/SECURITY.md): sorted keys, no spaces, ASCII
    assert chain.canonical(entry()) == (
        b'{"action":"destination_policy.updated","actor":{"id":"mem_01JD3Y9X8M2K4Q7R5T6V8W0Z1A",'
        b'"name":"ops@example.com","type":"member"},"after":{"destination":{"address":"0xAb",'
        b'"chainId":8453},"venue":"\\u00e9"},"before":null,'
        b'"createdAt":"2026-11-21T04:11:28.123000Z","id":"aud_00000000000000000000000001",'
        b'"ip":"203.0.113.7","prevHash":"' + chain.GENESIS.encode() + b'","requestId":"req_1",'
        b'"sequence":1,"target":{"id":"6f1c2a43-1b9e-4d5c-9a57-0f3c8d2e1b7a",'
        b'"type":"destination_policy"},"tenantId":"6f1c2a43-1b9e-4d5c-9a57-0f3c8d2e1b7a","v":1}'
    )
    assert entry().hash == "59c93a1854e44f0c8e6443d596c65dac590112068b7f8102df811ce6a7a456f9"


def test_floats_and_other_types_are_refused_before_they_are_stored() -> None:
    chain.check_recordable({"a": [1, "b", None, True, {"c": -3}]})
    for bad in ({"rate": 0.5}, [1.0], {"when": datetime.now(UTC)}, {1: "x"}):
        with pytest.raises(TypeError):
            chain.check_recordable(bad)


def build(n: int) -> list[AuditEvent]:
    rows: list[AuditEvent] = []
    for sequence in range(1, n + 1):
        rows.append(entry(sequence, rows[-1].hash if rows else chain.GENESIS))
    return rows


def test_a_whole_chain_ends_in_its_head() -> None:
    rows = build(4)
    assert list(chain.check_chain(rows)) == [chain.Head(rows[0].tenant_id, 4, rows[-1].hash)]


@pytest.mark.parametrize(
    ("damage", "bad", "reason"),
    [
        (lambda rows: setattr(rows[2], "ip", "10.0.0.1"), 2, "edited"),
        (lambda rows: setattr(rows[1], "after", {"venue": "x"}), 1, "edited"),
        (lambda rows: rows.pop(1), 1, "sequence"),
        (lambda rows: setattr(rows[2], "prev_hash", "f" * 64), 2, "prevHash"),
    ],
)
def test_the_first_bad_entry_is_named(damage: Any, bad: int, reason: str) -> None:
    rows = build(4)
    damage(rows)
    (found,) = chain.check_chain(rows)
    assert isinstance(found, chain.Break)
    assert found.id == rows[bad].id and reason in found.reason


def test_an_entry_rehashed_after_an_edit_breaks_the_next_link() -> None:
    rows = build(3)
    rows[1].actor_id = "mallory"
    rows[1].hash = chain.entry_hash(rows[1])
    (found,) = chain.check_chain(rows)
    assert isinstance(found, chain.Break) and found.id == rows[2].id


def test_an_anchor_catches_a_cut_or_rewritten_tail() -> None:
    rows = build(5)
    head = chain.Head(rows[0].tenant_id, 5, rows[-1].hash)
    (cut,) = chain.check_chain(rows[:3], anchor=head)
    assert isinstance(cut, chain.Break) and "anchored" in cut.reason
    rewritten = build(5)
    rewritten[4] = entry(5, rewritten[3].hash, action="something.else")
    (found,) = chain.check_chain(rewritten, anchor=head)
    assert isinstance(found, chain.Break) and found.id == rewritten[4].id
