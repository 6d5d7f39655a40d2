"""The accounting's named SQL views (analysis/sql/*.sql), laid on a reader connection as temporary views, and the
tables of their rows made once (stored in a finished store, or cached for the process).

DuckDB allows temporary views on read-only, locked connections, so `explain`, `query`, `run_sql` and
the SQL attached to evidence all see the same `thread_state`, `call_spans` and `thread_seconds`.
"""

from __future__ import annotations

import hashlib
import threading
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


# The views computed once per store content, for every connection of the process. A view is recomputed by every
# query that reads it (call_spans: window passes over every CUDA call; thread_seconds: four ASOF joins on call_spans),
# and a filter pushed into one can turn its ASOF joins into slow plans. `materialize` fills a table per view in
# CACHE, an in-memory catalog attached to the store's database instance (writable even when the store is read-only,
# and seen by every cursor of that instance: each MCP tool call has its own), and points the connection's views at
# them; any later connection whose store rows still match the cache's fingerprint reads them too, so a store
# without derived tables (v1/v2, an import, a live recording) is derived once, not on every call.
TABLES = {name: f"{name}_t" for name in VIEWS}
SECONDS_TABLE = TABLES["thread_seconds"]
CACHE = "ingero_cache"
CACHE_META = "fingerprint"
_CACHE_LOCK = threading.Lock()  # cursors run tool calls in parallel: one of them derives, the others wait and read


# v3 stores (schemas/v3.sql): the views' rows made once when the store was finished, in stored tables. A reader
# points the views (and the per-connection table names above, which causes/ names) at them while acct_meta says
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
    try:
        _make_cache(con)  # from the store's tables, whatever derived rows it holds (one transaction writes one catalog)
        con.execute("BEGIN TRANSACTION").fetchall()
    except BaseException:
        _drop_cache(con)
        raise
    try:
        con.execute(f"DELETE FROM {DERIVED_META}").fetchall()
        for name in VIEWS:
            con.execute(f"DELETE FROM {DERIVED[name]}").fetchall()
        for name in VIEWS:
            con.execute(f"INSERT INTO {DERIVED[name]} BY NAME SELECT * FROM {TABLES[name]}").fetchall()
        con.execute(f"INSERT INTO {DERIVED_META} SELECT ?, *, ? FROM ({_SOURCE})", [time.time_ns(), views_hash()]).fetchall()
        con.execute("COMMIT").fetchall()
    except BaseException:
        con.execute("ROLLBACK").fetchall()
        raise
    finally:
        _drop_cache(con)
    return True


def _drop_cache(con: duckdb.DuckDBPyConnection) -> None:
    """The connection's views and the cache go: later readers see the stored tables."""
    for name in VIEWS:
        con.execute(f"DROP VIEW IF EXISTS temp.{TABLES[name]}").fetchall()
        con.execute(f"DROP VIEW IF EXISTS temp.{name}").fetchall()
    con.execute(f"DETACH DATABASE IF EXISTS {CACHE}").fetchall()


def _derived_views(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's views read rows already made: the store's derived tables or the process's cache."""
    got = con.execute("SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?", [VIEWS[0]]).fetchall()
    return bool(got) and (DERIVED[VIEWS[0]] in got[0][0] or f"{CACHE}." in got[0][0])


def _fingerprint(con: duckdb.DuckDBPyConnection) -> str:
    """What the views' rows would be made from: the store's row counts and session span, and the views' SQL."""
    return f"{con.execute(_SOURCE).fetchall()[0]!r} {views_hash()}"


def _attach_cache(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {CACHE} (READ_ONLY false)").fetchall()


def _cache_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this process's cache holds the views' rows for the store's rows as they are now."""
    has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = ?",
                      [CACHE, CACHE_META]).fetchall()[0][0]
    if not has:
        return False
    made = con.execute(f"SELECT fingerprint FROM {CACHE}.{CACHE_META}").fetchall()
    return len(made) == 1 and made[0][0] == _fingerprint(con)


def _read_from(con: duckdb.DuckDBPyConnection, source: dict[str, str]) -> None:
    """Point the connection's views and per-view table names at made rows (`source`: view -> qualified table)."""
    for name in VIEWS:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {source[name]}").fetchall()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {TABLES[name]} AS SELECT * FROM {source[name]}").fetchall()


def materialize(con: duckdb.DuckDBPyConnection) -> None:
    """Make (once per store content, for every connection of the process) a table holding each view's rows, and
    point the connection's views at them."""
    install_views(con)
    if _derived_views(con):
        return  # the store's own tables, or the cache made by another connection: nothing to make
    _make_cache(con)


def _make_cache(con: duckdb.DuckDBPyConnection) -> None:
    """The views' rows made from the store's tables into CACHE (unless another connection just did), the
    connection's views pointed at them."""
    cached = {name: f"{CACHE}.{TABLES[name]}" for name in VIEWS}
    with _CACHE_LOCK:
        _attach_cache(con)
        if _cache_current(con):
            _read_from(con, cached)
            return
        fingerprint = _fingerprint(con)
        con.execute(f"DROP TABLE IF EXISTS {CACHE}.{CACHE_META}").fetchall()
        for name in VIEWS:  # the plain views again: the rows are made from the store's tables
            con.execute(f"DROP VIEW IF EXISTS temp.{TABLES[name]}").fetchall()
            con.execute(f"DROP TABLE IF EXISTS {cached[name]}").fetchall()
            con.execute(view_sql(name)).fetchall()
        in_call = None
        for name in VIEWS:  # in dependency order: thread_seconds is made from the tables before it
            table = TABLES[name]
            made = False
            if name == "call_spans":
                in_call = _materialize_spans(con, cached[name])
                made = in_call is not None
            elif name == "thread_seconds" and in_call is not None:
                made = _materialize_seconds(con, cached[name], in_call)
            elif name == "thread_sleeps" and in_call is not None:
                made = _materialize_sleeps(con, cached[name], in_call)
            if not made:
                con.execute(f"CREATE TABLE {cached[name]} AS SELECT * FROM {name}").fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM {cached[name]}").fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {table}").fetchall()
        con.execute(f"CREATE TABLE {CACHE}.{CACHE_META} AS SELECT ? AS fingerprint", [fingerprint]).fetchall()


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
        con.execute(f"CREATE TABLE {table} AS {body.rstrip().rstrip(';')}").fetchall()
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
        con.execute(f"CREATE TABLE {table} AS SELECT {', '.join(cols)} FROM {TABLES['thread_state']} "
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
        con.execute(f"CREATE TABLE {table} AS SELECT {', '.join(cols)} FROM {name}").fetchall()
    finally:
        con.unregister(name)
    return in_call


def materialize_seconds(con: duckdb.DuckDBPyConnection) -> str:
    """Make (once per store content) the tables behind the views (see `materialize`); returns thread_seconds' table."""
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
        _read_from(con, DERIVED)
        return
    if _cache_current(con):  # another connection of this process made them (no cache attached: not current)
        _read_from(con, {name: f"{CACHE}.{TABLES[name]}" for name in VIEWS})
        return
    for name in VIEWS:
        con.execute(view_sql(name)).fetchall()
