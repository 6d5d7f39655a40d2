"""The accounting's named SQL views (analysis/sql/*.sql), laid on a reader connection as temporary views.

DuckDB allows temporary views on read-only, locked connections, so `explain`, `query`, `run_sql` and
the SQL attached to evidence all see the same `thread_state`, `call_spans` and `thread_seconds`.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import duckdb

# In dependency order: each view reads only the store's tables and the views before it.
VIEWS: tuple[str, ...] = ("thread_state", "call_spans", "thread_seconds")


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


def materialize(con: duckdb.DuckDBPyConnection) -> None:
    """Make (once per connection) a table holding each view's rows, and point the view at it."""
    install_views(con)
    have = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary AND table_name IN ?",
                                      [list(TABLES.values())]).fetchall()}
    for name in VIEWS:  # in dependency order: thread_seconds is made from the tables before it
        table = TABLES[name]
        if table not in have:
            if not (name == "call_spans" and _materialize_spans(con, table)):
                con.execute(f"CREATE TEMP TABLE {table} AS SELECT * FROM {name}").fetchall()
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM {table}").fetchall()


def _materialize_spans(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """call_spans' rows made by analysis/spans.py (one linear pass; the view's window functions sort every call once
    per window), typed as the view types them, with the view's own call_class expression. False: not made."""
    from ingero_mcp.analysis.spans import span_rows

    got = span_rows(con)
    if got is None:
        return False
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
    return True


def materialize_seconds(con: duckdb.DuckDBPyConnection) -> str:
    """Make (once per connection) the tables behind the views (see `materialize`); returns thread_seconds' table."""
    materialize(con)
    return SECONDS_TABLE


def install_views(con: duckdb.DuckDBPyConnection) -> None:
    """Create (or refresh) the accounting views on `con`; cheap, and safe to call on every request."""
    have = {r[0] for r in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE temporary AND view_name IN ?", [list(VIEWS)]).fetchall()}
    if have == set(VIEWS):
        return
    for name in VIEWS:
        con.execute(view_sql(name)).fetchall()
