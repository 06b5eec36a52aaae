"""How CLI commands print a result: JSON for scripts, a readable listing for people.

JSON (one object, one line) when `--json` is given or stdout is not a terminal, so a
script that captures `settle tenants create` keeps getting the DESIGN.md contract;
aligned `key  value` lines (a table for lists of objects) on a terminal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

#: Set by `services.cli.main` from `--json`; None: decide by the terminal.
_forced_json: bool | None = None


def set_json(forced: bool | None) -> None:
    """`--json` given (True) or not (None: JSON unless stdout is a terminal)."""
    global _forced_json
    _forced_json = forced


def wants_json(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    if _forced_json:
        return True
    return not stream.isatty()


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Rows of flat objects as an aligned table (nested values shown as compact JSON)."""
    if not rows:
        return ["(none)"]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_scalar(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(min(len(r[i]), 60) for r in cells)) for i, c in enumerate(columns)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for row in cells:
        shown = [v if len(v) <= 60 else v[:57] + "..." for v in row]
        out.append("  ".join(v.ljust(w) for v, w in zip(shown, widths, strict=True)).rstrip())
    return out


def render(payload: Mapping[str, Any]) -> str:
    """The readable form: `key  value` lines; a list of objects becomes a table."""
    lines: list[str] = []
    width = max((len(k) for k in payload), default=0)
    for key, value in payload.items():
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            lines += ["", f"{key}:", *(f"  {line}" for line in _table(value)), ""]
        elif isinstance(value, Mapping) and value:
            lines += [f"{key}:", *(f"  {line}" for line in render(value).splitlines())]
        else:
            lines.append(f"{key.ljust(width)}  {_scalar(value)}")
    return "\n".join(lines).strip("\n")


def emit(payload: Mapping[str, Any], stream: TextIO | None = None) -> None:
    """Print a command's result (see the module doc)."""
    stream = stream or sys.stdout
    text = json.dumps(payload) if wants_json(stream) else render(payload)
    stream.write(text + "\n")
    stream.flush()
