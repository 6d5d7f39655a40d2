"""The store's vocabulary: the accounting's named SQL views (store/sql/*.sql, one file per view, its dependencies in
its header), laid on every reader connection by `open_store` and `cursor`, and where their rows are read from.

A view's rows are read, in order of preference, from the store's own derived tables (acct_*, made when a finished
store was written, while acct_meta says they match the rows it holds now; a v9 store's call_spans are its kept spans
and the rest of its calls, KEPT_VIEW), from this process's cache (made once per store content by analysis.derive,
which every connection and cursor of the process sees), or else computed by the view's SQL. DuckDB allows temporary
views on read-only, locked connections, so `explain`, `query`, `run_sql` and the SQL attached to evidence all see the
same `thread_state`, `call_spans`, `thread_seconds` and `thread_sleeps`.
"""

from __future__ import annotations

import hashlib
import threading
from functools import cache
from importlib import resources

import duckdb

from ingero_mcp.store.schema import current_version

# Every definition (store/sql/<name>.sql), in dependency order: each reads only the store's tables and the views
# before it.
DEFINITIONS: tuple[str, ...] = ("thread_state", "call_span_rows", "call_class", "call_spans", "thread_second_spans",
                                "thread_second_in_call", "thread_seconds", "thread_sleeps")
# The views whose rows are made once (stored in a finished store, or cached for the process): the vocabulary the
# analysis and the evidence SQL use. The others are the steps between them.
VIEWS: tuple[str, ...] = ("thread_state", "call_spans", "thread_seconds", "thread_sleeps")

# Per view, a second name for its rows that the analysis reads where it must not recompute a view (accounting,
# causes): a view over the made rows once they are made.
TABLES = {name: f"{name}_t" for name in VIEWS}
SECONDS_TABLE = TABLES["thread_seconds"]
# call_spans without before_ns, the running sum RECOMPUTED lays as a window: DuckDB pushes no filter on start_ns below
# a window, even one whose column a query never reads, so a question about a window of time asked of call_spans
# classed every call of a v9 store (0.10 s at 10M calls, 0.005 s asked here). The analysis' SQL names call_spans and
# runs against this (analysis/_sql.rows): the same rows and every other column.
SPANS_PLAIN = "call_spans_plain"

# The process's cache: an in-memory catalog attached to the store's database instance (writable even when the store
# is read-only, and seen by every cursor of that instance), holding each view's rows and the fingerprint of the
# store rows they were made from.
CACHE = "ingero_cache"
CACHE_META = "fingerprint"
CACHE_LOCK = threading.Lock()  # cursors run tool calls in parallel: one of them derives, the others wait and read

# v3 stores (schemas/v3.sql): the views' rows made once when the store was finished, in stored tables.
DERIVED = {name: f"acct_{name}" for name in VIEWS}
# Views laid by their own SQL where the store's table of their rows is empty: a projection of one store table costs
# a scan to read, not a second copy on disk. thread_state (sched_intervals in another shape) since v8: at 10M events
# its stored copy took 71 MB of 343 (7.1 B/event) and 1.8 s of the 9.7 s finish; explain reads the recorded answers
# (v7) for the whole trace, and a window's explain computes it for +0.04-0.09 s (bench/README.md). Stores of v3-v7
# keep theirs (read as they are); a v3-v7 store finished again keeps storing it (derive.stored_views).
COMPUTED: tuple[str, ...] = ("thread_state",)
COMPUTED_SINCE = 8  # the schema version from which the COMPUTED views' tables are left empty
STORED: tuple[str, ...] = tuple(name for name in VIEWS if name not in COMPUTED)
# Stored columns a v7 finish leaves NULL, and what a reader computes in their place (the same values: before_ns is
# call_span_rows' running sum of the thread's earlier span lengths). DuckDB drops the window from a query that does
# not read the column; one that does pays a sort of the spans.
RECOMPUTED: dict[str, dict[str, str]] = {"call_spans": {"before_ns": (
    "coalesce(before_ns, CAST(coalesce(sum(end_ns - start_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns "
    "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS HUGEINT))")}}
# v9 stores keep in acct_call_spans only the spans that are not simply one call (sql/call_spans_kept.sql says which,
# and reads the others from cuda_calls): at 10M events every span was one call, 82 MB of a 263 MB store (8.3
# B/event) copying cuda_calls' columns. A store of v3-v8 keeps (and, finished again, stores) every span.
KEPT_SINCE = 9
KEPT_VIEW = "call_spans_kept"
KEPT_WHERE = ("call_class = 'launch_first' OR (pid, tid) IN (SELECT pid, tid FROM ({spans}) WHERE calls > 1)")
DERIVED_META = "acct_meta"
SOURCE_SQL = ("SELECT (SELECT count(*) FROM cuda_calls), (SELECT count(*) FROM sched_intervals), "
              "(SELECT count(*) FROM sessions), (SELECT min(started_ns) FROM sessions), "
              "(SELECT max(stopped_ns) FROM sessions)")


@cache
def view_sql(name: str) -> str:
    """The text of one view's SQL file (a CREATE OR REPLACE TEMP VIEW statement)."""
    return (resources.files("ingero_mcp.store") / "sql" / f"{name}.sql").read_text()


# Hashes of earlier definitions whose rows are exactly those of today's (checked, when the SQL was restructured, by
# bench/same_reports.py with these left out: every store's views recomputed gave the same reports). A store derived
# with one of them keeps its derived rows.
SAME_ROWS_AS: frozenset[str] = frozenset({
    "1b7e01374d943115",  # the four views before call_spans and thread_seconds were split into steps (issue 22)
    "cc8e87255b6599c2",  # call_spans' CASE before it became the call_class macro (store v9)
})


@cache
def views_hash() -> str:
    """What derived rows are made with now: the definitions."""
    return hashlib.sha256("\n".join(view_sql(name) for name in DEFINITIONS).encode()).hexdigest()[:16]


def current_hash(made_with: str) -> bool:
    """Whether rows made with the definitions hashed `made_with` are the rows today's definitions make."""
    return made_with == views_hash() or made_with in SAME_ROWS_AS


def has_meta(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store behind `con` has the derived tables (v3 and later)."""
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND schema_name = 'main' AND table_name = ? "
        "AND database_name = current_database()", [DERIVED_META]).fetchall()[0][0])


def has_derived(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store behind `con` holds the views' rows, made from exactly the rows it holds now."""
    if not has_meta(con):
        return False
    made = con.execute("SELECT cuda_calls_n, sched_intervals_n, sessions_n, sessions_start_ns, sessions_stop_ns, "
                       f"views_sql_hash FROM {DERIVED_META}").fetchall()
    if len(made) != 1 or not current_hash(made[0][5]):
        return False
    return tuple(made[0][:5]) == tuple(con.execute(SOURCE_SQL).fetchall()[0])


def fingerprint(con: duckdb.DuckDBPyConnection) -> str:
    """What the views' rows would be made from: the store's row counts and session span, and the views' SQL."""
    return f"{con.execute(SOURCE_SQL).fetchall()[0]!r} {views_hash()}"


def attach_cache(con: duckdb.DuckDBPyConnection) -> None:
    """The process's cache catalog, attached to the store's database instance if it is not yet."""
    con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {CACHE} (READ_ONLY false)").fetchall()


def cache_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this process's cache holds the views' rows for the store's rows as they are now."""
    has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = ?",
                      [CACHE, CACHE_META]).fetchall()[0][0]
    if not has:
        return False
    made = con.execute(f"SELECT fingerprint FROM {CACHE}.{CACHE_META}").fetchall()
    return len(made) == 1 and made[0][0] == fingerprint(con)


def cached_tables() -> dict[str, str]:
    """view -> its table in the process's cache."""
    return {name: f"{CACHE}.{TABLES[name]}" for name in VIEWS}


def read_from(con: duckdb.DuckDBPyConnection, source: dict[str, str]) -> None:
    """Point the connection's views and per-view table names at made rows (`source`: view -> qualified table); the
    store's own (`DERIVED`) lay a COMPUTED view by its SQL where its table is empty, and read call_spans through
    KEPT_VIEW from a store finished by v9 or later."""
    kept = source is DERIVED and current_version(con) >= KEPT_SINCE
    if kept:
        con.execute(view_sql("call_class")).fetchall()
        con.execute(view_sql(KEPT_VIEW)).fetchall()
    for name in VIEWS:
        if source is DERIVED and name in COMPUTED and not con.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM {source[name]} LIMIT 1)").fetchall()[0][0]:
            con.execute(view_sql(name)).fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {TABLES[name]} AS SELECT * FROM {name}").fetchall()
            continue
        if source is DERIVED and name in RECOMPUTED:
            made = ", ".join(f"{expr} AS {column}" for column, expr in RECOMPUTED[name].items())
            rows = KEPT_VIEW if kept and name == "call_spans" else source[name]
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * REPLACE ({made}) FROM {rows}").fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {TABLES[name]} AS SELECT * FROM {name}").fetchall()
            continue
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {source[name]}").fetchall()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {TABLES[name]} AS SELECT * FROM {source[name]}").fetchall()
    spans = KEPT_VIEW if kept else source["call_spans"]
    con.execute(f"CREATE OR REPLACE TEMP VIEW {SPANS_PLAIN} AS SELECT * EXCLUDE (before_ns) FROM {spans}").fetchall()


def reads_made_rows(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's views read rows already made: the store's derived tables or the process's cache."""
    got = con.execute("SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?", [STORED[0]]).fetchall()
    return bool(got) and any(made in got[0][0] for made in (DERIVED[STORED[0]], KEPT_VIEW, f"{CACHE}."))


def lay_views(con: duckdb.DuckDBPyConnection) -> None:
    """The views on `con` (unless it has them), reading made rows where the store or the process has them; cheap.
    `open_store` and `cursor` call it: nothing else needs to. Where the rows are made, only the four views are laid
    (each a SELECT of its table); the steps between them are laid where the views are computed by their SQL."""
    have = {r[0] for r in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE temporary AND view_name IN ?", [list(VIEWS)]).fetchall()}
    if have == set(VIEWS):
        return
    if has_derived(con):
        read_from(con, DERIVED)
    elif cache_current(con):  # another connection of this process made them (no cache attached: not current)
        read_from(con, cached_tables())
    else:
        for name in DEFINITIONS:
            con.execute(view_sql(name)).fetchall()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {SPANS_PLAIN} AS SELECT * EXCLUDE (before_ns) FROM call_spans"
                    ).fetchall()
