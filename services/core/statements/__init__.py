"""Statements: a tenant's credited deposits over a period, with opening and closing totals,
as JSON or CSV, signed with Ed25519 so an auditor can prove a statement is Settle's and
unaltered (docs/DEPOSITS.md, "Statements").

| module | what it holds |
|---|---|
| `settings.py` | the limits and the signing key's settings (CoreConfig.statements) |
| `signing.py` | the signing key (derived from SETTLE_SECRET_KEY or given), key ids |
| `period.py` | which deposits a period holds: its bounds and their rules (pure) |
| `queries.py` | the SQL: the period's totals and its deposits, in one snapshot |
| `render.py` | writing a statement as JSON or CSV, row by row, to a file |
| `service.py` | the use case: validate, read, write, sign |
"""
