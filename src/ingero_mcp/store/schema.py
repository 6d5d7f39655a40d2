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

SCHEMA_VERSION = 9

# v3's derived tables (the accounting's views, made once when a store is finished): not trace tables. The writer
# does not append to them, live segments never hold them, a live snapshot does not copy them (schemas/v3.sql).
DERIVED_PREFIX = "acct_"

# Tables whose rows for a session are rewritten whole (latest state), not appended.
REPLACE_TABLES = frozenset({"sessions", "processes", "threads", "collector_stats", "table_coverage",
                            "stack_sources"})


# What an older store did not record, mapped to the current shape: (table, column) -> SQL over the
# old table's columns. A current column not named here and absent from the old table is NULL.
V1_AS_V2: dict[tuple[str, str], str] = {
    # v1's in-kernel per-call split already counted woken-then-waiting time as preempted.
    ("cuda_calls", "cpu_wait_ns"): "preempted_ns",
    ("cuda_calls", "sleep_ns"): "blocked_ns",
    # v1 intervals: 'preempted' waited for a CPU the whole time; 'blocked' slept until wakeup_ns
    # (when seen), then waited for a CPU until on_ns.
    ("sched_intervals", "sleep_ns"): (
        "CASE WHEN prev_state = 'preempted' THEN 0 ELSE coalesce(wakeup_ns, on_ns) - off_ns END"
    ),
    ("sched_intervals", "cpu_wait_ns"): (
        "CASE WHEN prev_state = 'preempted' THEN on_ns - off_ns "
        "WHEN wakeup_ns IS NOT NULL THEN on_ns - wakeup_ns END"
    ),
}


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


def _all_tables() -> tuple[str, ...]:
    """The trace tables of the current schema: those created by every version up to SCHEMA_VERSION, in order
    (the derived acct_* tables of v3 left out)."""
    names: list[str] = []
    for version in range(1, SCHEMA_VERSION + 1):
        names += [t for t in _table_names(ddl(version))
                  if t != "schema_version" and not t.startswith(DERIVED_PREFIX) and t not in names]
    return tuple(names)


TABLES: tuple[str, ...] = _all_tables()


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
        if version == 2 and have == 1:
            # The rows v1 wrote get the split their v1 states imply, as readers of v1 files see it.
            sets = ", ".join(f"{c} = {V1_AS_V2[('sched_intervals', c)]}" for c in ("sleep_ns", "cpu_wait_ns"))
            con.execute(f"UPDATE sched_intervals SET {sets}").fetchall()
        con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, time.time_ns()]).fetchall()
    return SCHEMA_VERSION
