"""`ingero-mcp query`: read-only SQL over a trace store, printed as a table or JSON."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ingero_mcp.store.schema import TABLES

if TYPE_CHECKING:
    import duckdb

DESCRIPTION = """\
Run read-only SQL over a trace store (DuckDB dialect). The connection cannot write, attach other
databases or read files. Every number in an `explain` report can be recomputed this way
(`explain --sql` shows the queries)."""

EPILOG = """\
examples:
  ingero-mcp query --db run.duckdb "SELECT op, count(*), quantile_disc(duration_ns, 0.99) AS p99_ns
                                    FROM cuda_calls GROUP BY op ORDER BY 2 DESC"
  ingero-mcp query --db run.duckdb --json "SELECT * FROM processes"
  ingero-mcp query --db run.duckdb "DESCRIBE cuda_calls"

tables: {tables} (see schemas/v1.sql)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `query` parser."""
    p = subparsers.add_parser(
        "query", help="read-only SQL over a trace store", description=DESCRIPTION,
        epilog=EPILOG.format(tables=", ".join(TABLES)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", required=True, help="trace store (DuckDB file)")
    p.add_argument("--json", action="store_true", help="print {columns, rows, truncated} as JSON")
    p.add_argument("--limit", type=int, default=1000, help="at most this many rows (default 1000)")
    p.add_argument("sql", help="the SQL statement")
    p.set_defaults(func=run)


def run_query(con: duckdb.DuckDBPyConnection, sql: str, limit: int) -> tuple[list[str], list[tuple], bool]:
    """Run `sql` read-only; at most `limit` rows. Errors become one-line AnalysisErrors naming the tables."""
    import duckdb

    from ingero_mcp.analysis import AnalysisError
    from ingero_mcp.store.schema import TABLES

    if limit < 1:
        raise AnalysisError("--limit must be >= 1")
    try:
        rel = con.sql(sql)
        if rel is None:  # a statement without a result
            return [], [], False
        columns = list(rel.columns)
        got = rel.limit(limit + 1).fetchall()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AnalysisError(f"{first} (read-only store; tables: {', '.join(TABLES)})") from None
    return columns, got[:limit], len(got) > limit


def run(args: argparse.Namespace) -> int:
    """Print the result as a table (or JSON)."""
    from ingero_mcp.store import open_store

    con = open_store(args.db)
    try:
        columns, got, truncated = run_query(con, args.sql, args.limit)
    finally:
        con.close()
    if args.json:
        print(json.dumps({"columns": columns, "rows": [list(r) for r in got], "truncated": truncated}, default=str))
        return 0
    from rich.table import Table

    from ingero_mcp.render import fmt
    from ingero_mcp.render.report import make_console

    console = make_console()
    table = Table()
    for c in columns or ["result"]:
        table.add_column(fmt.cell(c), overflow="fold")  # piped output is 100 columns wide: wrap, never cut
    for r in got:
        table.add_row(*(fmt.cell("NULL" if v is None else v, 200) for v in r))
    console.print(table)
    console.print(f"{len(got)} row{'s' if len(got) != 1 else ''}"
                  + (f" (truncated at --limit {args.limit})" if truncated else ""))
    return 0
