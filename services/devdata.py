"""What `settle dev` keeps in its data dir for the other commands: the demo tenant and key.

`demo.json` holds the demo tenant's id and its full-scope API key, readable by its
owner only: `settle dev` reuses the key on every start, and `settle listen` uses it
when no key is given.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: File of the data dir holding the demo tenant and its key.
DEMO_RECORD = "demo.json"


def read_demo(folder: Path) -> dict[str, str]:
    """What `settle dev` recorded about its demo tenant ({} when nothing usable is there)."""
    try:
        record = json.loads((folder / DEMO_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    return {k: v for k, v in record.items() if isinstance(k, str) and isinstance(v, str)}


def write_demo(folder: Path, tenant_id: str, api_key: str, api_key_id: str) -> None:
    """Record the demo tenant and key in a file only its owner can read."""
    path = folder / DEMO_RECORD
    text = json.dumps({"tenantId": tenant_id, "apiKey": api_key, "apiKeyId": api_key_id})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(path, 0o600)  # a file made earlier with a wider mode
