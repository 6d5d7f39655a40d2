"""One pass over cuda_calls: exact percentiles per op and per (pid, op), shared by stats, processes and chains.

A GROUPING SETS query computes both levels in a single scan, which is what keeps `explain` on
10M calls within its time budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from ingero_mcp.analysis._sql import pid_in, rows, tidy, ts_in, where
from ingero_mcp.analysis.models import TimeWindow


@dataclass(frozen=True)
class CallGroup:
    """Exact duration statistics of one op (pid None) or one (pid, op) over the window's rows."""

    pid: int | None
    op: str
    api: str
    count: int
    total_ns: int
    p50_ns: int
    p95_ns: int
    p99_ns: int
    max_ns: int
    min_ns: int
    mean_ns: float
    bytes_total: int | None
    first_ts_ns: int
    max_ts_ns: int
    first3_ts_ns: tuple[int, ...] = ()
    page_allocs: int | None = None


def call_stats_sql(window: TimeWindow | None, pids: list[int] | None) -> str:
    """The SQL behind `call_groups` (also cited by evidence)."""
    return tidy(f"""
        SELECT pid, op, min(api) AS api, count(*) AS calls, sum(duration_ns) AS total_ns,
               quantile_disc(duration_ns, [0.5, 0.95, 0.99]) AS q,
               max(duration_ns) AS max_ns, min(duration_ns) AS min_ns, avg(duration_ns) AS mean_ns,
               sum(bytes) AS bytes_total, min(ts_ns) AS first_ts_ns, arg_max(ts_ns, duration_ns) AS max_ts_ns,
               min(ts_ns, 3) AS first3, sum(page_allocs) AS page_allocs
        FROM cuda_calls {where(ts_in(window), pid_in(pids))}
        GROUP BY GROUPING SETS ((op), (pid, op))
    """)


def call_groups(
    con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None, pids: list[int] | None = None
) -> list[CallGroup]:
    """Per-op groups (pid None) and per-(pid, op) groups, exact over every row in the window."""
    out: list[CallGroup] = []
    for pid, op, api, n, total, q, mx, mn, mean, nbytes, first, max_ts, first3, pages in rows(
        con, call_stats_sql(window, pids)
    ):
        out.append(
            CallGroup(
                pid=None if pid is None else int(pid), op=op, api=api or "", count=int(n), total_ns=int(total or 0),
                p50_ns=int(q[0]), p95_ns=int(q[1]), p99_ns=int(q[2]), max_ns=int(mx), min_ns=int(mn),
                mean_ns=float(mean), bytes_total=None if nbytes is None else int(nbytes),
                first_ts_ns=int(first), max_ts_ns=int(max_ts), first3_ts_ns=tuple(int(t) for t in first3 or ()),
                page_allocs=None if pages is None else int(pages),
            )
        )
    return out
