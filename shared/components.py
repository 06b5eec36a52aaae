"""The migration components of Settle, in the order `settle db upgrade` runs them."""

from __future__ import annotations

from pathlib import Path

from shared.migrate import Component

_ROOT = Path(__file__).resolve().parent.parent

IDENTITY = Component("identity", _ROOT / "shared" / "identity" / "migrations")
CORE = Component("core", _ROOT / "services" / "core" / "migrations")
NOTIFIER = Component("notifier", _ROOT / "services" / "notifier" / "migrations")
