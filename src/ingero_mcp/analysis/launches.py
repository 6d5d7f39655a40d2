"""How the kernel launches were recorded (v4 stores): entry-only, and when the governor detached their probes. Read
by the accounting (what its work rates mean) and by the tracing cost."""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.answers import shared_rows


def launch_coverage_sql() -> str:
    """The share of the sessions' time (start to stop) in which the launch probes were attached (not in probe_gaps)."""
    return ("SELECT 1 - coalesce((SELECT sum(least(g.end_ns, s.stopped_ns) - greatest(g.start_ns, s.started_ns)) "
            "FROM probe_gaps g JOIN sessions s USING (session_id) WHERE g.probes = 'launch' "
            "AND g.end_ns > s.started_ns AND g.start_ns < s.stopped_ns), 0) / sum(stopped_ns - started_ns) "
            "FROM sessions WHERE stopped_ns > started_ns")


def has_launch_gaps(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the governor ever detached the launch probes (v4 probe_gaps; never in older stores)."""
    return bool(rows(con, "SELECT 1 FROM probe_gaps WHERE probes = 'launch' LIMIT 1"))


def launch_recording(con: duckdb.DuckDBPyConnection) -> tuple[bool, float | None]:
    """(launches probed entry-only, launch coverage or None when no probe gap): how v4 recorded the launches."""
    entry_only = bool(shared_rows(
        con, "SELECT 1 FROM cuda_calls WHERE duration_ns IS NULL AND contains(op, 'aunch') LIMIT 1"))
    if not has_launch_gaps(con):
        return entry_only, None
    got = rows(con, launch_coverage_sql())[0][0]
    return entry_only, None if got is None else round(float(got), 4)
