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


# thread_seconds computed once per connection: the view recomputes its joins on every query, and a filter pushed
# into it can turn its ASOF joins into slow plans. Internal queries read this table; evidence SQL names the view.
SECONDS_TABLE = "thread_seconds_t"


def materialize_seconds(con: duckdb.DuckDBPyConnection) -> str:
    """Make (once per connection) the table holding the rows of thread_seconds; returns its name."""
    install_views(con)
    if not con.execute("SELECT 1 FROM duckdb_tables() WHERE temporary AND table_name = ?", [SECONDS_TABLE]).fetchall():
        con.execute(f"CREATE TEMP TABLE {SECONDS_TABLE} AS SELECT * FROM thread_seconds").fetchall()
    return SECONDS_TABLE


def install_views(con: duckdb.DuckDBPyConnection) -> None:
    """Create (or refresh) the accounting views on `con`; cheap, and safe to call on every request."""
    have = {r[0] for r in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE temporary AND view_name IN ?", [list(VIEWS)]).fetchall()}
    if have == set(VIEWS):
        return
    for name in VIEWS:
        con.execute(view_sql(name)).fetchall()
