"""SQL building blocks shared by the analysis modules: window and pid predicates, coverage, errors.

Every analysis query is composed from these so that the SQL attached to evidence is the SQL that ran (call_spans
read through the same rows without before_ns: `rows`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import duckdb

from ingero_mcp.analysis.models import TimeWindow
from ingero_mcp.sanitize import alters
from ingero_mcp.store.errors import StoreError
from ingero_mcp.store.views import SPANS_PLAIN


class AnalysisError(StoreError):
    """A request the analysis cannot answer (bad window, unknown pid); shown as one line."""


# Schema v2 splits v1's 'blocked' into 'sleeping' and 'uninterruptible'; this analysis still reads them as one.
SLEEP_STATES = "('blocked', 'sleeping', 'uninterruptible')"
# Waits for input that carry a timeout. On a kernel without PREEMPT_RT a sleeper's timer expires in the timer's hard
# interrupt, so one of these that a hard interrupt ended ran out its timeout: a sleep the program chose, not input
# (input comes in a softirq: a packet; or from a task: a pipe, a Unix socket, an eventfd).
TIMEOUT_WAITS = ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "epoll_pwait2")


def state_expr(col: str = "prev_state") -> str:
    """`col` with every sleeping state read as v1's 'blocked'."""
    return f"CASE WHEN {col} IN {SLEEP_STATES} THEN 'blocked' ELSE {col} END"


# The analysis never reads call_spans.before_ns: its SQL runs against the view without it (store/views.py SPANS_PLAIN,
# the same rows), which DuckDB filters before classing every span. The SQL shown with evidence names call_spans.
_CALL_SPANS = re.compile(r"\bcall_spans\b")


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[object] | None = None) -> list[tuple]:
    """Run `sql` and fetch the whole result (DuckDB 2.0 wants results drained before the next call)."""
    return con.execute(_CALL_SPANS.sub(SPANS_PLAIN, sql), list(params) if params else []).fetchall()


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[object] | None = None) -> object:
    """The first column of the first row, or None."""
    got = rows(con, sql, params)
    return got[0][0] if got else None


def pid_list(pids: Iterable[int] | None) -> str:
    """A literal list for `pid IN (...)`, ints only (so it can be inlined in recomputable SQL)."""
    return ", ".join(str(int(p)) for p in pids or [])


def where(*clauses: str) -> str:
    """Join non-empty clauses into a WHERE clause ('' when none)."""
    kept = [c for c in clauses if c]
    return f"WHERE {' AND '.join(kept)}" if kept else ""


def ts_in(window: TimeWindow | None, column: str = "ts_ns") -> str:
    """Rows whose timestamp lies inside the window (inclusive)."""
    if window is None:
        return ""
    return f"{column} BETWEEN {int(window.start_ns)} AND {int(window.end_ns)}"


def bucket_in(window: TimeWindow | None) -> str:
    """host_aggregates buckets that overlap the window (their counts are exact per bucket)."""
    if window is None:
        return ""
    return f"bucket_start_ns <= {int(window.end_ns)} AND bucket_start_ns + bucket_ns > {int(window.start_ns)}"


def interval_in(window: TimeWindow | None) -> str:
    """sched_intervals that overlap the window."""
    if window is None:
        return ""
    return f"off_ns <= {int(window.end_ns)} AND coalesce(on_ns, off_ns) >= {int(window.start_ns)}"


def pid_in(pids: Iterable[int] | None, column: str = "pid") -> str:
    """Rows of the given pids ('' for all)."""
    listed = pid_list(pids)
    return f"{column} IN ({listed})" if listed else ""


def table_complete(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """False when table_coverage says `table` holds a sample (e.g. an Ingero import)."""
    got = scalar(con, "SELECT bool_and(complete) FROM table_coverage WHERE table_name = ?", [table])
    return True if got is None else bool(got)


def has_rows(con: duckdb.DuckDBPyConnection, table: str, predicate: str = "") -> bool:
    """Whether any row of `table` matches the predicate (cheap: LIMIT 1)."""
    return bool(rows(con, f"SELECT 1 FROM {table} {where(predicate)} LIMIT 1"))


def tidy(sql: str) -> str:
    """One-line SQL for evidence (whitespace collapsed)."""
    return " ".join(sql.split())


def sql_str(text: str) -> str:
    """A SQL string literal that matches `text` exactly, and that cleaning and `tidy` leave as it is.

    Quotes are doubled; every character that `sanitize.clean` would drop or fold (control, invisible and bidi
    characters, line breaks, a space after a space) is written as `chr(N)`. Evidence SQL is shown through the
    cleaning of traced text: a value the store holds with such characters is still the one the SQL finds."""
    parts: list[str] = []
    plain: list[str] = []
    for i, ch in enumerate(text):
        if ch == " " and not (i and text[i - 1] == " ") or not (ch.isspace() or alters(ch)):
            plain.append("''" if ch == "'" else ch)
            continue
        if plain:
            parts.append("'" + "".join(plain) + "'")
            plain = []
        parts.append(f"chr({ord(ch)})")
    if plain or not parts:
        parts.append("'" + "".join(plain) + "'")
    return parts[0] if len(parts) == 1 else "(" + " || ".join(parts) + ")"


def sql_round(x: float, digits: int = 0) -> float:
    """round() as DuckDB rounds (half away from zero), so a value shown beside its SQL is the one the SQL gives."""
    from decimal import ROUND_HALF_UP, Decimal

    return float(Decimal(repr(x)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))
