"""Delivery statuses: plain names, importable without the database layer (the CLI's
`--status` choices are read for `--help`); models.py re-exports them."""

from __future__ import annotations

#: Delivery statuses. `skipped` (an extension): its endpoint was disabled; enabling the
#: endpoint again (or `recover`) sends it.
PENDING, RETRYING, SUCCEEDED, FAILED = "pending", "retrying", "succeeded", "failed"
SKIPPED = "skipped"
DELIVERY_STATUSES = (PENDING, RETRYING, SUCCEEDED, FAILED, SKIPPED)
