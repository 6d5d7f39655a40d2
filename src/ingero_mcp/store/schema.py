"""Loads the versioned DDL from `schemas/` and applies or migrates it; the schema is written only there."""

from __future__ import annotations

import re
import time
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    import duckdb

SCHEMA_VERSION = 10

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


# Columns a store computes from its others since v10 (schemas/v10.sql: generated, not stored). Writers still give them;
# insert_sql checks them against the store's rule and stores what the rule needs that they do not give.
GENERATED: dict[str, tuple[str, ...]] = {
    "sched_intervals": ("off_cpu_ns", "sleep_ns", "cpu_wait_ns", "preemptor_pid", "last_holder_pid"),
    "cuda_calls": ("kernel_handle",), "acct_thread_sleeps": ("dur_ns",)}
# (table, column) -> SQL over a writer's columns: the stored facts those generated columns are computed from.
GENERATED_FROM: dict[tuple[str, str], str] = {
    ("sched_intervals", "stopped_ns"): "CASE WHEN on_ns IS NULL THEN off_ns + off_cpu_ns END",
    ("sched_intervals", "preemptor_pid_if_other"):
        "CASE WHEN preemptor_pid IS DISTINCT FROM preemptor_tid THEN preemptor_pid END",
    ("sched_intervals", "last_holder_pid_if_other"):
        "CASE WHEN last_holder_pid IS DISTINCT FROM last_holder_tid THEN last_holder_pid END",
    ("cuda_calls", "kernel_key"): "CAST(kernel_handle AS VARCHAR)",
}
# Per table, the columns v10 keeps only for its generated columns to be computed from: no reader reads them.
STORED_FOR: dict[str, set[str]] = {t: {c for (u, c) in GENERATED_FROM if u == t} for t in GENERATED}
# Generated columns whose stored fact is the given value itself in another form (GENERATED_FROM): nothing to check.
LOSSLESS = frozenset({("cuda_calls", "kernel_handle")})
_CATALOG: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {}


def _catalog(con: duckdb.DuckDBPyConnection, table: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The table's stored (column, type) and generated (column, expression) columns, as the store's catalog holds
    them (its DDL's); no generated column: a store before v10, asked again of the next store."""
    if table not in _CATALOG:
        got = con.execute(
            "SELECT column_name, data_type, is_generated = 'ALWAYS', generation_expression FROM "
            "information_schema.columns WHERE table_name = ? AND table_schema = 'main' AND "
            "table_catalog = current_database() ORDER BY ordinal_position", [table]).fetchall()
        found = ([(str(c), str(t)) for c, t, g, _e in got if not g], [(str(c), str(e)) for c, _t, g, e in got if g])
        if not found[1]:
            return found
        _CATALOG[table] = found
    return _CATALOG[table]


def insert_sql(con: duckdb.DuckDBPyConnection, table: str, source: str, given: Iterable[str]) -> str:
    """`INSERT INTO table BY NAME` the rows of `source` (a FROM item whose columns are `given`). Where the table
    computes columns (GENERATED), the values given for them must be what its rule computes: a row that disagrees
    stops the insert with an error naming the columns, rather than being stored as something it was not."""
    stored, rules = _catalog(con, table) if table in GENERATED else ([], [])
    if not rules:
        return f"INSERT INTO {table} BY NAME SELECT * FROM {source}"
    given = set(given)
    # a stored fact made from the given generated columns (missing stored columns read as NULL), where given
    made = {c: GENERATED_FROM[(t, c)] for (t, c) in GENERATED_FROM if t == table and _needs(t, c) <= given}
    columns = [c if c in given else f"CAST(NULL AS {t}) AS {c}" for c, t in stored if c not in made]
    carried = [c for c, _ in rules if c in given]
    checked = [(c, expr) for c, expr in rules if c in given and (table, c) not in LOSSLESS]
    rows = (f"(SELECT *{''.join(f', {e} AS {c}' for c, e in made.items())} FROM (SELECT "
            f"{', '.join(columns + carried)} FROM {source}))")
    keep = ", ".join(c for c, _ in stored)
    if not checked:
        return f"INSERT INTO {table} BY NAME SELECT {keep} FROM {rows}"
    wrong = [f"{c} IS DISTINCT FROM ({expr})" for c, expr in checked]
    names = ", ".join(f"CASE WHEN {w} THEN '{c}' END" for w, (c, _) in zip(wrong, checked, strict=True))
    at = next(c for c, _ in stored if c in ("off_ns", "ts_ns", "start_ns"))
    return (f"INSERT INTO {table} BY NAME SELECT {keep} FROM {rows} "
            f"WHERE CASE WHEN {' OR '.join(wrong)} THEN error('{table}: ' || concat_ws(', ', {names}) || ' given, "
            f"not what schemas/v{SCHEMA_VERSION}.sql computes from the other columns of the row (tid ' || tid || ', "
            f"{at} ' || {at} || ')') ELSE true END")


def _needs(table: str, column: str) -> set[str]:
    """The generated columns GENERATED_FROM's SQL for `column` reads (the stored ones read NULL where not given)."""
    return {c for c in GENERATED[table] if re.search(rf"\b{c}\b", GENERATED_FROM[(table, column)])}


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
