"""Exact duration statistics of cuda_calls per (pid, op) and per op, shared by stats, processes and chains.

Percentiles are holistic, so each grouping costs a pass over the rows: the (pid, op) pass runs
always, and the per-op pass only for ops called by more than one process (for the others the
per-op numbers are the (pid, op) numbers). That keeps `explain` on 10M calls within its budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import duckdb

from ingero_mcp.analysis._sql import pid_in, sql_str, tidy, ts_in, where
from ingero_mcp.analysis.answers import shared_rows
from ingero_mcp.analysis.models import TimeWindow


@dataclass(frozen=True)
class CallGroup:
    """Exact duration statistics of one op (pid None) or one (pid, op) over the window's rows."""

    pid: int | None
    op: str
    api: str
    count: int
    total_ns: int | None  # None (and the percentiles with it): no call of the group has a duration (entry-only)
    p50_ns: int | None
    p95_ns: int | None
    p99_ns: int | None
    max_ns: int | None
    min_ns: int | None
    mean_ns: float | None
    bytes_total: int | None
    first_ts_ns: int
    max_ts_ns: int | None
    page_allocs: int | None = None
    entry_only: int = 0  # calls probed entry-only (duration_ns NULL, v4 launches): in count, not in the durations


_AGGS = """min(api) AS api, count(*) AS calls, sum(duration_ns) AS total_ns,
    quantile_disc(duration_ns, [0.5, 0.95, 0.99]) AS q, max(duration_ns) AS max_ns, min(duration_ns) AS min_ns,
    avg(duration_ns) AS mean_ns, sum(bytes) AS bytes_total, min(ts_ns) AS first_ts_ns,
    arg_max(ts_ns, duration_ns) AS max_ts_ns, sum(page_allocs) AS page_allocs,
    count(*) - count(duration_ns) AS entry_only"""


def pid_op_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """Exact statistics per (pid, op)."""
    return tidy(f"SELECT pid, op, {_AGGS} FROM cuda_calls {where(ts_in(window), pid_in(pids))} GROUP BY pid, op")


def op_sql(window: TimeWindow | None, pids: list[int] | None, ops: list[str] | None = None) -> str:
    """Exact statistics per op (all its callers together)."""
    only = f"op IN ({', '.join(sql_str(o) for o in ops)})" if ops else ""
    return tidy(f"SELECT NULL AS pid, op, {_AGGS} FROM cuda_calls {where(ts_in(window), pid_in(pids), only)} "
                "GROUP BY op")


def _group(row: tuple) -> CallGroup:
    pid, op, api, n, total, q, mx, mn, mean, nbytes, first, max_ts, pages, entry_only = row
    timed = int(n) > int(entry_only)  # else every duration is unknown: None, never 0

    def known(v: object) -> int | None:
        return int(v) if timed and v is not None else None  # type: ignore[call-overload]

    q = q if timed and q is not None else [None, None, None]
    return CallGroup(
        pid=None if pid is None else int(pid), op=op, api=api or "", count=int(n), total_ns=known(total),
        p50_ns=known(q[0]), p95_ns=known(q[1]), p99_ns=known(q[2]), max_ns=known(mx), min_ns=known(mn),
        mean_ns=float(mean) if timed and mean is not None else None,
        bytes_total=None if nbytes is None else int(nbytes), first_ts_ns=int(first), max_ts_ns=known(max_ts),
        page_allocs=None if pages is None else int(pages), entry_only=int(entry_only),
    )


def call_groups(
    con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None, pids: list[int] | None = None
) -> list[CallGroup]:
    """Per-(pid, op) groups and per-op groups (pid None), exact over every row in the window."""
    per_pid = [_group(r) for r in shared_rows(con, pid_op_sql(window, pids))]
    callers: dict[str, list[CallGroup]] = {}
    for g in per_pid:
        callers.setdefault(g.op, []).append(g)
    shared = sorted(op for op, gs in callers.items() if len(gs) > 1)
    per_op = [replace(gs[0], pid=None) for op, gs in callers.items() if len(gs) == 1]
    if shared:
        per_op += [_group(r) for r in shared_rows(con, op_sql(window, pids, shared))]
    return per_op + per_pid
