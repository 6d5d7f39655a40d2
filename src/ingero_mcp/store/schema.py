"""Loads the versioned DDL from `schemas/` and applies or migrates it; the schema is written only there."""

from __future__ import annotations

import re
import time
from functools import cache
from importlib import resources
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

SCHEMA_VERSION = 1

# Tables whose rows for a session are rewritten whole (latest state), not appended.
REPLACE_TABLES = frozenset({"sessions", "processes", "collector_stats", "table_coverage"})


def _schema_dir() -> Path:
    """`schemas/` in a source checkout, or the copy packed into the wheel."""
    repo = Path(__file__).resolve().parents[3] / "schemas"
    if repo.is_dir():
        return repo
    return Path(str(resources.files("ingero_mcp") / "schemas"))


@cache
def ddl(version: int) -> str:
    """The DDL text of one schema version."""
    path = _schema_dir() / f"v{version}.sql"
    return path.read_text()


def _table_names(sql: str) -> tuple[str, ...]:
    return tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", sql))


TABLES: tuple[str, ...] = tuple(t for t in _table_names(ddl(SCHEMA_VERSION)) if t != "schema_version")


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """The schema version recorded in a store; 0 for an empty database."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
    ).fetchall()[0][0]
    if not exists:
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchall()[0]
    return int(row[0] or 0)


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Bring a writable store to SCHEMA_VERSION by applying each missing vN.sql in order."""
    have = current_version(con)
    if have > SCHEMA_VERSION:
        from ingero_mcp.store.errors import StoreError

        raise StoreError(
            f"this trace store has schema version {have}, newer than this ingero-mcp understands "
            f"({SCHEMA_VERSION}); upgrade ingero-mcp"
        )
    for version in range(have + 1, SCHEMA_VERSION + 1):
        con.execute(ddl(version)).fetchall()
        con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, time.time_ns()]).fetchall()
    return SCHEMA_VERSION
