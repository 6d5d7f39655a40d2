"""What happened around a moment: CUDA calls, scheduler intervals, process events and snapshots in time order.

When more entries than the limit fall in the window, the longest calls and stalls are kept (process
events always are, and so are snapshots in a window of up to 10 s; in a longer one, whose one-a-second
snapshots would fill the limit, they take the room left), then shown in time order.
"""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis._sql import AnalysisError, interval_in, pid_in, tidy, ts_in, where
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import Timeline, TimelineEntry, TimeWindow
from ingero_mcp.analysis.window import trace_window

AROUND_NS = 500_000_000  # +-0.5 s around a moment when no window is given
SNAPSHOTS_KEPT_NS = 10_000_000_000  # windows up to this long keep every snapshot whatever the limit


def timeline_sql(window: TimeWindow, pid: int | None, tid: int | None, limit: int | None = None) -> str:
    """All timestamped rows of the window, one shape: ts, pid, tid, kind, description, duration, weight. With
    `limit`: only each table's `limit` heaviest rows (the order `timeline` keeps), their text made for those alone."""
    pids = [pid] if pid is not None else None
    tids = [tid] if tid is not None else None
    at = where(ts_in(window), pid_in(pids), pid_in(tids, "tid"))  # rows of one moment: calls, process events
    sched = where(interval_in(window), pid_in(pids), pid_in(tids, "tid"))
    snap_weight = 9e18 if window.duration_ns <= SNAPSHOTS_KEPT_NS else 0

    def rows_of(table: str, cols: str, cond: str, weight: str | None, ts: str) -> str:
        order = f"{weight} DESC NULLS LAST, {ts}" if weight else ts  # no weight: one for all its rows
        top = f" ORDER BY {order} LIMIT {int(limit)}" if limit is not None else ""
        return f"(SELECT {cols} FROM {table} {cond}{top})"

    return tidy(f"""
        SELECT ts_ns, pid, tid, 'cuda' AS kind,
               op || coalesce(' ' || memcpy_kind, '') || coalesce(' ' || bytes || ' B', '')
                  || CASE WHEN return_code IS NOT NULL AND return_code <> 0 THEN ' rc=' || return_code ELSE '' END
                  || CASE WHEN off_cpu_ns > 0 THEN ' (off-CPU ' || off_cpu_ns || ' ns, preempted '
                          || coalesce(cpu_wait_ns, 0) || ' ns, blocked ' || coalesce(sleep_ns, 0) || ' ns)' ELSE '' END
                  || CASE WHEN duration_ns IS NULL THEN ' (entry-only: duration not recorded)' ELSE '' END
                  AS description,
               duration_ns, duration_ns AS weight
        FROM {rows_of("cuda_calls", "ts_ns, pid, tid, op, memcpy_kind, bytes, return_code, off_cpu_ns, cpu_wait_ns, "
                      "sleep_ns, duration_ns", at, "duration_ns", "ts_ns")}
        UNION ALL
        SELECT off_ns, pid, tid, 'sched',
               'off-CPU ' || prev_state
                  || CASE WHEN prev_state IN ('preempted', 'new')
                          THEN coalesce(' (CPU taken by ' || coalesce(preemptor_comm, '?') || '[' || preemptor_pid
                                        || '])', '')
                          ELSE coalesce(' in ' || syscall || '()', '')
                               || CASE WHEN waker_context IN ('irq', 'softirq') THEN ' (woken by an interrupt)'
                                       ELSE coalesce(' (woken by ' || coalesce(waker_comm, '?') || '[' || waker_pid
                                                     || '])', '') END END
                  || coalesce(' on cpu ' || cpu, ''),
               coalesce(off_cpu_ns, on_ns - off_ns), coalesce(off_cpu_ns, on_ns - off_ns, 0)
        FROM {rows_of("sched_intervals", "off_ns, on_ns, pid, tid, prev_state, preemptor_comm, preemptor_pid, cpu, "
                      "off_cpu_ns, syscall, waker_comm, waker_pid, waker_context", sched,
                      "coalesce(off_cpu_ns, on_ns - off_ns, 0)", "off_ns")}
        UNION ALL
        SELECT ts_ns, pid, tid, 'process', event || coalesce(' child ' || child_pid, '') || coalesce(' ' || comm, '')
                  || coalesce(' ' || filename, '') || coalesce(' exit ' || exit_code, ''), NULL, 9e18
        FROM {rows_of("process_events", "ts_ns, pid, tid, event, child_pid, comm, filename, exit_code", at,
                      None, "ts_ns")}
        UNION ALL
        SELECT ts_ns, NULL, NULL, 'snapshot',
               'CPU ' || round(cpu_percent, 1) || '%' || coalesce(', load ' || round(load1, 2), '')
                  || coalesce(', mem ' || round(mem_used_percent, 1) || '%', '')
                  || coalesce(', GPU ' || round(gpu_util_percent, 1) || '%', ''),
               NULL, {snap_weight}
        FROM {rows_of("snapshots", "ts_ns, cpu_percent, load1, mem_used_percent, gpu_util_percent",
                      where(ts_in(window)), None, "ts_ns")}
    """)


def timeline(
    con: duckdb.DuckDBPyConnection,
    pid: int | None = None,
    tid: int | None = None,
    window: TimeWindow | None = None,
    around_ns: int | None = None,
    limit: int = 200,
) -> Timeline:
    """Entries of the window (or +-0.5 s around `around_ns`), at most `limit`, most significant kept."""
    if window is None:
        if around_ns is not None:
            window = TimeWindow(start_ns=around_ns - AROUND_NS, end_ns=around_ns + AROUND_NS)
        else:
            window = trace_window(con)
            if window is None:
                raise AnalysisError("the trace is empty")
    limit = max(1, int(limit))
    total = int(shared_rows(con, f"SELECT count(*) FROM ({timeline_sql(window, pid, tid)})")[0][0])
    heaviest = timeline_sql(window, pid, tid, limit)  # the heaviest rows of all are among each table's heaviest
    got = shared_rows(
        con,
        f"SELECT * FROM (SELECT * FROM ({heaviest}) ORDER BY weight DESC NULLS LAST, ts_ns LIMIT {limit}) "
        "ORDER BY ts_ns, kind, pid, tid, description",  # rows of one moment in one order, whatever the plan
    )
    entries = [
        TimelineEntry(
            ts_ns=int(ts), pid=None if p is None else int(p), tid=None if t is None else int(t), kind=kind,
            description=desc or kind, duration_ns=None if dur is None else int(dur),
        )
        for ts, p, t, kind, desc, dur, _ in got
    ]
    return Timeline(window=window, entries=entries, truncated=total > limit, total_in_window=total)
