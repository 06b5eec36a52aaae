"""The event catalog (shared/event_catalog.py): complete, consistent; docs/EVENTS.md current."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema_rs
import marshmallow as ma
import pytest

from services.core.api.deposits import DepositSchema
from services.core.api.schemas import DepositAccountSchema
from services.notifier.api.schemas import EndpointSchema
from shared import event_catalog, events
from tests.support.catalog import catalog_errors, strict

DOC = Path(__file__).resolve().parents[2] / "docs" / "EVENTS.md"


def test_every_event_type_has_an_entry_and_only_pending_ones_are_extra() -> None:
    written = [entry.type for entry in event_catalog.ENTRIES]
    assert set(events.EVENT_TYPES) <= set(written)
    # The one entry written ahead of its emitter (the notifier adds it to EVENT_TYPES).
    assert set(written) - set(events.EVENT_TYPES) <= {event_catalog.WEBHOOK_ENDPOINT_DISABLED}
    assert [entry.type for entry in event_catalog.catalog()] == list(events.EVENT_TYPES)


@pytest.mark.parametrize("entry", event_catalog.ENTRIES, ids=lambda e: e.type)
def test_each_schema_is_valid_and_its_example_meets_it_strictly(
    entry: event_catalog.EventType,
) -> None:
    jsonschema_rs.meta.validate(entry.schema)
    assert catalog_errors(entry.example, entry) == []
    assert entry.example["type"] == entry.type
    # The summary is one sentence; the details say more.
    assert entry.summary.endswith(".") and entry.details


def test_durable_deposit_examples_have_their_predictable_ids() -> None:
    for status in events.DURABLE_DEPOSIT_STATUSES:
        example = event_catalog.get(f"deposit.{status}").example
        deposit_id = example["data"]["deposit"]["id"]
        assert example["id"] == events.durable_event_id(deposit_id, status)


@pytest.mark.parametrize(
    ("name", "marshmallow_schema"),
    [
        ("Deposit", DepositSchema),
        ("DepositAccount", DepositAccountSchema),
        ("WebhookEndpoint", EndpointSchema),
    ],
)
def test_shared_objects_have_the_fields_the_api_serves(
    name: str, marshmallow_schema: type[ma.Schema]
) -> None:
    # The API's response schemas and the catalog describe the same objects.
    api_fields = [f.data_key or key for key, f in marshmallow_schema().fields.items()]
    assert list(event_catalog.NAMED_OBJECTS[name]["properties"]) == api_fields


def test_a_wrong_body_fails_the_strict_check() -> None:
    # Given a real example, then broken in the ways a drifting emitter would break it
    def broken(change: Any) -> list[str]:
        example = event_catalog.get(events.DEPOSIT_CREDITED).example
        change(example["data"]["deposit"])
        return catalog_errors(example)

    assert broken(lambda d: d.pop("netAmountUsd"))  # a documented field is missing
    assert broken(lambda d: d.update(extra=1))  # an undocumented field appears
    assert broken(lambda d: d.update(amount=125.5))  # a decimal string became a number
    assert broken(lambda d: d.update(status="settled"))  # an unknown status
    assert broken(lambda d: d["destination"].update(chainId="8453"))  # deep in a $ref


def test_strict_closes_objects_only_where_properties_are_listed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object"}}}
    assert strict(schema) == {
        "type": "object",
        "properties": {"a": {"type": "object"}},
        "additionalProperties": False,
    }


def test_unknown_type_message_lists_every_type_and_bounds_what_it_echoes() -> None:
    message = event_catalog.unknown_type_message("deposit.*")
    assert message.startswith("unknown event type 'deposit.*'")
    assert all(t in message for t in events.EVENT_TYPES)
    huge = event_catalog.unknown_type_message("x" * 100_000)
    assert len(huge) < 1000 + len(", ".join(events.EVENT_TYPES))


def test_docs_events_md_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert event_catalog.render_into(text) == text, (
        "docs/EVENTS.md is stale: run `.venv/bin/python -m shared.event_catalog`"
    )


def test_what_the_catalog_hands_out_are_copies() -> None:
    # A caller changing an example or a schema (tests do) must not change the catalog
    entry = event_catalog.get(events.ACCOUNT_CREATED)
    before = (entry.example, entry.schema, event_catalog.documents())
    entry.example["data"]["depositAccount"]["metadata"]["x"] = 1
    entry.schema["$defs"]["DepositAccount"]["properties"].clear()
    event_catalog.documents()[0]["example"]["data"].clear()
    assert (entry.example, entry.schema, event_catalog.documents()) == before


def test_render_into_refuses_a_file_without_the_marks() -> None:
    with pytest.raises(ValueError, match="marks"):
        event_catalog.render_into("# Events\n")
