"""The deposit timeline's index covers exactly the deposit status events.

The partial index `ix_outbox_deposit_id` (migration core_0005) and the timeline's
query spell its predicate as literals. A new deposit status event type would be
missing from both: the timeline would silently leave that status out. This fails
first, saying a migration must rebuild the index.
"""

from __future__ import annotations

import importlib

from services.core import models
from services.core.deposits import states


def test_the_index_predicate_names_every_deposit_status_event() -> None:
    assert set(models.DEPOSIT_STATUS_EVENT_TYPES) == set(states.EVENT_TYPES.values()), (
        "a deposit status event type changed: rebuild ix_outbox_deposit_id in a migration"
    )
    for event_type in states.EVENT_TYPES.values():
        assert f"'{event_type}'" in models.IS_DEPOSIT_STATUS_EVENT


def test_the_migration_built_the_index_the_query_uses() -> None:
    migration = importlib.import_module(
        "services.core.migrations.versions.0005_deposit_timeline_index"
    )
    assert migration.DEPOSIT_ID_OF_EVENT == models.DEPOSIT_ID_OF_EVENT
    assert migration.IS_DEPOSIT_STATUS_EVENT == models.IS_DEPOSIT_STATUS_EVENT
