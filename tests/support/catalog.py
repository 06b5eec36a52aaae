"""Check events against the event catalog (shared/event_catalog.py), strictly.

The catalog's schemas leave `additionalProperties` open for receivers (Settle may
add fields). Tests close it, so a field Settle sends but the catalog does not
document fails here, as does a documented field that is missing or mistyped.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema_rs

from shared import event_catalog


def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists properties."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return copy.deepcopy(schema)


def catalog_errors(
    envelope: dict[str, Any], entry: event_catalog.EventType | None = None
) -> list[str]:
    """Why the body does not match its type's catalog entry (empty when it does)."""
    if entry is None:
        try:
            entry = event_catalog.get(str(envelope.get("type")))
        except KeyError:
            return [f"type {envelope.get('type')!r} is not in the catalog"]
    validator = jsonschema_rs.Draft202012Validator(strict(entry.schema), validate_formats=True)
    return [f"{list(err.instance_path)}: {err.message}" for err in validator.iter_errors(envelope)]


def conforming(envelope: dict[str, Any]) -> dict[str, Any]:
    """The envelope, after asserting it matches the catalog."""
    errors = catalog_errors(envelope)
    assert not errors, f"{envelope.get('type')} {envelope.get('id')} breaks the catalog: {errors}"
    return envelope
