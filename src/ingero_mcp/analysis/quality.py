"""Rows a trace store holds that the accounting cannot take as they are: counted by kind, never a traceback."""

from __future__ import annotations


def data_quality_sql() -> str:
    """Rows the accounting cannot take as they are: per kind, how many. Scheduler intervals that overlap the same
    thread's previous one, that end before they start, or whose split is negative; CUDA calls with a negative
    duration."""
    return """
        SELECT 'overlapping intervals of one thread' AS what, count(*) AS n FROM (
            SELECT off_ns, max(on_ns) OVER (PARTITION BY session_id, pid, tid ORDER BY off_ns, on_ns
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_on
            FROM sched_intervals WHERE on_ns IS NOT NULL) WHERE off_ns < prev_on
        UNION ALL SELECT 'intervals that end before they start', count(*) FROM sched_intervals WHERE on_ns < off_ns
        UNION ALL SELECT 'intervals with a negative sleep or CPU wait', count(*) FROM sched_intervals
            WHERE sleep_ns < 0 OR cpu_wait_ns < 0 OR wakeup_ns < off_ns OR wakeup_ns > on_ns
        UNION ALL SELECT 'CUDA calls with a negative duration', count(*) FROM cuda_calls WHERE duration_ns < 0"""
