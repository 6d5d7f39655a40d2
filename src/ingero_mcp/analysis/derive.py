"""The accounting views' rows made once: into the store's derived tables when a finished store is written
(`store_derived`, which the writer is handed by whoever finishes a store), or into the process's cache
(`materialize`) for a store without them (v1/v2, an import, a live recording, a store appended to since).

A view is recomputed by every query that reads it (call_spans: window passes over every CUDA call; thread_seconds:
ASOF joins on call_spans), and a filter pushed into one can turn its ASOF joins into slow plans: the analysis reads
made rows. Where the store's views are and where their rows are read from is store/views.py's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import duckdb

from ingero_mcp.analysis.answers import STORED as ANSWERS, recording, store_answers
from ingero_mcp.store.schema import current_version, insert_sql
from ingero_mcp.store.views import (
    CACHE,
    CACHE_LOCK,
    CACHE_META,
    COMPUTED_SINCE,
    DEFINITIONS,
    DERIVED,
    DERIVED_META,
    KEPT_SINCE,
    KEPT_WHERE,
    RECOMPUTED,
    SECONDS_TABLE,
    SOURCE_SQL,
    SPANS_PLAIN,
    STORED,
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

if TYPE_CHECKING:  # numpy and pyarrow load where spans are made, not at every start-up
    import pyarrow as pa

    from ingero_mcp.analysis.spans import InCall


def store_derived(con: duckdb.DuckDBPyConnection) -> bool:
    """On a writable v3 store: compute the views' rows and store them in the acct_* tables (replacing any), with
    acct_meta recording what they were made from. One transaction. Returns False where the store has no such tables.
    Then (v7) the report's costly questions for the whole trace, answered over those rows, go to acct_answers.

    The rows go from their making into the stored tables: the one-pass spans (a v9 store's kept ones), and the rows
    that need an in-call time (each thread-second's pieces, the sleeps) read into Arrow once to be given it; no
    in-memory copy of every view's rows first (at 10M events that copy took ~3 s and ~1 GB)."""
    if not has_meta(con):
        return False
    answers = _has_table(con, ANSWERS)
    con.execute("SET enable_progress_bar = false").fetchall()  # the collector's fold, a demo: no bars on stderr
    for name in DEFINITIONS:  # the plain definitions: the rows are made from the store's tables, not its acct_* rows
        con.execute(view_sql(name)).fetchall()
    from ingero_mcp.analysis.spans import span_rows

    made = span_rows(con, kept_only=current_version(con) >= KEPT_SINCE)  # rows only of the spans a v9 store keeps
    if made is None:  # keys with nulls: the views' own SQL, through the cache
        return _store_from_cache(con)
    _store_made(con, *made)
    del made  # the spans and the lookup go before the report runs over the stored rows (~0.5 GB at 10M)
    if answers:
        _store_answers(con)
    return True


def _store_made(con: duckdb.DuckDBPyConnection, spans: pa.Table, in_call: InCall) -> None:
    """store_derived's rows stored, made from `spans` (call_span_rows' rows, spans.span_rows) and the in-call lookup
    over all spans: the steps pointed at them, as _make_spans and _make_seconds do."""
    rows = "_ingero_call_span_rows"
    types = con.execute("DESCRIBE SELECT * FROM call_span_rows").fetchall()
    con.register(rows, spans)
    try:
        cols = ", ".join(f"CAST({column} AS {kind}) AS {column}" for column, kind, *_ in types)
        con.execute(f"CREATE OR REPLACE TEMP VIEW call_span_rows AS SELECT {cols} FROM {rows}").fetchall()
        _lay_in_call(con, in_call)
        selects = {"thread_state": "SELECT * FROM thread_state", "call_spans": "SELECT * FROM call_spans",
                   "thread_seconds": "SELECT * FROM thread_seconds",
                   "thread_sleeps": _sleeps_select(con, "thread_state", in_call)}
        _store(con, selects)
    finally:
        for name in (rows, _PIECES, _SLEEPING):
            con.unregister(name)
        _drop_cache(con)


def _store(con: duckdb.DuckDBPyConnection, selects: dict[str, str]) -> None:
    """In one transaction: the acct_* tables emptied, the STORED views' rows inserted from `selects` (view -> SELECT),
    acct_meta saying what they were made from.

    A store finished before (its rows made again) has its old rows deleted and checkpointed first, in a transaction
    of their own: deleted in the inserting transaction, their blocks were freed only after it, and every finish
    again grew the file by the tables' size (826 of a 10M store's 2,120 blocks were free). Should the insert fail
    then, the store is left as an unfinished one is (no acct_meta row: readers compute the views)."""
    made_before = con.execute(f"SELECT (SELECT count(*) FROM {DERIVED_META}) + "
                              + " + ".join(f"(SELECT count(*) FROM {DERIVED[name]})" for name in VIEWS)).fetchall()
    if made_before[0][0]:
        con.execute("BEGIN TRANSACTION").fetchall()
        try:
            answers = (ANSWERS,) if _has_table(con, ANSWERS) else ()  # v7: answers of the old rows go with them
            for table in (DERIVED_META, *answers, *(DERIVED[name] for name in VIEWS)):
                con.execute(f"DELETE FROM {table}").fetchall()
            con.execute("COMMIT").fetchall()
        except BaseException:
            con.execute("ROLLBACK").fetchall()
            raise
        con.execute("CHECKPOINT").fetchall()
    stored = stored_views(con)
    keeps_spans = current_version(con) >= KEPT_SINCE
    first = [name for name in stored if name in FIRST]
    for names in (first, [name for name in stored if name not in FIRST]):
        if not names and names is first:
            continue
        con.execute("BEGIN TRANSACTION").fetchall()
        try:
            for name in names:  # views.COMPUTED are laid by their SQL: not stored
                left = ", ".join(RECOMPUTED.get(name, {}))  # columns readers compute (views.RECOMPUTED): NULL here
                rows = selects[name]
                if name == "call_spans" and keeps_spans:  # v9: the spans that are not simply one call
                    rows = f"SELECT * FROM ({rows}) WHERE {KEPT_WHERE.format(spans=rows)}"
                rows = f"(SELECT * {f'EXCLUDE ({left})' if left else ''} FROM ({rows}))"
                given = [str(r[0]) for r in con.execute(f"DESCRIBE SELECT * FROM {rows}").fetchall()]
                con.execute(insert_sql(con, DERIVED[name], rows, given)).fetchall()
            if names is not first:
                con.execute(f"INSERT INTO {DERIVED_META} SELECT ?, *, ? FROM ({SOURCE_SQL})",
                            [time.time_ns(), views_hash()]).fetchall()
            con.execute("COMMIT").fetchall()
        except BaseException:
            con.execute("ROLLBACK").fetchall()
            raise
        if names is first:
            con.execute("CHECKPOINT").fetchall()


def stored_views(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """The views whose rows a finish stores: views.STORED from v8 on; every view in a v3-v7 store, whose readers
    read its tables as they are (an empty acct_thread_state would read as no thread ever slept)."""
    return STORED if current_version(con) >= COMPUTED_SINCE else VIEWS


# Written in a transaction of their own, checkpointed before the others: DuckDB's parallel insert of thread_state's
# UNION ALL leaves partly filled row groups that the commit rewrites, and blocks freed inside a transaction are reused
# only after it (at 10M: 178 of 1,381 blocks free when written with the others, 64 of 1,297 so). Until the others and
# acct_meta are committed the store reads as unfinished (readers compute the views; the next finish deletes them).
FIRST = ("thread_state",)


def _store_from_cache(con: duckdb.DuckDBPyConnection) -> bool:
    """store_derived through the process's cache (the views' SQL where the one-pass spans cannot be made)."""
    try:
        _make_cache(con)  # one transaction writes one catalog: the cache is made before the store's is written
        _store(con, {name: f"SELECT * FROM {TABLES[name]}" for name in stored_views(con)})
    finally:
        _drop_cache(con)
    if _has_table(con, ANSWERS):
        _store_answers(con)
    return True


def _has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND schema_name = 'main' "
                            "AND table_name = ? AND database_name = current_database()", [table]).fetchall()[0][0])


def _store_answers(con: duckdb.DuckDBPyConnection) -> None:
    """The report over the whole trace, run once on the derived rows just stored, its shared questions' answers
    kept in acct_answers (answers.py), with the trace's description as the MCP tool asks it (the overlap checks the
    report leaves out). A report that fails here stores none: readers ask as before."""
    import logging

    from ingero_mcp.analysis.info import trace_info
    from ingero_mcp.analysis.report import build_report

    try:
        with recording() as asked:
            build_report(con)
            trace_info(con)
        con.execute("BEGIN TRANSACTION").fetchall()
        try:
            store_answers(con, asked)
            con.execute("COMMIT").fetchall()
        except BaseException:
            con.execute("ROLLBACK").fetchall()
            raise
    except Exception as exc:  # the derived tables are committed: never lose them over a recorded answer
        logging.getLogger(__name__).warning("recorded answers not stored: %s", exc)
    finally:
        _drop_cache(con)


def _drop_cache(con: duckdb.DuckDBPyConnection) -> None:
    """The connection's views (the steps too) and the cache go: later readers see the stored tables."""
    for name in (*(TABLES[name] for name in VIEWS), SPANS_PLAIN, *DEFINITIONS):
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
        for name in VIEWS:
            con.execute(f"DROP VIEW IF EXISTS temp.{TABLES[name]}").fetchall()
            con.execute(f"DROP TABLE IF EXISTS {cached[name]}").fetchall()
        for name in DEFINITIONS:  # the plain definitions again: the rows are made from the store's tables
            con.execute(view_sql(name)).fetchall()
        in_call = None
        for name in VIEWS:  # in dependency order: each is made from the tables made before it
            if name == "call_spans":
                in_call = _make_spans(con, cached[name])
            elif name == "thread_seconds" and in_call is not None:
                _make_seconds(con, cached[name], in_call)
            elif name == "thread_sleeps" and in_call is not None:
                _make_sleeps(con, cached[name], in_call)
            else:
                con.execute(f"CREATE TABLE {cached[name]} AS SELECT * FROM {name}").fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {TABLES[name]} AS SELECT * FROM {cached[name]}").fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {TABLES[name]}").fetchall()
        con.execute(f"CREATE TABLE {CACHE}.{CACHE_META} AS SELECT ? AS fingerprint", [made_from]).fetchall()
        read_from(con, cached)  # as any later connection reads them (reads_made_rows sees the cache)


# The in-call lookup the views do with ASOF joins (thread_second_in_call, thread_sleeps), done instead by
# spans.InCall over the spans in memory (the in-call time of a thread up to a moment), for every row at once: the
# rows that need it are read into Arrow, given the in-call time up to each of their two bounds (_in_a, _in_b), and
# registered under these names. (As a DuckDB UDF, called per 2,048 rows, it took 1.4 s of a 10M store's finish.)
_PIECES = "_ingero_second_pieces"
_SLEEPING = "_ingero_sleeping"
_IN_CALL = "CAST(coalesce(_in_b, 0) AS HUGEINT) - CAST(coalesce(_in_a, 0) AS HUGEINT)"


def _looked_up(con: duckdb.DuckDBPyConnection, select: str, bounds: tuple[str, str], in_call: InCall) -> pa.Table:
    """The rows of `select` (with pid and tid) and the in-call time up to each of its `bounds` columns."""
    got = con.sql(select).to_arrow_table()
    looked_up = in_call(*(got[c].combine_chunks() for c in ("pid", "tid", *bounds)))
    for name, column in zip(("_in_a", "_in_b"), looked_up, strict=True):
        got = got.append_column(name, column)
    return got


def _lay_in_call(con: duckdb.DuckDBPyConnection, in_call: InCall) -> None:
    """thread_second_in_call over thread_second_spans' rows with their in-call times looked up (registered as
    _PIECES until the caller unregisters it), typed as the view types them."""
    kind = {c: k for c, k, *_ in con.execute("DESCRIBE SELECT * FROM thread_second_in_call").fetchall()}
    con.register(_PIECES, _looked_up(con, "SELECT * FROM thread_second_spans", ("a", "b"), in_call))
    con.execute("CREATE OR REPLACE TEMP VIEW thread_second_in_call AS SELECT * EXCLUDE (_in_a, _in_b), "
                f"CAST({_IN_CALL} AS {kind['inside_ns']}) AS inside_ns FROM {_PIECES}").fetchall()


def _make_spans(con: duckdb.DuckDBPyConnection, table: str) -> InCall | None:
    """call_spans' rows, from call_span_rows made by analysis/spans.py in one linear pass (the view's window
    functions sort every call once per window), typed as the view types them. Returns the in-call lookup over them
    (spans.InCall), or None: made by the view's SQL."""
    from ingero_mcp.analysis.spans import span_rows

    made = span_rows(con)
    if made is None:
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM call_spans").fetchall()
        return None
    got, in_call = made
    types = con.execute("DESCRIBE SELECT * FROM call_span_rows").fetchall()
    name = "_ingero_call_span_rows"
    con.register(name, got)
    try:
        cols = ", ".join(f"CAST({column} AS {kind}) AS {column}" for column, kind, *_ in types)
        con.execute(f"CREATE OR REPLACE TEMP VIEW call_span_rows AS SELECT {cols} FROM {name}").fetchall()
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM call_spans").fetchall()
    finally:
        con.execute(view_sql("call_span_rows")).fetchall()
        con.unregister(name)
    return in_call


def _make_seconds(con: duckdb.DuckDBPyConnection, table: str, in_call: InCall) -> None:
    """thread_seconds' rows, with thread_second_in_call's lookups done by `in_call` (spans.InCall)."""
    try:
        _lay_in_call(con, in_call)
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM thread_seconds").fetchall()
    finally:
        con.execute(view_sql("thread_second_in_call")).fetchall()
        con.unregister(_PIECES)


def _sleeps_select(con: duckdb.DuckDBPyConnection, state: str, in_call: InCall) -> str:
    """thread_sleeps' rows from `state` (thread_state's rows), their in-call time looked up by `in_call` (registered
    as _SLEEPING until the caller unregisters it), cast to the view's types."""
    con.register(_SLEEPING, _looked_up(con, f"SELECT * FROM {state} WHERE state = 'sleeping'",
                                       ("start_ns", "end_ns"), in_call))
    cols = []
    for column, kind, *_ in con.execute("DESCRIBE SELECT * FROM thread_sleeps").fetchall():
        cols.append(f"CAST({_IN_CALL if column == 'inside_ns' else column} AS {kind}) AS {column}")
    return f"SELECT {', '.join(cols)} FROM {_SLEEPING}"


def _make_sleeps(con: duckdb.DuckDBPyConnection, table: str, in_call: InCall) -> None:
    """thread_sleeps' rows with its in-call lookups done by `in_call` (spans.InCall), cast to the view's types."""
    try:
        con.execute(f"CREATE TABLE {table} AS {_sleeps_select(con, TABLES['thread_state'], in_call)}").fetchall()
    finally:
        con.unregister(_SLEEPING)


def materialize_seconds(con: duckdb.DuckDBPyConnection) -> str:
    """Make (once per store content) the tables behind the views (see `materialize`); returns thread_seconds' table."""
    materialize(con)
    return SECONDS_TABLE
