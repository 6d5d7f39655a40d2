"""What a trace is: sessions (host, GPU, collector), events seen/stored/lost per source, table coverage, row counts."""

from __future__ import annotations

from collections import defaultdict

import duckdb

from ingero_mcp.analysis._sql import rows
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.cost import tracing_cost
from ingero_mcp.analysis.quality import data_quality_sql
from ingero_mcp.analysis.models import DataQuality, SessionInfo, SourceStats, TableCoverage, TraceInfo
from ingero_mcp.analysis.window import trace_window
from ingero_mcp.store.schema import TABLES


def trace_info(con: duckdb.DuckDBPyConnection, overlaps: bool = True) -> TraceInfo:
    """Sessions with their collector statistics, the trace window, coverage, row counts per table and damaged rows
    (overlapping intervals only with `overlaps`: data_quality_sql)."""
    sources: dict[int, list[SourceStats]] = defaultdict(list)
    for sid, src, seen, stored, lost, aggregated in rows(
        con,
        "SELECT session_id, source, events_seen, events_stored, events_lost, events_aggregated "
        "FROM collector_stats ORDER BY session_id, source",
    ):
        sources[int(sid)].append(
            SourceStats(source=src, events_seen=seen, events_stored=stored, events_lost=lost,
                        events_aggregated=aggregated or 0)
        )
    sessions = [
        SessionInfo(
            session_id=r[0], source=r[1], host=r[2], kernel=r[3], cpu_count=r[4], memory_bytes=r[5], gpu_model=r[6],
            gpu_driver=r[7], cuda_runtime_version=r[8], collector_version=r[9], collector_flags=r[10], attached=r[11],
            started_ns=r[12], stopped_ns=r[13], sources=sources.get(int(r[0]), []),
        )
        for r in rows(
            con,
            "SELECT session_id, source, host, kernel, cpu_count, memory_bytes, gpu_model, gpu_driver, "
            "cuda_runtime_version, collector_version, collector_flags, attached, started_ns, stopped_ns "
            "FROM sessions ORDER BY session_id",
        )
    ]
    coverage = [
        TableCoverage(table_name=t, complete=bool(c), note=n)
        for t, c, n in shared_rows(con, "SELECT table_name, bool_and(complete), string_agg(DISTINCT note, '; ') FROM "
                                 "table_coverage GROUP BY table_name ORDER BY table_name")
    ]
    union = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in TABLES)
    counts = {t: int(n) for t, n in shared_rows(con, union)}
    quality = data_quality(con, overlaps)
    return TraceInfo(
        sessions=sessions,
        window=trace_window(con),
        coverage=coverage,
        row_counts=counts,
        live=any(s.stopped_ns is None for s in sessions),
        tracing=tracing_cost(con),
        data_quality=quality,
    )


def data_quality(con: duckdb.DuckDBPyConnection, overlaps: bool = True) -> list[DataQuality]:
    """Damaged rows by kind, each with the SQL that counts it (data_quality_sql); kinds with none left out."""
    sql = " ".join(data_quality_sql(overlaps).split())
    return [DataQuality(what=str(what), count=int(n), sql=f"SELECT n FROM ({sql}) WHERE what = '{what}'")
            for what, n in shared_rows(con, sql) if n]


def events_lost(info: TraceInfo) -> int:
    """Events the collector lost, over every session and source (the sum of collector_stats.events_lost)."""
    return sum(s.events_lost for session in info.sessions for s in session.sources)
