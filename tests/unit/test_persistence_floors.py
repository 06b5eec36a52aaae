"""Use cases reach the database one way: through the persistence modules.

The modules named here decide (accounts, detection, the chain watcher); their SQL, ORM
queries and driver statements live in store modules (`account_store.py`,
`deposits/detection_store.py`, `deposits/cursor_store.py`), which they call with the
session of the transaction they run in. A reader follows a request down the floors
without coming back up. Read from the source (ast), so no database is needed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USE_CASES = (
    "services/core/accounts.py",
    "services/core/deposits/detection.py",
    "services/core/deposits/watcher.py",
)

#: What a use case may take from these packages: a session's type, the Database handle
#: whose transactions it opens.
ALLOWED_IMPORTS = {
    "sqlalchemy.orm": {"Session"},
    "shared.db": {"Database"},
}
#: Packages that speak SQL or to the driver.
DATABASE_PACKAGES = ("sqlalchemy", "psycopg", "psycopg2", "psycopg_pool", "asyncpg")
#: Calls that run SQL or open a driver connection, whatever they are called on.
SQL_CALLS = {
    "execute",
    "executemany",
    "scalars",
    "scalar",
    "driver_autocommit",
    "driver_statement",
    "driver_connection",
    "driver_rows",
    "execute_json_rows",
    "autocommit",
    "connection",
    "cursor",
}
#: What an ORM session does that reaches the database (called on a `session`).
SESSION_CALLS = {
    "add",
    "add_all",
    "merge",
    "delete",
    "flush",
    "get",
    "query",
    "refresh",
    "begin_nested",
}
#: A string that reads as a statement.
SQL_TEXT = re.compile(
    r"\b(SELECT\b.+\bFROM|INSERT\s+INTO|UPDATE\b.+\bSET|DELETE\s+FROM|ON\s+CONFLICT)\b",
    re.IGNORECASE | re.DOTALL,
)


def problems(source: str) -> list[str]:
    """Where a module reaches the database itself (line: what)."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in DATABASE_PACKAGES:
                    found.append(f"{line}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            allowed = ALLOWED_IMPORTS.get(node.module)
            if allowed is not None:
                extra = {a.name for a in node.names} - allowed
                if extra:
                    found.append(f"{line}: from {node.module} import {sorted(extra)}")
            elif node.module.split(".")[0] in DATABASE_PACKAGES:
                found.append(f"{line}: from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            receiver = node.func.value
            if name in SQL_CALLS:
                found.append(f"{line}: .{name}(...)")
            elif (
                name in SESSION_CALLS
                and isinstance(receiver, ast.Name)
                and receiver.id in ("session", "conn")
            ):
                found.append(f"{line}: {receiver.id}.{name}(...)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in SQL_CALLS:
                found.append(f"{line}: {node.func.id}(...)")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SQL_TEXT.search(node.value)
            and not _is_docstring(tree, node)
        ):
            found.append(f"{line}: SQL text {node.value[:40]!r}")
    return found


def _is_docstring(tree: ast.AST, constant: ast.Constant) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and body[0].value is constant:
                return True
    return False


@pytest.mark.parametrize("module", USE_CASES)
def test_use_cases_reach_the_database_only_through_persistence_modules(module: str) -> None:
    found = problems((ROOT / module).read_text())
    assert not found, f"{module} reaches the database itself (move it to a store):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    "line",
    [
        "import sqlalchemy as sa",
        "from sqlalchemy.dialects.postgresql import insert",
        "from sqlalchemy.orm import Session, selectinload",
        "import psycopg",
        "from shared.db import Database, driver_rows",
        "session.execute(statement)",
        "rows = self.db.scalars(query)",
        "with db.driver_autocommit() as c:\n    pass",
        "deposit = session.get(Deposit, 'dep_1')",
        "session.add(deposit)",
        "with session.begin_nested():\n    pass",
        "QUERY = 'SELECT id FROM deposits WHERE status = %s'",
        "q = f'UPDATE deposits SET status = {x}'",
    ],
)
def test_the_walk_sees_each_way_to_the_database(line: str) -> None:
    assert problems(line), line


def test_the_walk_leaves_use_case_code_alone() -> None:
    source = (
        '"""Select deposits from the chain, then update them: prose, not SQL."""\n'
        "from sqlalchemy.orm import Session\n"
        "from shared.db import Database\n"
        "seen = set()\n"
        "seen.add(1)\n"
        "value = mapping.get('key')\n"
        "with db.transaction() as session:\n"
        "    detection_store.move(session, 'dep_1', {})\n"
    )
    assert problems(source) == []
