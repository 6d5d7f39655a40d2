"""Time windows of a trace: the whole recording, or a slice given relative to the trace's own end.

`--since 30s` means the last 30 s of the trace, not of the wall clock: traces are read long after
they were recorded.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import duckdb

from ingero_mcp.analysis._sql import AnalysisError
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import TimeWindow

_UNITS_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h)?\s*$")

# Each source of timestamps; min/max over each is a cheap column scan.
_BOUNDS_SQL = """
SELECT min(lo), max(hi) FROM (
    SELECT min(started_ns) AS lo, max(coalesce(stopped_ns, started_ns)) AS hi FROM sessions
    UNION ALL SELECT min(ts_ns), max(ts_ns + coalesce(duration_ns, 0)) FROM cuda_calls  -- entry-only: its entry
    UNION ALL SELECT min(off_ns), max(coalesce(on_ns, off_ns)) FROM sched_intervals
    UNION ALL SELECT min(ts_ns), max(ts_ns) FROM snapshots
    UNION ALL SELECT min(ts_ns), max(ts_ns) FROM process_events
)
"""


def parse_duration_ns(text: str) -> int:
    """'30s', '5m', '250ms', '1.5h', '1,234.5 s' as the report prints it (bare numbers are seconds) -> ns."""
    match = _DURATION.match(text.replace(",", ""))
    if not match:
        raise AnalysisError(f"cannot read duration {text!r}: use a number with a unit, e.g. 30s, 5m, 250ms")
    value, unit = match.groups()
    return int(float(value) * _UNITS_NS[unit or "s"])


def trace_window(con: duckdb.DuckDBPyConnection) -> TimeWindow | None:
    """The span of the whole trace (sessions and every timestamped row), or None when it is empty."""
    lo, hi = shared_rows(con, _BOUNDS_SQL)[0]
    if lo is None or hi is None:
        return None
    return TimeWindow(start_ns=int(lo), end_ns=int(max(lo, hi)))


def window_or_trace(con: duckdb.DuckDBPyConnection, window: TimeWindow | None) -> TimeWindow:
    """`window`, else the whole trace, else an empty window at 0 (an empty trace): the span results are reported
    over."""
    return window or trace_window(con) or TimeWindow(start_ns=0, end_ns=0)


def _point(text: str, whole: TimeWindow) -> int:
    """A moment: '30s' (before the trace end), '+10s' (after its start), ns since epoch, or ISO time."""
    value = text.strip()
    if value.startswith("+"):
        return whole.start_ns + parse_duration_ns(value[1:])
    if value.lstrip("-").isdigit() and abs(int(value)) >= 10**15:
        return int(value)
    if _DURATION.match(value.lstrip("-")):
        return whole.end_ns - parse_duration_ns(value.lstrip("-"))
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise AnalysisError(
            f"cannot read time {text!r}: use a duration before the trace end (30s), '+10s' after its start, "
            "ns since the epoch, or an ISO time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # traces are in UTC; a time without a zone is read as UTC
    return int(moment.timestamp() * 1_000_000) * 1_000


def resolve_window(
    con: duckdb.DuckDBPyConnection,
    since: str | None = None,
    start: str | None = None,
    end: str | None = None,
) -> TimeWindow:
    """The window the user asked for, clamped to the trace; durations count back from the trace end."""
    whole = trace_window(con)
    if whole is None:
        raise AnalysisError("the trace is empty: no sessions, CUDA calls, scheduler rows or snapshots")
    lo, hi = whole.start_ns, whole.end_ns
    if since:
        lo = whole.end_ns - parse_duration_ns(since)
    if start:
        lo = _point(start, whole)
    if end:
        hi = _point(end, whole)
    lo, hi = max(lo, whole.start_ns), min(hi, whole.end_ns)
    if hi < lo:
        raise AnalysisError(
            f"empty window: it ends before it starts (the trace spans {(whole.end_ns - whole.start_ns) / 1e9:.1f} s)"
        )
    return TimeWindow(start_ns=lo, end_ns=hi)
