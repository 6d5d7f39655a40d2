"""The accounting's named SQL views (analysis/sql/*.sql), laid on a reader connection as temporary views.

DuckDB allows temporary views on read-only, locked connections, so `explain`, `query`, `run_sql` and
the SQL attached to evidence all see the same `thread_state`, `call_spans` and `thread_seconds`.
"""

from __future__ import annotations

import hashlib
import time
from functools import cache
from importlib import resources

import duckdb

# In dependency order: each view reads only the store's tables and the views before it.
VIEWS: tuple[str, ...] = ("thread_state", "call_spans", "thread_seconds", "thread_sleeps")


@cache
def view_sql(name: str) -> str:
    """The text of one view's SQL file."""
    return (resources.files("ingero_mcp.analysis") / "sql" / f"{name}.sql").read_text()


# The views computed once per connection. A view is recomputed by every query that reads it (call_spans: window
# passes over every CUDA call; thread_seconds: four ASOF joins on call_spans), and a filter pushed into one can turn
# its ASOF joins into slow plans. `materialize` fills a temporary table per view and points the connection's view at
# it, so every later query on this connection (the accounting's, the chains', cold starts) reads the rows once made;
# the views keep their names and rows, and a cursor (`run_sql`, evidence SQL) gets the plain views (its own
# connection). DuckDB allows temporary tables on read-only, locked connections.
TABLES = {name: f"{name}_t" for name in VIEWS}
SECONDS_TABLE = TABLES["thread_seconds"]


# v3 stores (schemas/v3.sql): the views' rows made once when the store was finished, in stored tables. A reader
# points the views (and the per-connection table names above, which causes.py names) at them while acct_meta says
# they were made from the rows the store holds now, with these view definitions; else everything is computed as
# before (v1/v2 stores, live recordings, a store appended to since).
DERIVED = {name: f"acct_{name}" for name in VIEWS}
DERIVED_META = "acct_meta"
_SOURCE = ("SELECT (SELECT count(*) FROM cuda_calls), (SELECT count(*) FROM sched_intervals), (SELECT count(*) FROM sessions), "
           "(SELECT min(started_ns) FROM sessions), (SELECT max(stopped_ns) FROM sessions)")


@cache
def views_hash() -> str:
    """What the stored tables were made with: the three view definitions."""
    return hashlib.sha256("\n".join(view_sql(name) for name in VIEWS).encode()).hexdigest()[:16]


def _has_meta(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND schema_name = 'main' AND table_name = ? "
        "AND database_name = current_database()", [DERIVED_META]).fetchall()[0][0])


def has_derived(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store behind `con` holds the views' rows, made from exactly the rows it holds now."""
    if not _has_meta(con):
        return False
    made = con.execute(f"SELECT cuda_calls_n, sched_intervals_n, sessions_n, sessions_start_ns, sessions_stop_ns, views_sql_hash "
                       f"FROM {DERIVED_META}").fetchall()
    if len(made) != 1 or made[0][5] != views_hash():
        return False
    return tuple(made[0][:5]) == tuple(con.execute(_SOURCE).fetchall()[0])


def store_derived(con: duckdb.DuckDBPyConnection) -> bool:
    """On a writable v3 store: compute the views' rows and store them in the acct_* tables (replacing any), with
    acct_meta recording what they were made from. One transaction. Returns False where the store has no such tables."""
    if not _has_meta(con):
        return False
    con.execute("SET enable_progress_bar = false").fetchall()  # the collector's fold, a demo: no bars on stderr
    con.execute("BEGIN TRANSACTION").fetchall()
    try:
        con.execute(f"DELETE FROM {DERIVED_META}").fetchall()  # stale or absent: the views compute
        for name in VIEWS:
            con.execute(f"DELETE FROM {DERIVED[name]}").fetchall()
        materialize(con)
        for name in VIEWS:
            con.execute(f"INSERT INTO {DERIVED[name]} BY NAME SELECT * FROM {TABLES[name]}").fetchall()
        con.execute(f"INSERT INTO {DERIVED_META} SELECT ?, *, ? FROM ({_SOURCE})", [time.time_ns(), views_hash()]).fetchall()
        con.execute("COMMIT").fetchall()
    except BaseException:
        con.execute("ROLLBACK").fetchall()
        raise
    finally:
        for name in VIEWS:  # the connection's own tables and views go: later readers see the stored ones
            con.execute(f"DROP TABLE IF EXISTS temp.{TABLES[name]}").fetchall()
            con.execute(f"DROP VIEW IF EXISTS temp.{name}").fetchall()
    return True


def _derived_views(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's views read the stored tables (install_views decided so)."""
    got = con.execute("SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?", [VIEWS[0]]).fetchall()
    return bool(got) and DERIVED[VIEWS[0]] in got[0][0]


def materialize(con: duckdb.DuckDBPyConnection) -> None:
    """Make (once per connection) a table holding each view's rows, and point the view at it."""
    install_views(con)
    if _derived_views(con):
        return  # the store's own tables: nothing to make
    have = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary AND table_name IN ?",
                                      [list(TABLES.values())]).fetchall()}
    in_call = None
    for name in VIEWS:  # in dependency order: thread_seconds is made from the tables before it
        table = TABLES[name]
        if table in have:
            continue
        made = False
        if name == "call_spans":
            in_call = _materialize_spans(con, table)
            made = in_call is not None
        elif name == "thread_seconds" and in_call is not None:
            made = _materialize_seconds(con, table, in_call)
        elif name == "thread_sleeps" and in_call is not None:
            made = _materialize_sleeps(con, table, in_call)
        if not made:
            con.execute(f"CREATE TEMP TABLE {table} AS SELECT * FROM {name}").fetchall()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {table}").fetchall()


# thread_seconds.sql's in-call lookups (an ASOF join of every boundary against call_spans, then joins back), and
# what the materialisation puts in their place: the same values from spans.InCall, a UDF over the spans in memory.
_ASOF_FROM, _ASOF_TO = "bounds AS (", "off AS ("
_UDF = "_ingero_in_call"
_BY_UDF = f"""secs_inb AS (
    SELECT s.*, coalesce({_UDF}(s.pid, s.tid, s.b), 0)::HUGEINT - coalesce({_UDF}(s.pid, s.tid, s.a), 0)::HUGEINT AS in_call_ns
    FROM secs s
),
pieces_inb AS (
    SELECT p.*, coalesce({_UDF}(p.pid, p.tid, p.b), 0)::HUGEINT - coalesce({_UDF}(p.pid, p.tid, p.a), 0)::HUGEINT AS inside_ns
    FROM pieces p
),
"""


def _materialize_seconds(con: duckdb.DuckDBPyConnection, table: str, in_call: object) -> bool:
    """thread_seconds' rows with the in-call lookups done by `in_call` (spans.InCall); False: not made."""
    sql = view_sql("thread_seconds")
    if _ASOF_FROM not in sql or _ASOF_TO not in sql:
        return False
    body = sql[sql.index("WITH origin AS"):]
    body = body[:body.index(_ASOF_FROM)] + _BY_UDF + body[body.index(_ASOF_TO):]
    con.create_function(_UDF, in_call, [duckdb.sqltypes.BIGINT] * 3,
                        duckdb.sqltypes.BIGINT, type="arrow", side_effects=False)
    try:
        con.execute(f"CREATE TEMP TABLE {table} AS {body.rstrip().rstrip(';')}").fetchall()
    finally:
        con.remove_function(_UDF)
    return True


def _materialize_sleeps(con: duckdb.DuckDBPyConnection, table: str, in_call: object) -> bool:
    """thread_sleeps' rows with its in-call lookups done by `in_call` (spans.InCall) instead of its ASOF join, cast
    to the view's types."""
    cols = []
    for column, kind, *_ in con.execute("DESCRIBE SELECT * FROM thread_sleeps").fetchall():
        expr = (f"coalesce({_UDF}(pid, tid, end_ns), 0)::HUGEINT - coalesce({_UDF}(pid, tid, start_ns), 0)::HUGEINT"
                if column == "inside_ns" else column)
        cols.append(f"CAST({expr} AS {kind}) AS {column}")
    con.create_function(_UDF, in_call, [duckdb.sqltypes.BIGINT] * 3,
                        duckdb.sqltypes.BIGINT, type="arrow", side_effects=False)
    try:
        con.execute(f"CREATE TEMP TABLE {table} AS SELECT {', '.join(cols)} FROM {TABLES['thread_state']} "
                    "WHERE state = 'sleeping'").fetchall()
    finally:
        con.remove_function(_UDF)
    return True


def _materialize_spans(con: duckdb.DuckDBPyConnection, table: str) -> object | None:
    """call_spans' rows made by analysis/spans.py (one linear pass; the view's window functions sort every call once
    per window), typed as the view types them, with the view's own call_class expression. Returns the in-call
    lookup over them (spans.InCall), or None: not made."""
    from ingero_mcp.analysis.spans import span_rows

    made = span_rows(con)
    if made is None:
        return None
    got, in_call = made
    sql = view_sql("call_spans")
    case = sql[sql.rindex("CASE WHEN contains(op, 'ynchronize')"):sql.rindex("AS call_class")]
    cols = []
    for column, kind, *_ in con.execute("DESCRIBE SELECT * FROM call_spans").fetchall():
        expr = case if column == "call_class" else column
        cols.append(f"CAST({expr} AS {kind}) AS {column}")
    name = "_ingero_call_span_rows"
    con.register(name, got)
    try:
        con.execute(f"CREATE TEMP TABLE {table} AS SELECT {', '.join(cols)} FROM {name}").fetchall()
    finally:
        con.unregister(name)
    return in_call


def materialize_seconds(con: duckdb.DuckDBPyConnection) -> str:
    """Make (once per connection) the tables behind the views (see `materialize`); returns thread_seconds' table."""
    materialize(con)
    return SECONDS_TABLE


def install_views(con: duckdb.DuckDBPyConnection) -> None:
    """Create (or refresh) the accounting views on `con`; cheap, and safe to call on every request. On a store
    holding the views' rows (v3, made when it was finished, still current) the views read those."""
    have = {r[0] for r in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE temporary AND view_name IN ?", [list(VIEWS)]).fetchall()}
    if have == set(VIEWS):
        return
    if has_derived(con):
        for name in VIEWS:
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {DERIVED[name]}").fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {TABLES[name]} AS SELECT * FROM {DERIVED[name]}").fetchall()
        return
    for name in VIEWS:
        con.execute(view_sql(name)).fetchall()
