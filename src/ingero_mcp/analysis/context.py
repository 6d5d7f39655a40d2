"""The host over time: system snapshots (CPU, memory, swap, load, GPU), downsampled to a point budget."""

from __future__ import annotations

import duckdb

from ingero_mcp.analysis._sql import rows, tidy, ts_in, where
from ingero_mcp.analysis.models import Snapshot, SystemContext, TimeWindow
from ingero_mcp.analysis.window import window_or_trace

_COLUMNS = ("cpu_percent, procs_running, load1, mem_used_percent, mem_available_bytes, swap_used_bytes, "
            "gpu_util_percent, gpu_mem_used_bytes")


def context_sql(window: TimeWindow | None, start_ns: int, step_ns: int) -> str:
    """Snapshots averaged per step (CPU/GPU/memory as means, swap as the max) in the window."""
    return tidy(f"""
        SELECT min(ts_ns), avg(cpu_percent), round(avg(procs_running))::BIGINT, avg(load1), avg(mem_used_percent),
               round(avg(mem_available_bytes))::BIGINT, max(swap_used_bytes), avg(gpu_util_percent),
               round(avg(gpu_mem_used_bytes))::BIGINT
        FROM snapshots {where(ts_in(window))}
        GROUP BY (ts_ns - {int(start_ns)}) // {max(1, step_ns)} ORDER BY 1
    """)


def system_context(con: duckdb.DuckDBPyConnection, window: TimeWindow | None = None,
                   max_points: int = 120) -> SystemContext:
    """Snapshots in the window, averaged into at most `max_points` points, with the window's max/mean."""
    whole = window_or_trace(con, window)
    n, cpu_max, cpu_mean, mem_max, swap_max, gpu_mean, lo, hi = rows(
        con,
        f"SELECT count(*), max(cpu_percent), avg(cpu_percent), max(mem_used_percent), max(swap_used_bytes), "
        f"avg(gpu_util_percent), min(ts_ns), max(ts_ns) FROM snapshots {where(ts_in(window))}",
    )[0]
    points: list[Snapshot] = []
    downsampled = None
    if n:
        max_points = max(1, max_points)
        if n <= max_points:
            got = rows(con, f"SELECT ts_ns, {_COLUMNS} FROM snapshots {where(ts_in(window))} ORDER BY ts_ns")
        else:
            step = (int(hi) - int(lo)) // max_points + 1
            got = rows(con, context_sql(window, int(lo), step))
            downsampled = int(n)
        points = [
            Snapshot(
                ts_ns=int(r[0]), cpu_percent=r[1], procs_running=r[2], load1=r[3], mem_used_percent=r[4],
                mem_available_bytes=r[5], swap_used_bytes=r[6], gpu_util_percent=r[7], gpu_mem_used_bytes=r[8],
            )
            for r in got
        ]
    return SystemContext(
        window=whole, points=points, downsampled_from=downsampled,
        cpu_percent_max=cpu_max, cpu_percent_mean=None if cpu_mean is None else round(cpu_mean, 2),
        mem_used_percent_max=mem_max, swap_used_bytes_max=swap_max,
        gpu_util_percent_mean=None if gpu_mean is None else round(gpu_mean, 2),
    )
