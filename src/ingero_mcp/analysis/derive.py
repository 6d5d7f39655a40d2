"""The accounting views' rows made once: into the store's derived tables when a finished store is written
(`store_derived`, which the writer is handed by whoever finishes a store), or into the process's cache
(`materialize`) for a store without them (v1/v2, an import, a live recording, a store appended to since).

A view is recomputed by every query that reads it (call_spans: window passes over every CUDA call; thread_seconds:
ASOF joins on call_spans), and a filter pushed into one can turn its ASOF joins into slow plans: the analysis reads
made rows. Where the store's views are and where their rows are read from is store/views.py's.
"""

from __future__ import annotations

import time

import duckdb

from ingero_mcp.store.views import (
    CACHE,
    CACHE_LOCK,
    CACHE_META,
    DERIVED,
    DERIVED_META,
    SECONDS_TABLE,
    SOURCE_SQL,
    TABLES,
    VIEWS,
    attach_cache,
    cache_current,
    cached_tables,
    fingerprint,
    has_meta,
    lay_views,
    read_from,
    reads_made_rows,
    view_sql,
    views_hash,
)


def store_derived(con: duckdb.DuckDBPyConnection) -> bool:
    """On a writable v3 store: compute the views' rows and store them in the acct_* tables (replacing any), with
    acct_meta recording what they were made from. One transaction. Returns False where the store has no such tables."""
    if not has_meta(con):
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
        con.execute(f"INSERT INTO {DERIVED_META} SELECT ?, *, ? FROM ({SOURCE_SQL})",
                    [time.time_ns(), views_hash()]).fetchall()
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


def materialize(con: duckdb.DuckDBPyConnection) -> None:
    """Make (once per store content, for every connection of the process) a table holding each view's rows, and
    point the connection's views at them."""
    lay_views(con)
    if reads_made_rows(con):
        return  # the store's own tables, or the cache made by another connection: nothing to make
    _make_cache(con)


def _make_cache(con: duckdb.DuckDBPyConnection) -> None:
    """The views' rows made from the store's tables into CACHE (unless another connection just did), the
    connection's views pointed at them."""
    cached = cached_tables()
    with CACHE_LOCK:
        attach_cache(con)
        if cache_current(con):
            read_from(con, cached)
            return
        made_from = fingerprint(con)
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
        con.execute(f"CREATE TABLE {CACHE}.{CACHE_META} AS SELECT ? AS fingerprint", [made_from]).fetchall()


# thread_seconds.sql's in-call lookups (an ASOF join of every boundary against call_spans, then joins back), and
# what the materialisation puts in their place: the same values from spans.InCall, a UDF over the spans in memory.
_ASOF_FROM, _ASOF_TO = "bounds AS (", "off AS ("
_UDF = "_ingero_in_call"
_BY_UDF = f"""secs_inb AS (
    SELECT s.*, coalesce({_UDF}(s.pid, s.tid, s.b), 0)::HUGEINT - coalesce({_UDF}(s.pid, s.tid, s.a), 0)::HUGEINT
           AS in_call_ns
    FROM secs s
),
pieces_inb AS (
    SELECT p.*, coalesce({_UDF}(p.pid, p.tid, p.b), 0)::HUGEINT - coalesce({_UDF}(p.pid, p.tid, p.a), 0)::HUGEINT
           AS inside_ns
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
