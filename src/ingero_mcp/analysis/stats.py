"""Per-operation statistics over a window: count, total time, share of the span, exact percentiles.

Percentiles are exact over every stored row (DuckDB quantile_disc), not a rolling sample. When
cuda_calls holds only a sample (an Ingero import), the exact counts and total time come from
host_aggregates and the percentiles are flagged as computed from the stored sample.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis._sql import bucket_in, pid_in, rows, table_complete, tidy, where
from ingero_mcp.analysis.calls import CallGroup, call_groups
from ingero_mcp.analysis.models import HostTotal, OpStats, TimeWindow, TraceStats
from ingero_mcp.analysis.window import window_or_trace

def sample_note(con: duckdb.DuckDBPyConnection, counted_ops: set[str] | None = None) -> str:
    """What it means that cuda_calls is not complete: percentiles from the stored sample, totals from where."""
    why = rows(con, "SELECT string_agg(DISTINCT note, '; ') FROM table_coverage WHERE table_name = 'cuda_calls' AND NOT complete")[0][0]
    counted = counted_ops if counted_ops is not None else {
        r[0] for r in rows(con, "SELECT DISTINCT op FROM host_aggregates WHERE op IN (SELECT DISTINCT op FROM cuda_calls)")}
    totals = ("counts and total time are exact totals from host_aggregates" if counted
              else "counts and totals cover the stored rows only (no CUDA totals in host_aggregates)")
    return (f"cuda_calls does not hold every call (table_coverage{': ' + why if why else ''}): percentiles are computed "
            f"from the stored sample; {totals}")


def host_totals_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Exact totals per aggregated host event (sched_switch, mm_page_alloc, counted CUDA ops...)."""
    return tidy(f"""
        SELECT source, op, sum(count) AS events, count(DISTINCT pid) AS pids,
               sum(sum_duration_ns) AS sum_duration_ns, sum(sum_bytes) AS sum_bytes
        FROM host_aggregates {where(bucket_in(window), pid_in(pids))}
        GROUP BY source, op ORDER BY events DESC
    """)


def host_totals(con: duckdb.DuckDBPyConnection, window: TimeWindow | None, pids: list[int] | None) -> list[HostTotal]:
    """host_aggregates summed per (source, op) over the buckets overlapping the window."""
    return [
        HostTotal(
            source=src, op=op, count=int(n), pids=int(np),
            sum_duration_ns=None if dur is None else int(dur), sum_bytes=None if b is None else int(b),
        )
        for src, op, n, np, dur, b in rows(con, host_totals_sql(window, pids))
    ]


def op_stats(groups: list[CallGroup], span_ns: int, host: list[HostTotal], sampled: bool) -> list[OpStats]:
    """OpStats per op from the per-op call groups, totals from aggregates when sampled."""
    agg = {h.op: h for h in host}
    out: list[OpStats] = []
    for g in groups:
        if g.pid is not None:
            continue
        total_count, total_ns = None, g.total_ns
        if sampled and g.op in agg:
            total_count = agg[g.op].count
            total_ns = agg[g.op].sum_duration_ns or g.total_ns
        out.append(
            OpStats(
                op=g.op, api=g.api, count=g.count, total_count=total_count, total_ns=total_ns,
                share_of_span=round(total_ns / span_ns, 6) if span_ns else 0.0,
                p50_ns=g.p50_ns, p95_ns=g.p95_ns, p99_ns=g.p99_ns, max_ns=g.max_ns, min_ns=g.min_ns,
                mean_ns=round(g.mean_ns, 1), bytes_total=g.bytes_total, from_sample=sampled,
            )
        )
    out.sort(key=lambda s: (-s.total_ns, s.op))
    return out


def trace_stats(
    con: duckdb.DuckDBPyConnection,
    window: TimeWindow | None = None,
    pids: list[int] | None = None,
    *,
    groups: list[CallGroup] | None = None,
) -> TraceStats:
    """Per-op statistics over `window` (default: the whole trace), optionally for some pids only."""
    whole = window_or_trace(con, window)
    groups = call_groups(con, window, pids) if groups is None else groups
    sampled = not table_complete(con, "cuda_calls")
    host = host_totals(con, window, pids)
    ops = op_stats(groups, whole.duration_ns, host, sampled)
    call_pids = sorted({g.pid for g in groups if g.pid is not None})
    notes = [sample_note(con, {h.op for h in host} & {s.op for s in ops})] if sampled else []
    if window is not None and host:
        notes.append("host_aggregates totals cover the buckets that overlap the window")
    return TraceStats(
        window=whole, ops=ops, calls=sum(s.count for s in ops), pids=call_pids, host=host, sampled=sampled, notes=notes
    )
